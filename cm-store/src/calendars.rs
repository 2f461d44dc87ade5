//! The `calendars` table: holiday calendars routines share ([`cm_domain::calendar`]), and the
//! schedule of a routine on one.
//!
//! A routine names its calendar in `routines.calendar` and its policy in
//! `routines.on_holiday`. Every path that plans a routine (its write, its resume, the claim, the
//! planning pass, `routine show`) reads the calendar and applies it with
//! [`cm_domain::Schedule::with_calendar`].
//!
//! An edit of a calendar re-plans the routines on it in its own transaction: it locks the
//! calendar (`FOR UPDATE`), writes the new calendar, locks the routines on it group by group (in
//! `(group, id)` order) and moves each one's clock from the occurrence it stood for under the
//! old calendar to where the new calendar plans it. A claim reads the calendars of the
//! routines it locked in a statement after the lock, so it reads the calendar their clocks were
//! planned with: an edit either committed before (the clocks it wrote and the new calendar) or
//! waits for the claim's locks (the old clocks and the old calendar). A write that puts a
//! routine on a calendar reads the calendar `FOR SHARE`, so an edit waits for it and re-plans
//! the routine it wrote, or it waits for the edit and plans with the new calendar.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use cm_domain::calendar::{self, Calendar, CalendarError, OnHoliday};
use cm_domain::{Schedule, Zone};
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use crate::groups::GroupId;
use crate::model::{Routine, RoutineRow, routines_of};
use crate::{PgStore, StoreError};

/// A calendar as stored.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StoredCalendar {
    /// Its name (unique).
    pub name: String,
    /// Its zone, dates off and weekly days off.
    pub calendar: Calendar,
    /// How many routines are on it.
    pub routines: u64,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last changed.
    pub updated_at: DateTime<Utc>,
}

/// What an edit of a calendar did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CalendarEdit {
    /// The calendar as it is now.
    pub calendar: StoredCalendar,
    /// How many dates the edit added or removed (those already so are not counted).
    pub changed: u64,
    /// The routines on it whose clock the edit moved.
    pub replanned: u64,
}

/// A row of `calendars` with how many routines are on it.
#[derive(sqlx::FromRow)]
struct CalendarRow {
    name: String,
    timezone: String,
    days_off: String,
    dates: Vec<NaiveDate>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    routines: i64,
}

/// A statement that reads [`CalendarRow`]s, `$tail` after the `FROM` of `cm.calendars c`.
/// The routines on each are counted in a joined aggregate, not a correlated subquery: Citus
/// plans no correlated subquery over a reference table.
macro_rules! select_calendars {
    ($tail:literal) => {
        concat!(
            "SELECT c.name, c.timezone, c.days_off, c.dates, c.created_at, c.updated_at,
                    coalesce(u.routines, 0) AS routines
             FROM cm.calendars c
             LEFT JOIN (SELECT calendar, count(*) AS routines FROM cm.routines
                        WHERE calendar IS NOT NULL GROUP BY calendar) u ON u.calendar = c.name",
            $tail
        )
    };
}

/// A stored calendar the domain refuses (written past cm's checks).
fn corrupt(name: &str, reason: impl std::fmt::Display) -> StoreError {
    StoreError::InvalidCalendar(format!(
        "the stored calendar {name:?} is unusable: {reason}"
    ))
}

/// Reads a calendar's stored columns.
fn calendar_of(
    name: &str,
    timezone: &str,
    days_off: &str,
    dates: &[NaiveDate],
) -> Result<Calendar, StoreError> {
    let zone = Zone::parse(timezone).map_err(|e| corrupt(name, e))?;
    let days = calendar::parse_days_off(days_off).map_err(|e| corrupt(name, e))?;
    Calendar::new(zone, dates.iter().copied(), &days).map_err(|e| corrupt(name, e))
}

impl TryFrom<CalendarRow> for StoredCalendar {
    type Error = StoreError;

