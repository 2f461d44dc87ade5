//! Routines that stop themselves: one whose last N fires all failed (by their outcome: a
//! mission's is its run's) is paused, with the reason kept in `routines.paused_reason` until it
//! is resumed.

use async_trait::async_trait;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, Postgres};
use std::time::Duration;
use uuid::Uuid;

use crate::{GroupId, PgStore, StoreError};

/// A routine the store paused because its last fires all failed.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct AutoPaused {
    /// The routine.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// The reason kept on it.
    pub reason: String,
    /// Its group.
    pub group_id: GroupId,
}

/// The `routine.paused` events of routines cm paused.
fn paused_events(paused: &[AutoPaused]) -> Vec<crate::events::NewEvent> {
    paused
        .iter()
        .map(|routine| crate::events::NewEvent {
            group_id: routine.group_id,
            routine_id: routine.id,
            routine_name: routine.name.clone(),
            event_type: cm_domain::EventType::Paused,
            scheduled_at: None,
            data: serde_json::json!({"by": "cm", "reason": routine.reason}),
        })
        .collect()
}

/// Pausing routines whose last fires all failed.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait FailingRoutines: Send + Sync {
    /// Pauses every running routine whose newest `after_failures` fires (claimed since it was
    /// created or last resumed, whose outcome is known) all failed: a failed dispatch, or a
    /// mission's run that failed or was lost. Keeps the reason and the latest error.
    /// Only routines with a failure settled within `window` are examined, so a pass stays
    /// bounded however many routines exist. Returns the routines it paused.
    async fn pause_failing_routines(
        &self,
        after_failures: u32,
        window: Duration,
    ) -> Result<Vec<AutoPaused>, StoreError>;

    /// [`FailingRoutines::pause_failing_routines`] among the routines of `group` only (on
    /// Citus, one shard). By default, every group's.
    async fn pause_failing_routines_in(
        &self,
        group: GroupId,
        after_failures: u32,
        window: Duration,
    ) -> Result<Vec<AutoPaused>, StoreError> {
        let _ = group;
        self.pause_failing_routines(after_failures, window).await
    }
}

