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
    FireStatus, Occurrence, OverlapDecision, OverlapPolicy, RunHolder, RunState, RunStateName,
    decide_overlap,
};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, Postgres};
use uuid::Uuid;

use crate::ledger::{
    given_up_error_sql, next_occurrence_sql, reason_instant_sql, retry_decision_sql, retry_wait_sql,
};
use crate::{GroupId, PgStore, StoreError};

/// A mission fire whose run is not known to have finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfinishedRun {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// The fire's status: `claimed` while its launch is under way, `fired` once launched,
    /// `failed` when the launch failed after the run was begun.
    pub status: FireStatus,
    /// Where the run's evidence is, as its runtime named its place when the run was begun
    /// (`None`: not recorded).
    pub place: Option<String>,
    /// Which retry of the occurrence the run is (0: its first attempt's); the run is named
    /// [`Occurrence::run_name`] of it.
    pub retry: u32,
}

impl UnfinishedRun {
    /// The run's name in its runtime ([`Occurrence::run_name`]).
    pub fn run_name(&self) -> String {
        self.occurrence.run_name(self.retry)
    }
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
    /// This scheduler cannot see the run's evidence (its place is another host's, or a
    /// directory it cannot read): only marked checked, and left to a scheduler that can.
    Unseen,
}

/// A run a [`MissionRuns::record_runs`] call ended: its occurrence, how it ended, and when a
/// failure of it is tried again, the retry's instant.
pub type EndedRun = (Occurrence, RunState, Option<DateTime<Utc>>);

/// What an ended run left, as its runtime reported it: kept on its fire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunRecord {
    /// The last of its output, secrets already scrubbed; cut to [`MAX_RUN_OUTPUT`] bytes (at a
    /// character boundary, keeping the end) when longer.
    pub output: Option<String>,
    /// When it started, by the runtime's clock.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended, by the runtime's clock.
    pub finished_at: Option<DateTime<Utc>>,
}

/// The most bytes of a run's output the ledger keeps (`routine_fires.run_output`).
pub const MAX_RUN_OUTPUT: usize = 16 * 1024;

/// What a mission about to launch may do, decided while the deciders of its routine take turns.
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
    /// `replace`: stop the run of `holder` first. Nothing was taken: once the runtime confirms
    /// the stop, [`MissionRuns::take_replaced`] takes the run, if `holder` still holds it. A
    /// stop that fails leaves `holder` the routine's run.
    Replace {
        /// The occurrence whose run to stop.
        holder: Occurrence,
        /// Where its run's evidence is, as recorded when it was begun (`None`: not recorded).
        place: Option<String>,
        /// Its run's name ([`Occurrence::run_name`] of the retry it is).
        run_name: String,
    },
    /// The routine, or this occurrence's claim, is gone (the routine was deleted, the claim
    /// settled by another attempt): launch nothing.
    Gone,
}

