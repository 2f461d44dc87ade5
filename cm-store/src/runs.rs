//! Mission runs watched after their launch: the `run_*` columns of `routine_fires`.
//!
//! A mission fire's run is marked `running` when its launch goes ahead ([`MissionRuns::begin_run`],
//! on the row still `claimed`), so a scheduler that dies between the launch and the settle leaves
//! a run that is still watched. The watch pass reads the runs not yet finished, least recently
//! checked first, through `routine_fires_running_idx` ([`MissionRuns::unfinished_runs`]), asks
//! the runtime about each, and writes what it learned ([`MissionRuns::record_runs`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::{
    FireStatus, Occurrence, OverlapDecision, OverlapPolicy, RunHolder, RunState, decide_overlap,
};
use sqlx::Connection as _;
use uuid::Uuid;

use crate::{PgStore, StoreError};

/// A mission fire whose run is not known to have finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfinishedRun {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// The fire's status: `claimed` while its launch is under way, `fired` once launched,
    /// `failed` when the launch failed after the run was begun.
    pub status: FireStatus,
}

/// What the watch pass learned about one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunUpdate {
    /// The runtime's answer: still running (the row is only marked checked), or ended.
    Observed(RunState),
    /// The launch never happened (the fire settled `failed`): the fire has no run.
    NotLaunched,
    /// Its launch is still under way: only marked checked, so the pass moves on to others.
    Launching,
}

/// What a mission about to launch may do, decided under its routine's row lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunTake {
    /// Launch it: its run is marked `running` (and, unless the policy is `allow`, it now holds
    /// the routine's run).
    Launch,
    /// Do not launch: the earlier fire of `holder` holds the routine's run (`forbid`, or a
    /// `replace` whose holder is still being launched).
    Skip {
        /// The holder's occurrence.
        holder: Occurrence,
        /// What the holder is doing.
        state: RunHolder,
    },
    /// Stop the run of `holder`, then launch (`replace`); this fire now holds the run.
    Replace {
        /// The occurrence whose run to stop.
        holder: Occurrence,
    },
}

/// The run columns of the ledger.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait MissionRuns: Send + Sync {
    /// Marks the run of `occurrence` (a `claimed` mission fire about to launch) `running`.
    async fn begin_run(&self, occurrence: Occurrence) -> Result<(), StoreError>;

    /// Decides, under the routine's row lock, whether the mission of `occurrence` (a `claimed`
    /// fire about to launch) launches under its routine's overlap policy
    /// ([`cm_domain::decide_overlap`]); when it does, begins its run in the same transaction
    /// and, unless the policy is `allow`, makes it the routine's run holder. A retry of the
    /// holder itself finds the run its own.
    async fn take_run(&self, occurrence: Occurrence) -> Result<RunTake, StoreError>;

    /// Sets the overlap policy of the routine `routine_id`; `false` when there is no such
    /// routine.
    async fn set_overlap(
        &self,
        routine_id: Uuid,
        policy: OverlapPolicy,
    ) -> Result<bool, StoreError>;

    /// Up to `limit` runs still `running`, least recently checked first.
    async fn unfinished_runs(&self, limit: u32) -> Result<Vec<UnfinishedRun>, StoreError>;

    /// Writes what the watch pass learned. Only runs still `running` change, so two passes
    /// of two schedulers at once write the same states.
    async fn record_runs(&self, updates: &[(Occurrence, RunUpdate)]) -> Result<(), StoreError>;
}

