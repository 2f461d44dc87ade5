//! Mission runs watched to their end, beside the ticks.
//!
//! Before a mission launches, its routine's overlap policy decides whether it may, and its
//! fire's run is marked `running` ([`RunWatch::before_launch`]). A pass
//! every tick interval (at least every second) reads up to [`WATCH_BATCH`] runs not yet
//! finished, least recently checked first, asks the runtime about each (Docker inspect, the
//! Job's status, the process runner's exit file), at most [`WATCH_CONCURRENCY`] at once, and
//! writes what it learned. A runtime that does not answer leaves its runs as they were, for the
//! next pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cm_dispatch::{MissionRuntime, RunRef};
use cm_domain::{ErrorText, FireOutcome, FireStatus, Occurrence, RunHolder, Settlement};
use cm_store::{GroupId, MissionRuns, RunRecord, RunTake, RunUpdate, StoreError, UnfinishedRun};
use tracing::{debug, info, warn};

use crate::counters::{Stats, add};

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
    /// The scheduler's own secrets (its database password, tokens), scrubbed from every run's
    /// output before it is kept.
    pub secrets: Vec<String>,
    /// Where a retry of a failed run is noted, to wake the reaper when it is due.
    pub retries: Arc<crate::engine::RetryWake>,
}

/// What a mission does before its launch, under its routine's overlap policy.
pub enum BeforeLaunch {
    /// Launch it (its run is marked `running`).
    Launch,
    /// Settle it with this instead of launching: `skipped`, naming the fire whose run holds
    /// the routine (under `forbid`, or a `replace` whose stop the runtime refused).
    Settle(Settlement),
    /// Its routine (or its claim) is gone: launch nothing and settle nothing.
    Gone,
}

/// How many times one occurrence stops a run under `replace` before it is skipped: each stop
/// that succeeds but finds another occurrence took the run meanwhile is one.
const REPLACE_TRIES: usize = 3;

impl RunWatch {
    /// Decides under the routine's overlap policy whether the mission of `occurrence` launches.
    /// Under `replace` the running one is stopped first, and the run is taken only once the
    /// runtime confirmed the stop: a stop that fails leaves the old run the routine's, and this
    /// occurrence `skipped` with the reason. When it launches, its run is marked `running`
    /// before the launch, so the run is watched even if this scheduler dies between the launch
    /// and the settle. No lock is held across a runtime call.
    pub async fn before_launch(
        &self,
        occurrence: Occurrence,
        deadline: Instant,
    ) -> Result<BeforeLaunch, StoreError> {
        // Where the runtime keeps the run's evidence, recorded as its run begins, so whichever
        // scheduler watches it looks there (and one that cannot see it leaves it alone).
        let place = self.runtime.place();
        let mut take = self.store.take_run(occurrence, place.clone()).await?;
        for _ in 0..REPLACE_TRIES {
            let (holder, holder_place, name) = match take {
                RunTake::Launch => return Ok(BeforeLaunch::Launch),
                RunTake::Gone => return Ok(BeforeLaunch::Gone),
                RunTake::Skip { holder, state } => {
                    let doing = match state {
                        RunHolder::Launching => "is still being launched",
                        _ => "is still running",
                    };
                    return Ok(skipped(format!(
                        "skipped: the run of the fire of {} {doing} (overlap forbids a second)",
                        fire_name(holder)
                    )));
                }
                RunTake::Replace {
                    holder,
                    place,
                    run_name,
                } => (holder, place, run_name),
            };
            let run = RunRef {
                name: name.clone(),
                place: holder_place,
            };
            // Only a stop the runtime confirmed frees the run: one that failed, or did not see
            // the run gone by the deadline, leaves it the routine's.
            if let Err(e) = self.runtime.stop(&run, deadline).await {
                warn!(routine_id = %occurrence.routine_id, running = %name, error = %e,
                    "overlap replace: the runtime did not stop the running mission; it keeps the routine's run");
                return Ok(skipped(format!(
                    "skipped: overlap replace could not stop the run of the fire of {}, which \
                     keeps the routine's run: {e}",
                    fire_name(holder)
                )));
            }
            info!(routine_id = %occurrence.routine_id, replaced = %name,
                "stopped the running mission to launch the next (overlap replace)");
            take = self
                .store
                .take_replaced(occurrence, holder, place.clone())
                .await?;
        }
        Ok(match take {
            RunTake::Launch => BeforeLaunch::Launch,
            RunTake::Gone => BeforeLaunch::Gone,
            RunTake::Skip { holder, .. } | RunTake::Replace { holder, .. } => skipped(format!(
                "skipped: overlap replace stopped {REPLACE_TRIES} runs and the run of the fire \
                 of {} still holds the routine",
                fire_name(holder)
            )),
        })
    }