/// The run columns of the ledger.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait MissionRuns: Send + Sync {
    /// Marks the run of `occurrence` (a `claimed` mission fire about to launch) `running`.
    async fn begin_run(&self, occurrence: Occurrence) -> Result<(), StoreError>;

    /// Decides whether the mission of `occurrence` (a `claimed` fire about to launch) launches
    /// under its routine's overlap policy ([`cm_domain::decide_overlap`]); when it does, begins
    /// its run in the same transaction and, unless the policy is `allow`, makes it the
    /// routine's run holder. A retry of the holder itself finds the run its own. The deciders
    /// of one routine take turns on a transaction-scoped advisory lock: the routine's row is
    /// neither locked nor written, so no claim skips it meanwhile. A run begun records `place`,
    /// where the runtime that launches it keeps its evidence
    /// (`cm_dispatch::MissionRuntime::place`).
    async fn take_run(
        &self,
        occurrence: Occurrence,
        place: Option<String>,
    ) -> Result<RunTake, StoreError>;

    /// After the runtime confirmed that the run of `stopped` (the holder a [`RunTake::Replace`]
    /// named) is stopped: decides again as [`MissionRuns::take_run`] does, with that run taken
    /// as ended, so the run is taken only if `stopped` still holds it (or nothing does).
    async fn take_replaced(
        &self,
        occurrence: Occurrence,
        stopped: Occurrence,
        place: Option<String>,
    ) -> Result<RunTake, StoreError>;

    /// Sets the overlap policy of the routine `routine_id`; `false` when there is no such
    /// routine.
    async fn set_overlap(
        &self,
        routine_id: Uuid,
        policy: OverlapPolicy,
    ) -> Result<bool, StoreError>;

    /// Up to `limit` runs still `running`, least recently checked first.
    async fn unfinished_runs(&self, limit: u32) -> Result<Vec<UnfinishedRun>, StoreError>;

    /// As [`MissionRuns::unfinished_runs`], in `group` only: one shard on Citus, so a worker
    /// that is down fails only the groups it holds.
    async fn unfinished_runs_in(
        &self,
        group: GroupId,
        limit: u32,
    ) -> Result<Vec<UnfinishedRun>, StoreError>;

    /// Writes what the watch pass learned. Only runs still `running` change, so two passes
    /// of two schedulers at once write the same states. Returns the runs this call ended, each
    /// once whichever pass wrote it: what run counters count; with each, when a failed run is
    /// tried again under its routine's retry policy, the retry's instant (its fire is `claimed`
    /// again, for the reaper then). A run whose row another
    /// transaction holds locked is skipped, not waited on: it is not returned, and stays the
    /// least recently checked, for the next pass.
    async fn record_runs(
        &self,
        updates: &[(Occurrence, RunUpdate)],
    ) -> Result<Vec<EndedRun>, StoreError>;

    /// Keeps what the ended run of `occurrence` left (its output's tail, its start and end) on
    /// its fire. Called by the pass whose [`MissionRuns::record_runs`] returned the run, once.
    async fn keep_run_record(
        &self,
        occurrence: Occurrence,
        record: &RunRecord,
    ) -> Result<(), StoreError>;
}

#[async_trait]
impl MissionRuns for PgStore {
    async fn begin_run(&self, occurrence: Occurrence) -> Result<(), StoreError> {
        let group = self.group_of_routine(occurrence.routine_id).await?;
        on_store!(self, |e| crate::schema::query(BEGIN_RUN_SQL)
            .bind(occurrence.routine_id)
            .bind(occurrence.scheduled_at)
            .bind(group)
            .bind(None::<String>)
            .execute(e))?;
        Ok(())
    }

    async fn set_overlap(
        &self,
        routine_id: Uuid,
        policy: OverlapPolicy,
    ) -> Result<bool, StoreError> {
        let group = self.group_of_routine(routine_id).await?;
        let updated = on_store!(self, |e| {
            crate::schema::query(
            "UPDATE cm.routines SET overlap = $2, updated_at = now() WHERE id = $1 AND group_id = $3",
        )
        .bind(routine_id)
        .bind(policy.as_str())
        .bind(group)
        .execute(e)
        })?
        .rows_affected();
        Ok(updated == 1)
    }

    async fn take_run(
        &self,
        occurrence: Occurrence,
        place: Option<String>,
    ) -> Result<RunTake, StoreError> {
        self.take(occurrence, None, place).await
    }

    async fn take_replaced(
        &self,
        occurrence: Occurrence,
        stopped: Occurrence,
        place: Option<String>,
    ) -> Result<RunTake, StoreError> {
        self.take(occurrence, Some(stopped), place).await
    }

    async fn unfinished_runs(&self, limit: u32) -> Result<Vec<UnfinishedRun>, StoreError> {
        let rows = on_store!(self, |e| unfinished_runs_query(None, limit)
            .try_map(|row| <UnfinishedRow>::from_row(&row))
            .fetch_all(e))?;
        unfinished(rows)
    }