#[async_trait]
impl MissionRuns for PgStore {
    async fn begin_run(&self, occurrence: Occurrence) -> Result<(), StoreError> {
        let group = self.group_of_routine(occurrence.routine_id).await?;
        sqlx::query(BEGIN_RUN_SQL)
            .bind(occurrence.routine_id)
            .bind(occurrence.scheduled_at)
            .bind(group)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn set_overlap(
        &self,
        routine_id: Uuid,
        policy: OverlapPolicy,
    ) -> Result<bool, StoreError> {
        let group = self.group_of_routine(routine_id).await?;
        let updated = sqlx::query(
            "UPDATE routines SET overlap = $2, updated_at = now() WHERE id = $1 AND group_id = $3",
        )
        .bind(routine_id)
        .bind(policy.as_str())
        .bind(group)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(updated == 1)
    }

    async fn take_run(&self, occurrence: Occurrence) -> Result<RunTake, StoreError> {
        // Every statement names the routine's group: on Citus the transaction is one shard's.
        let group = self.group_of_routine(occurrence.routine_id).await?;
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        // The routine's row lock serialises the deciders of one routine. The holder's fire is
        // read by a statement of its own, after the lock is granted: in READ COMMITTED a join
        // in the locking statement would be re-evaluated against the holder row of the old
        // snapshot, and two schedulers could both find the run free.
        let row: Option<(String, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT overlap, run_holder FROM routines WHERE id = $1 AND group_id = $2
                 FOR UPDATE",
        )
        .bind(occurrence.routine_id)
        .bind(group)
        .fetch_optional(&mut *tx)
        .await?;
        // A routine deleted meanwhile: its fire goes with it, and the settle will say so.
        let Some((policy, holder_at)) = row else {
            return Ok(RunTake::Launch);
        };
        let (holder_status, holder_run): (Option<String>, Option<String>) = match holder_at {
            Some(at) => sqlx::query_as(
                "SELECT status, run_state FROM routine_fires
                 WHERE routine_id = $1 AND scheduled_at = $2 AND group_id = $3",
            )
            .bind(occurrence.routine_id)
            .bind(at)
            .bind(group)
            .fetch_optional(&mut *tx)
            .await?
            .map_or((None, None), |(status, run): (String, Option<String>)| {
                (Some(status), run)
            }),
            None => (None, None),
        };
        let policy: OverlapPolicy =
            policy
                .parse()
                .map_err(
                    |e: cm_domain::ParseOverlapPolicyError| StoreError::CorruptRoutine {
                        routine_id: occurrence.routine_id,
                        reason: e.to_string(),
                    },
                )?;
        let holder = match (holder_at, holder_status.as_deref(), holder_run.as_deref()) {
            (Some(at), _, _) if at == occurrence.scheduled_at => RunHolder::Free,
            (Some(_), Some("claimed"), _) => RunHolder::Launching,
            (Some(_), Some("fired"), Some("running")) => RunHolder::Running,
            _ => RunHolder::Free,
        };
        let held_by = holder_at.map(|at| Occurrence::new(occurrence.routine_id, at));
        let take = match (decide_overlap(policy, &holder), held_by) {
            (OverlapDecision::Skip, Some(holder)) => {
                return Ok(RunTake::Skip {
                    holder,
                    state: holder_state(&holder_run, &holder_status),
                });
            }
            (OverlapDecision::ReplaceRunning, Some(holder)) => RunTake::Replace { holder },
            _ => RunTake::Launch,
        };
        if policy != OverlapPolicy::Allow {
            sqlx::query("UPDATE routines SET run_holder = $2 WHERE id = $1 AND group_id = $3")
                .bind(occurrence.routine_id)
                .bind(occurrence.scheduled_at)
                .bind(group)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(BEGIN_RUN_SQL)
            .bind(occurrence.routine_id)
            .bind(occurrence.scheduled_at)
            .bind(group)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(take)
    }

    async fn unfinished_runs(&self, limit: u32) -> Result<Vec<UnfinishedRun>, StoreError> {
        let rows: Vec<(Uuid, DateTime<Utc>, String)> = sqlx::query_as(UNFINISHED_RUNS_SQL)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|(routine_id, scheduled_at, status)| {
                let status = status
                    .parse()
                    .map_err(
                        |e: cm_domain::ParseFireStatusError| StoreError::CorruptRoutine {
                            routine_id,
                            reason: e.to_string(),
                        },
                    )?;
                Ok(UnfinishedRun {
                    occurrence: Occurrence::new(routine_id, scheduled_at),
                    status,
                })
            })
            .collect()
    }

    async fn record_runs(&self, updates: &[(Occurrence, RunUpdate)]) -> Result<(), StoreError> {
        if updates.is_empty() {
            return Ok(());
        }
        let n = updates.len();
        let (mut ids, mut instants) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut states, mut codes, mut reasons) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for (occurrence, update) in updates {
            ids.push(occurrence.routine_id);
            instants.push(occurrence.scheduled_at);
            let (state, code, reason) = match update {
                RunUpdate::Observed(state) => (
                    Some(state.name().as_str()),
                    state.exit_code(),
                    state.reason().map(str::to_owned),
                ),
                RunUpdate::NotLaunched => (None, None, None),
                RunUpdate::Launching => (Some("running"), None, None),
            };
            states.push(state);
            codes.push(code);
            reasons.push(reason);
        }
        sqlx::query(
            "UPDATE routine_fires AS f
             SET run_state = t.state, run_exit_code = t.exit_code, run_reason = t.reason,
                 run_checked_at = now()
             FROM UNNEST($1::uuid[], $2::timestamptz[], $3::text[], $4::int[], $5::text[])
                  AS t(routine_id, scheduled_at, state, exit_code, reason)
             WHERE f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
               AND f.run_state = 'running'",
        )
        .bind(&ids)
        .bind(&instants)
        .bind(&states)
        .bind(&codes)
        .bind(&reasons)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// What the holder of a routine's run was found doing.
fn holder_state(run: &Option<String>, status: &Option<String>) -> RunHolder {
    match (status.as_deref(), run.as_deref()) {
        (Some("claimed"), _) => RunHolder::Launching,
        (_, Some("running")) => RunHolder::Running,
        _ => RunHolder::Free,
    }
}

/// Begins a run: `$1`/`$2` the occurrence, a fire still `claimed`, `$3` its routine's group.
const BEGIN_RUN_SQL: &str = "
UPDATE routine_fires SET run_state = 'running', run_exit_code = NULL, run_reason = NULL,
    run_checked_at = now()
WHERE routine_id = $1 AND scheduled_at = $2 AND group_id = $3 AND status = 'claimed'";

/// The watch pass's read. `$1` is the most runs to return. It reads `routine_fires_running_idx`
/// in its order and stops after `$1` rows: the runs still running, never the finished ledger.
pub const UNFINISHED_RUNS_SQL: &str = "
SELECT routine_id, scheduled_at, status
FROM routine_fires
WHERE run_state = 'running'
ORDER BY run_checked_at NULLS FIRST, routine_id, scheduled_at
LIMIT $1";
