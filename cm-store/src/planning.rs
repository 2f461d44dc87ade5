//! Planning the routines written through SQL (`cm.create_routine`, `cm.create_mission_routine`,
//! `cm.update_routine`, `cm.set_routine_paused` to resume). SQL checks what it can when it
//! writes the row (the name, the zone, every cron field and clause, the payload's shape); what
//! only cm's Rust reads (a jitter longer than the schedule's interval, exclusions that leave
//! nothing, a mission's fields) is checked here, and the row is `planned = false`, never due,
//! until then. Rows written past the functions, by the tables' owner, are checked here whole.
//! A pass takes each unplanned routine with its row locked (`SKIP LOCKED`: two schedulers plan
//! different rows, and a caller's uncommitted write is not seen at all) and either gives it its
//! first run, from the schedule and the database's clock, or pauses it with the reason, so a
//! refused routine fires nothing and says why in `routine show`, `routine list` and the status
//! page.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::Schedule;
use cm_domain::definition;
use cm_domain::name::escape_unseen;
use uuid::Uuid;

use crate::groups::GroupId;

use crate::model::{Routine, RoutineRow};
use crate::schedules::Parsed;
use crate::{PgStore, StoreError};

/// The most routines one pass plans.
pub const PLAN_BATCH: u32 = 100;

/// What a pass did with one routine.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlannedRoutine {
    /// The routine.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// Its first run, when planned and not paused.
    pub next_run_at: Option<DateTime<Utc>>,
    /// Why it was refused and paused; `None` when it was planned.
    pub refused: Option<String>,
}

/// Planning the routines written unplanned.
#[async_trait]
pub trait UnplannedRoutines: Send + Sync {
    /// Plans at most `limit` unplanned routines of `group` (of every group when `None`), each in
    /// a transaction of its own: a valid one gets its next run (none while paused), a refused
    /// one is paused with the reason. Returns what it did.
    async fn plan_routines(
        &self,
        group: Option<GroupId>,
        limit: u32,
    ) -> Result<Vec<PlannedRoutine>, StoreError>;
}