    async fn unfinished_runs_in(
        &self,
        group: GroupId,
        limit: u32,
    ) -> Result<Vec<UnfinishedRun>, StoreError> {
        let rows = on_store!(self, |e| unfinished_runs_query(Some(group), limit)
            .try_map(|row| <UnfinishedRow>::from_row(&row))
            .fetch_all(e))?;
        unfinished(rows)
    }

    async fn record_runs(
        &self,
        updates: &[(Occurrence, RunUpdate)],
    ) -> Result<Vec<EndedRun>, StoreError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        // On Citus, one statement per group, each on one shard: a worker that is down fails
        // only its own groups' updates (the engine's watch passes give one group at a time).
        if self.is_citus().await? {
            let count = self.group_count().await?;
            let mut by_group: std::collections::BTreeMap<GroupId, Vec<(Occurrence, RunUpdate)>> =
                std::collections::BTreeMap::new();
            for (occurrence, update) in updates {
                by_group
                    .entry(crate::group_of(occurrence.routine_id, count))
                    .or_default()
                    .push((*occurrence, update.clone()));
            }
            let mut ended = Vec::new();
            for (group, updates) in by_group {
                ended.extend(self.record_runs_of(Some(group), &updates).await?);
            }
            return Ok(ended);
        }
        self.record_runs_of(None, updates).await
    }

    async fn keep_run_record(
        &self,
        occurrence: Occurrence,
        record: &RunRecord,
    ) -> Result<(), StoreError> {
        let group = self.group_of_routine(occurrence.routine_id).await?;
        // PostgreSQL text holds no NUL byte.
        let output = record
            .output
            .as_deref()
            .map(|o| output_tail(o).replace('\0', ""));
        on_store!(self, |e| crate::schema::query(
            "UPDATE cm.routine_fires
             SET run_output = $4, run_started_at = $5, run_finished_at = $6
             WHERE routine_id = $1 AND scheduled_at = $2 AND group_id = $3",
        )
        .bind(occurrence.routine_id)
        .bind(occurrence.scheduled_at)
        .bind(group)
        .bind(output)
        .bind(record.started_at)
        .bind(record.finished_at)
        .execute(e))?;
        Ok(())
    }
}

