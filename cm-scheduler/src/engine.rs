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
//! [`DRAIN_BATCH_LIMIT`]), until nothing more is due, the in-flight room is full, or the
//! process is stopping; missions past the launch rate are left unclaimed for a later claim.
//! A tick never waits for the dispatches it starts: a target that takes the whole dispatch
//! timeout holds one place in the in-flight set, not the scheduler. A claim takes the places its
//! dispatches need out of the in-flight set before it is made (a reaper pass meanwhile cannot
//! take them) and claims no more than it holds; missions, scheduled or asked for by hand
//! (trigger, backfill), no more than the launch rate's second leaves either. So no claim waits
//! for room while its lease runs, a backfill of missions drains at the launch rate beside the
//! other routines instead of stalling the tick, and every dispatch runs under a timeout that
//! ends before its lease does, counted from before its claim began.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cm_dispatch::{Dispatch, DispatchError, Dispatcher};
use cm_domain::trace::TraceParent;
use cm_domain::{
    ClaimAction, ClaimOutcome, ConfigError, ErrorText, FireCap, FireOrigin, FireStatus,
    MisfireRules, SchedulerConfig, Settlement,
};
use cm_store::{
    ClaimDueParams, ClaimedFire, DueCursor, FireLedger, FireRef, FireSettle, GroupDirectory,
    GroupId, InClaimWrites, OutboxConsumer, ReapParams, RoutineKind, StoreError, TickClaim,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, watch};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use crate::autopause::AutoPause;
use crate::completer::{BatchCompleter, BatchOptions, Completed, Completer};
use crate::groups::GroupLeases;
use crate::outages::{GroupOutages, each_group};
use crate::runs::{BeforeLaunch, RunWatch};
use crate::stats::{Stats, add};
use crate::traces::{AttemptFacts, AttemptTrace, ClaimWindow, FireTracer};

/// How many rows one prune statement deletes (settled fires, or acknowledged outbox messages).
/// Measured by `cargo xtask scale` (docs/BENCHMARKS.md, "Scale"): a batch of this size is
/// deleted in a fraction of a second, and batches repeat while they come back full, so a pass
/// deletes far more rows a second than the engine fires.
pub const PRUNE_BATCH: u32 = 10_000;

/// The log target of each fire's own line (at info): left out by the default filter, since a
/// busy scheduler fires thousands a second; `RUST_LOG=info` shows them.
pub const FIRES: &str = "cm_scheduler::fires";

/// The largest batch one claim of a drain takes (or the cap, if larger). A tick's first claim
/// takes the cap, or twice what the previous tick claimed if that was more than the cap (up to
/// this bound); each claim that comes back full multiplies the next one's batch by
/// [`DRAIN_BATCH_GROWTH`] up to this bound, so a burst is drained in transactions large enough
/// to keep the database busy (measured in docs/BENCHMARKS.md, "Fast by default") while each
/// stays short: a claim of this many occurrences commits in tens of milliseconds.
pub const DRAIN_BATCH_LIMIT: usize = 1_000;

/// How much each claim of a drain that comes back full grows the next one's batch: from the
/// default cap of 25 the batches are 25, 100, 400 and then [`DRAIN_BATCH_LIMIT`], the fourth
/// claim, where doubling reached it at the seventh, each claim paying its round trips and its
/// commit: on a 2-core machine a claim of 25 took about 14 ms and one of 100 about 24 ms
/// (docs/BENCHMARKS.md, "The ledger without its foreign key").
pub const DRAIN_BATCH_GROWTH: usize = 4;

/// A tick's first claim takes this many times what the previous tick claimed: with two
/// processes sharing a load due every second, each one's share moves from second to second
/// (whichever starts its claim first locks more), and a first claim of about last second's
/// share left what was over it to a second claim, a whole claim later: 1 to 5 % of the
/// occurrences 50 to 140 ms late, the every-second lateness p99 (docs/BENCHMARKS.md, "The
/// ledger without its foreign key"). A claim is still bounded by [`DRAIN_BATCH_LIMIT`].
const FIRST_BATCH_HEADROOM: usize = 2;

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
    /// Room for dispatches in flight: one permit per running dispatch.
    room: Arc<Semaphore>,
    /// The kinds the store settles inside the claim (their backend is database-local).
    in_claim: InClaimWrites,
    completion: Completion,
    auto_pause: Option<AutoPause>,
    planning: Option<Arc<dyn cm_store::UnplannedRoutines>>,
    outbox: Option<Arc<dyn OutboxConsumer>>,
    launches: Arc<LaunchWindow>,
    /// Mission runs watched after their launch (`runs.rs`).
    runs: Option<Arc<RunWatch>>,
    secrets: Vec<String>,
    /// Claims per routine group, in the groups this scheduler leases (`groups.rs`); `None`
    /// claims across every group at once.
    groups: Option<Arc<GroupLeases>>,
    /// The groups whose passes fail now, claiming per group (`outages.rs`).
    outages: GroupOutages,
    /// How many occurrences each routine of the last claim that fired gave, on average (at
    /// least one): how many routines the next claim locks to fill its batch.
    owed_per_routine: AtomicUsize,
    /// What the last tick claimed: when that is more than the cap, the next tick's first claim
    /// takes twice as many, up to [`DRAIN_BATCH_LIMIT`] (see [`Scheduler::drain`]).
    first_batch: AtomicUsize,
    /// The supervisor told of readiness, the loop's liveness and the shutdown, if one listens.
    notifier: Option<crate::notify::Notifier>,
    /// Where each attempt's spans go (`--otlp-endpoint`), if anywhere.
    traces: Option<FireTracer>,
}

