//! What operators do with routines beyond creating them: finding one by name, reading the table
//! a page at a time, editing one in place, importing many at once, and reading the requests a
//! routine still has pending. The [`RoutineStore`](crate::RoutineStore) methods of `PgStore`
//! delegate here.

use chrono::{DateTime, Utc};
use cm_domain::definition::{self, DefinitionError};
use cm_domain::{RoutineKind, Schedule};
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use crate::groups::{GroupId, group_of, stored_group_count};
pub use crate::model::{
    ImportedRoutine, PendingRequest, PendingRequests, RoutineAction, RoutineCursor, RoutineUpdate,
    SyncAction, SyncedRoutine,
};
use crate::model::{NewRoutine, Routine, RoutineRow, routines_of};
use crate::{MIGRATOR, PgStore, StoreError};

/// The group of the routine `id`, by the schema's group count.
pub(crate) async fn routine_group(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<GroupId, StoreError> {
    Ok(group_of(id, stored_group_count(conn).await?))
}

/// The routine `id`, locked `FOR UPDATE` in the caller's transaction (through its group, so on
/// Citus one shard); [`StoreError::RoutineNotFound`] when there is none.
pub(crate) async fn lock_routine(conn: &mut PgConnection, id: Uuid) -> Result<Routine, StoreError> {
    let group = routine_group(conn, id).await?;
    crate::schema::query_as::<_, RoutineRow>(
        "SELECT * FROM cm.routines WHERE id = $1 AND group_id = $2 FOR UPDATE",
    )
    .bind(id)
    .bind(group)
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::RoutineNotFound(id))?
    .try_into()
}