/// `text`'s last [`MAX_RUN_OUTPUT`] bytes, cut at a character boundary.
fn output_tail(text: &str) -> &str {
    let mut start = text.len().saturating_sub(MAX_RUN_OUTPUT);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

impl PgStore {
    /// [`MissionRuns::take_run`], and with `stopped`, [`MissionRuns::take_replaced`].
    async fn take(
        &self,
        occurrence: Occurrence,
        stopped: Option<Occurrence>,
        place: Option<String>,
    ) -> Result<RunTake, StoreError> {
        // Every statement names the routine's group: on Citus the transaction is one shard's
        // (the advisory lock is the coordinator's, which every scheduler talks to).
        let group = self.group_of_routine(occurrence.routine_id).await?;
        let mut conn = self.pool.acquire().await?;
        let mut tx = self.begin_on(&mut conn).await?;
        // The deciders of one routine take turns here, and each reads the holder after its turn
        // began (READ COMMITTED: each statement sees what committed before it), so two never
        // both find the run free. The routine's row is only read.
        crate::schema::query(
            "SELECT pg_advisory_xact_lock(hashtextextended('cm.run:' || $1::text, 0))",
        )
        .bind(occurrence.routine_id)
        .execute(&mut *tx)
        .await?;
        let policy: Option<String> = crate::schema::query_scalar(
            "SELECT overlap FROM cm.routines WHERE id = $1 AND group_id = $2",
        )
        .bind(occurrence.routine_id)
        .bind(group)
        .fetch_optional(&mut *tx)
        .await?;
        // A routine deleted since its claim: its fire went with it; nothing may launch.
        let Some(policy) = policy else {
            return Ok(RunTake::Gone);
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
        let held: Option<HolderRow> = crate::schema::query_as(HOLDER_SQL)
            .bind(occurrence.routine_id)
            .bind(group)
            .fetch_optional(&mut *tx)
            .await?;
        let holder = match &held {
            None => RunHolder::Free,
            Some((at, ..)) if *at == occurrence.scheduled_at => RunHolder::Free,
            Some((at, ..)) if stopped.is_some_and(|s| s.scheduled_at == *at) => RunHolder::Free,
            Some((_, status, run, _, _)) => holder_state(status, run.as_deref()),
        };
        let (held_by, held_place, held_retry) = match held {
            Some((at, _, _, place, retry)) => (
                Some(Occurrence::new(occurrence.routine_id, at)),
                place,
                u32::try_from(retry).unwrap_or(0),
            ),
            None => (None, None, 0),
        };
        match (decide_overlap(policy, &holder), held_by) {
            (OverlapDecision::Skip, Some(holder_of)) => {
                return Ok(RunTake::Skip {
                    holder: holder_of,
                    state: holder,
                });
            }
            (OverlapDecision::ReplaceRunning, Some(holder_of)) => {
                return Ok(RunTake::Replace {
                    holder: holder_of,
                    place: held_place,
                    run_name: holder_of.run_name(held_retry),
                });
            }
            _ => {}
        }
        let begun = crate::schema::query(BEGIN_RUN_SQL)
            .bind(occurrence.routine_id)
            .bind(occurrence.scheduled_at)
            .bind(group)
            .bind(place)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        // The fire is no longer this claim's to launch (deleted with its routine, settled):
        // nothing is written and nothing launches.
        if begun == 0 {
            return Ok(RunTake::Gone);
        }
        if policy != OverlapPolicy::Allow {
            crate::schema::query(
                "UPDATE cm.routine_fires SET holds_run = (scheduled_at = $2)
                 WHERE routine_id = $1 AND group_id = $3
                   AND (holds_run OR scheduled_at = $2)",
            )
            .bind(occurrence.routine_id)
            .bind(occurrence.scheduled_at)
            .bind(group)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(RunTake::Launch)
    }
}

/// What the holder of a routine's run, a fire of `status` whose run is `run`, is doing. A fire
/// settled `failed` whose run was begun and is not known to be over (an abandoned launch whose
/// container may exist) still holds the run, until the watch pass finds it gone.
fn holder_state(status: &str, run: Option<&str>) -> RunHolder {
    match (status, run) {
        ("claimed", _) => RunHolder::Launching,
        ("fired" | "failed", Some("running")) => RunHolder::Running,
        _ => RunHolder::Free,
    }
}

/// The fire that holds a routine's run (`$1` the routine, `$2` its group), if one does.
const HOLDER_SQL: &str = "
SELECT scheduled_at, status, run_state, run_place, retry FROM cm.routine_fires
WHERE routine_id = $1 AND group_id = $2 AND holds_run
ORDER BY scheduled_at DESC
LIMIT 1";

/// Begins a run: `$1`/`$2` the occurrence, a fire still `claimed`, `$3` its routine's group,
/// `$4` its place.
const BEGIN_RUN_SQL: &str = "
UPDATE cm.routine_fires SET run_state = 'running', run_exit_code = NULL, run_reason = NULL,
    run_checked_at = now(), run_place = $4
WHERE routine_id = $1 AND scheduled_at = $2 AND group_id = $3 AND status = 'claimed'";

/// [`MissionRuns::record_runs`]'s statement, with `$tail` added to its conditions. The rows
/// are picked and locked first, `FOR UPDATE SKIP LOCKED`, and only those are written: a row
/// another transaction holds (a caller's open `cm.delete_routine`, another pass writing the
/// same run) is left as it is, its `run_checked_at` unchanged, so the next pass reads it first
/// again; it never makes the statement wait, nor fail the other runs' updates.
///
/// A run that ended failed or lost, or a launch settled `failed` that the runtime never knew,
/// is tried again when its routine's retry policy says so (`retry_decision_sql!`): the fire goes
/// back to `claimed`, its lease running out at the retry's instant, its run's columns moved into
/// its `tries` and cleared, and `retry` counted up, so the reaper takes it over then and
/// launches a run of a new name ([`cm_domain::Occurrence::run_name`]). A failure not retried
/// keeps, after its reason, why it was not. Returns each written row with its retry's instant.
macro_rules! record_runs_sql {
    ($tail:literal, in: $group:literal) => {
        concat!(
            "WITH held AS (
                 SELECT f.routine_id, f.scheduled_at, f.group_id, t.state, t.exit_code, t.reason,
                        now() + ",
            retry_wait_sql!(),
            " AS retry_at, ",
            retry_decision_sql!(
                "t.state IN ('failed', 'lost') OR (t.state IS NULL AND f.status = 'failed')",
                group: $group
            ),
            " AS decision,
                        CASE WHEN t.state IS DISTINCT FROM 'running' THEN
                        jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                            'attempt', f.attempt, 'outcome', coalesce(t.state, 'failed'),
                            'error', f.error, 'exit_code', t.exit_code, 'reason', t.reason,
                            'output', right(f.run_output, 4000), 'started_at', f.run_started_at,
                            'finished_at', f.run_finished_at, 'ended_at', now(),
                            'retry_at', now() + ",
            retry_wait_sql!(),
            "))) END AS try
                 FROM cm.routine_fires AS f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::text[], $4::int[], $5::text[])
                      AS t(routine_id, scheduled_at, state, exit_code, reason)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
                 LEFT JOIN cm.routines AS r ON r.id = f.routine_id AND r.group_id = ",
            $group,
            "
                 WHERE f.run_state = 'running'",
            $tail,
            "
                 FOR UPDATE OF f SKIP LOCKED
             )
             UPDATE cm.routine_fires AS f
             SET run_state = CASE WHEN h.decision = 'retry' THEN NULL ELSE h.state END,
                 run_exit_code = CASE WHEN h.decision = 'retry' THEN NULL ELSE h.exit_code END,
                 run_reason = CASE WHEN h.decision = 'retry' THEN NULL
                                   WHEN h.reason IS NULL THEN h.decision
                                   ELSE ",
            given_up_error_sql!("h.reason", "h.decision"),
            " END,
                 run_checked_at = now(),
                 status = CASE WHEN h.decision = 'retry' THEN 'claimed' ELSE f.status END,
                 completed_at = CASE WHEN h.decision = 'retry' THEN NULL ELSE f.completed_at END,
                 lease_expires_at = CASE WHEN h.decision = 'retry' THEN h.retry_at
                                         ELSE f.lease_expires_at END,
                 retry = f.retry + CASE WHEN h.decision = 'retry' THEN 1 ELSE 0 END,
                 tries = CASE WHEN h.decision = 'retry' THEN coalesce(f.tries, '[]'::jsonb) || h.try
                              ELSE f.tries END,
                 run_output = CASE WHEN h.decision = 'retry' THEN NULL ELSE f.run_output END,
                 run_started_at = CASE WHEN h.decision = 'retry' THEN NULL
                                       ELSE f.run_started_at END,
                 run_finished_at = CASE WHEN h.decision = 'retry' THEN NULL
                                        ELSE f.run_finished_at END,
                 run_place = CASE WHEN h.decision = 'retry' THEN NULL ELSE f.run_place END
             FROM held AS h
             WHERE f.routine_id = h.routine_id AND f.scheduled_at = h.scheduled_at
               AND f.group_id = h.group_id",
            $tail,
            " RETURNING f.routine_id, f.scheduled_at,
                         CASE WHEN h.decision = 'retry' THEN h.retry_at END AS retry_at"
        )
    };
}

impl PgStore {
    /// [`MissionRuns::record_runs`]'s statement, for the runs of `group` (on Citus, naming the
    /// group keeps it on one shard) or of any group.
    async fn record_runs_of(
        &self,
        group: Option<GroupId>,
        updates: &[(Occurrence, RunUpdate)],
    ) -> Result<Vec<EndedRun>, StoreError> {
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
                RunUpdate::Launching | RunUpdate::Unseen => (Some("running"), None, None),
            };
            states.push(state);
            codes.push(code);
            reasons.push(reason);
        }
        // The row update is what ends a run, once: a second pass (another scheduler's) that
        // read the run as `running` skips the row while the first holds it, and finds it ended
        // afterwards, so only the pass that ended a run returns it.
        // With a group, the statement names it as a constant (not `$6 IS NULL OR ...`), so
        // Citus plans it on that group's shard alone.
        let query = crate::schema::query_as(match group {
            None => record_runs_sql!("", in: "f.group_id"),
            Some(_) => record_runs_sql!(" AND f.group_id = $6", in: "$6"),
        })
        .bind(&ids)
        .bind(&instants)
        .bind(&states)
        .bind(&codes)
        .bind(&reasons);
        let query = match group {
            None => query,
            Some(group) => query.bind(group),
        };
        // A run ended failed or lost may be its routine's Nth failure in a row: its pause is
        // written in the same transaction as the run's end.
        let failing: Vec<(Uuid, DateTime<Utc>)> = updates
            .iter()
            .filter(|(_, update)| {
                matches!(update, RunUpdate::Observed(state)
                    if matches!(state.name(), RunStateName::Failed | RunStateName::Lost))
            })
            .map(|(occurrence, _)| (occurrence.routine_id, occurrence.scheduled_at))
            .collect();
        let ended = self.record_then_pause(group, true, &failing, query).await?;
        let ended: std::collections::HashMap<Occurrence, Option<DateTime<Utc>>> = ended
            .into_iter()
            .map(|(routine_id, at, retry)| (Occurrence::new(routine_id, at), retry))
            .collect();
        Ok(updates
            .iter()
            .filter_map(
                |(occurrence, update)| match (update, ended.get(occurrence)) {
                    (RunUpdate::Observed(state), Some(retry)) if state.is_finished() => {
                        Some((*occurrence, state.clone(), *retry))
                    }
                    _ => None,
                },
            )
            .collect())
    }
}