    fn try_from(row: CalendarRow) -> Result<StoredCalendar, StoreError> {
        Ok(StoredCalendar {
            calendar: calendar_of(&row.name, &row.timezone, &row.days_off, &row.dates)?,
            name: row.name,
            routines: u64::try_from(row.routines).unwrap_or(0),
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// The calendar `name`, read in the caller's transaction (`FOR SHARE` when `share`);
/// [`StoreError::CalendarNotFound`] when there is none.
pub(crate) async fn read_calendar(
    conn: &mut PgConnection,
    name: &str,
    share: bool,
) -> Result<Calendar, StoreError> {
    let statement = if share {
        "SELECT timezone, days_off, dates FROM cm.calendars WHERE name = $1 FOR SHARE"
    } else {
        "SELECT timezone, days_off, dates FROM cm.calendars WHERE name = $1"
    };
    let row: Option<(String, String, Vec<NaiveDate>)> = crate::schema::query_as(statement)
        .bind(name)
        .fetch_optional(conn)
        .await?;
    let (timezone, days_off, dates) =
        row.ok_or_else(|| StoreError::CalendarNotFound(name.to_owned()))?;
    calendar_of(name, &timezone, &days_off, &dates)
}

/// The calendars named `names`, read in the caller's transaction, each with the name it was
/// read for; a name no calendar has is left out. The claim reads the calendars of the routines
/// it locked with this, after locking them.
pub(crate) async fn read_calendars(
    conn: &mut PgConnection,
    names: &[&str],
) -> Result<Vec<(String, Result<Arc<Calendar>, String>)>, StoreError> {
    let rows: Vec<(String, String, String, Vec<NaiveDate>)> = crate::schema::query_as(
        "SELECT name, timezone, days_off, dates FROM cm.calendars WHERE name = ANY($1)",
    )
    .bind(names)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(name, timezone, days_off, dates)| {
            let calendar = calendar_of(&name, &timezone, &days_off, &dates)
                .map(Arc::new)
                .map_err(|e| e.to_string());
            (name, calendar)
        })
        .collect())
}

/// `schedule` on the calendar `calendar` under `on_holiday`, or `schedule` itself with no
/// calendar; a combination the domain refuses is [`StoreError::InvalidRoutine`].
pub(crate) fn on_calendar(
    schedule: Schedule,
    calendar: Option<Arc<Calendar>>,
    on_holiday: OnHoliday,
) -> Result<Schedule, StoreError> {
    match calendar {
        None => Ok(schedule),
        Some(calendar) => schedule
            .with_calendar(calendar, on_holiday)
            .map_err(|e| StoreError::InvalidRoutine(e.to_string())),
    }
}

/// The schedule of `routine` with its calendar applied, the calendar read in the caller's
/// transaction (`FOR SHARE` when `share`: the write puts the routine on that calendar).
pub(crate) async fn schedule_in(
    conn: &mut PgConnection,
    schedule: Schedule,
    calendar: Option<&str>,
    on_holiday: OnHoliday,
    share: bool,
) -> Result<Schedule, StoreError> {
    let calendar = match calendar {
        None => None,
        Some(name) => Some(Arc::new(read_calendar(conn, name, share).await?)),
    };
    on_calendar(schedule, calendar, on_holiday)
}

/// The checks of a calendar's name, as a store error.
fn checked_name(name: &str) -> Result<(), StoreError> {
    calendar::check_calendar_name(name).map_err(invalid)
}

/// A calendar the domain refuses, as a store error.
fn invalid(e: CalendarError) -> StoreError {
    StoreError::InvalidCalendar(e.to_string())
}

/// Holiday calendars: creating, reading, editing and deleting them.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait CalendarStore: Send + Sync {
    /// Stores a new calendar named `name`; a name another calendar has is
    /// [`StoreError::CalendarNameTaken`].
    async fn create_calendar(
        &self,
        name: &str,
        calendar: &Calendar,
    ) -> Result<StoredCalendar, StoreError>;

    /// The calendar named `name`.
    async fn get_calendar(&self, name: &str) -> Result<StoredCalendar, StoreError>;

    /// Every calendar, by name.
    async fn list_calendars(&self) -> Result<Vec<StoredCalendar>, StoreError>;

    /// Adds `dates` to the calendar's days off (`add`), or takes them off it, and re-plans the
    /// routines on it, in one transaction (see the module documentation).
    async fn edit_calendar_dates(
        &self,
        name: &str,
        dates: &[NaiveDate],
        add: bool,
    ) -> Result<CalendarEdit, StoreError>;

    /// Deletes the calendar; refused with [`StoreError::CalendarInUse`] while a routine is on
    /// it.
    async fn delete_calendar(&self, name: &str) -> Result<(), StoreError>;

    /// The schedule of `routine` with its calendar applied (its stored text, parsed, on the
    /// calendar it names): what `routine show` lists its next runs from.
    async fn routine_schedule(&self, routine: &Routine) -> Result<Schedule, StoreError>;
}

#[async_trait]
impl CalendarStore for PgStore {
    async fn create_calendar(
        &self,
        name: &str,
        calendar: &Calendar,
    ) -> Result<StoredCalendar, StoreError> {
        checked_name(name)?;
        let dates: Vec<NaiveDate> = calendar.dates().collect();
        let row: CalendarRow = on_store!(self, |e| {
            crate::schema::query_as(
            "INSERT INTO cm.calendars AS c (name, timezone, days_off, dates) VALUES ($1, $2, $3, $4)
             RETURNING c.name, c.timezone, c.days_off, c.dates, c.created_at, c.updated_at,
                       0::bigint AS routines",
        )
        .bind(name)
        .bind(calendar.zone().name())
        .bind(calendar::days_off_text(&calendar.days_off()))
        .bind(&dates)
        .fetch_one(e)
        })
        .map_err(|e| {
            if e.as_database_error()
                .is_some_and(|d| d.kind() == sqlx::error::ErrorKind::UniqueViolation)
            {
                StoreError::CalendarNameTaken(name.to_owned())
            } else {
                e.into()
            }
        })?;
        row.try_into()
    }

