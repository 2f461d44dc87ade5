//! The scheduler: ticks that claim what is due, dispatches that run beside them, a completer
//! that settles their results in batches, and the reaper.
//!
//! # Shape of a run
//!
//! ```text
//!   tick loop (every tick interval, aligned to the wall clock)
//!     claim ≤ min(batch, free room), again at once while full
//!                             ──▶ in-claim fires (outbox): settled in the claim itself
//!                                └──▶ dispatches ──▶ in-flight set (≤ max_in_flight) ──┐
//!   reaper loop (every half lease)                                                      │
//!     take expired claims over ────────────────▶ the same in-flight set ───────────────┤
//!                                                                                       ▼
//!                                                       completer: fenced settles, batched
//! ```
//!
//! A tick drains what is due: a claim that comes back full is followed at once by another
//! (resumed where the last one stopped in the due index, with a batch that grows fourfold up to
//! [`drain::DRAIN_BATCH_LIMIT`]), until nothing more is due, the in-flight room is full, or the
//! process is stopping; missions past the launch rate are left unclaimed for a later claim.
//! A tick never waits for the dispatches it starts: a target that takes the whole dispatch
//! timeout holds one place in the in-flight set, not the scheduler. A claim takes the places its
//! dispatches need out of the in-flight set before it is made (a reaper pass meanwhile cannot
//! take them) and claims no more than it holds; missions, scheduled or asked for by hand
//! (trigger, backfill), no more than the launch rate's second leaves either. So no claim waits
//! for room while its lease runs, a backfill of missions drains at the launch rate beside the
//! other routines instead of stalling the tick, and every dispatch runs under a timeout that
//! ends before its lease does, counted from before its claim began.
//!
//! # Where each part lives
//!
//! - here: [`Scheduler`], its construction and settings, and the whole passes
//!   ([`Scheduler::tick`], [`Scheduler::reap`]);
//! - `loops.rs`: [`Scheduler::run`], the tick loop and the loops beside it;
//! - `drain.rs`: a tick's claims, one after another while they come back full;
//! - `room.rs`: the in-flight places a claim takes before it is made;
//! - `launch_gate.rs`: the launch rate's gate for missions;
//! - `claimed.rs`: what each claimed occurrence becomes (a dispatch, an abandon, a count);
//! - `fire_job.rs`: one dispatch task, from the dispatch to its settle;
//! - `reaper.rs`: expired claims taken over;
//! - `maintenance.rs`: planning and pruning, in the groups this scheduler maintains.

mod claimed;
mod drain;
mod events;
mod fire_job;
mod launch_gate;
mod loops;
mod maintenance;
mod reaper;
mod retry_wake;
mod room;

pub use retry_wake::RetryWake;

use std::sync::Arc;
use std::time::Duration;

use cm_dispatch::Dispatcher;
use cm_domain::{ConfigError, SchedulerConfig};
use cm_store::{
    FireLedger, GroupDirectory, GroupId, InClaimWrites, OutboxConsumer, RoutineKind, StoreError,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::error;

use crate::autopause::AutoPause;
use crate::completer::{BatchCompleter, BatchOptions, Completer};
use crate::counters::Stats;
use crate::groups::GroupLeases;
use crate::outages::GroupOutages;
use crate::runs::RunWatch;
use crate::traces::FireTracer;

use drain::DrainPace;
pub use events::{
    DEADLINES_READ, EVENT_PASS, EventSink, MAX_BACKOFF, WebhookEventSink, event_data,
};
use fire_job::FireResult;
use launch_gate::LaunchWindow;
pub use maintenance::PRUNE_BATCH;

/// The log target of each fire's own line (at info): left out by the default filter, since a
/// busy scheduler fires thousands a second; `RUST_LOG=info` shows them.
pub const FIRES: &str = "cm_scheduler::fires";

/// How many routine groups a scheduler claims, takes expired claims over or maintains in at
/// once, claiming per group: a claim that waits on a slow or moving shard delays only its own
/// group. Four is under half the claims' pool of ten connections, leaving the rest to settles
/// and the passes beside the ticks.
pub const GROUP_WIDTH: usize = 4;

/// Why a tick or reaper pass failed. The loop logs it, counts it and keeps it for health; the
/// next tick tries again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TickError {
    /// The claim (or reaper) transaction failed; nothing was claimed.
    #[error("claim failed: {0}")]
    Claim(#[source] StoreError),
}

impl TickError {
    fn into_store(self) -> StoreError {
        match self {
            TickError::Claim(e) => e,
        }
    }
}

/// What one tick (or reaper pass) did.
///
/// From [`Scheduler::tick`], which waits for its dispatches, every field is final. Within
/// [`Scheduler::run`] a tick does not wait: its dispatches are counted in [`Stats`] as they
/// settle, and the report of the tick counts only what the claim itself settled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Occurrences settled `fired` (dispatched, or written in the claim itself).
    pub fired: usize,
    /// Occurrences settled `failed` (dispatch error or timeout).
    pub failed: usize,
    /// Occurrences settled `failed` without dispatch after too many crashed attempts.
    pub abandoned: usize,
    /// Claims another live scheduler holds.
    pub in_flight: usize,
    /// Claims found already settled.
    pub already_settled: usize,
    /// Claims left `claimed` for the reaper: the settle matched nothing (the claim was taken
    /// over, or its routine deleted) or could not be written, the lease was used up before the
    /// dispatch could start, or cm's own database failed during the dispatch.
    pub unsettled: usize,
    /// Occurrences the cap deferred.
    pub deferred: usize,
    /// Mission occurrences left unclaimed by the launch rate.
    pub held: usize,
    /// Claims the tick made (a full claim is followed by another at once).
    pub claims: usize,
    /// Misfires skipped by policy.
    pub skipped: u64,
    /// Missions settled `skipped`: an earlier run of their routine was still running.
    pub overlap_skipped: usize,
    /// Failed attempts left `claimed` for a retry under their routine's retry policy.
    pub retrying: usize,
}