    /// One pass: reads the unfinished runs, asks the runtime, writes what changed. Returns how
    /// many runs ended in this pass, or the store's error.
    pub async fn pass(&self, stats: &Stats) -> Result<usize, StoreError> {
        self.pass_in(stats, None).await
    }

    /// [`RunWatch::pass`] over the runs of `group` alone (every group: `None`): on Citus one
    /// shard's, so a worker that is down fails only the passes of its groups.
    pub async fn pass_in(
        &self,
        stats: &Stats,
        group: Option<GroupId>,
    ) -> Result<usize, StoreError> {
        let runs = match group {
            None => self.store.unfinished_runs(WATCH_BATCH).await?,
            Some(group) => self.store.unfinished_runs_in(group, WATCH_BATCH).await?,
        };
        if runs.is_empty() {
            return Ok(0);
        }
        // A fire settled `fired` is counted by its run's outcome when the run ends; one settled
        // `failed` (its launch refused or abandoned) was counted failed then.
        let launched: std::collections::HashSet<Occurrence> = runs
            .iter()
            .filter(|r| r.status == FireStatus::Fired)
            .map(|r| r.occurrence)
            .collect();
        // Each run's report is read where its evidence is, under its name.
        let places: std::collections::HashMap<Occurrence, RunRef> = runs
            .iter()
            .map(|r| {
                let run = RunRef {
                    name: r.run_name(),
                    place: r.place.clone(),
                };
                (r.occurrence, run)
            })
            .collect();
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
        // A run that failed or was lost has its report (its output's tail) kept before its
        // end is recorded, so the `routine.failed` event written with the end carries it.
        let failing: Vec<Occurrence> = updates
            .iter()
            .filter(|(_, update)| {
                matches!(update, RunUpdate::Observed(state)
                    if matches!(state.name(), cm_domain::RunStateName::Failed | cm_domain::RunStateName::Lost))
            })
            .map(|(occurrence, _)| *occurrence)
            .collect();
        self.keep_reports(&failing, &places, &room).await;
        // Every scheduler watches every run; only the row update that ended a run returns it,
        // so each ended run is counted and logged once, by whichever pass wrote it.
        let ended = self.store.record_runs(&updates).await?;
        for (occurrence, state, retry) in &ended {
            stats.run_reached(state.name());
            if let Some(at) = retry {
                // The fire is counted by its retry's outcome.
                add(&stats.retrying, 1);
                self.retries.due_at(*at);
            } else if launched.contains(occurrence) {
                stats.fire_ended(state);
            }
            info!(routine_id = %occurrence.routine_id, scheduled_at = %occurrence.scheduled_at,
                run = %state.name(), exit_code = ?state.exit_code(),
                reason = state.reason().unwrap_or(""), retry_at = ?retry, "mission run ended");
        }
        // What every other ended run left is asked for by the pass that ended it, once.
        let rest: Vec<Occurrence> = ended
            .iter()
            .map(|(occurrence, _, _)| *occurrence)
            .filter(|occurrence| !failing.contains(occurrence))
            .collect();
        self.keep_reports(&rest, &places, &room).await;
        Ok(ended.len())
    }