/// Takes the transaction-scoped advisory lock on `source`: imports and syncs of one source take
/// turns, so a routine another import of that source creates meanwhile is not missed.
pub(crate) async fn lock_source(conn: &mut PgConnection, source: &str) -> Result<(), StoreError> {
    crate::schema::query("SELECT pg_advisory_xact_lock(hashtextextended('cm.source:' || $1, 0))")
        .bind(source)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Records that the routine `current` comes from `source`, in the caller's transaction, and
/// returns it as stored.
async fn set_source(
    conn: &mut PgConnection,
    current: &Routine,
    source: &str,
) -> Result<Routine, StoreError> {
    crate::schema::query_as::<_, RoutineRow>(
        "UPDATE cm.routines SET source = $2 WHERE id = $1 AND group_id = $3 RETURNING *",
    )
    .bind(current.id)
    .bind(source)
    .bind(current.group_id)
    .fetch_one(&mut *conn)
    .await?
    .try_into()
}

/// The routines named `names` and, with a `source`, those that came from it, locked `FOR UPDATE`
/// in the caller's transaction, in name order. Names resolve through `routine_names` and
/// sources through an unlocked read; the rows are then locked group by group, each statement
/// naming its group (on Citus one shard each), in `(group, id)` order, so two imports naming
/// the same routines cannot deadlock. A routine renamed or moved to another source between the
/// read and the lock is left out. With a source, its advisory lock ([`lock_source`]) is taken
/// first, so a routine another import of that source creates meanwhile is not missed.
async fn lock_named(
    conn: &mut PgConnection,
    names: &[&str],
    source: Option<&str>,
) -> Result<Vec<Routine>, StoreError> {
    if let Some(source) = source {
        lock_source(conn, source).await?;
    }
    let mut targets: Vec<(GroupId, Uuid)> = crate::schema::query_as(
        "SELECT group_id, routine_id FROM cm.routine_names WHERE name = ANY($1)",
    )
    .bind(names)
    .fetch_all(&mut *conn)
    .await?;
    if let Some(source) = source {
        let from_source: Vec<(GroupId, Uuid)> =
            crate::schema::query_as("SELECT group_id, id FROM cm.routines WHERE source = $1")
                .bind(source)
                .fetch_all(&mut *conn)
                .await?;
        targets.extend(from_source);
    }
    targets.sort_unstable();
    targets.dedup();
    let mut locked = Vec::with_capacity(targets.len());
    for group in targets.chunk_by(|a, b| a.0 == b.0) {
        let ids: Vec<Uuid> = group.iter().map(|(_, id)| *id).collect();
        let rows: Vec<RoutineRow> = crate::schema::query_as(
            "SELECT * FROM cm.routines WHERE group_id = $1 AND id = ANY($2) ORDER BY id FOR UPDATE",
        )
        .bind(group[0].0)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        locked.extend(routines_of(rows)?);
    }
    locked.retain(|r| {
        names.contains(&r.name.as_str()) || (source.is_some() && r.source.as_deref() == source)
    });
    locked.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(locked)
}

/// Records that `name` is the routine `id`'s, in the caller's transaction; a name another
/// routine has is [`StoreError::NameTaken`].
async fn take_name(
    conn: &mut PgConnection,
    name: &str,
    id: Uuid,
    group: GroupId,
) -> Result<(), StoreError> {
    crate::schema::query(
        "INSERT INTO cm.routine_names (name, routine_id, group_id) VALUES ($1, $2, $3)",
    )
    .bind(name)
    .bind(id)
    .bind(group)
    .execute(conn)
    .await
    .map_err(|e| name_conflict(e, name))?;
    Ok(())
}

/// Maps a unique violation of the name constraint to [`StoreError::NameTaken`]. On Citus the
/// error comes from a worker's shard (`routine_names_pkey_102040`) without its constraint
/// field, and only its message names the constraint.
pub(crate) fn name_conflict(e: sqlx::Error, name: &str) -> StoreError {
    let taken = e.as_database_error().is_some_and(|d| {
        d.kind() == sqlx::error::ErrorKind::UniqueViolation
            && match d.constraint() {
                Some(c) => c.starts_with("routine_names_pkey"),
                None => d.message().contains("\"routine_names_pkey"),
            }
    });
    if taken {
        StoreError::NameTaken(name.to_string())
    } else {
        e.into()
    }
}

/// What a new routine's insert computes before it writes: its id, its first run, its run limit
/// as the column holds it.
pub(crate) struct Planned {
    pub(crate) id: Uuid,
    pub(crate) next_run_at: Option<DateTime<Utc>>,
    pub(crate) runs_left: Option<i32>,
}

/// Plans `routine` at `now`: its schedule on its calendar (read under a share lock: an edit of
/// the calendar waits for this write, and re-plans the routine it wrote, `calendars.rs`), refused
/// when already over; its id, a version 7 UUID, ordered by creation within this process, so
/// routines created in one transaction (an import, which gives them one `created_at`) still
/// list in the order they were written; and its first run, unless paused.
pub(crate) async fn planned(
    conn: &mut PgConnection,
    routine: &NewRoutine,
    now: DateTime<Utc>,
) -> Result<Planned, StoreError> {
    let calendar = match routine.calendar.as_deref() {
        None => None,
        Some(name) => Some(std::sync::Arc::new(
            crate::calendars::read_calendar(conn, name, true).await?,
        )),
    };
    plan(routine, calendar, now)
}

/// [`planned`] with the routine's calendar already read (`None`: it has none).
pub(crate) fn plan(
    routine: &NewRoutine,
    calendar: Option<std::sync::Arc<cm_domain::Calendar>>,
    now: DateTime<Utc>,
) -> Result<Planned, StoreError> {
    let schedule =
        crate::calendars::on_calendar(routine.schedule.clone(), calendar, routine.on_holiday)?;
    // A schedule already over (its window closed, its one instant passed) would make a
    // routine that never fires: refused, not stored finished.
    if schedule.is_over_after(now) {
        return Err(StoreError::InvalidRoutine(format!(
            "its schedule {:?} has no occurrence after now ({now}): it would never fire",
            routine.schedule.expression()
        )));
    }
    // The rest was checked when the routine was built (`NewRoutineBuilder::build`).
    let runs_left = runs_left_column(routine.runs_left)?;
    // Time-ordered, as `cm.new_routine_id()` makes the SQL functions' ids: routines due at one
    // instant are claimed in id order, which for routines created one after another is the
    // order the table holds them in.
    let id = Uuid::now_v7();
    // The clock is the next occurrence's planned instant (later than it by its jitter, if any).
    let next_run_at = if routine.paused {
        None
    } else {
        schedule
            .next_planned_after(id, now)
            .map(|(_, planned)| planned)
    };
    Ok(Planned {
        id,
        next_run_at,
        runs_left,
    })
}

/// Inserts `routine`, planned as [`planned`] plans it.
pub(crate) async fn insert_routine(
    conn: &mut PgConnection,
    routine: &NewRoutine,
    source: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Routine, StoreError> {
    let Planned {
        id,
        next_run_at,
        runs_left,
    } = planned(conn, routine, now).await?;
    let group = routine_group(conn, id).await?;
    take_name(conn, &routine.name, id, group).await?;
    let (retries, backoff, backoff_max) = retry_columns(routine.retry);
    crate::schema::query_as::<_, RoutineRow>(
        "INSERT INTO cm.routines
             (id, name, schedule, timezone, kind, payload, misfire_policy, paused, next_run_at,
              source, group_id, runs_left, overlap, calendar, on_holiday, deadline_secs,
              retries, retry_backoff_secs, retry_backoff_max_secs, concurrency_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                 $18, $19, $20)
         RETURNING *",
    )
    .bind(id)
    .bind(&routine.name)
    .bind(routine.schedule.expression())
    .bind(routine.schedule.zone().name())
    .bind(routine.kind.as_str())
    .bind(&routine.payload)
    .bind(routine.misfire.as_str())
    .bind(routine.paused)
    .bind(next_run_at)
    .bind(source)
    .bind(group)
    .bind(runs_left)
    .bind(routine.overlap.as_str())
    .bind(routine.calendar.as_deref())
    .bind(routine.on_holiday.as_str())
    .bind(deadline_column(routine.deadline))
    .bind(retries)
    .bind(backoff)
    .bind(backoff_max)
    .bind(routine.concurrency_key.as_ref().map(|k| k.as_str()))
    .fetch_one(conn)
    .await
    .map_err(|e| name_conflict(e, &routine.name))?
    .try_into()
}

/// A run limit as the `runs_left` column holds it.
fn runs_left_column(limit: Option<u32>) -> Result<Option<i32>, StoreError> {
    limit
        .map(|n| {
            i32::try_from(n).map_err(|_| {
                StoreError::InvalidRoutine(format!("a run limit is at most {}", i32::MAX))
            })
        })
        .transpose()
}

/// A deadline as the `deadline_secs` column holds it (checked already: at most 366 days).
pub(crate) fn deadline_column(deadline: Option<std::time::Duration>) -> Option<i32> {
    deadline.map(|d| i32::try_from(d.as_secs()).unwrap_or(i32::MAX))
}

/// A retry policy as the `retries`, `retry_backoff_secs` and `retry_backoff_max_secs` columns
/// hold it (checked already: at most 100 retries, waits of at most a day).
pub(crate) fn retry_columns(retry: cm_domain::RetryPolicy) -> (i16, i32, i32) {
    let secs = |d: std::time::Duration| i32::try_from(d.as_secs()).unwrap_or(i32::MAX);
    (
        i16::try_from(retry.retries).unwrap_or(i16::MAX),
        secs(retry.backoff.base),
        secs(retry.backoff.max),
    )
}

pub(crate) async fn db_now(conn: &mut PgConnection) -> Result<DateTime<Utc>, StoreError> {
    Ok(crate::schema::query_scalar("SELECT now()")
        .fetch_one(conn)
        .await?)
}

/// Applies `update` to `current`, a row the caller holds locked, at the database instant `now`.
async fn apply_update(
    conn: &mut PgConnection,
    current: &Routine,
    update: &RoutineUpdate,
    now: DateTime<Utc>,
) -> Result<Routine, StoreError> {
    let expression = update.expression.as_deref().unwrap_or(&current.schedule);
    let zone = update.zone.map_or(current.timezone.as_str(), |z| z.name());
    let runs_left = match update.runs_left {
        Some(limit) => limit,
        None => current.runs_left,
    };
    let calendar = match &update.calendar {
        Some(calendar) => calendar.as_deref(),
        None => current.calendar.as_deref(),
    };
    let on_holiday = update.on_holiday.unwrap_or(current.on_holiday);
    // A new schedule, zone, run limit or calendar computes the next run again: a routine
    // finished by its limit or its window comes back when the edit gives it occurrences.
    let recompute = expression != current.schedule
        || zone != current.timezone
        || runs_left != current.runs_left
        || calendar != current.calendar.as_deref()
        || on_holiday != current.on_holiday;
    let next_run_at = if recompute {
        let schedule = Schedule::parse(expression, zone)
            .map_err(|e| StoreError::InvalidRoutine(e.to_string()))?;
        // A calendar the routine was not on is read under a share lock, as a create reads it;
        // its own calendar needs none: an edit of it waits for this routine's lock.
        let newly_on = calendar.is_some() && calendar != current.calendar.as_deref();
        let schedule =
            crate::calendars::schedule_in(conn, schedule, calendar, on_holiday, newly_on).await?;
        if current.paused || runs_left == Some(0) {
            None
        } else {
            schedule
                .next_planned_after(current.id, now)
                .map(|(_, planned)| planned)
        }
    } else {
        current.next_run_at
    };
    // A new name, payload or run limit is checked as a new routine's is
    // (`cm_domain::definition`), so an update writes nothing a create would refuse.
    let checked_name = update
        .name
        .as_deref()
        .map(definition::checked_name)
        .transpose()?;
    let name = checked_name
        .as_ref()
        .map_or(current.name.as_str(), |n| n.as_str());
    let (kind, payload) = match &update.action {
        Some(action) => {
            definition::check_payload(action.kind, &action.payload, None)?;
            (action.kind, &action.payload)
        }
        None => (current.kind, &current.payload),
    };
    if let Some(limit) = update.runs_left {
        definition::check_run_limit(limit)?;
    }
    if let Some(deadline) = update.deadline {
        definition::check_deadline(deadline)?;
    }
    let deadline = update.deadline.unwrap_or(current.deadline);
    // A new part of the retry policy is merged with the other, read under the routine's lock.
    let retry = cm_domain::RetryPolicy {
        retries: update.retries.unwrap_or(current.retry.retries),
        backoff: update.retry_backoff.unwrap_or(current.retry.backoff),
    };
    retry
        .check()
        .map_err(|e| DefinitionError::Retry(e.to_string()))?;
    let retry = retry_columns(retry);
    if update.expression.is_some() || update.runs_left.is_some() {
        definition::check_limited_schedule(expression, runs_left)?;
    }
    let misfire = update.misfire.unwrap_or(current.misfire_policy);
    if update.overlap.is_some() && kind != RoutineKind::Mission {
        return Err(DefinitionError::OverlapOfMessage.into());
    }
    let overlap = update.overlap.unwrap_or(current.overlap);
    if name != current.name {
        take_name(conn, name, current.id, current.group_id).await?;
        crate::schema::query("DELETE FROM cm.routine_names WHERE name = $1 AND routine_id = $2")
            .bind(&current.name)
            .bind(current.id)
            .execute(&mut *conn)
            .await?;
    }
    crate::schema::query_as::<_, RoutineRow>(
        "UPDATE cm.routines
         SET name = $2, schedule = $3, timezone = $4, kind = $5, payload = $6,
             misfire_policy = $7, next_run_at = $8, overlap = $10, runs_left = $11,
             calendar = $12, on_holiday = $13, deadline_secs = $14, retries = $15,
             retry_backoff_secs = $16, retry_backoff_max_secs = $17, concurrency_key = $18,
             updated_at = now()
         WHERE id = $1 AND group_id = $9
         RETURNING *",
    )
    .bind(current.id)
    .bind(name)
    .bind(expression)
    .bind(zone)
    .bind(kind.as_str())
    .bind(payload)
    .bind(misfire.as_str())
    .bind(next_run_at)
    .bind(current.group_id)
    .bind(overlap.as_str())
    .bind(runs_left_column(runs_left)?)
    .bind(calendar)
    .bind(on_holiday.as_str())
    .bind(deadline_column(deadline))
    .bind(retry.0)
    .bind(retry.1)
    .bind(retry.2)
    .bind(
        update
            .concurrency_key
            .as_ref()
            .unwrap_or(&current.concurrency_key)
            .as_ref()
            .map(|k| k.as_str()),
    )
    .fetch_one(conn)
    .await
    .map_err(|e| name_conflict(e, name))?
    .try_into()
}

/// The routine named `name`. The name resolves through `routine_names` (the routines table
/// keeps no index of names: each fire updates its routine's row, and an index of names would
/// take an entry at a random place on every fire), then the row is read by its key and group (on
/// Citus one shard each) and must still carry the name. A routine renamed between the two reads
/// is looked up again; a name no routine has is [`StoreError::RoutineNameNotFound`].
pub(crate) async fn get_routine_by_name(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Routine, StoreError> {
    // A rename moves a name in one transaction: a second look finds where it went, and a
    // third is for a name renamed twice meanwhile.
    for _ in 0..3 {
        let Some((id, group)): Option<(Uuid, GroupId)> = crate::schema::query_as(
            "SELECT routine_id, group_id FROM cm.routine_names WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?
        else {
            break;
        };
        let row: Option<RoutineRow> = crate::schema::query_as(
            "SELECT * FROM cm.routines WHERE id = $1 AND group_id = $2 AND name = $3",
        )
        .bind(id)
        .bind(group)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(row) = row {
            return row.try_into();
        }
    }
    Err(StoreError::RoutineNameNotFound(name.to_string()))
}

pub(crate) async fn list_routines_page(
    conn: &mut PgConnection,
    after: Option<RoutineCursor>,
    limit: u32,
) -> Result<Vec<Routine>, StoreError> {
    // Two statements rather than one with `$1 IS NULL OR …`, so each keeps a plan that walks
    // `routines_created_idx` from its start or from the cursor.
    let limit = i64::from(limit);
    let rows = match after {
        None => {
            crate::schema::query_as::<_, RoutineRow>(
                "SELECT * FROM cm.routines ORDER BY created_at, id LIMIT $1",
            )
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?
        }
        Some(cursor) => {
            crate::schema::query_as::<_, RoutineRow>(
                "SELECT * FROM cm.routines WHERE (created_at, id) > ($1, $2)
                 ORDER BY created_at, id LIMIT $3",
            )
            .bind(cursor.created_at)
            .bind(cursor.id)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?
        }
    };
    routines_of(rows)
}

pub(crate) async fn update_routine(
    conn: &mut PgConnection,
    id: Uuid,
    update: &RoutineUpdate,
) -> Result<Routine, StoreError> {
    let mut tx = conn.begin().await?;
    let current = lock_routine(&mut tx, id).await?;
    let now = db_now(&mut tx).await?;
    let updated = apply_update(&mut tx, &current, update, now).await?;
    tx.commit().await?;
    Ok(updated)
}

/// Whether a set's write is kept, or only worked out (a dry run: done under the same locks, then
/// rolled back, so it says exactly what the write would do at that moment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    Commit,
    RollBack,
}

async fn finish(tx: sqlx::Transaction<'_, sqlx::Postgres>, write: Write) -> Result<(), StoreError> {
    match write {
        Write::Commit => tx.commit().await?,
        Write::RollBack => tx.rollback().await?,
    }
    Ok(())
}

pub(crate) async fn import_routines(
    conn: &mut PgConnection,
    routines: &[NewRoutine],
    upsert: bool,
    source: Option<&str>,
    write: Write,
) -> Result<Vec<ImportedRoutine>, StoreError> {
    let mut tx = conn.begin().await?;
    let now = db_now(&mut tx).await?;
    if let Some(source) = source {
        lock_source(&mut tx, source).await?;
    }
    let names: Vec<&str> = routines.iter().map(|r| r.name.as_str()).collect();
    let existing = lock_named(&mut tx, &names, None).await?;
    let existing: std::collections::HashMap<&str, &Routine> =
        existing.iter().map(|r| (r.name.as_str(), r)).collect();
    // The new routines are written together, a chunk a statement; the others one by one.
    let new: Vec<&NewRoutine> = routines
        .iter()
        .filter(|r| !existing.contains_key(r.name.as_str()))
        .collect();
    if let Some(taken) = routines
        .iter()
        .find(|r| existing.contains_key(r.name.as_str()))
        && !upsert
    {
        return Err(StoreError::NameTaken(taken.name.clone()));
    }
    let mut created = crate::bulk::insert_routines(&mut tx, &new, source, now)
        .await?
        .into_iter();
    let mut imported = Vec::with_capacity(routines.len());
    for routine in routines {
        let written = match existing.get(routine.name.as_str()) {
            None => ImportedRoutine {
                routine: created.next().ok_or_else(|| {
                    StoreError::InvalidRoutine("a created routine was not returned".into())
                })?,
                created: true,
            },
            Some(current) => {
                let mut updated =
                    apply_update(&mut tx, current, &settings_of(routine), now).await?;
                // The file now gives the routine its settings: it comes from the file.
                if let Some(source) = source.filter(|s| current.source.as_deref() != Some(*s)) {
                    updated = set_source(&mut tx, &updated, source).await?;
                }
                ImportedRoutine {
                    routine: updated,
                    created: false,
                }
            }
        };
        imported.push(written);
    }
    finish(tx, write).await?;
    Ok(imported)
}

/// The change that gives a stored routine `routine`'s settings (a mission's overlap policy
/// included). Pausing and resuming are their own commands: an import leaves them be. So is a run limit: it is set when the routine is
/// created and counts down from there, so importing the same file again does not give a routine
/// its runs back.
fn settings_of(routine: &NewRoutine) -> RoutineUpdate {
    RoutineUpdate {
        name: None,
        expression: Some(routine.schedule.expression().to_string()),
        zone: Some(routine.schedule.zone()),
        misfire: Some(routine.misfire),
        action: Some(RoutineAction {
            kind: routine.kind,
            payload: routine.payload.clone(),
        }),
        overlap: (routine.kind == RoutineKind::Mission).then_some(routine.overlap),
        runs_left: None,
        calendar: Some(routine.calendar.clone()),
        on_holiday: Some(routine.on_holiday),
        deadline: Some(routine.deadline),
        retries: Some(routine.retry.retries),
        retry_backoff: Some(routine.retry.backoff),
        concurrency_key: Some(routine.concurrency_key.clone()),
    }
}

/// Whether `stored` already has `routine`'s settings (its paused state aside).
fn same_settings(stored: &Routine, routine: &NewRoutine) -> bool {
    stored.schedule == routine.schedule.expression()
        && stored.timezone == routine.schedule.zone().name()
        && stored.misfire_policy == routine.misfire
        && stored.deadline == routine.deadline
        && stored.retry == routine.retry
        && stored.concurrency_key == routine.concurrency_key
        && stored.kind == routine.kind
        && stored.payload == routine.payload
        && (routine.kind != RoutineKind::Mission || stored.overlap == routine.overlap)
        && stored.calendar == routine.calendar
        && stored.on_holiday == routine.on_holiday
}

/// Deletes a routine the caller holds locked, with its requests and fires (children first, as
/// `delete_routine` does, so no claim waits on a lock held here).
pub(crate) async fn delete_locked(conn: &mut PgConnection, id: Uuid) -> Result<(), StoreError> {
    let group = routine_group(conn, id).await?;
    for statement in [
        "DELETE FROM cm.routine_requests WHERE routine_id = $1 AND group_id = $2",
        "DELETE FROM cm.routine_fires WHERE routine_id = $1 AND group_id = $2",
        "DELETE FROM cm.routines WHERE id = $1 AND group_id = $2",
        "DELETE FROM cm.routine_names WHERE routine_id = $1 AND group_id = $2",
    ] {
        crate::schema::query(statement)
            .bind(id)
            .bind(group)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Locks the routines without a source, named from `source` (`SOURCE: …`), whose payload one of
/// `routines` has (those a sync may adopt by identity), beside the `held` already locked.
async fn lock_sourceless_like(
    conn: &mut PgConnection,
    source: &str,
    routines: &[NewRoutine],
    held: &[Routine],
) -> Result<Vec<Routine>, StoreError> {
    let payloads = serde_json::Value::Array(routines.iter().map(|r| r.payload.clone()).collect());
    let mut targets: Vec<(GroupId, Uuid)> = crate::schema::query_as(
        "SELECT group_id, id FROM cm.routines
         WHERE source IS NULL AND starts_with(name, $2 || ': ')
           AND payload IN (SELECT value FROM jsonb_array_elements($1::jsonb))",
    )
    .bind(&payloads)
    .bind(source)
    .fetch_all(&mut *conn)
    .await?;
    targets.retain(|(_, id)| !held.iter().any(|r| r.id == *id));
    targets.sort_unstable();
    let mut locked = Vec::with_capacity(targets.len());
    for group in targets.chunk_by(|a, b| a.0 == b.0) {
        let ids: Vec<Uuid> = group.iter().map(|(_, id)| *id).collect();
        let rows: Vec<RoutineRow> = crate::schema::query_as(
            "SELECT * FROM cm.routines WHERE group_id = $1 AND id = ANY($2) AND source IS NULL
             ORDER BY id FOR UPDATE",
        )
        .bind(group[0].0)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        locked.extend(routines_of(rows)?);
    }
    Ok(locked)
}

/// Whether `stored` may be the routine of `line` by identity: one with the line's kind and
/// payload (its command: an edited schedule keeps its routine) that is the source's, or has no
/// source and a name the source gave it (`SOURCE: …`, as a crontab import of that file name
/// names its entries: one from standard input, or from before imports recorded their source).
/// A routine made by hand, or named from another file, is never taken for a line it does not
/// name.
fn same_identity(stored: &Routine, line: &NewRoutine, source: &str) -> bool {
    let same_action = stored.kind == line.kind && stored.payload == line.payload;
    let ours = match stored.source.as_deref() {
        Some(s) => s == source,
        None => stored
            .name
            .strip_prefix(source)
            .is_some_and(|rest| rest.starts_with(": ")),
    };
    ours && same_action
}

/// Pairs each line with the stored routine it is: by name, else by identity
/// ([`same_identity`]) where exactly one unpaired routine and exactly one unpaired line share
/// it (two lines with one command are each matched by name alone).
fn pair_lines(existing: &[Routine], routines: &[NewRoutine], source: &str) -> Vec<Option<usize>> {
    let mut paired: Vec<Option<usize>> = routines
        .iter()
        .map(|r| existing.iter().position(|e| e.name == r.name))
        .collect();
    let taken = |paired: &[Option<usize>], j: usize| paired.contains(&Some(j));
    for i in 0..routines.len() {
        if paired[i].is_some() {
            continue;
        }
        let candidates: Vec<usize> = (0..existing.len())
            .filter(|&j| !taken(&paired, j) && same_identity(&existing[j], &routines[i], source))
            .collect();
        let [only] = candidates[..] else { continue };
        let rivals = (0..routines.len())
            .filter(|&k| {
                k != i
                    && paired[k].is_none()
                    && same_identity(&existing[only], &routines[k], source)
            })
            .count();
        if rivals == 0 {
            paired[i] = Some(only);
        }
    }
    paired
}

pub(crate) async fn sync_routines(
    conn: &mut PgConnection,
    source: &str,
    routines: &[NewRoutine],
    write: Write,
) -> Result<Vec<SyncedRoutine>, StoreError> {
    let mut tx = conn.begin().await?;
    let now = db_now(&mut tx).await?;
    let names: Vec<&str> = routines.iter().map(|r| r.name.as_str()).collect();
    let mut existing = lock_named(&mut tx, &names, Some(source)).await?;
    let adoptable = lock_sourceless_like(&mut tx, source, routines, &existing).await?;
    existing.extend(adoptable);
    let paired = pair_lines(&existing, routines, source);
    let mut synced = Vec::with_capacity(routines.len());
    for (routine, pair) in routines.iter().zip(&paired) {
        let (routine, action) = match pair.map(|j| &existing[j]) {
            None => (
                insert_routine(&mut tx, routine, Some(source), now).await?,
                SyncAction::Created,
            ),
            Some(current) => match current.source.as_deref() {
                Some(other) if other != source => {
                    return Err(StoreError::InvalidRoutine(format!(
                        "a routine named {:?} already comes from {other:?}; rename one of them",
                        routine.name
                    )));
                }
                Some(_) if current.name == routine.name && same_settings(current, routine) => {
                    (current.clone(), SyncAction::Unchanged)
                }
                from => {
                    let mut update = settings_of(routine);
                    if current.name != routine.name {
                        // Paired by identity: the line's name (an edited schedule renames a
                        // crontab entry named by its content) comes with it.
                        update.name = Some(routine.name.clone());
                    }
                    apply_update(&mut tx, current, &update, now).await?;
                    // A routine without a source (made by hand, or imported without one)
                    // joins this one.
                    let updated = set_source(&mut tx, current, source).await?;
                    let action = if from.is_none() {
                        SyncAction::Adopted
                    } else {
                        SyncAction::Updated
                    };
                    (updated, action)
                }
            },
        };
        synced.push(SyncedRoutine { routine, action });
    }
    for (j, gone) in existing.into_iter().enumerate() {
        if gone.source.as_deref() == Some(source) && !paired.contains(&Some(j)) {
            delete_locked(&mut tx, gone.id).await?;
            synced.push(SyncedRoutine {
                routine: gone,
                action: SyncAction::Deleted,
            });
        }
    }
    finish(tx, write).await?;
    Ok(synced)
}

pub(crate) async fn pending_requests(
    conn: &mut PgConnection,
    id: Uuid,
    limit: u32,
) -> Result<PendingRequests, StoreError> {
    let total: i64 = crate::schema::query_scalar(
        "SELECT count(*) FROM cm.routine_requests WHERE routine_id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let oldest = crate::schema::query_as::<_, PendingRequest>(
        "SELECT scheduled_at, requested_at FROM cm.routine_requests
         WHERE routine_id = $1 ORDER BY scheduled_at LIMIT $2",
    )
    .bind(id)
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    Ok(PendingRequests {
        total: u64::try_from(total).unwrap_or(0),
        oldest,
    })
}

impl PgStore {
    /// Creates the routines `chunks` sends (names no routine has), each recording `source`, as
    /// [`RoutineStore::import_routines`](crate::RoutineStore::import_routines) creates new
    /// ones, all or none: each chunk is written as it comes, while the caller checks the next,
    /// in one transaction that commits when [`crate::Streamed::End`] comes and rolls back if
    /// the sender goes away before it. A name taken is [`StoreError::NameTaken`]. The ids and
    /// names written, in order.
    pub async fn create_routines_streamed(
        &self,
        source: Option<&str>,
        mut chunks: tokio::sync::mpsc::Receiver<crate::Streamed>,
    ) -> Result<Vec<(Uuid, String)>, StoreError> {
        on_store_conn!(self, |c| crate::bulk::create_streamed(
            c,
            source,
            &mut chunks
        ))
    }

    /// At most `limit` routine names starting with `prefix`, in name order (what a shell
    /// completes a routine's name from).
    pub async fn routine_names(&self, prefix: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            "SELECT name FROM cm.routine_names WHERE starts_with(name, $1) ORDER BY name LIMIT $2",
        )
        .bind(prefix)
        .bind(i64::from(limit))
        .fetch_all(e))?)
    }

    /// What [`RoutineStore::import_routines`](crate::RoutineStore::import_routines) would write, worked out under the same locks in a
    /// transaction rolled back: nothing is written (`routine import --dry-run`). The ids of
    /// routines it would create are not kept.
    pub async fn plan_import(
        &self,
        routines: &[NewRoutine],
        upsert: bool,
        source: Option<&str>,
    ) -> Result<Vec<ImportedRoutine>, StoreError> {
        on_store_conn!(self, |c| import_routines(
            c,
            routines,
            upsert,
            source,
            Write::RollBack
        ))
    }

    /// What [`RoutineStore::sync_routines`](crate::RoutineStore::sync_routines) would do, worked out under the same locks in a
    /// transaction rolled back: nothing is written or deleted (`routine import --sync
    /// --dry-run`).
    pub async fn plan_sync(
        &self,
        source: &str,
        routines: &[NewRoutine],
    ) -> Result<Vec<SyncedRoutine>, StoreError> {
        on_store_conn!(self, |c| sync_routines(
            c,
            source,
            routines,
            Write::RollBack
        ))
    }

    /// The names of those of `ids` that still exist, by id (what `fires` prints beside each
    /// fire's routine id). A deleted routine is absent.
    pub async fn names_of(
        &self,
        ids: &[Uuid],
    ) -> Result<std::collections::HashMap<Uuid, String>, StoreError> {
        let rows: Vec<(Uuid, String)> = on_store!(self, |e| crate::schema::query_as(
            "SELECT id, name FROM cm.routines WHERE id = ANY($1)"
        )
        .bind(ids)
        .fetch_all(e))?;
        Ok(rows.into_iter().collect())
    }

    /// Makes one connection to `url` and closes it, with no retry: a refused connection, an
    /// unknown database or a rejected password is reported at once, where a pool would retry
    /// until its acquire timeout and report only that it timed out.
    ///
    /// On a multi-host URL, succeeds when one host qualifies for its `target_session_attrs`,
    /// and otherwise fails naming each host and why it was refused.
    pub async fn check_connection(url: &str) -> Result<(), StoreError> {
        Self::check_connection_with(url, &crate::StoreOptions::default()).await
    }

    /// [`PgStore::check_connection`] connecting as a store with `options` would (through a
    /// pooler, with no startup parameter it would refuse).
    pub async fn check_connection_with(
        url: &str,
        options: &crate::StoreOptions,
    ) -> Result<(), StoreError> {
        let parsed = crate::DatabaseUrl::parse(url)?;
        if !parsed.is_plain() {
            let hosts: Vec<sqlx::postgres::PgConnectOptions> =
                parsed.hosts.into_iter().map(|h| options.apply(h)).collect();
            let (_, conn) = crate::failover::resolve(&hosts, parsed.target)
                .await
                .map_err(StoreError::NoUsableHost)?;
            conn.close().await?;
            return Ok(());
        }
        let connect = parsed.hosts.into_iter().next().expect("one host");
        let conn = PgConnection::connect_with(&options.apply(connect)).await?;
        conn.close().await?;
        Ok(())
    }

    /// Checks that the database holds cm's schema, at least as new as this build's migrations:
    /// [`StoreError::SchemaMissing`] or [`StoreError::SchemaOutdated`] otherwise.
    pub async fn check_schema(&self) -> Result<(), StoreError> {
        let (has_routines, has_migrations): (bool, bool) = on_store!(self, |e| {
            crate::schema::query_as(
            "SELECT to_regclass('cm.routines') IS NOT NULL, to_regclass('cm.migrations') IS NOT NULL",
        )
        .fetch_one(e)
        })?;
        if !has_routines || !has_migrations {
            return Err(StoreError::SchemaMissing);
        }
        let applied: Option<i64> = on_store!(self, |e| crate::schema::query_scalar(
            "SELECT max(version) FROM cm.migrations WHERE success"
        )
        .fetch_one(e))?;
        let expected = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
        match applied {
            Some(applied) if applied >= expected => Ok(()),
            applied => Err(StoreError::SchemaOutdated {
                applied: applied.unwrap_or(0),
                expected,
            }),
        }
    }
}
