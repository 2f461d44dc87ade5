//! What each occurrence a claim returned becomes: a dispatch started in one of the claim's
//! places under a deadline inside its lease, an abandon after too many attempts, or a count
//! (settled in the claim, in flight elsewhere, already settled).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use cm_domain::trace::TraceParent;
use cm_domain::{ClaimAction, ClaimOutcome, FireOrigin, FireStatus, Settlement};
use cm_store::{FireSettle, StoreError, TickClaim};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use super::fire_job::{FireJob, FireResult, completed, note_unsettled, panic_text, unwritten};
use super::room::Places;
use super::{FIRES, Scheduler, TickError, TickReport};
use crate::completer::Completer;
use crate::counters::add;
use crate::traces::{AttemptFacts, ClaimWindow};

/// Runs one claim statement (a claim of what is due, or a takeover of expired claims), noting
/// when it ran on the wall clock: what it took, and its window.
pub(super) async fn timed_claim(
    claim: impl Future<Output = Result<TickClaim, StoreError>>,
) -> Result<(TickClaim, ClaimWindow), TickError> {
    let began = SystemTime::now();
    let claim = claim.await.map_err(TickError::Claim)?;
    let window = ClaimWindow {
        began,
        ended: SystemTime::now(),
        fires: claim.fires.len(),
    };
    Ok((claim, window))
}