/// The automatic pause. `$1` is how many newest fires must all have failed, `$2` the window in
/// seconds within which a routine must have a failure to be examined.
///
/// A fire counts by its outcome: a failed dispatch, or a mission whose run failed or was lost
/// (a mission that exits 3 every time is failing). Fires whose outcome is not known yet (a
/// claim not settled and without an ended run, a run still running) and missions skipped under
/// their overlap policy say nothing either way and are passed over; the reason kept names the
/// latest failure (`exit code 3`).
///
/// A routine's newest fires since it was created or last resumed (`updated_at` moves on pause
/// and resume, never on a claim, so a resumed routine starts with a clean record) are read in
/// claim order (occurrences claimed together, newest first) through
/// `routine_fires_claimed_idx`, so the scan stops after `$1` rows or at
/// `updated_at`, whichever comes first, however long the routine's history: read in occurrence
/// order, a routine with fewer than `$1` fires since its update was read back to its first
/// fire. A routine a tick holds locked is skipped this pass.
macro_rules! pause_failing_sql {
    ($recent:literal, $routines:literal, $lock:literal) => {
        concat!(
            "
WITH recent AS (
    SELECT DISTINCT routine_id FROM cm.routine_fires
    WHERE ",
            failure_sql!(""),
            " AND scheduled_at > now() - make_interval(secs => $2)",
            $recent,
            "
),
failing AS (
    SELECT r.id,
           left(format('paused by cm: its last %s fires failed; the latest: %s', $1, last.error),
                1000) AS reason
    FROM cm.routines r
    JOIN recent ON recent.routine_id = r.id
    CROSS JOIN LATERAL (
        SELECT count(*) AS fires,
               count(*) FILTER (WHERE ",
            failure_sql!("f."),
            ") AS failed,
               (array_agg(",
            failure_reason_sql!("f."),
            " ORDER BY f.claimed_at DESC, f.scheduled_at DESC))[1] AS error
        FROM (SELECT status, error, run_state, run_reason, claimed_at, scheduled_at
              FROM cm.routine_fires
              WHERE routine_id = r.id AND claimed_at >= r.updated_at
                AND (status = 'failed' OR (status = 'fired' AND run_state IS NULL)
                     OR run_state IN ('succeeded', 'failed', 'lost'))",
            $recent,
            "
              ORDER BY claimed_at DESC, scheduled_at DESC
              LIMIT $1) f
    ) last
    WHERE NOT r.paused AND last.fires = $1 AND last.failed = $1",
            $routines,
            "
    FOR UPDATE OF r",
            $lock,
            "
)
UPDATE cm.routines r
SET paused = true, next_run_at = NULL, updated_at = now(), paused_reason = failing.reason
FROM failing
WHERE r.id = failing.id AND NOT r.paused",
            $routines,
            "
RETURNING r.id, r.name, r.paused_reason AS reason, r.group_id"
        )
    };
}

/// The automatic pause across every group (see `pause_failing_sql!`).
const PAUSE_FAILING_SQL: &str = pause_failing_sql!("", "", " SKIP LOCKED");

/// [`PAUSE_FAILING_SQL`] within the group `$3` (one shard on Citus).
const PAUSE_FAILING_GROUP_SQL: &str =
    pause_failing_sql!(" AND group_id = $3", " AND r.group_id = $3", " SKIP LOCKED");

/// The automatic pause of the routines `$3` alone, in the transaction that recorded their
/// failures: it waits for a routine's row (up to the transaction's `lock_timeout`) rather than
/// skip it, since the routine it skipped would be claimed again.
const PAUSE_FAILED_SQL: &str =
    pause_failing_sql!(" AND routine_id = ANY($3)", " AND r.id = ANY($3)", "");

/// [`PAUSE_FAILED_SQL`] within the group `$4` (one shard on Citus).
const PAUSE_FAILED_GROUP_SQL: &str = pause_failing_sql!(
    " AND routine_id = ANY($3) AND group_id = $4",
    " AND r.id = ANY($3) AND r.group_id = $4",
    ""
);

/// How far back the pause in the failure's transaction looks for the failure it was called
/// for: any instant a late occurrence may have (a routine's own fires are few to read).
const FAILED_WINDOW: Duration = Duration::from_secs(366 * 86_400);

/// How long the pause in the failure's transaction waits for a routine's row that another
/// transaction holds (a tick claiming it, a caller's update) before leaving it to the
/// maintenance pass.
const FAILED_LOCK_WAIT: &str = "1s";

impl PgStore {
    /// Runs `write`, a statement recording outcomes that returns the occurrences it wrote
    /// (routine and instant, and the instant of the retry of a failure tried again), in a transaction with their events (`routine.failed`,
    /// `routine.recovered`: `crate::events`; with `all_outcomes` false, only when `failing` is
    /// not empty) and, when the store pauses after N failures and
    /// `failing` names occurrences whose outcome `write` records as failed, the pause of the
    /// routines of those it wrote ([`pause_failed_in`]).
    pub(crate) async fn record_then_pause<'q>(
        &self,
        group: Option<GroupId>,
        all_outcomes: bool,
        failing: &[(Uuid, chrono::DateTime<chrono::Utc>)],
        write: sqlx::query::QueryAs<'q, Postgres, crate::ledger::Written, PgArguments>,
    ) -> Result<Vec<crate::ledger::Written>, StoreError> {
        if !all_outcomes && failing.is_empty() {
            return Ok(on_store!(self, |e| write.fetch_all(e))?);
        }
        let mut conn = self.pool.acquire().await?;
        let mut tx = self.begin_on(&mut conn).await?;
        let written = write.fetch_all(&mut *tx).await?;
        let keys: Vec<(Uuid, chrono::DateTime<chrono::Utc>)> =
            written.iter().map(|(id, at, _)| (*id, *at)).collect();
        // A batch of settles with no failure writes no event: its recoveries are heard from a
        // batch that also fails, or from a run's end (`all_outcomes`), so the common settle
        // stays one statement's work.
        if all_outcomes || !failing.is_empty() {
            crate::events::record_outcome_events(&mut tx, group, &keys).await?;
        }
        if let Some(after) = self.pause_after.filter(|_| !failing.is_empty()) {
            let mut routines: Vec<Uuid> = failing
                .iter()
                .filter(|occurrence| {
                    written
                        .iter()
                        .any(|(id, at, retry)| retry.is_none() && (*id, *at) == **occurrence)
                })
                .map(|(routine_id, _)| *routine_id)
                .collect();
            routines.sort_unstable();
            routines.dedup();
            pause_failed_in(&mut tx, group, after, &routines).await?;
        }
        tx.commit().await?;
        Ok(written)
    }
}

/// In the transaction `tx` that has just recorded failed outcomes of `routines` (in `group`,
/// or any): pauses those whose newest `after` fires all failed, as
/// [`FailingRoutines::pause_failing_routines`] does, and logs each. Under a savepoint: a
/// routine's row held past [`FAILED_LOCK_WAIT`], or any error, leaves the pause to the
/// maintenance pass and the recorded outcomes stand.
pub(crate) async fn pause_failed_in(
    tx: &mut sqlx::PgConnection,
    group: Option<GroupId>,
    after: std::num::NonZeroU32,
    routines: &[Uuid],
) -> Result<Vec<AutoPaused>, StoreError> {
    if routines.is_empty() {
        return Ok(Vec::new());
    }
    crate::schema::query("SAVEPOINT cm_pause_failed")
        .execute(&mut *tx)
        .await?;
    let paused: Result<Vec<AutoPaused>, sqlx::Error> = async {
        crate::schema::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(FAILED_LOCK_WAIT)
            .execute(&mut *tx)
            .await?;
        let query = crate::schema::query(match group {
            None => PAUSE_FAILED_SQL,
            Some(_) => PAUSE_FAILED_GROUP_SQL,
        })
        .bind(i64::from(after.get()))
        .bind(FAILED_WINDOW.as_secs_f64())
        .bind(routines);
        crate::ledger::bind_group(query, group)
            .try_map(|row| AutoPaused::from_row(&row))
            .fetch_all(&mut *tx)
            .await
    }
    .await;
    match paused {
        Ok(paused) => {
            // Released, the lock_timeout set inside stays for the rest of this transaction,
            // which only commits after this.
            crate::schema::query("RELEASE SAVEPOINT cm_pause_failed")
                .execute(&mut *tx)
                .await?;
            crate::events::record(&mut *tx, &paused_events(&paused)).await?;
            for routine in &paused {
                tracing::error!(routine = %routine.name, routine_id = %routine.id,
                    reason = %routine.reason,
                    "routine paused: its last {after} fires failed; resume it once it is fixed");
            }
            Ok(paused)
        }
        Err(e) => {
            crate::schema::query("ROLLBACK TO SAVEPOINT cm_pause_failed")
                .execute(&mut *tx)
                .await?;
            tracing::warn!(error = %e,
                "the automatic pause at a failure was left to the maintenance pass");
            Ok(Vec::new())
        }
    }
}

#[async_trait]
impl FailingRoutines for PgStore {
    async fn pause_failing_routines(
        &self,
        after_failures: u32,
        window: Duration,
    ) -> Result<Vec<AutoPaused>, StoreError> {
        self.pause_failing(None, after_failures, window).await
    }

    async fn pause_failing_routines_in(
        &self,
        group: GroupId,
        after_failures: u32,
        window: Duration,
    ) -> Result<Vec<AutoPaused>, StoreError> {
        self.pause_failing(Some(group), after_failures, window)
            .await
    }
}

impl PgStore {
    /// The automatic pause in `group`, or in every group.
    async fn pause_failing(
        &self,
        group: Option<GroupId>,
        after_failures: u32,
        window: Duration,
    ) -> Result<Vec<AutoPaused>, StoreError> {
        if after_failures == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.pool.acquire().await?;
        let mut tx = self.begin_on(&mut conn).await?;
        let paused = pause_failing_query(group, after_failures, window)
            .try_map(|row| AutoPaused::from_row(&row))
            .fetch_all(&mut *tx)
            .await?;
        crate::events::record(&mut tx, &paused_events(&paused)).await?;
        tx.commit().await?;
        Ok(paused)
    }
}

/// The automatic pause's statement in `group`, or in every group, bound.
pub(crate) fn pause_failing_query(
    group: Option<GroupId>,
    after_failures: u32,
    window: Duration,
) -> Query<'static, Postgres, PgArguments> {
    let query = crate::schema::query(match group {
        None => PAUSE_FAILING_SQL,
        Some(_) => PAUSE_FAILING_GROUP_SQL,
    })
    .bind(i64::from(after_failures))
    .bind(window.as_secs_f64());
    crate::ledger::bind_group(query, group)
}