#[async_trait]
impl UnplannedRoutines for PgStore {
    async fn plan_routines(
        &self,
        group: Option<GroupId>,
        limit: u32,
    ) -> Result<Vec<PlannedRoutine>, StoreError> {
        // An unlocked read of the candidates (on Citus, one shard with a group, or every shard
        // without), then each locked by its own statement naming its group.
        let candidates: Vec<(Uuid, GroupId, String, String)> = match group {
            Some(group) => on_store!(self, |e| crate::schema::query_as(
                "SELECT id, group_id, schedule, timezone FROM cm.routines
                 WHERE NOT planned AND group_id = $1 ORDER BY id LIMIT $2",
            )
            .bind(group)
            .bind(i64::from(limit))
            .fetch_all(e))?,
            None => on_store!(self, |e| {
                crate::schema::query_as(
                    "SELECT id, group_id, schedule, timezone FROM cm.routines
                 WHERE NOT planned ORDER BY group_id, id LIMIT $1",
                )
                .bind(i64::from(limit))
                .fetch_all(e)
            })?,
        };
        // Each schedule is parsed before any transaction is opened, off the scheduler's loops
        // (`schedules.rs`); the locked row's text, if it changed since, is parsed again there.
        let texts: Vec<(&str, &str)> = candidates
            .iter()
            .map(|(_, _, schedule, zone)| (schedule.as_str(), zone.as_str()))
            .collect();
        self.schedules.parse_all(&texts).await;
        let mut planned = Vec::with_capacity(candidates.len());
        for (id, group, _, _) in candidates {
            let mut tx = self.begin().await?;
            let row: Option<RoutineRow> = crate::schema::query_as(
                "SELECT * FROM cm.routines WHERE id = $1 AND group_id = $2 AND NOT planned
                 FOR UPDATE SKIP LOCKED",
            )
            .bind(id)
            .bind(group)
            .fetch_optional(&mut *tx)
            .await?;
            let row = row.map(Routine::try_from).transpose()?;
            let Some(routine) = row else { continue };
            let now: DateTime<Utc> = crate::schema::query_scalar("SELECT now()")
                .fetch_one(&mut *tx)
                .await?;
            let schedule = self
                .schedules
                .parse(&routine.schedule, &routine.timezone)
                .await;
            // On a calendar: the calendar read after the row's lock, as a resume reads it.
            let schedule = match (check(&routine, schedule), routine.calendar.as_deref()) {
                (Ok(schedule), Some(calendar)) => match crate::calendars::schedule_in(
                    &mut tx,
                    (*schedule).clone(),
                    Some(calendar),
                    routine.on_holiday,
                    false,
                )
                .await
                {
                    Ok(schedule) => Ok(Arc::new(schedule)),
                    Err(
                        e @ (StoreError::InvalidRoutine(_)
                        | StoreError::CalendarNotFound(_)
                        | StoreError::InvalidCalendar(_)),
                    ) => {
                        let reason = format!("refused when planned: {e}");
                        Err(cm_domain::ErrorText::new(reason).as_str().to_owned())
                    }
                    Err(e) => return Err(e),
                },
                (checked, _) => checked,
            };
            let outcome = match schedule {
                Ok(schedule) => {
                    // A routine an edit of its calendar from SQL left waiting: its clock moved
                    // from the occurrence it stood for; any other from the clock now.
                    let replanned = if routine.paused {
                        None
                    } else {
                        crate::calendars::replan_pending(&mut tx, &routine, &schedule, now).await?
                    };
                    let next = match replanned {
                        Some(next) => next,
                        None => (!routine.paused)
                            .then(|| schedule.next_planned_after(id, now).map(|(_, at)| at))
                            .flatten(),
                    };
                    crate::schema::query(
                        "UPDATE cm.routines SET planned = true, next_run_at = $3, updated_at = now(),
                             replan_clock = NULL, replan_calendar = NULL
                         WHERE id = $1 AND group_id = $2",
                    )
                    .bind(id)
                    .bind(group)
                    .bind(next)
                    .execute(&mut *tx)
                    .await?;
                    PlannedRoutine {
                        id,
                        name: routine.name,
                        next_run_at: next,
                        refused: None,
                    }
                }
                Err(reason) => {
                    crate::schema::query(
                        "UPDATE cm.routines
                         SET planned = true, paused = true, next_run_at = NULL,
                             paused_reason = $3, updated_at = now(),
                             replan_clock = NULL, replan_calendar = NULL
                         WHERE id = $1 AND group_id = $2",
                    )
                    .bind(id)
                    .bind(group)
                    .bind(&reason)
                    .execute(&mut *tx)
                    .await?;
                    let event = crate::events::NewEvent {
                        group_id: group,
                        routine_id: id,
                        routine_name: routine.name.clone(),
                        event_type: cm_domain::EventType::PlanningRefused,
                        scheduled_at: None,
                        data: serde_json::json!({ "error": reason }),
                    };
                    crate::events::record(&mut tx, std::slice::from_ref(&event)).await?;
                    PlannedRoutine {
                        id,
                        name: routine.name,
                        next_run_at: None,
                        refused: Some(reason),
                    }
                }
            };
            tx.commit().await?;
            planned.push(outcome);
        }
        Ok(planned)
    }
}

/// The routine's schedule (`schedule`, its parse), when everything SQL could not check reads:
/// its name, expression and zone, and its payload as its kind needs it. Else the reason, as the
/// pause keeps it.
fn check(routine: &Routine, schedule: Parsed) -> Result<Arc<Schedule>, String> {
    // The reason is kept in `paused_reason`, bounded like an error the ledger keeps.
    let refused = |what: String| {
        let reason = format!("refused when planned: {what}");
        cm_domain::ErrorText::new(reason).as_str().to_owned()
    };
    // The name as `cm_domain::definition` stores it: a name stored with whitespace around it
    // that the SQL functions' trim left would never be found by the name people type.
    let name = definition::checked_name(&routine.name).map_err(|e| refused(e.to_string()))?;
    if name.as_str() != routine.name {
        return Err(refused(format!(
            "the name {:?} has whitespace around it",
            escape_unseen(&routine.name)
        )));
    }
    let schedule = schedule.map_err(refused)?;
    definition::check_payload(routine.kind, &routine.payload, None)
        .map_err(|e| refused(e.to_string()))?;
    Ok(schedule)
}