    async fn get_calendar(&self, name: &str) -> Result<StoredCalendar, StoreError> {
        let row: Option<CalendarRow> = on_store!(self, |e| crate::schema::query_as(
            select_calendars!(" WHERE c.name = $1")
        )
        .bind(name)
        .fetch_optional(e))?;
        row.ok_or_else(|| StoreError::CalendarNotFound(name.to_owned()))?
            .try_into()
    }

    async fn list_calendars(&self) -> Result<Vec<StoredCalendar>, StoreError> {
        let rows: Vec<CalendarRow> = on_store!(self, |e| crate::schema::query_as(
            select_calendars!(" ORDER BY c.name")
        )
        .fetch_all(e))?;
        rows.into_iter().map(StoredCalendar::try_from).collect()
    }

    async fn edit_calendar_dates(
        &self,
        name: &str,
        dates: &[NaiveDate],
        add: bool,
    ) -> Result<CalendarEdit, StoreError> {
        let mut tx = self.begin().await?;
        let edit = edit_dates(&mut tx, self, name, dates, add).await?;
        tx.commit().await?;
        Ok(edit)
    }

    async fn delete_calendar(&self, name: &str) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        read_calendar(&mut tx, name, false).await?;
        crate::schema::query("SELECT 1 FROM cm.calendars WHERE name = $1 FOR UPDATE")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let users: Vec<String> = crate::schema::query_scalar(
            "SELECT name FROM cm.routines WHERE calendar = $1 ORDER BY name LIMIT 4",
        )
        .bind(name)
        .fetch_all(&mut *tx)
        .await?;
        if !users.is_empty() {
            return Err(StoreError::CalendarInUse {
                name: name.to_owned(),
                routines: users,
            });
        }
        crate::schema::query("DELETE FROM cm.calendars WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn routine_schedule(&self, routine: &Routine) -> Result<Schedule, StoreError> {
        let schedule = routine.parsed_schedule()?;
        let Some(name) = routine.calendar.as_deref() else {
            return Ok(schedule);
        };
        let mut conn = self.pool().acquire().await?;
        let calendar = read_calendar(&mut conn, name, false).await?;
        on_calendar(schedule, Some(Arc::new(calendar)), routine.on_holiday)
    }
}

/// [`CalendarStore::edit_calendar_dates`] in the caller's transaction.
async fn edit_dates(
    conn: &mut PgConnection,
    store: &PgStore,
    name: &str,
    dates: &[NaiveDate],
    add: bool,
) -> Result<CalendarEdit, StoreError> {
    let mut tx = conn.begin().await?;
    let old = read_calendar(&mut tx, name, false).await?;
    crate::schema::query("SELECT 1 FROM cm.calendars WHERE name = $1 FOR UPDATE")
        .bind(name)
        .execute(&mut *tx)
        .await?;
    // Read again under the lock: an edit that committed meanwhile is the one edited.
    let old = match read_calendar(&mut tx, name, false).await {
        Ok(locked) => locked,
        Err(_) => old,
    };
    let mut all: Vec<NaiveDate> = old.dates().collect();
    let before = all.len();
    if add {
        all.extend_from_slice(dates);
        all.sort_unstable();
        all.dedup();
    } else {
        all.retain(|d| !dates.contains(d));
    }
    let changed = all.len().abs_diff(before) as u64;
    let new = Calendar::new(old.zone(), all.iter().copied(), &old.days_off()).map_err(invalid)?;
    crate::schema::query("UPDATE cm.calendars SET dates = $2, updated_at = now() WHERE name = $1")
        .bind(name)
        .bind(&all)
        .execute(&mut *tx)
        .await?;
    let replanned = if changed == 0 {
        0
    } else {
        replan(&mut tx, store, name, Arc::new(old), Arc::new(new)).await?
    };
    let row: CalendarRow = crate::schema::query_as(select_calendars!(" WHERE c.name = $1"))
        .bind(name)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(CalendarEdit {
        calendar: row.try_into()?,
        changed,
        replanned,
    })
}

/// Moves the clocks of the routines on the calendar `name` from `old` to `new`, their rows
/// locked group by group in the caller's transaction. Returns how many clocks moved.
async fn replan(
    conn: &mut PgConnection,
    store: &PgStore,
    name: &str,
    old: Arc<Calendar>,
    new: Arc<Calendar>,
) -> Result<u64, StoreError> {
    let mut targets: Vec<(GroupId, Uuid)> = crate::schema::query_as(
        "SELECT group_id, id FROM cm.routines WHERE calendar = $1 AND next_run_at IS NOT NULL",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await?;
    targets.sort_unstable();
    let now = crate::catalog::db_now(conn).await?;
    let mut moved = 0;
    for group in targets.chunk_by(|a, b| a.0 == b.0) {
        let ids: Vec<Uuid> = group.iter().map(|(_, id)| *id).collect();
        let rows: Vec<RoutineRow> = crate::schema::query_as(
            "SELECT * FROM cm.routines WHERE group_id = $1 AND id = ANY($2) ORDER BY id FOR UPDATE",
        )
        .bind(group[0].0)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        for routine in routines_of(rows)? {
            let (Some(clock), Some(calendar)) = (routine.next_run_at, routine.calendar.as_deref())
            else {
                continue;
            };
            if calendar != name || routine.paused {
                continue;
            }
            let parsed = store
                .schedules
                .parse(&routine.schedule, &routine.timezone)
                .await
                .map_err(|reason| StoreError::CorruptRoutine {
                    routine_id: routine.id,
                    reason,
                })?;
            let refused = |e: StoreError| {
                StoreError::InvalidCalendar(format!(
                    "the edit would leave the routine {:?} unusable: {e}",
                    cm_domain::name::escape_unseen(&routine.name)
                ))
            };
            let before = on_calendar((*parsed).clone(), Some(old.clone()), routine.on_holiday)
                .map_err(refused)?;
            let after = on_calendar((*parsed).clone(), Some(new.clone()), routine.on_holiday)
                .map_err(refused)?;
            let next = replanned_clock(routine.id, clock, &before, &after, routine.on_holiday, now);
            if next != Some(clock) {
                crate::schema::query(
                    "UPDATE cm.routines SET next_run_at = $3, updated_at = now()
                     WHERE id = $1 AND group_id = $2",
                )
                .bind(routine.id)
                .bind(routine.group_id)
                .bind(next)
                .execute(&mut *conn)
                .await?;
                moved += 1;
            }
        }
    }
    Ok(moved)
}

/// For a routine an edit of its calendar from SQL (`cm.edit_calendar_dates`) left unplanned:
/// its clock moved from the calendar it was planned with (kept beside it) to `schedule`, the
/// routine's schedule on its calendar now, as [`replanned_clock`] moves it. `None` when the
/// routine waits for no such move, or the kept calendar no longer reads (it is then planned
/// from the clock, as a resume is).
pub(crate) async fn replan_pending(
    conn: &mut PgConnection,
    routine: &Routine,
    schedule: &Schedule,
    now: DateTime<Utc>,
) -> Result<Option<Option<DateTime<Utc>>>, StoreError> {
    let kept: Option<(Option<DateTime<Utc>>, Option<serde_json::Value>)> = crate::schema::query_as(
        "SELECT replan_clock, replan_calendar FROM cm.routines WHERE id = $1 AND group_id = $2",
    )
    .bind(routine.id)
    .bind(routine.group_id)
    .fetch_optional(conn)
    .await?;
    let Some((Some(clock), Some(old))) = kept else {
        return Ok(None);
    };
    let text = |key: &str| old.get(key).and_then(|v| v.as_str()).unwrap_or_default();
    let dates: Vec<NaiveDate> = old
        .get("dates")
        .and_then(|d| d.as_array())
        .map(|dates| {
            dates
                .iter()
                .filter_map(|d| d.as_str().and_then(|d| calendar::parse_date(d).ok()))
                .collect()
        })
        .unwrap_or_default();
    let name = routine.calendar.as_deref().unwrap_or_default();
    let Ok(old) = calendar_of(name, text("timezone"), text("days_off"), &dates) else {
        return Ok(None);
    };
    let Ok(bare) = routine.parsed_schedule() else {
        return Ok(None);
    };
    let Ok(before) = on_calendar(bare, Some(Arc::new(old)), routine.on_holiday) else {
        return Ok(None);
    };
    Ok(Some(replanned_clock(
        routine.id,
        clock,
        &before,
        schedule,
        routine.on_holiday,
        now,
    )))
}

/// A routine's clock after its calendar changed: `clock` stood for an occurrence under
/// `before`; the new clock is where `after` plans the first occurrence still owed. A clock
/// already due (at or before `now`) keeps its occurrence owed, planned where `after` plans it:
/// an edit never takes back what was due when it committed.
///
/// Every occurrence before the one the clock stood for was handled (fired, or passed over as a
/// day off or a misfire), except, under `skip` or `next`, those after `now`: an occurrence is
/// handled only once its planned instant passed, and neither policy plans one before itself.
/// So the first owed under `after` is its first occurrence at or after the clock's occurrence,
/// or after `now` when that is earlier (a day the edit made a business day). Under `previous`
/// an occurrence can have been handled before its own instant, so none before the clock's is
/// owed again.
pub(crate) fn replanned_clock(
    routine: Uuid,
    clock: DateTime<Utc>,
    before: &Schedule,
    after: &Schedule,
    on_holiday: OnHoliday,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let stood_for = before.occurrence_planned_at(routine, clock)?;
    if clock <= now {
        // Due already: it stays owed, where the new calendar plans it.
        return Some(after.planned(routine, stood_for));
    }
    let from = stood_for - TimeDelta::milliseconds(1);
    let from = match on_holiday {
        OnHoliday::Previous => from,
        OnHoliday::Skip | OnHoliday::Next => from.min(now),
    };
    let next = after.next_after(from)?;
    Some(after.planned(routine, next))
}
