//! The tick loop: claim what is due, dispatch it under a timeout, settle it; and the reaper.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cm_dispatch::{Dispatch, Dispatcher};
use cm_domain::{
    ClaimAction, ClaimOutcome, ConfigError, ErrorText, MisfireRules, SchedulerConfig, Settlement,
};
use cm_store::{
    ClaimDueParams, ClaimedFire, FireLedger, OutboxConsumer, ReapParams, StoreError, TickClaim,
};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::stats::{Stats, add};

/// Why a tick or reaper pass failed. The loop logs it, counts it and keeps it for health; the
/// next tick tries again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TickError {
    /// The claim (or reaper) transaction failed; nothing was claimed.
    #[error("claim failed: {0}")]
    Claim(#[source] StoreError),
}

/// What one tick (or reaper pass) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Occurrences dispatched and settled `fired`.
    pub fired: usize,
    /// Occurrences settled `failed` (dispatch error or timeout).
    pub failed: usize,
    /// Occurrences settled `failed` without dispatch after too many crashed attempts.
    pub abandoned: usize,
    /// Claims another live scheduler holds.
    pub in_flight: usize,
    /// Claims found already settled.
    pub already_settled: usize,
    /// Dispatches whose settle matched nothing (the claim was taken over) or failed to write.
    pub unsettled: usize,
    /// Occurrences the cap deferred.
    pub deferred: usize,
    /// Misfires skipped by policy.
    pub skipped: u64,
}

/// What a run did, returned when it stops. Errors are counted here as well as logged, so a
/// caller can tell a scheduler that stopped firing from one with nothing to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Ticks run.
    pub ticks: u64,
    /// Ticks and reaper passes that failed.
    pub tick_errors: u64,
    /// The latest of those errors.
    pub last_error: Option<String>,
    /// Occurrences settled `fired`.
    pub fired: u64,
    /// Occurrences settled `failed`.
    pub failed: u64,
}

/// One scheduler instance: a ledger, a dispatcher, validated settings and an instance id.
pub struct Scheduler {
    ledger: Arc<dyn FireLedger>,
    dispatcher: Arc<dyn Dispatcher>,
    config: SchedulerConfig,
    instance_id: String,
    stats: Arc<Stats>,
    outbox: Option<Arc<dyn OutboxConsumer>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("instance_id", &self.instance_id)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A process-unique instance id: `cm-<pid>-<8 random hex digits>`.
pub fn default_instance_id() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("cm-{}-{}", std::process::id(), &random[..8])
}

impl Scheduler {
    /// A scheduler; refuses settings under which a dispatch could outlive its lease.
    pub fn new(
        ledger: Arc<dyn FireLedger>,
        dispatcher: Arc<dyn Dispatcher>,
        config: SchedulerConfig,
        instance_id: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        Ok(Scheduler {
            ledger,
            dispatcher,
            config: config.validate()?,
            instance_id: instance_id.into(),
            stats: Arc::new(Stats::default()),
            outbox: None,
        })
    }

    /// The same scheduler, also pruning outbox messages acknowledged longer than the retention
    /// ago in its prune pass.
    pub fn with_outbox_pruning(mut self, outbox: Arc<dyn OutboxConsumer>) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// The instance id written on this scheduler's claims.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The settings.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The counters, shared with whoever serves metrics and health.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// One tick: claim what is due (at most the cap), dispatch it, settle it.
    pub async fn tick(&self) -> Result<TickReport, TickError> {
        let started = Instant::now();
        add(&self.stats.ticks, 1);
        let params = ClaimDueParams {
            claimant: self.instance_id.clone(),
            lease: self.config.lease,
            cap: self.config.max_fires_per_tick,
            rules: MisfireRules::from(&self.config),
            // Lock a few more routines than the cap, so a routine whose occurrences are all
            // deferred does not crowd out the oldest work of others.
            max_routines: u32::try_from(self.config.max_fires_per_tick.get() * 4)
                .unwrap_or(u32::MAX),
        };
        let claim = self
            .ledger
            .claim_due(&params)
            .await
            .map_err(TickError::Claim)?;
        let report = self.process(claim).await;
        self.stats.tick_duration.observe(started.elapsed());
        Ok(report)
    }

    /// One reaper pass: take over claims whose lease ran out (their claimant crashed) and fire
    /// them again, or abandon those that crashed too often.
    pub async fn reap(&self) -> Result<TickReport, TickError> {
        let params = ReapParams {
            claimant: self.instance_id.clone(),
            lease: self.config.lease,
            limit: u32::try_from(self.config.max_fires_per_tick.get()).unwrap_or(u32::MAX),
        };
        let claim = self
            .ledger
            .reap_expired(&params)
            .await
            .map_err(TickError::Claim)?;
        add(&self.stats.reaped, claim.fires.len() as u64);
        for fire in &claim.fires {
            warn!(
                routine = %fire.occurrence.routine_id,
                scheduled_at = %fire.occurrence.scheduled_at,
                attempt = fire.row.attempt,
                "took over an expired claim (its claimant stopped before settling)"
            );
        }
        Ok(self.process(claim).await)
    }