/// The launch rate's gate. A launch counts from when it passes the gate until a second after its
/// runtime answered (while it is under way it always counts): so however long a launch takes to
/// reach the runtime, no more than the rate arrive there in any second. Missions claimed and not
/// yet through the gate count too, so a claim takes only what the gate has room for
/// ([`LaunchWindow::room`]) and nobody waits at the gate with a lease running for long.
#[derive(Debug, Default)]
struct LaunchWindow {
    passed: Mutex<Passed>,
    pending: AtomicUsize,
}

/// The launches that count: each with the instant its runtime answered, `None` while under way.
#[derive(Debug, Default)]
struct Passed {
    launches: Vec<(u64, Option<Instant>)>,
    next_id: u64,
}

impl Passed {
    /// When the first launch that counts stops counting, if one has ended.
    fn next_room(&self) -> Option<Instant> {
        self.launches
            .iter()
            .filter_map(|(_, answered)| *answered)
            .min()
            .map(|at| at + LaunchWindow::WINDOW)
    }

    fn forget(&mut self, now: Instant) {
        self.launches.retain(|(_, answered)| {
            answered.is_none_or(|at| now.duration_since(at) < LaunchWindow::WINDOW)
        });
    }
}

impl LaunchWindow {
    /// A second, and a hundredth more: whoever counts the launches at the runtime may read a
    /// coarse clock (file times come from the kernel's tick clock, up to 4 ms behind), and must
    /// still never see more than the rate in a second.
    const WINDOW: Duration = Duration::from_millis(1_010);

    /// How many more missions may be claimed now under `per_second`.
    fn room(&self, per_second: u32, now: Instant) -> usize {
        let used = {
            let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
            passed.forget(now);
            passed.launches.len()
        };
        (per_second as usize).saturating_sub(used + self.pending.load(Ordering::Acquire))
    }

    /// A claimed mission's place at the gate; it counts against the room until it is dropped.
    fn ticket(self: &Arc<Self>, per_second: u32) -> LaunchTicket {
        self.pending.fetch_add(1, Ordering::AcqRel);
        LaunchTicket {
            window: self.clone(),
            per_second: per_second as usize,
        }
    }

    /// When the first launch that counts stops counting (room comes back), if one has ended.
    fn next_room(&self) -> Option<Instant> {
        self.passed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_room()
    }
}

/// A claimed mission's place at the launch rate's gate. Dropped without [`LaunchTicket::admit`]
/// (the mission was skipped, its run could not be taken, its task ended), it gives its room back.
struct LaunchTicket {
    window: Arc<LaunchWindow>,
    per_second: usize,
}