impl TickReport {
    /// Adds another claim's report to this one.
    fn add(&mut self, other: &TickReport) {
        self.fired += other.fired;
        self.failed += other.failed;
        self.abandoned += other.abandoned;
        self.in_flight += other.in_flight;
        self.already_settled += other.already_settled;
        self.unsettled += other.unsettled;
        self.deferred += other.deferred;
        self.held += other.held;
        self.claims += other.claims;
        self.skipped += other.skipped;
        self.overlap_skipped += other.overlap_skipped;
        self.retrying += other.retrying;
    }
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
    /// Occurrences settled `fired` with no run to watch (messages, missions handed on).
    pub fired: u64,
    /// Occurrences that failed: failed dispatches and launched missions whose run failed.
    pub failed: u64,
    /// Launched missions whose run succeeded.
    pub succeeded: u64,
    /// Launched missions whose run was lost.
    pub lost: u64,
}

/// How a scheduler writes the ends of its dispatches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completion {
    /// Batched: many settles to one statement ([`BatchCompleter`]).
    #[default]
    Batched,
    /// One statement per settle, at once ([`crate::completer::InlineCompleter`]).
    Inline,
}

/// One scheduler instance: a ledger, a dispatcher, validated settings and an instance id.
pub struct Scheduler {
    ledger: Arc<dyn FireLedger>,
    dispatcher: Arc<dyn Dispatcher>,
    config: SchedulerConfig,
    instance_id: String,
    stats: Arc<Stats>,
    /// Room for dispatches in flight: one permit per running dispatch (`room.rs`).
    room: Arc<Semaphore>,
    /// The kinds the store settles inside the claim (their backend is database-local).
    in_claim: InClaimWrites,
    completion: Completion,
    /// Pauses failing routines beside the reaper (`autopause.rs`).
    auto_pause: Option<AutoPause>,
    /// Where routines written through SQL are planned (`maintenance.rs`).
    planning: Option<Arc<dyn cm_store::UnplannedRoutines>>,
    /// Where the prune pass also deletes acknowledged outbox messages (`maintenance.rs`).
    outbox: Option<Arc<dyn OutboxConsumer>>,
    /// The launch rate's gate for missions (`launch_gate.rs`).
    launches: Arc<LaunchWindow>,
    /// Mission runs watched after their launch (`runs.rs`).
    runs: Option<Arc<RunWatch>>,
    /// The retries this process decided, which wake its reaper when due (`retry_wake.rs`).
    retries: Arc<RetryWake>,
    secrets: Vec<String>,
    /// Claims per routine group, in the groups this scheduler leases (`groups.rs`); `None`
    /// claims across every group at once.
    groups: Option<Arc<GroupLeases>>,
    /// The groups whose passes fail now, claiming per group (`outages.rs`).
    outages: GroupOutages,
    /// How the drain sizes its claims, carried from tick to tick (`drain.rs`).
    pace: DrainPace,
    /// The supervisor told of readiness, the loop's liveness and the shutdown, if one listens.
    notifier: Option<crate::notify::Notifier>,
    /// Where each attempt's spans go (`--otlp-endpoint`), if anywhere.
    traces: Option<FireTracer>,
    /// The event log: missed deadlines raised, events delivered (`events.rs`).
    events: Option<events::EventWatch>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("instance_id", &self.instance_id)
            .field("config", &self.config)
            .field("in_claim", &self.in_claim)
            .field("completion", &self.completion)
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
        let config = config.validate()?;
        let in_claim = InClaimWrites {
            message: dispatcher.in_claim_effect(RoutineKind::Message),
            mission: dispatcher.in_claim_effect(RoutineKind::Mission),
        };
        Ok(Scheduler {
            ledger,
            dispatcher,
            room: Arc::new(Semaphore::new(config.max_in_flight)),
            config,
            instance_id: instance_id.into(),
            stats: Arc::new(Stats::default()),
            in_claim,
            completion: Completion::default(),
            auto_pause: None,
            planning: None,
            outbox: None,
            launches: Arc::default(),
            runs: None,
            retries: Arc::default(),
            secrets: Vec::new(),
            groups: None,
            outages: GroupOutages::default(),
            pace: DrainPace::default(),
            notifier: None,
            traces: None,
            events: None,
        })
    }

    /// The same scheduler telling a supervisor (systemd's notify socket) that it is ready after
    /// its first good tick, that its tick loop still turns, and that it is stopping; see
    /// [`crate::notify`].
    pub fn with_notifier(mut self, notifier: crate::notify::Notifier) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// The same scheduler recording each attempt's claim, dispatch and settle as OpenTelemetry
    /// spans with `traces` (see [`crate::traces`]).
    pub fn with_traces(mut self, traces: FireTracer) -> Self {
        self.traces = Some(traces);
        self
    }

    /// The same scheduler raising missed deadlines into `log` every second and, with a `sink`,
    /// delivering the events of the groups it holds there (see `engine/events.rs`).
    pub fn with_events(
        mut self,
        log: Arc<dyn cm_store::EventLog>,
        sink: Option<Arc<dyn EventSink>>,
    ) -> Self {
        self.events = Some(events::EventWatch::new(log, sink));
        self
    }

    /// The same scheduler writing settles the given way (batched by default).
    pub fn with_completion(mut self, completion: Completion) -> Self {
        self.completion = completion;
        self
    }

    /// The same scheduler, also pruning outbox messages acknowledged longer than the retention
    /// ago in its prune pass.
    pub fn with_outbox_pruning(mut self, outbox: Arc<dyn OutboxConsumer>) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// Plans, every tick interval (and at the start of every [`Scheduler::tick`]), the routines
    /// written through SQL (`cm.create_routine`): a valid one gets its first run, a refused one
    /// is paused with the reason, logged and counted (`cm_routines_planned_total`).
    pub fn with_planning(mut self, store: Arc<dyn cm_store::UnplannedRoutines>) -> Self {
        self.planning = Some(store);
        self
    }

    /// Pauses, in the loop's periodic maintenance, every routine whose last `after_failures`
    /// fires all failed (0: never), keeping the reason on the routine.
    pub fn with_auto_pause(
        mut self,
        store: Arc<dyn cm_store::FailingRoutines>,
        after_failures: u32,
    ) -> Self {
        self.auto_pause = (after_failures > 0).then_some(AutoPause {
            store,
            after_failures,
        });
        self
    }

    /// Watches every mission launched to its end: marks its run `running` before the launch,
    /// and asks `runtime` about the unfinished runs every tick interval (at least every second).
    pub fn with_run_watch(
        mut self,
        store: Arc<dyn cm_store::MissionRuns>,
        runtime: Arc<dyn cm_dispatch::MissionRuntime>,
    ) -> Self {
        self.runs = Some(Arc::new(RunWatch {
            store,
            runtime,
            secrets: self.secrets.clone(),
            retries: self.retries.clone(),
        }));
        self
    }

    /// Secrets of the scheduler's own (its database password, tokens) that are scrubbed from
    /// every run's output before it is kept; give them before [`Scheduler::with_run_watch`].
    pub fn with_secrets(mut self, secrets: Vec<String>) -> Self {
        self.secrets = secrets;
        self
    }

    /// The same scheduler claiming one routine group at a time: each tick claims in the groups
    /// it leases or nobody leases, [`GROUP_WIDTH`] side by side (a group whose last claim
    /// took nothing is first asked whether anything is due there), and so do the reaper and
    /// the maintenance passes (without the question); the
    /// leases, each lasting `lease`, are renewed and rebalanced every third of it beside the
    /// ticks (`groups.rs`). Every statement then names its group, which on Citus is one shard:
    /// a worker that is down fails only its own groups, logged once per outage (`outages.rs`).
    ///
    /// It does so where the schema is distributed (Citus), or always with `always`; on plain
    /// PostgreSQL a claim across every group is cheaper per occurrence, and the leases are
    /// still kept.
    pub fn with_groups(
        mut self,
        directory: Arc<dyn GroupDirectory>,
        always: bool,
        lease: Duration,
    ) -> Self {
        self.outages = GroupOutages::new(directory.clone());
        self.groups = Some(Arc::new(GroupLeases::new(
            directory,
            self.instance_id.clone(),
            lease,
            always,
        )));
        self
    }

    /// The groups to claim in and take expired claims over in, when this scheduler claims per
    /// group: those it leases and those nobody leases ([`GroupLeases::claimable`]); `None`
    /// when it claims across every group at once.
    async fn claim_groups(&self) -> Result<Option<Vec<GroupId>>, StoreError> {
        match &self.groups {
            Some(leases) if leases.per_group().await? => Ok(Some(leases.claimable().await?)),
            _ => Ok(None),
        }
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

    /// How many dispatches are running now.
    pub fn dispatches_in_flight(&self) -> usize {
        self.config.max_in_flight - self.room.available_permits()
    }

    fn completer(&self) -> (Arc<dyn Completer>, Option<crate::completer::CompleterTask>) {
        match self.completion {
            Completion::Batched => {
                let (completer, task) =
                    BatchCompleter::start(self.ledger.clone(), BatchOptions::default());
                (Arc::new(completer), Some(task))
            }
            Completion::Inline => (
                Arc::new(crate::completer::InlineCompleter::new(self.ledger.clone())),
                None,
            ),
        }
    }

    /// One tick, whole: claim what is due (at most the cap, and no more than there is room to
    /// start), dispatch it, and wait until every dispatch is settled.
    pub async fn tick(&self) -> Result<TickReport, TickError> {
        self.plan().await;
        self.whole_pass(Pass::Tick).await
    }

    /// One reaper pass, whole: take over claims whose lease ran out (their claimant crashed)
    /// and fire them again, or abandon those that crashed too often; wait until settled.
    pub async fn reap(&self) -> Result<TickReport, TickError> {
        self.whole_pass(Pass::Reap).await
    }

    /// Runs one pass with a completer of its own and waits for its dispatches and their
    /// settles, so the report is final.
    async fn whole_pass(&self, pass: Pass) -> Result<TickReport, TickError> {
        let (completer, task) = self.completer();
        let mut dispatches = JoinSet::new();
        let mut result = match pass {
            Pass::Tick => {
                self.claim_and_start(&completer, Some(&mut dispatches), None)
                    .await
            }
            Pass::Reap => self.reap_and_start(&completer, Some(&mut dispatches)).await,
        };
        if let Ok(report) = &mut result {
            collect(&mut dispatches, report).await;
        }
        drop(completer);
        if let Some(task) = task {
            task.finish().await;
        }
        result
    }
}

/// Which pass [`Scheduler::whole_pass`] runs.
enum Pass {
    Tick,
    Reap,
}

/// Joins the dispatches of a whole tick and adds their ends to its report.
async fn collect(dispatches: &mut JoinSet<FireResult>, report: &mut TickReport) {
    while let Some(result) = dispatches.join_next().await {
        match result {
            Ok(FireResult::Fired) => report.fired += 1,
            Ok(FireResult::Failed) => report.failed += 1,
            Ok(FireResult::Skipped) => report.overlap_skipped += 1,
            Ok(FireResult::Unsettled) => report.unsettled += 1,
            Ok(FireResult::Retrying) => report.retrying += 1,
            Err(e) => {
                // The wrapper itself never panics; a cancelled runtime ends it.
                error!(error = %e, "a dispatch task ended abnormally");
                report.unsettled += 1;
            }
        }
    }
}