    /// Dispatches and settles what a claim returned.
    async fn process(&self, claim: TickClaim) -> TickReport {
        let mut report = TickReport {
            deferred: claim.deferred,
            skipped: claim.skipped,
            ..TickReport::default()
        };
        add(&self.stats.deferred, claim.deferred as u64);
        add(&self.stats.skipped, claim.skipped);
        if claim.deferred > 0 {
            warn!(
                deferred = claim.deferred,
                cap = self.config.max_fires_per_tick.get(),
                "more occurrences due than the per-tick cap; the rest are deferred to the next tick"
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

        let mut dispatches = JoinSet::new();
        for fire in claim.fires {
            let outcome = fire.outcome(claim.token);
            match outcome.action(self.config.max_attempts) {
                ClaimAction::Dispatch { attempt } => {
                    let lateness = (claim.now - fire.occurrence.scheduled_at)
                        .to_std()
                        .unwrap_or_default();
                    let timeout = self.dispatch_budget(claim.began);
                    if timeout.is_zero() {
                        // The claim itself used up the lease: dispatching now could outlive it.
                        // Leave the row claimed; the reaper retries it once the lease is over.
                        warn!(routine_id = %fire.occurrence.routine_id,
                            scheduled_at = %fire.occurrence.scheduled_at,
                            "no lease left to dispatch in; leaving the occurrence to the reaper");
                        add(&self.stats.unstarted, 1);
                        report.unsettled += 1;
                        continue;
                    }
                    let job = FireJob {
                        ledger: self.ledger.clone(),
                        dispatcher: self.dispatcher.clone(),
                        timeout,
                        stats: self.stats.clone(),
                    };
                    dispatches.spawn(async move { job.fire(fire, attempt, lateness).await });
                }
                ClaimAction::Abandon { reason } => {
                    error!(routine = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                        %reason, "occurrence abandoned");
                    let settled = settle(&*self.ledger, &fire, &Settlement::Failed(reason)).await;
                    if settled == Settled::Yes {
                        add(&self.stats.abandoned, 1);
                        report.abandoned += 1;
                    } else {
                        report.unsettled += 1;
                    }
                }
                ClaimAction::Leave => match outcome {
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
        while let Some(result) = dispatches.join_next().await {
            match result {
                Ok(FireResult::Fired) => report.fired += 1,
                Ok(FireResult::Failed) => report.failed += 1,
                Ok(FireResult::Unsettled) => report.unsettled += 1,
                Err(e) => {
                    // A panic in a backend: the claim stays `claimed` and the reaper retries it
                    // after the lease, like a crash.
                    error!(error = %e, "a dispatch task panicked");
                    add(&self.stats.dispatch_panics, 1);
                    report.unsettled += 1;
                }
            }
        }
        report
    }

    /// Deletes settled fires older than the retention, a bounded batch per pass so a large
    /// backlog of old rows never makes one pass long. Returns whether the pass succeeded.
    async fn prune(&self) -> bool {
        if let Some(outbox) = &self.outbox
            && let Err(e) = outbox.outbox_prune_acked(self.config.retention, 1000).await
        {
            error!(error = %e, "pruning acknowledged outbox messages failed");
            self.stats
                .tick_failed(format!("pruning the outbox failed: {e}"));
            return false;
        }
        match self.ledger.prune_settled(self.config.retention, 1000).await {
            Ok(pruned) => {
                add(&self.stats.pruned, pruned);
                if pruned > 0 {
                    debug!(pruned, "pruned settled fires past their retention");
                }
                true
            }
            Err(e) => {
                error!(error = %e, "pruning settled fires failed");
                self.stats.tick_failed(format!("pruning failed: {e}"));
                false
            }
        }
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

    /// Runs ticks every tick interval, and the reaper every half lease, until `shutdown`
    /// completes; then finishes and settles what is in flight and returns what it did.
    ///
    /// A failing tick never ends the loop: its error is logged, counted, kept for health and
    /// reported in the summary, and the next tick tries again (the database may come back).
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> RunSummary {
        // Ticks are aligned to multiples of the interval on the wall clock, a few milliseconds
        // after the boundary: occurrences fall on whole seconds, so an aligned tick finds them
        // due at once instead of up to one interval late.
        let first_tick = tokio::time::Instant::now() + until_aligned(self.config.tick_interval);
        let mut interval = tokio::time::interval_at(first_tick, self.config.tick_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reap_every = (self.config.lease.duration() / 2).max(self.config.tick_interval);
        let mut last_reap: Option<Instant> = None;
        tokio::pin!(shutdown);
        info!(instance = %self.instance_id, tick = ?self.config.tick_interval,
            cap = self.config.max_fires_per_tick.get(), lease = ?self.config.lease.duration(),
            "scheduler running");
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = interval.tick() => {}
            }
            // A tick is not cancelled by shutdown: its dispatches are bounded by the dispatch
            // timeout, and finishing them means settling them instead of leaving them to a
            // reaper.
            let mut ok = self.record(self.tick().await, "tick");
            if last_reap.is_none_or(|at| at.elapsed() >= reap_every) {
                ok &= self.record(self.reap().await, "reaper pass");
                ok &= self.prune().await;
                last_reap = Some(Instant::now());
            }
            if ok {
                self.stats.tick_succeeded();
            }
        }
        info!(instance = %self.instance_id, "scheduler stopped: nothing left in flight");
        RunSummary {
            ticks: Stats::get(&self.stats.ticks),
            tick_errors: Stats::get(&self.stats.tick_errors),
            last_error: self.stats.last_error(),
            fired: Stats::get(&self.stats.fired),
            failed: Stats::get(&self.stats.failed),
        }
    }

    fn record(&self, result: Result<TickReport, TickError>, what: &str) -> bool {
        match result {
            Ok(report) => {
                if report != TickReport::default() {
                    debug!(?report, "{what} done");
                }
                true
            }
            Err(e) => {
                error!(error = %e, "{what} failed");
                self.stats.tick_failed(format!("{what} failed: {e}"));
                false
            }
        }
    }

    /// Runs the loop on the runtime until `shutdown` completes. The handle yields the summary,
    /// errors included: nothing the loop meets is dropped.
    pub fn spawn(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<RunSummary> {
        tokio::spawn(async move { self.run(shutdown).await })
    }
}

/// How long until the next multiple of `interval` on the wall clock, plus a small margin.
fn until_aligned(interval: Duration) -> Duration {
    const MARGIN: Duration = Duration::from_millis(5);
    let period = interval.as_nanos().max(1);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let wait = period - since_epoch % period;
    Duration::from_nanos(u64::try_from(wait).unwrap_or(0)) + MARGIN
}

/// What one dispatch task needs, cloned out of the scheduler so the task is `'static`.
struct FireJob {
    ledger: Arc<dyn FireLedger>,
    dispatcher: Arc<dyn Dispatcher>,
    timeout: Duration,
    stats: Arc<Stats>,
}

enum FireResult {
    Fired,
    Failed,
    Unsettled,
}

#[derive(PartialEq, Eq)]
enum Settled {
    Yes,
    Lost,
    Error,
}

impl FireJob {
    async fn fire(self, fire: ClaimedFire, attempt: u32, lateness: Duration) -> FireResult {
        let dispatch = Dispatch::new(
            fire.occurrence,
            fire.routine_name.clone(),
            fire.kind,
            fire.payload.clone(),
            attempt,
            Instant::now() + self.timeout,
        );
        self.stats.lateness.observe(lateness);
        let settlement = match tokio::time::timeout(
            self.timeout,
            self.dispatcher.dispatch(&dispatch),
        )
        .await
        {
            Ok(Ok(receipt)) => {
                info!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt,
                    lateness_ms = lateness.as_millis() as u64, duplicate = receipt.duplicate,
                    detail = %receipt.detail, "fired");
                Settlement::Fired
            }
            Ok(Err(e)) => {
                warn!(routine = %fire.routine_name, routine_id = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at, attempt, error = %e, "dispatch failed");
                Settlement::Failed(ErrorText::new(e.to_string()))
            }
            Err(_) => {
                warn!(routine = %fire.routine_name, scheduled_at = %fire.occurrence.scheduled_at,
                    attempt, timeout = ?self.timeout, "dispatch timed out");
                Settlement::Failed(ErrorText::new(format!(
                    "dispatch timed out after {}",
                    humantime::format_duration(self.timeout)
                )))
            }
        };
        match settle(&*self.ledger, &fire, &settlement).await {
            Settled::Yes => match settlement {
                Settlement::Fired => {
                    add(&self.stats.fired, 1);
                    FireResult::Fired
                }
                Settlement::Failed(_) => {
                    add(&self.stats.failed, 1);
                    FireResult::Failed
                }
            },
            Settled::Lost => {
                add(&self.stats.lost_settles, 1);
                FireResult::Unsettled
            }
            Settled::Error => {
                add(&self.stats.settle_errors, 1);
                FireResult::Unsettled
            }
        }
    }
}

/// Settles a claim, retrying a failed write a few times: an unsettled claim is retried by the
/// reaper after its lease, which the backend's idempotency key makes safe but costs a dispatch.
async fn settle(ledger: &dyn FireLedger, fire: &ClaimedFire, settlement: &Settlement) -> Settled {
    let fire_ref = fire.fire_ref();
    let mut backoff = Duration::from_millis(100);
    for attempt in 1..=3 {
        match ledger.settle_fire(&fire_ref, settlement).await {
            Ok(true) => return Settled::Yes,
            Ok(false) => {
                warn!(routine_id = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                    attempt = fire.row.attempt,
                    "settle matched nothing: the claim was taken over after its lease ran out");
                return Settled::Lost;
            }
            Err(e) if attempt < 3 => {
                warn!(error = %e, "settle failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(e) => {
                error!(routine_id = %fire.occurrence.routine_id, scheduled_at = %fire.occurrence.scheduled_at,
                    error = %e, "settle failed; the reaper will retry this occurrence after its lease");
            }
        }
    }
    Settled::Error
}