/// The watch pass's read. `$1` is the most runs to return. It reads `routine_fires_running_idx`
/// in its order and stops after `$1` rows: the runs still running, never the finished ledger.
const UNFINISHED_RUNS_SQL: &str = "
SELECT routine_id, scheduled_at, status, run_place, retry
FROM cm.routine_fires
WHERE run_state = 'running'
ORDER BY run_checked_at NULLS FIRST, routine_id, scheduled_at
LIMIT $1";

/// The same in the group `$2`.
const UNFINISHED_RUNS_IN_SQL: &str = "
SELECT routine_id, scheduled_at, status, run_place, retry
FROM cm.routine_fires
WHERE run_state = 'running' AND group_id = $2
ORDER BY run_checked_at NULLS FIRST, routine_id, scheduled_at
LIMIT $1";

/// The watch pass's read in `group`, or in every group, bound.
pub(crate) fn unfinished_runs_query(
    group: Option<GroupId>,
    limit: u32,
) -> Query<'static, Postgres, PgArguments> {
    let query = crate::schema::query(match group {
        None => UNFINISHED_RUNS_SQL,
        Some(_) => UNFINISHED_RUNS_IN_SQL,
    })
    .bind(i64::from(limit));
    crate::ledger::bind_group(query, group)
}

/// A row of the watch pass's read: the occurrence, its status, its run's place and its retry.
type UnfinishedRow = (Uuid, DateTime<Utc>, String, Option<String>, i16);

/// The runs an unfinished-runs read returned.
fn unfinished(rows: Vec<UnfinishedRow>) -> Result<Vec<UnfinishedRun>, StoreError> {
    rows.into_iter()
        .map(|(routine_id, scheduled_at, status, place, retry)| {
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
                place,
                retry: u32::try_from(retry).unwrap_or(0),
            })
        })
        .collect()
}

/// The run holder's row: its occurrence, status, run state, place and retry.
type HolderRow = (DateTime<Utc>, String, Option<String>, Option<String>, i16);