impl LaunchTicket {
    /// Waits until fewer than the rate count, then passes the gate: the launch counts until a
    /// second after its [`Launching`] is dropped.
    async fn admit(self) -> Launching {
        loop {
            let wait = {
                let mut passed = self.window.passed.lock().unwrap_or_else(|e| e.into_inner());
                passed.forget(Instant::now());
                if passed.launches.len() < self.per_second {
                    let id = passed.next_id;
                    passed.next_id += 1;
                    passed.launches.push((id, None));
                    return Launching {
                        window: self.window.clone(),
                        id,
                    };
                }
                passed.next_room()
            };
            match wait {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                // Every launch that counts is still under way: look again shortly.
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

impl Drop for LaunchTicket {
    fn drop(&mut self) {
        self.window.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A launch under way; dropped once its runtime answered.
struct Launching {
    window: Arc<LaunchWindow>,
    id: u64,
}

impl Drop for Launching {
    fn drop(&mut self) {
        let mut passed = self.window.passed.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(entry) = passed.launches.iter_mut().find(|(id, _)| *id == self.id) {
            entry.1 = Some(now);
        }
    }
}

/// The room of one claim ([`Scheduler::claim_room`]).
struct ClaimRoom {
    /// The most occurrences it may take; `None` when there is no room at all.
    budget: Option<FireCap>,
    /// The most missions it may take ([`ClaimDueParams::mission_room`]).
    mission_room: Option<usize>,
    /// The in-flight places its dispatches run in.
    places: Places,
}

/// Places in the in-flight set taken for one claim before it is made, handed one to each
/// dispatch it starts; those left over go back when dropped.
struct Places(Option<OwnedSemaphorePermit>);

impl Places {
    /// Up to `wanted` places, as many as are free.
    fn take(room: &Arc<Semaphore>, wanted: usize) -> Places {
        loop {
            let n = wanted.min(room.available_permits());
            let Ok(n) = u32::try_from(n) else {
                // More than a semaphore holds in one permit: the in-flight set is smaller.
                return Places(None);
            };
            if n == 0 {
                return Places(None);
            }
            match room.clone().try_acquire_many_owned(n) {
                Ok(permit) => return Places(Some(permit)),
                // Another pass took some in between: take what is left.
                Err(TryAcquireError::NoPermits) => continue,
                Err(TryAcquireError::Closed) => return Places(None),
            }
        }
    }

    /// How many are held.
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// One place for one dispatch, if any is left.
    fn one(&mut self) -> Option<OwnedSemaphorePermit> {
        let held = self.0.as_mut()?;
        if held.num_permits() > 1 {
            held.split(1)
        } else {
            self.0.take()
        }
    }
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
            secrets: Vec::new(),
            groups: None,
            outages: GroupOutages::default(),
            owed_per_routine: AtomicUsize::new(1),
            first_batch: AtomicUsize::new(0),
            notifier: None,
            traces: None,
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
    /// it leases or nobody leases, [`GROUP_WIDTH`] side by side (a claim in a group with
    /// nothing due returns at once), and so do the reaper and the maintenance passes; the
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

    /// One planning pass (see [`Scheduler::with_planning`]) over the groups this scheduler
    /// maintains; whether it succeeded. A failure is logged and kept for health like a failed
    /// tick, and the next pass tries again.
    async fn plan(&self) -> bool {
        let Some(store) = &self.planning else {
            return true;
        };
        self.maintain("planning routines written through SQL", |group| {
            self.plan_in(store.as_ref(), group)
        })
        .await
    }

    /// Plans the routines written through SQL in `group` (every group: `None`).
    async fn plan_in(
        &self,
        store: &dyn cm_store::UnplannedRoutines,
        group: Option<GroupId>,
    ) -> Result<(), StoreError> {
        for routine in store.plan_routines(group, cm_store::PLAN_BATCH).await? {
            match &routine.refused {
                None => {
                    add(&self.stats.planned, 1);
                    info!(routine = %routine.name, routine_id = %routine.id,
                        next_run_at = ?routine.next_run_at, "planned a routine written through SQL");
                }
                Some(reason) => {
                    add(&self.stats.refused_at_planning, 1);
                    error!(routine = %routine.name, routine_id = %routine.id, %reason,
                        "paused a routine written through SQL: it cannot be planned");
                }
            }
        }
        Ok(())
    }

    /// Runs the maintenance pass `run` across every group at once (`None`), its failure logged
    /// and kept for health, or, claiming per group, in each group this scheduler leases,
    /// [`GROUP_WIDTH`] side by side, each group's failure on its own (`outages.rs`). Returns
    /// whether it succeeded everywhere.
    async fn maintain<F, Fut>(&self, pass: &'static str, run: F) -> bool
    where
        F: Fn(Option<GroupId>) -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        match self.maintained_groups().await {
            None => match run(None).await {
                Ok(()) => true,
                Err(e) => {
                    error!(error = %e, "{pass} failed");
                    self.stats.tick_failed(format!("{pass} failed: {e}"));
                    false
                }
            },
            Some(groups) => each_group(
                &self.outages,
                &self.stats,
                pass,
                &groups,
                GROUP_WIDTH,
                |group| run(Some(group)),
            )
            .await
            .is_ok_and(|done| done.len() == groups.len()),
        }
    }

    /// Plans the routines written through SQL every tick interval, beside the ticks (nothing
    /// without [`Scheduler::with_planning`]).
    async fn plan_loop(&self, mut stopped: watch::Receiver<bool>) {
        if self.planning.is_none() {
            return;
        }
        let mut beat = beat(self.config.tick_interval);
        while next_beat(&mut beat, &mut stopped).await {
            self.plan().await;
        }
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

    /// Claims what is due and starts its dispatches, claiming again at once while a claim comes
    /// back full (see the module documentation), until `stopped` says so. With `wait`, the
    /// dispatch tasks go there for the caller to join; without, they run on their own, holding
    /// their room until settled.
    async fn claim_and_start(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
        stopped: Option<&watch::Receiver<bool>>,
    ) -> Result<TickReport, TickError> {
        let started = Instant::now();
        add(&self.stats.ticks, 1);
        let (total, last_deferred) = match self.claim_groups().await.map_err(TickError::Claim)? {
            None => self.drain(completer, wait, stopped, None).await?,
            Some(groups) => {
                // Side by side, each with dispatches of its own, joined there when waiting.
                let waiting = wait.is_some();
                let drained = each_group(
                    &self.outages,
                    &self.stats,
                    "claim",
                    &groups,
                    GROUP_WIDTH,
                    |group| async move {
                        let mut own = JoinSet::new();
                        let (mut report, deferred) = self
                            .drain(completer, waiting.then_some(&mut own), stopped, Some(group))
                            .await
                            .map_err(TickError::into_store)?;
                        collect(&mut own, &mut report).await;
                        Ok((report, deferred))
                    },
                )
                .await
                .map_err(TickError::Claim)?;
                let mut total = TickReport::default();
                let mut deferred = 0;
                for (report, left) in &drained {
                    total.add(report);
                    deferred += left;
                }
                (total, deferred)
            }
        };
        if last_deferred > 0 {
            warn!(
                deferred = last_deferred,
                claims = total.claims,
                "more occurrences due than there is room to dispatch; the rest wait for room"
            );
        }
        self.stats.tick_duration.observe(started.elapsed());
        Ok(total)
    }

    /// Claims what is due in `group` (every group: `None`) and starts its dispatches, claiming
    /// again at once while a claim comes back full. Returns what it did and how many
    /// occurrences its last claim deferred.
    async fn drain(
        &self,
        completer: &Arc<dyn Completer>,
        mut wait: Option<&mut JoinSet<FireResult>>,
        stopped: Option<&watch::Receiver<bool>>,
        group: Option<GroupId>,
    ) -> Result<(TickReport, usize), TickError> {
        let cap = self.config.max_fires_per_tick.get();
        let limit = DRAIN_BATCH_LIMIT.max(cap);
        // A tick starts where the last one's work left it: after a tick that claimed more than
        // the cap, twice what it claimed (at most the limit), so a load that comes due every
        // second (a thousand every-second routines) is claimed by the processes' first claims,
        // not the ramp from the cap, and not a second claim for the few a first claim left
        // over when the split between the processes moved; after one whose work fitted in the
        // cap, the cap.
        let carried = self.first_batch.load(Ordering::Relaxed);
        let mut batch = if carried > cap {
            carried.saturating_mul(FIRST_BATCH_HEADROOM).min(limit)
        } else {
            cap
        };
        let mut claimed = 0usize;
        let mut after: Option<DueCursor> = None;
        let mut total = TickReport::default();
        let mut last_deferred = 0;
        loop {
            let ClaimRoom {
                budget,
                mission_room,
                places,
            } = self.claim_room(batch);
            let Some(budget) = budget else {
                if total.claims == 0 {
                    add(&self.stats.saturated_ticks, 1);
                    debug!(
                        in_flight = self.dispatches_in_flight(),
                        "no room for dispatches; not claiming this tick"
                    );
                }
                break;
            };
            let params = ClaimDueParams {
                claimant: self.instance_id.clone(),
                lease: self.config.lease,
                cap: budget,
                rules: MisfireRules::from(&self.config),
                max_routines: self.routines_to_lock(budget),
                in_claim: self.in_claim,
                mission_room,
                after,
                group,
            };
            let began = SystemTime::now();
            let claim = self
                .ledger
                .claim_due(&params)
                .await
                .map_err(TickError::Claim)?;
            let window = ClaimWindow {
                began,
                ended: SystemTime::now(),
                fires: claim.fires.len(),
            };
            self.stats.tick_succeeded();
            let (more_due, resume_after) = (claim.more_due, claim.resume_after);
            self.note_owed_per_routine(&claim);
            claimed += claim.fires.len();
            last_deferred = claim.deferred;
            let report = self
                .start(claim, window, completer, wait.as_deref_mut(), places)
                .await;
            total.add(&TickReport {
                claims: 1,
                ..report
            });
            if stopped.is_some_and(|s| *s.borrow()) {
                break;
            }
            if more_due {
                // Resume after what this claim handled; grow the batch while claims come back
                // full.
                after = resume_after;
                batch = (batch * DRAIN_BATCH_GROWTH).min(limit);
            } else if after.is_some() {
                // The resumed walk ran out: one more claim over the whole walk picks up what
                // came due behind it (a routine created, resumed or released meanwhile).
                after = None;
            } else {
                break;
            }
        }
        self.first_batch.store(claimed, Ordering::Relaxed);
        Ok((total, last_deferred))
    }

    /// How many due routines a claim of `budget` occurrences locks. Every routine locked owes at
    /// least one occurrence unless its policy skips them all, and a routine behind owes many
    /// (a backlog), all claimed with it: the batch divided by what each routine of the last
    /// claim gave is what fills it, and a few more keep routines that owe less from holding
    /// the claim back. Locking the batch's count of routines whatever they owe would lock and
    /// plan (every occurrence each owes) many times the routines the batch can take; a claim
    /// that locks too few comes back `more_due` and is followed at once, with the estimate
    /// corrected.
    fn routines_to_lock(&self, budget: FireCap) -> u32 {
        let per_routine = self.owed_per_routine.load(Ordering::Relaxed).max(1);
        let wanted = budget.get().div_ceil(per_routine);
        u32::try_from(wanted + wanted / 16 + 1).unwrap_or(u32::MAX)
    }

    /// Keeps how many occurrences each routine of `claim` gave, for the next claim's lock count
    /// ([`Scheduler::routines_to_lock`]); a claim that fired nothing resets it to one.
    fn note_owed_per_routine(&self, claim: &TickClaim) {
        let routines: std::collections::HashSet<_> = claim
            .fires
            .iter()
            .map(|f| f.occurrence.routine_id)
            .collect();
        let per_routine = claim.fires.len().checked_div(routines.len()).unwrap_or(1);
        self.owed_per_routine
            .store(per_routine.max(1), Ordering::Relaxed);
    }

    /// The room of one claim of `batch`, taken out of the in-flight set before the claim.
    /// Occurrences written in the claim take no room; every other one needs a place in the
    /// in-flight set the moment it is claimed, or its lease would run while it waits: the claim
    /// takes no more than the places it holds, and missions (scheduled or requested) no more
    /// than the launch rate's second has left either. The places are its own from before the
    /// claim, so a reaper pass meanwhile cannot take them.
    fn claim_room(&self, batch: usize) -> ClaimRoom {
        let launches = match (
            self.in_claim.mission,
            self.config.max_mission_launches_per_second,
        ) {
            (None, Some(per_second)) => self.launches.room(per_second.get(), Instant::now()),
            _ => usize::MAX,
        };
        // A place for every occurrence the claim may dispatch: any of them when messages are
        // dispatched, else missions only (none when they are written in the claim too).
        let wanted = match (self.in_claim.message, self.in_claim.mission) {
            (None, _) => batch,
            (Some(_), None) => batch.min(launches),
            (Some(_), Some(_)) => 0,
        };
        let places = Places::take(&self.room, wanted);
        let held = places.len();
        ClaimRoom {
            budget: FireCap::new(if self.in_claim.message.is_some() {
                batch
            } else {
                held
            }),
            mission_room: self.in_claim.mission.is_none().then(|| held.min(launches)),
            places,
        }
    }

    /// A place at the launch rate's gate for a mission this process launches itself.
    fn launch_ticket(&self, kind: RoutineKind) -> Option<LaunchTicket> {
        if kind != RoutineKind::Mission || self.in_claim.mission.is_some() {
            return None;
        }
        let per_second = self.config.max_mission_launches_per_second?;
        Some(self.launches.ticket(per_second.get()))
    }

    /// Whether the launch rate leaves no mission to launch in this second.
    fn launch_rate_spent(&self) -> bool {
        self.in_claim.mission.is_none()
            && self
                .config
                .max_mission_launches_per_second
                .is_some_and(|per_second| self.launches.room(per_second.get(), Instant::now()) == 0)
    }

    async fn reap_and_start(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
    ) -> Result<TickReport, TickError> {
        let Some(groups) = self.claim_groups().await.map_err(TickError::Claim)? else {
            return self.reap_group(completer, wait, None).await;
        };
        // In the groups a tick claims in, side by side: a crashed scheduler's claims are taken
        // over in the groups it held once its group leases run out (they are shorter than a
        // claim's lease by default).
        let waiting = wait.is_some();
        let reaped = each_group(
            &self.outages,
            &self.stats,
            "reaper pass",
            &groups,
            GROUP_WIDTH,
            |group| async move {
                let mut own = JoinSet::new();
                let mut report = self
                    .reap_group(completer, waiting.then_some(&mut own), Some(group))
                    .await
                    .map_err(TickError::into_store)?;
                collect(&mut own, &mut report).await;
                Ok(report)
            },
        )
        .await
        .map_err(TickError::Claim)?;
        let mut total = TickReport::default();
        for report in &reaped {
            total.add(report);
        }
        Ok(total)
    }

    /// One reaper pass in `group` (every group: `None`).
    async fn reap_group(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
        group: Option<GroupId>,
    ) -> Result<TickReport, TickError> {
        // Every claim taken over is dispatched: a place for each, held from before the pass.
        let places = Places::take(&self.room, self.config.max_fires_per_tick.get());
        let limit = places.len();
        if limit == 0 {
            return Ok(TickReport::default());
        }
        let params = ReapParams {
            claimant: self.instance_id.clone(),
            lease: self.config.lease,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            group,
        };
        let began = SystemTime::now();
        let claim = self
            .ledger
            .reap_expired(&params)
            .await
            .map_err(TickError::Claim)?;
        let window = ClaimWindow {
            began,
            ended: SystemTime::now(),
            fires: claim.fires.len(),
        };
        add(&self.stats.reaped, claim.fires.len() as u64);
        for fire in &claim.fires {
            warn!(
                routine = %fire.occurrence.routine_id,
                scheduled_at = %fire.occurrence.scheduled_at,
                attempt = fire.row.attempt,
                "took over an expired claim (its claimant stopped before settling)"
            );
        }
        Ok(self.start(claim, window, completer, wait, places).await)
    }

    /// Acts on what a claim returned: counts what the claim settled itself, starts a dispatch
    /// for each occurrence to fire in the `places` held for the claim, abandons those that
    /// crashed too often, leaves the rest. The places left over go back to the in-flight room.
    async fn start(
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
            let action = outcome.action(self.config.max_attempts);
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

    /// Deletes acknowledged outbox messages and settled fires older than the retention, in
    /// batches of [`PRUNE_BATCH`] repeated while they come back full, so what is deleted keeps up
    /// with what is written however fast the engine fires. A pass stops after a quarter of the
    /// lease (the outbox's share at most half of that; per group, each group's share of it), so
    /// it never holds the maintenance loop for long. Returns whether the pass succeeded.
    async fn prune(&self) -> bool {
        let budget = self.config.lease.duration() / 4;
        let held = self.groups.as_ref().map_or(1, |leases| leases.held().len());
        let rounds = u32::try_from(held.div_ceil(GROUP_WIDTH).max(1)).unwrap_or(u32::MAX);
        let share = match self.maintained_groups().await {
            None => budget,
            Some(_) => budget / rounds,
        };
        self.maintain("pruning", |group| self.prune_in(group, share))
            .await
    }

    /// One prune pass in `group` (every group: `None`) within `budget`.
    async fn prune_in(&self, group: Option<GroupId>, budget: Duration) -> Result<(), StoreError> {
        let started = Instant::now();
        let retention = self.config.retention;
        if let Some(outbox) = &self.outbox {
            let pruned = prune_in_batches(budget / 2, || async {
                match group {
                    None => outbox.outbox_prune_acked(retention, PRUNE_BATCH).await,
                    Some(g) => {
                        outbox
                            .outbox_prune_acked_in(g, retention, PRUNE_BATCH)
                            .await
                    }
                }
            })
            .await?;
            if pruned > 0 {
                debug!(
                    pruned,
                    ?group,
                    "pruned acknowledged outbox messages past their retention"
                );
            }
        }
        let left = budget.saturating_sub(started.elapsed());
        let pruned = prune_in_batches(left, || async {
            let pruned = match group {
                None => self.ledger.prune_settled(retention, PRUNE_BATCH).await?,
                Some(g) => {
                    self.ledger
                        .prune_settled_in(g, retention, PRUNE_BATCH)
                        .await?
                }
            };
            add(&self.stats.pruned, pruned);
            Ok(pruned)
        })
        .await?;
        if pruned > 0 {
            debug!(pruned, ?group, "pruned settled fires past their retention");
        }
        Ok(())
    }

    /// The groups this scheduler's maintenance (prunes, the automatic pause, planning, the
    /// run watch) covers: those it leases, each on its own; or every group at once (`None`)
    /// without group claims.
    async fn maintained_groups(&self) -> Option<Vec<GroupId>> {
        match &self.groups {
            Some(leases) if leases.per_group().await.unwrap_or(true) => Some(leases.held()),
            _ => None,
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

    /// Runs ticks every tick interval, and the reaper every half lease beside them, until
    /// `shutdown` completes; then stops claiming, finishes and settles what is in flight, and
    /// returns what it did.
    ///
    /// A failing tick never ends the loop: its error is logged, counted, kept for health and
    /// reported in the summary, and the next tick tries again (the database may come back).
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> RunSummary {
        let (completer, task) = self.completer();
        let (stop, stopped) = watch::channel(false);
        info!(instance = %self.instance_id, tick = ?self.config.tick_interval,
            cap = self.config.max_fires_per_tick.get(), lease = ?self.config.lease.duration(),
            max_in_flight = self.config.max_in_flight,
            in_claim_messages = self.in_claim.message.is_some(),
            "scheduler running");
        let signal = async {
            shutdown.await;
            if let Some(notifier) = &self.notifier {
                notifier.stopping();
            }
            let _ = stop.send(true);
        };
        tokio::join!(
            signal,
            self.tick_loop(stopped.clone(), &completer),
            self.reap_loop(stopped.clone(), &completer),
            self.watch_loop(stopped.clone()),
            self.plan_loop(stopped.clone()),
            self.lease_loop(stopped),
        );
        // No new claims from here on; wait for every dispatch in flight to settle (each is
        // bounded by the dispatch timeout), then for the completer's last batch.
        let in_flight = self.dispatches_in_flight();
        if in_flight > 0 {
            info!(in_flight, "waiting for dispatches in flight to settle");
        }
        let all = u32::try_from(self.config.max_in_flight).unwrap_or(u32::MAX);
        let _ = self.room.acquire_many(all).await;
        drop(completer);
        if let Some(task) = task {
            task.finish().await;
        }
        info!(instance = %self.instance_id, "scheduler stopped: nothing left in flight");
        RunSummary {
            ticks: Stats::get(&self.stats.ticks),
            tick_errors: Stats::get(&self.stats.tick_errors),
            last_error: self.stats.last_error(),
            fired: Stats::get(&self.stats.fired),
            failed: Stats::get(&self.stats.failed),
            succeeded: Stats::get(&self.stats.succeeded),
            lost: Stats::get(&self.stats.lost),
        }
    }

    /// Ticks on multiples of the interval on the wall clock, a few milliseconds after each
    /// boundary: occurrences fall on whole seconds, so an aligned tick finds them due at once
    /// instead of up to one interval late. A tick that overruns its interval is counted, and the
    /// next one waits for the next boundary rather than firing late ones in a burst.
    async fn tick_loop(&self, mut stopped: watch::Receiver<bool>, completer: &Arc<dyn Completer>) {
        let first_tick = tokio::time::Instant::now() + until_aligned(self.config.tick_interval);
        let mut interval = tokio::time::interval_at(first_tick, self.config.tick_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // Missions held back by the launch rate are claimed as soon as it has room again, not a
        // whole interval later.
        let mut wake: Option<Instant> = None;
        // The supervisor's watchdog is pinged from this loop only, between ticks: a tick that
        // never ends stops the pings, and the supervisor restarts the process.
        let notifier = self.notifier.as_ref();
        let ping_every = notifier.and_then(crate::notify::Notifier::ping_every);
        loop {
            let early = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let idle_ping = async {
                match ping_every {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stopped.wait_for(|stop| *stop) => break,
                _ = interval.tick() => {}
                _ = early => {}
                _ = idle_ping => {
                    if let Some(notifier) = notifier {
                        notifier.ping();
                    }
                    continue;
                }
            }
            // A claim is not cancelled by shutdown: it is one short transaction, and what it
            // claims is dispatched and settled before the run returns; a drain stops between
            // claims.
            let began = Instant::now();
            let result = self.claim_and_start(completer, None, Some(&stopped)).await;
            // A claim made while the launch rate's second was spent did not look at missions at
            // all (so it holds none back): wake when that second ends as well.
            wake = match &result {
                Ok(report) if report.held > 0 || self.launch_rate_spent() => {
                    self.launches.next_room()
                }
                _ => None,
            };
            let succeeded = self.record(result, "tick");
            if succeeded {
                self.stats.tick_succeeded();
            }
            if let Some(notifier) = notifier {
                notifier.tick_ended(succeeded);
            }
            let took = began.elapsed();
            if took > self.config.tick_interval {
                add(&self.stats.tick_overruns, 1);
                debug!(took = ?took, interval = ?self.config.tick_interval, "tick overran its interval");
            }
        }
    }

    /// Takes expired claims over, prunes old fires and pauses failing routines every half lease
    /// (at least every tick interval), beside the ticks.
    async fn reap_loop(&self, mut stopped: watch::Receiver<bool>, completer: &Arc<dyn Completer>) {
        let every = (self.config.lease.duration() / 2).max(self.config.tick_interval);
        let mut beat = beat(every);
        while next_beat(&mut beat, &mut stopped).await {
            let result = self.reap_and_start(completer, None).await;
            self.record(result, "reaper pass");
            self.prune().await;
            if let Some(auto_pause) = &self.auto_pause {
                self.maintain("pausing failing routines", |group| async move {
                    auto_pause.pass(group).await.map(|_| ())
                })
                .await;
            }
        }
    }

    /// Renews and rebalances the group leases every third of a lease, beside the ticks, and
    /// gives them up when the scheduler stops; nothing without [`Scheduler::with_groups`].
    async fn lease_loop(&self, mut stopped: watch::Receiver<bool>) {
        let Some(leases) = &self.groups else { return };
        let mut beat = beat(leases.every().max(self.config.tick_interval));
        loop {
            if let Err(e) = leases.rebalance().await {
                warn!(error = %e, "could not renew the group leases; claiming in free groups");
            }
            if !next_beat(&mut beat, &mut stopped).await {
                break;
            }
        }
        if let Err(e) = leases.release_all().await {
            warn!(error = %e, "could not release the group leases; they run out by themselves");
        }
    }

    /// Asks the mission runtime about unfinished runs every tick interval (at least every
    /// second), beside the ticks; nothing without [`Scheduler::with_run_watch`].
    async fn watch_loop(&self, mut stopped: watch::Receiver<bool>) {
        let Some(runs) = &self.runs else { return };
        let every = self.config.tick_interval.max(Duration::from_secs(1));
        let mut beat = beat(every);
        while next_beat(&mut beat, &mut stopped).await {
            self.maintain("watching mission runs", |group| async move {
                runs.pass_in(&self.stats, group).await.map(|_| ())
            })
            .await;
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
            Err(e) => {
                // The wrapper itself never panics; a cancelled runtime ends it.
                error!(error = %e, "a dispatch task ended abnormally");
                report.unsettled += 1;
            }
        }
    }
}

/// Runs `batch` (one prune statement of at most [`PRUNE_BATCH`] rows) until one comes back short
/// or `budget` has passed. Returns how many rows the batches deleted.
async fn prune_in_batches<F, Fut>(budget: Duration, mut batch: F) -> Result<u64, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let started = Instant::now();
    let mut total = 0;
    loop {
        let pruned = batch().await?;
        total += pruned;
        if pruned < u64::from(PRUNE_BATCH) || started.elapsed() >= budget {
            return Ok(total);
        }
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

/// An interval for a pass beside the ticks: a beat missed while a pass ran is delayed, not
/// bunched.
fn beat(every: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// Waits for the next beat; `false` once the scheduler is told to stop (which wins a tie).
async fn next_beat(beat: &mut tokio::time::Interval, stopped: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        biased;
        _ = stopped.wait_for(|stop| *stop) => false,
        _ = beat.tick() => true,
    }
}

/// What one dispatch task needs, cloned out of the scheduler so the task is `'static`.
struct FireJob {
    dispatcher: Arc<dyn Dispatcher>,
    completer: Arc<dyn Completer>,
    /// Where an attempt that ends without settling notes why.
    ledger: Arc<dyn FireLedger>,
    /// The dispatch's budget as it was counted, for its timeout's message.
    budget: Duration,
    /// When the dispatch must have finished: counted once, when the budget was (on tokio's
    /// clock, which its timeout runs on).
    deadline: tokio::time::Instant,
    /// When the occurrence's first attempt was claimed, on this process's clock (`None`: too
    /// long ago to say).
    first_claimed: Option<Instant>,
    stats: Arc<Stats>,
    runs: Option<Arc<RunWatch>>,
    /// A mission's place at the launch rate's gate, passed just before its launch.
    launch_ticket: Option<LaunchTicket>,
    /// The attempt's spans, recorded when the job ends (`--otlp-endpoint`).
    trace: Option<AttemptTrace>,
}

/// How long stopping the run of a deleted routine's mission may take.
const ORPHAN_STOP_TIMEOUT: Duration = Duration::from_secs(10);

enum FireResult {
    Fired,
    Failed,
    Skipped,
    Unsettled,
}

/// Notes on a still-held claim why its attempt ends without settling; a failure to note is
/// logged and otherwise ignored (the claim is the reaper's either way).
async fn note_unsettled(ledger: &dyn FireLedger, fire: &FireRef, why: String) {
    if let Err(e) = ledger.note_unsettled(fire, &ErrorText::new(why)).await {
        debug!(error = %e, routine_id = %fire.occurrence.routine_id,
            "could not note why the attempt ended unsettled");
    }
}

/// A panic's message, when it has one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_string()
    }
}

/// Why a settle was not written, for its span (`None`: it was).
fn unwritten(completed: &Completed) -> Option<String> {
    match completed {
        Completed::Settled => None,
        Completed::NotHeld => Some("the claim was taken over after its lease ran out".into()),
        Completed::RoutineDeleted => Some("the routine was deleted".into()),
        Completed::Unwritten(reason) => Some(reason.to_string()),
    }
}

/// Counts and logs what a completer did with one settle; returns whether the row was settled.
fn completed(fire: &ClaimedFire, completed: Completed, stats: &Stats) -> bool {
    match completed {
        Completed::Settled => true,
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
    async fn fire(mut self, fire: ClaimedFire, attempt: u32, lateness: Duration) -> FireResult {
        let dispatch = Dispatch::new(
            fire.occurrence,
            fire.routine_name.clone(),
            fire.kind,
            fire.payload.clone(),
            attempt,
            self.deadline.into_std(),
        )
        .with_first_attempt_age(self.first_claimed.map_or(Duration::MAX, |at| at.elapsed()));
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
        let run = cm_dispatch::RunRef {
            name: fire.occurrence.idempotency_key().to_string(),
        };
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
                Ok(Err(e)) if let Some(open) = outcome_left_open(&e, attempt) => {
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
fn outcome_left_open(e: &DispatchError, attempt: u32) -> Option<&'static str> {
    match e {
        DispatchError::Unconfirmed(_) => Some("the target did not confirm the dispatch"),
        DispatchError::Unavailable(_) if attempt > 1 => {
            Some("a retried dispatch found the target unavailable")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However the launches are timed, the runtime sees no more than the rate in any second: each
    /// launch below notes when it reached the "runtime" (somewhere between passing the gate and
    /// its answer, as over a real connection), and no window of a second holds more than the rate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_gate_lets_no_more_than_the_rate_reach_the_runtime_in_any_second() {
        const RATE: u32 = 8;
        let window = Arc::new(LaunchWindow::default());
        let reached = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        for i in 0..3 * RATE as u64 {
            // Claimed all at once, more than the rate: the gate must hold the rest back.
            let ticket = window.ticket(RATE);
            let reached = reached.clone();
            tasks.spawn(async move {
                let launching = ticket.admit().await;
                // Some launches take a while to reach the runtime, some answer slowly.
                tokio::time::sleep(Duration::from_millis(5 * (i % 4))).await;
                reached.lock().unwrap().push(Instant::now());
                tokio::time::sleep(Duration::from_millis(10 * (i % 3))).await;
                drop(launching);
            });
        }
        while tasks.join_next().await.is_some() {}
        let mut times = reached.lock().unwrap().clone();
        times.sort();
        assert_eq!(times.len(), 3 * RATE as usize);
        for (start, at) in times.iter().enumerate() {
            let within = times[start..]
                .iter()
                .take_while(|t| t.duration_since(*at) < LaunchWindow::WINDOW)
                .count();
            assert!(within <= RATE as usize, "{within} launches within a second");
        }
        // Every ticket was given back, and room comes back once the last second has passed.
        assert_eq!(window.pending.load(Ordering::Acquire), 0);
        tokio::time::sleep(LaunchWindow::WINDOW).await;
        assert_eq!(window.room(RATE, Instant::now()), RATE as usize);
    }

    /// A ticket dropped unused (a skipped mission) gives its room back at once.
    #[test]
    fn an_unused_ticket_gives_its_room_back() {
        let window = Arc::new(LaunchWindow::default());
        let ticket = window.ticket(2);
        assert_eq!(window.room(2, Instant::now()), 1);
        drop(ticket);
        assert_eq!(window.room(2, Instant::now()), 2);
    }
}