impl Scheduler {
    /// Acts on what a claim returned: counts what the claim settled itself, starts a dispatch
    /// for each occurrence to fire in the `places` held for the claim, abandons those that
    /// crashed too often, leaves the rest. The places left over go back to the in-flight room.
    pub(super) async fn start(
        &self,
        claim: TickClaim,
        window: ClaimWindow,
        completer: &Arc<dyn Completer>,
        mut wait: Option<&mut JoinSet<FireResult>>,
        mut places: Places,
    ) -> TickReport {
        let mut report = TickReport {
            deferred: claim.deferred,
            held: claim.held,
            skipped: claim.skipped,
            ..TickReport::default()
        };
        add(&self.stats.deferred, claim.deferred as u64);
        add(&self.stats.skipped, claim.skipped);
        if claim.deferred > 0 {
            debug!(
                deferred = claim.deferred,
                more_due = claim.more_due,
                "more occurrences due than one claim takes; claiming again"
            );
        }
        if claim.held > 0 {
            debug!(
                held = claim.held,
                "missions past the launch rate left unclaimed until it has room"
            );
        }
        if claim.skipped > 0 {
            info!(
                skipped = claim.skipped,
                "misfires skipped by their routines' policies"
            );
        }
        for unusable in &claim.unusable {
            error!(routine = %unusable.routine_id, reason = %unusable.reason,
                "routine paused: its stored schedule or policy cannot be read");
        }

        let mut dispatching = 0usize;
        // The traces of fires written in the claim, recorded off the tick (below).
        let mut settled_in_claim = Vec::new();
        let oldest = claim.fires.iter().map(|f| f.planned_at).min();
        for fire in claim.fires {
            let outcome = fire.outcome(claim.token);
            // From when the occurrence came due: its instant, or later by its jitter.
            let lateness = (claim.now - fire.planned_at).to_std().unwrap_or_default();
            // Lateness is judged for scheduled fires only: a backfill of last week is not late.
            let scheduled = fire.origin == FireOrigin::Schedule;
            let action = outcome.action_after_retries(self.config.max_attempts, fire.retry);
            let trace = |attempt: u32| {
                self.traces.as_ref().map(|traces| {
                    traces.attempt(
                        AttemptFacts {
                            traceparent: TraceParent::for_attempt(&fire.occurrence, attempt),
                            routine_id: fire.occurrence.routine_id,
                            routine_name: fire.routine_name.clone(),
                            kind: fire.kind,
                            scheduled_at: fire.occurrence.scheduled_at,
                            attempt,
                        },
                        window,
                    )
                })
            };
            match action.with_last_error(fire.row.last_error.as_deref()) {
                ClaimAction::Dispatch { attempt } => {
                    // The claim's places were taken before it. Only an occurrence it did not
                    // count waits for one: a crashed claim of a kind written in the claim,
                    // taken over by it, which is rare, and which a place frees for quickly.
                    let permit = match places.one() {
                        Some(permit) => permit,
                        None => match self.room.clone().acquire_owned().await {
                            Ok(permit) => permit,
                            Err(_) => continue,
                        },
                    };
                    let budget = self.dispatch_budget(claim.began);
                    if budget.is_zero() {
                        // The claim itself used up the lease: dispatching now could outlive it.
                        // Leave the row claimed; the reaper retries it once the lease is over.
                        warn!(routine_id = %fire.occurrence.routine_id,
                            scheduled_at = %fire.occurrence.scheduled_at,
                            "no lease left to dispatch in; leaving the occurrence to the reaper");
                        let why = format!(
                            "not dispatched: the claim took {} of its lease",
                            humantime::format_duration(claim.began.elapsed())
                        );
                        note_unsettled(&*self.ledger, &fire.fire_ref(), why).await;
                        add(&self.stats.unstarted, 1);
                        report.unsettled += 1;
                        continue;
                    }
                    dispatching += 1;
                    // The deadline is fixed here, where the budget was counted: the task that
                    // dispatches may first run later, and that wait comes out of the budget.
                    let job = FireJob {
                        dispatcher: self.dispatcher.clone(),
                        completer: completer.clone(),
                        ledger: self.ledger.clone(),
                        budget,
                        deadline: tokio::time::Instant::now() + budget,
                        // The database's clock says how long before the claim the first
                        // attempt's claim was; unknown or before this process, long ago.
                        first_claimed: claim.began.checked_sub(
                            (claim.now - fire.first_claimed_at)
                                .to_std()
                                .unwrap_or_default(),
                        ),
                        stats: self.stats.clone(),
                        runs: self.runs.clone(),
                        retries: self.retries.clone(),
                        launch_ticket: self.launch_ticket(fire.kind),
                        trace: trace(attempt),
                    };
                    let stats = self.stats.clone();
                    let ledger = self.ledger.clone();
                    let task = async move {
                        let _permit = permit;
                        stats.dispatch_started();
                        let fire_ref = fire.fire_ref();
                        // The dispatch runs in a task of its own, so a backend that panics is
                        // seen here (its claim is retried after the lease, like a crash; the
                        // panic is kept on the row, for the abandon that may follow).
                        let result = match tokio::spawn(job.fire(fire, attempt, lateness)).await {
                            Ok(result) => result,
                            Err(e) => {
                                error!(error = %e, "a dispatch task panicked");
                                add(&stats.dispatch_panics, 1);
                                let why = match e.try_into_panic() {
                                    Ok(panic) => panic_text(&*panic),
                                    Err(e) => e.to_string(),
                                };
                                note_unsettled(
                                    &*ledger,
                                    &fire_ref,
                                    format!("the dispatch panicked: {why}"),
                                )
                                .await;
                                FireResult::Unsettled
                            }
                        };
                        stats.dispatch_ended();
                        result
                    };
                    match wait.as_deref_mut() {
                        Some(set) => {
                            set.spawn(task);
                        }
                        None => {
                            tokio::spawn(task);
                        }
                    }
                }
                ClaimAction::Abandon { reason } => {
                    error!(routine = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                        %reason, "occurrence abandoned");
                    let mut trace = trace(fire.row.attempt);
                    if let Some(trace) = &mut trace {
                        trace.ended("abandoned", Some(reason.as_str().to_string()));
                    }
                    let settle = FireSettle {
                        fire: fire.fire_ref(),
                        settlement: Settlement::Failed(reason),
                        receipt: None,
                    };
                    let began = SystemTime::now();
                    let completion = completer.complete(settle).await;
                    if let Some(trace) = &mut trace {
                        trace.settled(began, unwritten(&completion));
                    }
                    if completed(&fire, completion, &self.stats) {
                        add(&self.stats.abandoned, 1);
                        report.abandoned += 1;
                    } else {
                        report.unsettled += 1;
                    }
                }
                ClaimAction::Leave => match outcome {
                    ClaimOutcome::SettledInClaim(status) => {
                        if scheduled {
                            self.stats.lateness.observe(lateness);
                        }
                        info!(target: FIRES, routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                            scheduled_at = %fire.occurrence.scheduled_at,
                            lateness_ms = lateness.as_millis() as u64,
                            receipt = fire.receipt.as_deref().unwrap_or(""), "fired in the claim");
                        if let Some(mut trace) = trace(fire.row.attempt) {
                            trace.dispatched_in_claim();
                            match status {
                                FireStatus::Fired => trace.ended("fired", None),
                                _ => trace.ended("failed", fire.row.last_error.clone()),
                            }
                            settled_in_claim.push(trace);
                        }
                        if status == FireStatus::Fired {
                            add(&self.stats.fired, 1);
                            report.fired += 1;
                        } else {
                            add(&self.stats.failed, 1);
                            report.failed += 1;
                        }
                    }
                    ClaimOutcome::InFlight { claimant, .. } => {
                        debug!(routine = %fire.occurrence.routine_id, %claimant, "occurrence in flight elsewhere");
                        add(&self.stats.in_flight, 1);
                        report.in_flight += 1;
                    }
                    _ => {
                        add(&self.stats.already_settled, 1);
                        report.already_settled += 1;
                    }
                },
            }
        }
        if !settled_in_claim.is_empty() {
            // Their spans are built as they are dropped: on a blocking thread, not before the
            // next claim.
            tokio::task::spawn_blocking(move || drop(settled_in_claim));
        }
        if report.fired + dispatching > 0 {
            info!(
                fired_in_claim = report.fired,
                dispatching,
                deferred = report.deferred,
                oldest_lateness_ms = (claim.now - oldest.unwrap_or(claim.now)).num_milliseconds(),
                "claimed"
            );
        }
        report
    }

    /// How long a dispatch of a claim taken after `claimed_from` may run: the dispatch timeout,
    /// cut short if the claim's own processing has eaten into the lease, so a dispatch never
    /// outlives its lease even when a tick is slow. A margin is kept for the settle.
    fn dispatch_budget(&self, claimed_from: Instant) -> Duration {
        let lease = self.config.lease.duration();
        let margin = (lease / 10).min(Duration::from_secs(1));
        let left = lease
            .saturating_sub(claimed_from.elapsed())
            .saturating_sub(margin);
        self.config.dispatch_timeout.min(left)
    }
}
