//! One dispatch task: a claimed occurrence dispatched (a mission through its run's overlap
//! decision and the launch rate's gate) under its deadline, its result settled through the
//! completer, and what ended unsettled noted on the claim for the attempt after.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cm_dispatch::{Dispatch, DispatchError, Dispatcher};
use cm_domain::{ErrorText, FireOrigin, Settlement};
use cm_store::{ClaimedFire, FireLedger, FireRef, FireSettle, RoutineKind};
use tracing::{debug, error, info, warn};

use super::FIRES;
use super::launch_gate::LaunchTicket;
use crate::completer::{Completed, Completer};
use crate::counters::{Stats, add};
use crate::runs::{BeforeLaunch, RunWatch};
use crate::traces::AttemptTrace;

/// What one dispatch task needs, cloned out of the scheduler so the task is `'static`.
pub(super) struct FireJob {
    pub(super) dispatcher: Arc<dyn Dispatcher>,
    pub(super) completer: Arc<dyn Completer>,
    /// Where an attempt that ends without settling notes why.
    pub(super) ledger: Arc<dyn FireLedger>,
    /// The dispatch's budget as it was counted, for its timeout's message.
    pub(super) budget: Duration,
    /// When the dispatch must have finished: counted once, when the budget was (on tokio's
    /// clock, which its timeout runs on).
    pub(super) deadline: tokio::time::Instant,
    /// When the occurrence's first attempt was claimed, on this process's clock (`None`: too
    /// long ago to say).
    pub(super) first_claimed: Option<Instant>,
    pub(super) stats: Arc<Stats>,
    pub(super) runs: Option<Arc<RunWatch>>,
    /// Where a retry this attempt's failure is given is noted, to wake the reaper then.
    pub(super) retries: Arc<super::RetryWake>,
    /// A mission's place at the launch rate's gate, passed just before its launch.
    pub(super) launch_ticket: Option<LaunchTicket>,
    /// The attempt's spans, recorded when the job ends (`--otlp-endpoint`).
    pub(super) trace: Option<AttemptTrace>,
}

/// How long stopping the run of a deleted routine's mission may take.
const ORPHAN_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How a dispatch task ended.
pub(super) enum FireResult {
    Fired,
    Failed,
    Skipped,
    Unsettled,
    /// The attempt failed and is tried again later under its routine's retry policy.
    Retrying,
}

/// Notes on a still-held claim why its attempt ends without settling; a failure to note is
/// logged and otherwise ignored (the claim is the reaper's either way).
pub(super) async fn note_unsettled(ledger: &dyn FireLedger, fire: &FireRef, why: String) {
    if let Err(e) = ledger.note_unsettled(fire, &ErrorText::new(why)).await {
        debug!(error = %e, routine_id = %fire.occurrence.routine_id,
            "could not note why the attempt ended unsettled");
    }
}

/// A panic's message, when it has one.
pub(super) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_string()
    }
}

/// Why a settle was not written, for its span (`None`: it was).
pub(super) fn unwritten(completed: &Completed) -> Option<String> {
    match completed {
        Completed::Settled | Completed::Retrying { .. } => None,
        Completed::NotHeld => Some("the claim was taken over after its lease ran out".into()),
        Completed::RoutineDeleted => Some("the routine was deleted".into()),
        Completed::Unwritten(reason) => Some(reason.to_string()),
    }
}

/// Counts and logs what a completer did with one settle; returns whether the row was settled.
pub(super) fn completed(fire: &ClaimedFire, completed: Completed, stats: &Stats) -> bool {
    match completed {
        Completed::Settled => true,
        Completed::Retrying { .. } => false,
        Completed::NotHeld => {
            warn!(routine_id = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                attempt = fire.row.attempt,
                "settle matched nothing: the claim was taken over after its lease ran out");
            add(&stats.lost_settles, 1);
            false
        }
        Completed::RoutineDeleted => {
            info!(routine_id = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                "the routine was deleted while its occurrence was dispatched; nothing to settle");
            add(&stats.lost_settles, 1);
            false
        }
        Completed::Unwritten(reason) => {
            error!(routine_id = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                error = %reason, "settle failed; the reaper will retry this occurrence after its lease");
            add(&stats.settle_errors, 1);
            false
        }
    }
}

