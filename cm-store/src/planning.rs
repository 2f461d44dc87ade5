//! Planning the routines written through SQL (`cm.create_routine`, `cm.create_mission_routine`,
//! `cm.set_routine_paused` to resume). SQL checks what it can when it writes the row; what only
//! cm's Rust reads (the cron expression, the IANA zone, the name's invisible characters, a
//! mission's fields) is checked here, and the row is `planned = false`, never due, until then.
//! A pass takes each unplanned routine with its row locked (`SKIP LOCKED`: two schedulers plan
//! different rows, and a caller's uncommitted write is not seen at all) and either gives it its
//! first run, from the schedule and the database's clock, or pauses it with the reason, so a
//! refused routine fires nothing and says why in `routine show`, `routine list` and the status
//! page.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::Schedule;
use cm_domain::definition;
use cm_domain::name::escape_unseen;
use uuid::Uuid;

use crate::groups::GroupId;

use crate::model::{Routine, RoutineRow};
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
        let candidates: Vec<(Uuid, GroupId)> = match group {
            Some(group) => on_store!(self, |e| sqlx::query_as(
                "SELECT id, group_id FROM routines
                 WHERE NOT planned AND group_id = $1 ORDER BY id LIMIT $2",
            )
            .bind(group)
            .bind(i64::from(limit))
            .fetch_all(e))?,
            None => on_store!(self, |e| {
                sqlx::query_as(
                "SELECT id, group_id FROM routines WHERE NOT planned ORDER BY group_id, id LIMIT $1",
            )
            .bind(i64::from(limit))
            .fetch_all(e)
            })?,
        };
        let mut planned = Vec::with_capacity(candidates.len());
        for (id, group) in candidates {
            let mut tx = self.begin().await?;
            let row: Option<RoutineRow> = sqlx::query_as(
                "SELECT * FROM routines WHERE id = $1 AND group_id = $2 AND NOT planned
                 FOR UPDATE SKIP LOCKED",
            )
            .bind(id)
            .bind(group)
            .fetch_optional(&mut *tx)
            .await?;
            let row = row.map(Routine::try_from).transpose()?;
            let Some(routine) = row else { continue };
            let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
                .fetch_one(&mut *tx)
                .await?;
            let outcome = match check(&routine) {
                Ok(schedule) => {
                    let next = (!routine.paused)
                        .then(|| schedule.next_planned_after(id, now).map(|(_, at)| at))
                        .flatten();
                    sqlx::query(
                        "UPDATE routines SET planned = true, next_run_at = $3, updated_at = now()
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
                    sqlx::query(
                        "UPDATE routines
                         SET planned = true, paused = true, next_run_at = NULL,
                             paused_reason = $3, updated_at = now()
                         WHERE id = $1 AND group_id = $2",
                    )
                    .bind(id)
                    .bind(group)
                    .bind(&reason)
                    .execute(&mut *tx)
                    .await?;
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

/// The routine's schedule, when everything SQL could not check reads: its name, expression and
/// zone, and its payload as its kind needs it. Else the reason, as the pause keeps it.
fn check(routine: &Routine) -> Result<Schedule, String> {
    let refused = |what: String| format!("refused when planned: {what}");
    // The name as `cm_domain::definition` stores it: SQL trims only ASCII whitespace, so a name
    // with other whitespace around it (a no-break space) would be stored untrimmed, and never
    // found by the name people type.
    let name = definition::checked_name(&routine.name).map_err(|e| refused(e.to_string()))?;
    if name.as_str() != routine.name {
        return Err(refused(format!(
            "the name {:?} has whitespace around it",
            escape_unseen(&routine.name)
        )));
    }
    let schedule = Schedule::parse(&routine.schedule, &routine.timezone)
        .map_err(|e| refused(e.to_string()))?;
    definition::check_payload(routine.kind, &routine.payload, None)
        .map_err(|e| refused(e.to_string()))?;
    Ok(schedule)
}