    /// Asks the runtime what each run of `occurrences` left (its output's tail, scrubbed, its
    /// start and end), `places` saying where each run's evidence is, and keeps it with the run.
    async fn keep_reports(
        &self,
        occurrences: &[Occurrence],
        places: &std::collections::HashMap<Occurrence, RunRef>,
        room: &Arc<tokio::sync::Semaphore>,
    ) {
        let mut reporting = tokio::task::JoinSet::new();
        for occurrence in occurrences {
            let (runtime, room, occurrence) = (self.runtime.clone(), room.clone(), *occurrence);
            let run = places.get(&occurrence).cloned().unwrap_or_else(|| RunRef {
                name: occurrence.idempotency_key().to_string(),
                place: None,
            });
            reporting.spawn(async move {
                let _turn = room.acquire_owned().await;
                let report = runtime.report(&run, Instant::now() + OBSERVE_TIMEOUT).await;
                (occurrence, report)
            });
        }
        let known: Vec<&str> = self.secrets.iter().map(String::as_str).collect();
        while let Some(answer) = reporting.join_next().await {
            let Ok((occurrence, report)) = answer else {
                continue;
            };
            let report = match report {
                Ok(report) => report,
                Err(e) => {
                    debug!(routine_id = %occurrence.routine_id, scheduled_at = %occurrence.scheduled_at,
                        error = %e, "the runtime did not report the run's output");
                    continue;
                }
            };
            let record = RunRecord {
                output: report
                    .output
                    .as_deref()
                    .map(|o| cm_dispatch::scrub_output(o, &known)),
                started_at: report.started_at,
                finished_at: report.finished_at,
            };
            if let Err(e) = self.store.keep_run_record(occurrence, &record).await {
                warn!(routine_id = %occurrence.routine_id, error = %e,
                    "keeping the run's output failed");
            }
        }
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
        // A launch settled `failed` after its run was begun (refused, or abandoned after
        // unconfirmed tries) may still have a container: it is asked about like a launched one,
        // and keeps the routine's run until the runtime says it is gone.
        FireStatus::Fired | FireStatus::Failed => {
            let status = run.status;
            let run = RunRef {
                name: run.run_name(),
                place: run.place,
            };
            // A run whose evidence this scheduler cannot see (another host's, a directory it
            // cannot read) is not judged here, lost least of all: a scheduler that sees it does.
            if run.place.is_some() && !runtime.sees(&run) {
                debug!(routine_id = %occurrence.routine_id, scheduled_at = %occurrence.scheduled_at,
                    place = run.place.as_deref().unwrap_or_default(),
                    "a mission run this scheduler cannot see; left to one that can");
                return Some((occurrence, RunUpdate::Unseen));
            }
            let deadline = Instant::now() + OBSERVE_TIMEOUT;
            let observed =
                tokio::time::timeout(OBSERVE_TIMEOUT, runtime.observe(&run, deadline)).await;
            match observed {
                // A failed launch the runtime does not know: it never ran.
                Ok(Ok(cm_domain::RunState::Lost { .. })) if status == FireStatus::Failed => {
                    RunUpdate::NotLaunched
                }
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
        // Skipped: no run to watch.
        FireStatus::Skipped => RunUpdate::NotLaunched,
    };
    Some((occurrence, update))
}

/// A fire's outcome as the listings and the page print it: a mission's run with its exit code
/// (`failed (exit 3)`, `succeeded (exit 0)`), else the outcome's name (`running`, `lost`,
/// `fired`, `failed`, `skipped`, `claimed`).
pub fn outcome_text(outcome: FireOutcome, status: &str, exit_code: Option<i32>) -> String {
    match exit_code {
        Some(code) if status != "failed" => format!("{outcome} (exit {code})"),
        _ => outcome.as_str().to_owned(),
    }
}

/// A run's duration as the listings and the page print it: `2.4 s`, `3 min 05 s`,
/// `1 h 02 min`.
pub fn duration_text(d: chrono::TimeDelta) -> String {
    let secs = d.num_milliseconds() as f64 / 1000.0;
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        format!("{} min {:02} s", d.num_minutes(), d.num_seconds() % 60)
    } else {
        format!("{} h {:02} min", d.num_hours(), d.num_minutes() % 60)
    }
}

/// [`outcome_text`] of a listed fire.
pub fn fire_outcome_text(f: &cm_store::Fire) -> String {
    outcome_text(f.outcome(), &f.status, f.run_exit_code)
}

/// A skipped occurrence's settlement.
fn skipped(reason: String) -> BeforeLaunch {
    BeforeLaunch::Settle(Settlement::Skipped(ErrorText::new(reason)))
}

/// A fire as a reason names it: its occurrence and idempotency key.
fn fire_name(fire: Occurrence) -> String {
    format!(
        "{} ({})",
        fire.scheduled_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        fire.idempotency_key()
    )
}