impl FireJob {
    pub(super) async fn fire(
        mut self,
        fire: ClaimedFire,
        attempt: u32,
        lateness: Duration,
    ) -> FireResult {
        let dispatch = Dispatch::new(
            fire.occurrence,
            fire.routine_name.clone(),
            fire.kind,
            fire.payload.clone(),
            attempt,
            self.deadline.into_std(),
        )
        .with_first_attempt_age(self.first_claimed.map_or(Duration::MAX, |at| at.elapsed()))
        .with_retry(fire.retry);
        // Lateness is judged for scheduled fires only: a backfill of last week is not late.
        if fire.origin == FireOrigin::Schedule {
            self.stats.lateness.observe(lateness);
        }
        let before = match self
            .runs
            .as_ref()
            .filter(|_| fire.kind == RoutineKind::Mission)
        {
            Some(runs) => runs.before_launch(fire.occurrence, dispatch.deadline).await,
            None => Ok(BeforeLaunch::Launch),
        };
        let (settlement, receipt) = match before {
            Ok(BeforeLaunch::Launch) => {
                let launching = match self.launch_ticket.take() {
                    Some(ticket) => Some(ticket.admit().await),
                    None => None,
                };
                let began = SystemTime::now();
                let launched = self.launch(&fire, &dispatch, attempt, lateness).await;
                drop(launching);
                if let Some(trace) = &mut self.trace {
                    let error = match &launched {
                        Ok((Settlement::Failed(e), _)) => Some(e.as_str().to_string()),
                        Ok(_) => None,
                        Err(_) => Some("the outcome was left open for the next attempt".into()),
                    };
                    trace.dispatched(began, error);
                }
                match launched {
                    Ok(ended) => ended,
                    Err(unsettled) => return unsettled,
                }
            }
            Ok(BeforeLaunch::Settle(settlement)) => {
                info!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at,
                    reason = settlement.error().unwrap_or(""), "mission not launched");
                (settlement, None)
            }
            Ok(BeforeLaunch::Gone) => {
                info!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at,
                    "the routine was deleted (or the claim settled) before its mission launched; nothing launched");
                add(&self.stats.lost_settles, 1);
                return FireResult::Unsettled;
            }
            Err(e) => {
                // Nothing was launched: leave the claim for a retry after its lease.
                warn!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt, error = %e,
                    "cannot take the mission's run; the reaper will retry this occurrence after its lease");
                add(&self.stats.left_for_retry, 1);
                let why = format!("taking the mission's run hit a database error: {e}");
                note_unsettled(&*self.ledger, &fire.fire_ref(), why).await;
                return FireResult::Unsettled;
            }
        };
        let failed = matches!(settlement, Settlement::Failed(_));
        let failure = settlement.error().unwrap_or_default().to_owned();
        let skipped = matches!(settlement, Settlement::Skipped(_));
        let unsettled = match &settlement {
            Settlement::Fired => "dispatched, but the settle was not written".to_string(),
            Settlement::Failed(e) | Settlement::Skipped(e) => {
                format!("{}; the settle was not written", e.as_str())
            }
        };
        let traced_end = self.trace.as_ref().map(|_| match &settlement {
            Settlement::Fired => ("fired", None),
            Settlement::Failed(e) => ("failed", Some(e.as_str().to_string())),
            Settlement::Skipped(e) => ("skipped", Some(e.as_str().to_string())),
        });
        let settle = FireSettle {
            fire: fire.fire_ref(),
            settlement,
            receipt,
        };
        let began = SystemTime::now();
        let outcome = self.completer.complete(settle).await;
        if let Some(trace) = &mut self.trace {
            trace.settled(began, unwritten(&outcome));
            if let (Some((name, error)), Completed::Settled) = (traced_end, &outcome) {
                trace.ended(name, error);
            }
        }
        if let Completed::Retrying { at } = outcome {
            info!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                scheduled_at = %fire.occurrence.scheduled_at, attempt, retry_at = %at,
                error = failure.as_str(), "the attempt failed; its routine's retry policy tries it again");
            add(&self.stats.retrying, 1);
            self.retries.due_at(at);
            return FireResult::Retrying;
        }
        let unwritten = matches!(outcome, Completed::Unwritten(_));
        let deleted = matches!(outcome, Completed::RoutineDeleted);
        if deleted && !failed && !skipped {
            // The routine went while its mission launched: nothing would watch the run, so it
            // is stopped now.
            self.stop_orphan(&fire).await;
        }
        if !completed(&fire, outcome, &self.stats) {
            if unwritten {
                // Most often the database is still away and this fails too; when it is back,
                // the next attempt's abandon, if any, can say what this one met.
                note_unsettled(&*self.ledger, &fire.fire_ref(), unsettled).await;
            }
            return FireResult::Unsettled;
        }
        if failed {
            add(&self.stats.failed, 1);
            FireResult::Failed
        } else if skipped {
            add(&self.stats.overlap_skipped, 1);
            FireResult::Skipped
        } else {
            // The runtime confirmed the launch, and this settle is the occurrence's only one
            // (fenced): its run is counted `running` once, and the fire by its run's outcome
            // when the run ends.
            if fire.kind == RoutineKind::Mission && self.runs.is_some() {
                self.stats.run_reached(cm_domain::RunStateName::Running);
            } else {
                add(&self.stats.fired, 1);
            }
            FireResult::Fired
        }
    }

    /// Stops the run of a mission whose routine was deleted while it launched.
    async fn stop_orphan(&self, fire: &ClaimedFire) {
        let Some(runs) = self
            .runs
            .as_ref()
            .filter(|_| fire.kind == RoutineKind::Mission)
        else {
            return;
        };
        let run = cm_dispatch::RunRef::named(fire.occurrence.run_name(fire.retry));
        let deadline = Instant::now() + ORPHAN_STOP_TIMEOUT;
        match tokio::time::timeout(ORPHAN_STOP_TIMEOUT, runs.runtime.stop(&run, deadline)).await {
            Ok(Ok(())) => info!(routine_id = %fire.occurrence.routine_id, run = %run.name,
                "stopped the mission of a deleted routine"),
            Ok(Err(e)) => warn!(routine_id = %fire.occurrence.routine_id, run = %run.name,
                error = %e, "cannot stop the mission of a deleted routine"),
            Err(_) => warn!(routine_id = %fire.occurrence.routine_id, run = %run.name,
                "stopping the mission of a deleted routine timed out"),
        }
    }

    /// Dispatches under the deadline: the settlement and receipt, or the result of a dispatch
    /// left for a retry.
    async fn launch(
        &self,
        fire: &ClaimedFire,
        dispatch: &Dispatch,
        attempt: u32,
        lateness: Duration,
    ) -> Result<(Settlement, Option<String>), FireResult> {
        Ok(
            match tokio::time::timeout_at(self.deadline, self.dispatcher.dispatch(dispatch)).await {
                Ok(Ok(receipt)) => {
                    info!(target: FIRES, routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt,
                    lateness_ms = lateness.as_millis() as u64, duplicate = receipt.duplicate,
                    detail = %receipt.detail, "fired");
                    (Settlement::Fired, Some(receipt.detail))
                }
                Ok(Err(e)) if e.is_transient_store_error() => {
                    // cm's own database failed, not the target: leave the claim for a retry
                    // after its lease instead of settling the occurrence failed.
                    warn!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt, error = %e,
                    "dispatch hit a database error; the reaper will retry this occurrence after its lease");
                    add(&self.stats.left_for_retry, 1);
                    let why = format!("the dispatch hit a database error: {e}");
                    note_unsettled(&*self.ledger, &fire.fire_ref(), why).await;
                    return Err(FireResult::Unsettled);
                }
                Ok(Err(e)) if let Some(open) = outcome_left_open(&e, attempt, fire.retry_began) => {
                    // Settling `failed` what may be delivered could leave a mission running
                    // under a failed row. Leave it for the next attempt, which finds what this
                    // one did by the occurrence's name (bounded by the attempt limit, past which
                    // it is abandoned with its reason).
                    warn!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt, error = %e,
                    "{open}; leaving it for the next attempt");
                    add(&self.stats.left_for_retry, 1);
                    note_unsettled(&*self.ledger, &fire.fire_ref(), format!("{open}: {e}")).await;
                    return Err(FireResult::Unsettled);
                }
                Ok(Err(e)) => {
                    warn!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt, error = %e, "dispatch failed");
                    (Settlement::Failed(ErrorText::new(e.to_string())), None)
                }
                Err(_) => {
                    warn!(routine = %fire.routine_name, scheduled_at = %fire.occurrence.scheduled_at,
                    attempt, timeout = ?self.budget, "dispatch timed out");
                    (
                        Settlement::Failed(ErrorText::new(format!(
                            "dispatch timed out after {}",
                            humantime::format_duration(self.budget)
                        ))),
                        None,
                    )
                }
            },
        )
    }
}

/// Why a failed dispatch leaves its occurrence's outcome open, if it does: the target did not
/// confirm a dispatch it may have taken (a container created, its start unanswered), or a
/// taken-over claim, whose claimant stopped before settling perhaps after the target took the
/// occurrence, found the target unavailable (which does not say the first attempt failed).
/// The first attempt of a retry (`began`, after a failure its routine's retry policy tries
/// again) took over no claimant's: the attempt before it is known to have failed.
fn outcome_left_open(e: &DispatchError, attempt: u32, began: u32) -> Option<&'static str> {
    match e {
        DispatchError::Unconfirmed(_) => Some("the target did not confirm the dispatch"),
        DispatchError::Unavailable(_) if attempt > began => {
            Some("a retried dispatch found the target unavailable")
        }
        _ => None,
    }
}
