//! Mission runs watched to their end, beside the ticks.
//!
//! Before a mission launches, its fire's run is marked `running` ([`RunWatch::begin`]). A pass
//! every tick interval (at least every second) reads up to [`WATCH_BATCH`] runs not yet
//! finished, least recently checked first, asks the runtime about each (Docker inspect, the
//! Job's status, the process runner's exit file), at most [`WATCH_CONCURRENCY`] at once, and
//! writes what it learned. A runtime that does not answer leaves its runs as they were, for the
//! next pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cm_dispatch::{MissionRuntime, RunRef};
use cm_domain::{FireStatus, Occurrence};
use cm_store::{MissionRuns, RunUpdate, StoreError, UnfinishedRun};
use tracing::{debug, info, warn};

use crate::stats::Stats;

/// How many runs one pass asks about: bounded, so a pass is short whatever is running; a
/// larger set of runs is walked over several passes, least recently checked first.
pub const WATCH_BATCH: u32 = 100;

/// How many runtime calls a pass has open at once.
pub const WATCH_CONCURRENCY: usize = 8;

/// How long one runtime call of a pass may take.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The ledger's runs and the runtime that runs them.
pub struct RunWatch {
    /// The run columns of the ledger.
    pub store: Arc<dyn MissionRuns>,
    /// The mission backend, seen after its launches.
    pub runtime: Arc<dyn MissionRuntime>,
}

impl RunWatch {
    /// Marks the run of `occurrence` `running` before its launch, so the run is watched even if
    /// this scheduler dies between the launch and the settle.
    pub async fn begin(&self, occurrence: Occurrence, stats: &Stats) -> Result<(), StoreError> {
        self.store.begin_run(occurrence).await?;
        stats.run_reached(cm_domain::RunStateName::Running);
        Ok(())
    }

    /// One pass: reads the unfinished runs, asks the runtime, writes what changed. Returns how
    /// many runs ended in this pass, or the store's error.
    pub async fn pass(&self, stats: &Stats) -> Result<usize, StoreError> {
        let runs = self.store.unfinished_runs(WATCH_BATCH).await?;
        if runs.is_empty() {
            return Ok(0);
        }
        let room = Arc::new(tokio::sync::Semaphore::new(WATCH_CONCURRENCY));
        let mut asking = tokio::task::JoinSet::new();
        for run in runs {
            let (runtime, room) = (self.runtime.clone(), room.clone());
            asking.spawn(async move {
                let _turn = room.acquire_owned().await;
                update(runtime.as_ref(), run).await
            });
        }
        let mut updates: Vec<(Occurrence, RunUpdate)> = Vec::new();
        while let Some(answer) = asking.join_next().await {
            if let Ok(Some(update)) = answer {
                updates.push(update);
            }
        }
        let mut ended = 0;
        for (occurrence, update) in &updates {
            if let RunUpdate::Observed(state) = update
                && state.is_finished()
            {
                ended += 1;
                stats.run_reached(state.name());
                info!(routine_id = %occurrence.routine_id, scheduled_at = %occurrence.scheduled_at,
                    run = %state.name(), exit_code = ?state.exit_code(),
                    reason = state.reason().unwrap_or(""), "mission run ended");
            }
        }
        self.store.record_runs(&updates).await?;
        Ok(ended)
    }
}

/// What the runtime says of one unfinished run; `None` when it did not answer.
async fn update(
    runtime: &dyn MissionRuntime,
    run: UnfinishedRun,
) -> Option<(Occurrence, RunUpdate)> {
    let occurrence = run.occurrence;
    let update = match run.status {
        FireStatus::Claimed => RunUpdate::Launching,
        FireStatus::Fired => {
            let name = occurrence.idempotency_key().to_string();
            let deadline = Instant::now() + OBSERVE_TIMEOUT;
            let observed =
                tokio::time::timeout(OBSERVE_TIMEOUT, runtime.observe(&RunRef { name }, deadline))
                    .await;
            match observed {
                Ok(Ok(state)) => RunUpdate::Observed(state),
                Ok(Err(e)) => {
                    warn!(routine_id = %occurrence.routine_id, scheduled_at = %occurrence.scheduled_at,
                            error = %e, "cannot read a mission run; trying again next pass");
                    return None;
                }
                Err(_) => {
                    debug!(routine_id = %occurrence.routine_id, "reading a mission run timed out");
                    return None;
                }
            }
        }
        // The launch failed after the run was begun (or a later status): no run to watch.
        _ => RunUpdate::NotLaunched,
    };
    Some((occurrence, update))
}

/// A mission fire's run as `fires`, `routine show` and the status page show it: `running`,
/// `succeeded`, `failed (exit 3)`, `failed (OOMKilled)`, `lost`; empty for a message or a
/// mission not launched. The reason of a lost or failed run is in `--json`.
pub fn run_text(f: &cm_store::Fire) -> String {
    match (f.run_state.as_deref(), f.run_exit_code) {
        (None, _) => String::new(),
        (Some(state), Some(code)) => format!("{state} (exit {code})"),
        (Some("failed"), None) => match f.run_reason.as_deref() {
            Some(reason) => format!("failed ({reason})"),
            None => "failed".into(),
        },
        (Some(state), None) => state.to_owned(),
    }
}
