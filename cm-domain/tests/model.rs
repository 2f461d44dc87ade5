//! A model-based test of the claim protocol: several schedulers tick, dispatch, settle, reap,
//! crash and restart against one in-memory ledger, and the protocol's invariants are checked
//! after every step.
//!
//! The system under test ([`World`]) is a reference implementation of what the PostgreSQL store
//! and the scheduler loop do: a `routines` table, a `routine_fires` ledger, one shared database
//! clock, and schedulers that keep their in-flight dispatches in memory. Every decision in it is
//! taken by a `cm-domain` function ([`plan_due`], [`plan_tick`], [`ClaimOutcome::classify`],
//! [`ClaimOutcome::action`], [`lease_expired`], [`FireStatus::settle`]); the world only moves
//! rows, so the test checks the domain rules, not the harness.
//!
//! `proptest-state-machine` generates the sequences. Its reference state is small (the setup and
//! which schedulers are up or inside a tick) because it only has to say which transitions are
//! valid; the world keeps everything else. A case ends with a drain (every scheduler restarted and
//! left running until the ledger is quiet), which is where liveness is checked.
//!
//! Modelling choices, where the design leaves the store free:
//!
//! - A tick is one transaction, and `now()` is its start. Besides whole ticks, a tick can be
//!   split into its read ([`Transition::TickBegin`]) and its claim and commit
//!   ([`Transition::TickCommit`]) with other steps between, as two schedulers without a lock on
//!   `routines` would run. That is the only way a claim statement meets a row that is already
//!   there, so it is what exercises the InFlight, Settled and Retry outcomes of a claim.
//! - How a tick writes `next_run_at` after such a race is a setup choice ([`RoutineUpdate`]):
//!   never backwards, or last writer wins.
//! - A routine's backend is external (a dispatch under the claim's lease, settled afterwards)
//!   or database-local, as the transactional outbox of message routines is: there a fresh
//!   claim inserts the row already `fired` and writes its effect in the same statement
//!   ([`ClaimOutcome::SettledInClaim`]); a row that exists (a retry after a crash) goes through
//!   the dispatch path like any other.
//! - The abandon settle (too many attempts) runs in the transaction of the claim or reap that
//!   found it; a dispatch that is still pending when its lease runs out has been stopped by its
//!   timeout, produces no effect, and is settled failed (fenced) whenever its scheduler gets to
//!   it.
//!
//! The last tests inject a broken rule into the world (for example a claim statement that takes
//! over a live lease) and assert that the same model finds a failing sequence, so a green run
//! means something.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use cm_domain::claim::lease_expired;
use cm_domain::{
    ClaimAction, ClaimOutcome, ClaimRow, ClaimToken, DuePlan, ErrorText, FireCap, FireStatus,
    MisfirePolicy, MisfireRules, Occurrence, RoutineId, Schedule, Settlement, TickPlan, plan_due,
    plan_tick,
};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{
    Config as ProptestConfig, TestCaseError, TestError, TestRng, TestRunner,
};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use uuid::Uuid;

/// The longest generated sequence of transitions in one case (before the drain).
const MAX_TRANSITIONS: usize = 150;

/// The lease every claim gets. The clock moves by up to three leases at a time.
const LEASE_MS: i64 = 10_000;

/// The schedules routines are drawn from: seconds-first expressions, in UTC and in a zone with
/// daylight-saving changes (the last one has gaps around the 2026 Berlin transitions).
const SCHEDULES: &[(&str, &str)] = &[
    ("*/1 * * * * *", "UTC"),
    ("*/2 * * * * *", "UTC"),
    ("*/5 * * * * *", "UTC"),
    ("*/5 * * * * *", "Europe/Berlin"),
    ("*/3 59,0 1,2,3 * * *", "Europe/Berlin"),
];

/// Where the database clock starts: just before the Berlin spring-forward and fall-back
/// transitions of 2026 (both at 01:00 UTC), and an ordinary instant.
fn starts() -> Vec<DateTime<Utc>> {
    vec![
        Utc.with_ymd_and_hms(2026, 3, 29, 0, 59, 20).unwrap(),
        Utc.with_ymd_and_hms(2026, 10, 25, 0, 59, 20).unwrap(),
        Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap(),
    ]
}

// ---------------------------------------------------------------------------------------------
// The reference state machine: the setup of a case and which transitions are valid.
// ---------------------------------------------------------------------------------------------

/// The fixed parameters of one case.
#[derive(Clone, Debug)]
struct Setup {
    start: DateTime<Utc>,
    schedulers: usize,
    routines: Vec<RoutineSetup>,
    cap: usize,
    max_attempts: u32,
    grace_secs: u64,
    max_backlog: usize,
    max_scan: usize,
    update: RoutineUpdate,
}

/// One routine of a case.
#[derive(Clone, Copy, Debug)]
struct RoutineSetup {
    /// An index into [`SCHEDULES`].
    schedule: usize,
    policy: MisfirePolicy,
    /// How long before the clock's start the routine was created, so a case can start with
    /// misfires already owed.
    created_secs_before: u64,
    /// Whether the routine's backend is database-local (the transactional outbox of message
    /// routines): a fresh claim inserts the row already `fired` and writes the effect in the
    /// same statement. Otherwise the backend is external (a webhook, a container) and the
    /// effect is a dispatch under the claim's lease.
    in_claim: bool,
}

/// How a tick writes a routine's `next_run_at`. With one tick at a time both are the same; they
/// differ only when two ticks planned the same routine from the same snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RoutineUpdate {
    /// `SET next_run_at = GREATEST(next_run_at, $advance)`: the clock never moves back.
    Greatest,
    /// `SET next_run_at = $advance`: the last writer wins, and a stale tick can move the clock
    /// back over occurrences already in the ledger (which the claim statement must then see).
    Plain,
}

/// The reference state: the setup, and per scheduler whether it is up and inside an open tick.
#[derive(Clone, Debug)]
struct RefState {
    setup: Setup,
    up: Vec<bool>,
    open: Vec<bool>,
}

/// One step of the world.
#[derive(Clone, Debug)]
enum Transition {
    /// Scheduler `s` runs a whole tick in one transaction.
    Tick(usize),
    /// Scheduler `s` opens a tick transaction: it reads the clock and the due routines and plans.
    /// Other schedulers may act before it commits (READ COMMITTED, no lock on `routines`).
    TickBegin(usize),
    /// Scheduler `s` runs the claim statement of its open tick and commits.
    TickCommit(usize),
    /// Scheduler `s` dispatches one of its claimed, not yet dispatched occurrences (picked by
    /// `pick` modulo their number); the backend succeeds or fails.
    Dispatch { s: usize, pick: u8, ok: bool },
    /// Scheduler `s` settles one of its finished dispatches (picked by `pick`).
    Settle { s: usize, pick: u8 },
    /// Scheduler `s` finds, before dispatching one of its claimed occurrences (picked by `pick`),
    /// that an earlier run of the routine is still running under `forbid`: no effect, and the
    /// occurrence is to be settled `skipped` with the running fire named.
    Skip { s: usize, pick: u8 },
    /// Scheduler `s` runs the reaper.
    Reap(usize),
    /// Scheduler `s` dies: its memory (in-flight dispatches, an open tick) is gone.
    Crash(usize),
    /// Scheduler `s` comes back, with its old instance id or a new one.
    Restart { s: usize, same_id: bool },
    /// The database clock moves forward by this many milliseconds.
    AdvanceClock(u64),
}

fn setup_strategy() -> impl Strategy<Value = Setup> {
    let routine = (
        0..SCHEDULES.len(),
        prop::sample::select(vec![
            MisfirePolicy::FireOnce,
            MisfirePolicy::CatchUp,
            MisfirePolicy::Skip,
        ]),
        0u64..=30,
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(schedule, policy, created_secs_before, in_claim)| RoutineSetup {
                schedule,
                policy,
                created_secs_before,
                in_claim,
            },
        );
    (
        (
            prop::sample::select(starts()),
            2usize..=5,
            prop::collection::vec(routine, 1..=4),
            1usize..=4,
        ),
        (
            1u32..=3,
            0u64..=15,
            1usize..=5,
            prop::sample::select(vec![10_000usize, 1, 2, 3, 5, 8]),
            prop::sample::select(vec![RoutineUpdate::Greatest, RoutineUpdate::Plain]),
        ),
    )
        .prop_map(
            |(
                (start, schedulers, routines, cap),
                (max_attempts, grace_secs, max_backlog, max_scan, update),
            )| Setup {
                start,
                schedulers,
                routines,
                cap,
                max_attempts,
                grace_secs,
                max_backlog,
                max_scan,
                update,
            },
        )
}

/// Clock moves: mostly whole seconds (so leases run out exactly on a tick's clock, the boundary
/// `lease_expired` decides), sometimes an arbitrary number of milliseconds, up to three leases.
fn advance_strategy() -> impl Strategy<Value = Transition> {
    prop_oneof![
        4 => (0u64..=3).prop_map(|s| s * 1000),
        3 => (0u64..=12).prop_map(|s| s * 1000),
        1 => 0u64..=(3 * LEASE_MS as u64),
    ]
    .prop_map(Transition::AdvanceClock)
}

/// The reference state machine of the claim protocol.
struct ClaimProtocol;

impl ReferenceStateMachine for ClaimProtocol {
    type State = RefState;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<RefState> {
        setup_strategy()
            .prop_map(|setup| RefState {
                up: vec![true; setup.schedulers],
                open: vec![false; setup.schedulers],
                setup,
            })
            .boxed()
    }

    fn transitions(state: &RefState) -> BoxedStrategy<Transition> {
        let all = 0..state.setup.schedulers;
        let up: Vec<usize> = all.clone().filter(|&s| state.up[s]).collect();
        let idle: Vec<usize> = up.iter().copied().filter(|&s| !state.open[s]).collect();
        let open: Vec<usize> = up.iter().copied().filter(|&s| state.open[s]).collect();
        let down: Vec<usize> = all.filter(|&s| !state.up[s]).collect();

        let mut options: Vec<(u32, BoxedStrategy<Transition>)> =
            vec![(3, advance_strategy().boxed())];
        if !idle.is_empty() {
            options.push((
                4,
                prop::sample::select(idle.clone())
                    .prop_map(Transition::Tick)
                    .boxed(),
            ));
            options.push((
                2,
                prop::sample::select(idle)
                    .prop_map(Transition::TickBegin)
                    .boxed(),
            ));
        }
        if !open.is_empty() {
            options.push((
                2,
                prop::sample::select(open)
                    .prop_map(Transition::TickCommit)
                    .boxed(),
            ));
        }
        if !up.is_empty() {
            let pick = || prop::sample::select(up.clone());
            options.push((
                6,
                (pick(), 0u8..8, prop::bool::weighted(0.8))
                    .prop_map(|(s, pick, ok)| Transition::Dispatch { s, pick, ok })
                    .boxed(),
            ));
            options.push((
                4,
                (pick(), 0u8..8)
                    .prop_map(|(s, pick)| Transition::Settle { s, pick })
                    .boxed(),
            ));
            options.push((
                1,
                (pick(), 0u8..8)
                    .prop_map(|(s, pick)| Transition::Skip { s, pick })
                    .boxed(),
            ));
            options.push((1, pick().prop_map(Transition::Reap).boxed()));
            options.push((1, pick().prop_map(Transition::Crash).boxed()));
        }
        if !down.is_empty() {
            options.push((
                3,
                (prop::sample::select(down), any::<bool>())
                    .prop_map(|(s, same_id)| Transition::Restart { s, same_id })
                    .boxed(),
            ));
        }
        Union::new_weighted(options).boxed()
    }

    fn preconditions(state: &RefState, transition: &Transition) -> bool {
        let known = |s: usize| s < state.setup.schedulers;
        match *transition {
            Transition::Tick(s) | Transition::TickBegin(s) => {
                known(s) && state.up[s] && !state.open[s]
            }
            Transition::TickCommit(s) => known(s) && state.up[s] && state.open[s],
            Transition::Dispatch { s, .. }
            | Transition::Settle { s, .. }
            | Transition::Skip { s, .. }
            | Transition::Reap(s)
            | Transition::Crash(s) => known(s) && state.up[s],
            Transition::Restart { s, .. } => known(s) && !state.up[s],
            Transition::AdvanceClock(_) => true,
        }
    }

    fn apply(mut state: RefState, transition: &Transition) -> RefState {
        match *transition {
            Transition::TickBegin(s) => state.open[s] = true,
            Transition::TickCommit(s) => state.open[s] = false,
            Transition::Crash(s) => {
                state.up[s] = false;
                state.open[s] = false;
            }
            Transition::Restart { s, .. } => state.up[s] = true,
            _ => {}
        }
        state
    }
}

// ---------------------------------------------------------------------------------------------
// The system under test: the database and the schedulers' memory.
// ---------------------------------------------------------------------------------------------

/// A broken rule the world can be built with, to show the model notices it. Never used by the
/// passing test; the domain crate has no such switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    /// The rules as written.
    None,
    /// The claim statement's `ON CONFLICT DO UPDATE` takes over any `claimed` row, live lease or
    /// not: an InFlight row is treated as a crash (Retry).
    ClaimTakesLiveLease,
    /// The reaper takes over `claimed` rows whose lease is still live.
    ReaperTakesLiveLease,
    /// The settle statement forgets the fence: it updates a `claimed` row whoever holds it.
    UnfencedSettle,
    /// The tick moves a routine's clock to its misfire plan's next run, forgetting that the cap
    /// deferred some of its occurrences.
    DeferralDropped,
    /// The claim statement of a database-local backend writes its effect for every occurrence it
    /// names, not only for the rows it inserted: a second tick that meets a settled row writes a
    /// second message.
    InClaimOnExistingRow,
}

/// One row of `routine_fires`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fire {
    status: FireStatus,
    claimant: String,
    token: ClaimToken,
    attempt: u32,
    lease_from: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    error: Option<String>,
}

/// The occurrences of one routine's schedule from its creation on, computed lazily with
/// [`Schedule::next_after`] and kept, so invariant checks do not walk the schedule again.
struct Chain {
    schedule: Schedule,
    items: RefCell<Vec<DateTime<Utc>>>,
    ended: Cell<bool>,
}

impl Chain {
    fn new(schedule: Schedule, created: DateTime<Utc>) -> Self {
        let first = schedule.next_after(created);
        Chain {
            schedule,
            items: RefCell::new(first.into_iter().collect()),
            ended: Cell::new(first.is_none()),
        }
    }

    /// Extends the chain until it holds an occurrence at or after `bound` (or the schedule ends).
    fn extend_to(&self, bound: DateTime<Utc>) {
        let mut items = self.items.borrow_mut();
        while !self.ended.get() && items.last().is_some_and(|last| *last < bound) {
            let last = *items.last().unwrap();
            match self.schedule.next_after(last) {
                Some(next) => {
                    assert!(
                        next > last,
                        "next_after({last}) returned {next}, not a later instant"
                    );
                    items.push(next);
                }
                None => self.ended.set(true),
            }
        }
    }

    /// How many occurrences come strictly before `bound` (`None`: the schedule's end).
    fn count_before(&self, bound: Option<DateTime<Utc>>) -> usize {
        let bound = bound.expect("the model's schedules never end");
        self.extend_to(bound);
        self.items.borrow().partition_point(|t| *t < bound)
    }

    /// The occurrence at `index` (which must be below a `count_before` already asked).
    fn get(&self, index: usize) -> DateTime<Utc> {
        self.items.borrow()[index]
    }

    fn contains(&self, t: DateTime<Utc>) -> bool {
        self.extend_to(t);
        self.items.borrow().binary_search(&t).is_ok()
    }

    /// The occurrences in `[from, to)`.
    fn between(&self, from: DateTime<Utc>, to: Option<DateTime<Utc>>) -> Vec<DateTime<Utc>> {
        let end = self.count_before(to);
        let items = self.items.borrow();
        let start = items.partition_point(|t| *t < from);
        items[start..end.max(start)].to_vec()
    }
}

/// One row of `routines`, with what the model keeps about it.
struct Routine {
    id: RoutineId,
    schedule: Schedule,
    policy: MisfirePolicy,
    next_run_at: Option<DateTime<Utc>>,
    /// Bumped by every tick that writes the row, to notice ticks that planned from a stale read.
    version: u64,
    chain: Chain,
    /// The sum of the skipped counts the ticks reported (what the scheduler logs and counts).
    skipped_total: u64,
    /// Which occurrences the misfire plans skipped, recomputed from each plan.
    skipped: BTreeSet<DateTime<Utc>>,
    /// Whether two ticks ever planned this routine from the same read; the exact count form of
    /// "owed" only holds when they did not.
    racy: bool,
    /// Whether a fresh claim settles it in the claim's own statement ([`RoutineSetup::in_claim`]).
    in_claim: bool,
}

/// What a dispatch a scheduler holds is doing.
#[derive(Clone, Debug)]
enum ItemState {
    /// Claimed, not dispatched yet.
    Pending,
    /// Dispatched (or stopped by its timeout); the settle is still to run.
    Done(Settlement),
}

/// One occurrence a scheduler holds in memory.
#[derive(Clone, Debug)]
struct Item {
    occurrence: Occurrence,
    token: ClaimToken,
    attempt: u32,
    lease_from: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    /// The tick that claimed it (`None` for the reaper), for the cap invariant.
    tick: Option<usize>,
    state: ItemState,
}

/// A tick transaction that has read and planned but not yet committed.
struct OpenTick {
    /// The transaction's clock (`now()` in PostgreSQL is the transaction's start).
    now: DateTime<Utc>,
    /// Per due routine: its index, the `next_run_at` it was planned from, and its version.
    read: Vec<(usize, DateTime<Utc>, u64)>,
    due: Vec<(RoutineId, DuePlan)>,
    plan: TickPlan,
}

/// One scheduler process.
struct Scheduler {
    instance: String,
    generation: u32,
    up: bool,
    items: Vec<Item>,
    open: Option<OpenTick>,
}

/// An external side effect: a message sent or a container started.
#[derive(Clone, Debug)]
struct Effect {
    occurrence: Occurrence,
    claimant: String,
    token: ClaimToken,
    attempt: u32,
    lease_from: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    at: DateTime<Utc>,
    step: u64,
}

/// What one tick claimed and dispatched.
struct TickRecord {
    claims: usize,
    dispatched: usize,
}

/// Counters of what the cases exercised, so a green run can be told from a vacuous one.
#[derive(Clone, Debug, Default)]
struct Stats {
    cases: u64,
    transitions: u64,
    fresh: u64,
    retry: u64,
    in_flight: u64,
    settled: u64,
    settled_in_claim: u64,
    reaped: u64,
    abandoned: u64,
    fenced_out: u64,
    timeouts: u64,
    effects: u64,
    deferring_ticks: u64,
    skipped: u64,
    stale_commits: u64,
    crashes: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.cases += o.cases;
        self.transitions += o.transitions;
        self.fresh += o.fresh;
        self.retry += o.retry;
        self.in_flight += o.in_flight;
        self.settled += o.settled;
        self.settled_in_claim += o.settled_in_claim;
        self.reaped += o.reaped;
        self.abandoned += o.abandoned;
        self.fenced_out += o.fenced_out;
        self.timeouts += o.timeouts;
        self.effects += o.effects;
        self.deferring_ticks += o.deferring_ticks;
        self.skipped += o.skipped;
        self.stale_commits += o.stale_commits;
        self.crashes += o.crashes;
    }
}

/// What the invariant checks remember between steps. Kept outside the world's own state so a
/// broken rule in the world cannot also break the record it is judged by.
#[derive(Default)]
struct Observer {
    /// Each settled row as first seen, and the step at which it was.
    settled: BTreeMap<Occurrence, (Fire, u64)>,
    /// Per routine, how many of its occurrences are known to be accounted for.
    covered: Vec<usize>,
    /// How many effects have been checked.
    effects_checked: usize,
}

/// The database and the schedulers.
struct World {
    setup: Setup,
    bug: Bug,
    lease: TimeDelta,
    rules: MisfireRules,
    cap: FireCap,
    now: DateTime<Utc>,
    routines: Vec<Routine>,
    fires: BTreeMap<Occurrence, Fire>,
    schedulers: Vec<Scheduler>,
    tokens: u128,
    step: u64,
    effects: Vec<Effect>,
    ticks: Vec<TickRecord>,
    /// Domain answers the world found inconsistent while applying a step.
    faults: Vec<String>,
    /// A readable log of what happened, printed with a failure.
    trace: Vec<String>,
    stats: Stats,
    observer: RefCell<Observer>,
}

impl World {
    fn new(setup: &Setup, bug: Bug) -> Self {
        let routines: Vec<Routine> = setup
            .routines
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (expr, zone) = SCHEDULES[r.schedule];
                let schedule = Schedule::parse(expr, zone).expect("the model's schedules parse");
                let created = setup.start - TimeDelta::seconds(r.created_secs_before as i64);
                let chain = Chain::new(schedule.clone(), created);
                Routine {
                    id: Uuid::from_u128(i as u128 + 1),
                    next_run_at: schedule.next_after(created),
                    schedule,
                    policy: r.policy,
                    version: 0,
                    chain,
                    skipped_total: 0,
                    skipped: BTreeSet::new(),
                    racy: false,
                    in_claim: r.in_claim,
                }
            })
            .collect();
        let schedulers = (0..setup.schedulers)
            .map(|s| Scheduler {
                instance: format!("s{s}"),
                generation: 0,
                up: true,
                items: Vec::new(),
                open: None,
            })
            .collect();
        World {
            bug,
            lease: TimeDelta::milliseconds(LEASE_MS),
            rules: MisfireRules {
                grace: Duration::from_secs(setup.grace_secs),
                max_backlog: setup.max_backlog,
                max_scan: setup.max_scan,
            },
            cap: FireCap::new(setup.cap).unwrap(),
            now: setup.start,
            observer: RefCell::new(Observer {
                covered: vec![0; routines.len()],
                ..Observer::default()
            }),
            routines,
            fires: BTreeMap::new(),
            schedulers,
            tokens: 0,
            step: 0,
            effects: Vec::new(),
            ticks: Vec::new(),
            faults: Vec::new(),
            trace: Vec::new(),
            stats: Stats {
                cases: 1,
                ..Stats::default()
            },
            setup: setup.clone(),
        }
    }

    /// A time as seconds since the case's start, for the trace.
    fn rel(&self, t: DateTime<Utc>) -> String {
        let ms = (t - self.setup.start).num_milliseconds();
        format!(
            "{}{}.{:03}s",
            if ms < 0 { "-" } else { "+" },
            ms.abs() / 1000,
            ms.abs() % 1000
        )
    }

    fn occ(&self, o: &Occurrence) -> String {
        format!("r{}@{}", o.routine_id.as_u128(), self.rel(o.scheduled_at))
    }

    fn log(&mut self, line: String) {
        self.trace
            .push(format!("[{}] now {} {line}", self.step, self.rel(self.now)));
    }

    fn fault(&mut self, what: String) {
        self.log(format!("FAULT {what}"));
        self.faults.push(what);
    }

    /// Every claim statement and reaper pass runs with a token of its own.
    fn fresh_token(&mut self) -> ClaimToken {
        self.tokens += 1;
        ClaimToken(Uuid::from_u128(self.tokens))
    }

    fn apply(&mut self, transition: &Transition) {
        self.step += 1;
        self.stats.transitions += 1;
        self.log(format!("{transition:?}"));
        match *transition {
            Transition::Tick(s) => {
                let open = self.begin_tick();
                self.commit_tick(s, open);
            }
            Transition::TickBegin(s) => {
                let open = self.begin_tick();
                self.schedulers[s].open = Some(open);
            }
            Transition::TickCommit(s) => {
                let open = self.schedulers[s].open.take().expect("an open tick");
                self.commit_tick(s, open);
            }
            Transition::Dispatch { s, pick, ok } => self.dispatch(s, pick, ok),
            Transition::Settle { s, pick } => self.settle_item(s, pick),
            Transition::Skip { s, pick } => self.skip(s, pick),
            Transition::Reap(s) => self.reap(s),
            Transition::Crash(s) => {
                let scheduler = &mut self.schedulers[s];
                scheduler.up = false;
                scheduler.items.clear();
                scheduler.open = None;
                self.stats.crashes += 1;
            }
            Transition::Restart { s, same_id } => {
                let scheduler = &mut self.schedulers[s];
                scheduler.up = true;
                scheduler.generation += 1;
                if !same_id {
                    scheduler.instance = format!("s{s}g{}", scheduler.generation);
                }
            }
            Transition::AdvanceClock(ms) => self.now += TimeDelta::milliseconds(ms as i64),
        }
        self.time_out();
    }

    /// The read half of a tick: the clock, the due routines, their misfire plans and the tick
    /// plan under the cap.
    fn begin_tick(&mut self) -> OpenTick {
        let now = self.now;
        let mut read = Vec::new();
        let mut due = Vec::new();
        for (i, r) in self.routines.iter().enumerate() {
            let Some(next) = r.next_run_at.filter(|next| *next <= now) else {
                continue;
            };
            read.push((i, next, r.version));
            due.push((
                r.id,
                plan_due(next, &r.schedule, now, r.policy, &self.rules),
            ));
        }
        let plan = plan_tick(&due, self.cap);

        let mut planned: Vec<Occurrence> = due
            .iter()
            .flat_map(|(id, p)| p.occurrences.iter().map(|at| Occurrence::new(*id, *at)))
            .collect();
        planned.sort();
        planned.dedup();
        if !plan.claims.is_sorted() || plan.claims.len() + plan.deferred != planned.len() {
            self.fault(format!(
                "plan_tick claims {} (sorted: {}) and defers {} of {} planned occurrences",
                plan.claims.len(),
                plan.claims.is_sorted(),
                plan.deferred,
                planned.len()
            ));
        }
        if plan
            .claims
            .iter()
            .any(|c| planned.binary_search(c).is_err())
        {
            self.fault("plan_tick claims an occurrence no plan named".into());
        }
        if plan.deferred > 0 {
            self.stats.deferring_ticks += 1;
        }
        OpenTick {
            now,
            read,
            due,
            plan,
        }
    }

    /// The write half of a tick: the claim statement over the planned occurrences, the routines'
    /// new clocks, then the classification of every returned row.
    fn commit_tick(&mut self, s: usize, open: OpenTick) {
        let token = self.fresh_token();
        let claimant = self.schedulers[s].instance.clone();
        let until = open.now + self.lease;

        // INSERT … ON CONFLICT (routine_id, scheduled_at) DO UPDATE … WHERE status = 'claimed'
        // AND lease_expires_at <= now() RETURNING (xmax = 0) AS inserted, …
        let mut returned = Vec::with_capacity(open.plan.claims.len());
        let mut in_claim_effects = 0;
        for occurrence in &open.plan.claims {
            let take_live = self.bug == Bug::ClaimTakesLiveLease;
            let in_claim = self
                .routines
                .iter()
                .any(|r| r.id == occurrence.routine_id && r.in_claim);
            let (inserted, row) = match self.fires.get_mut(occurrence) {
                // A database-local backend: the row is inserted `fired` and its effect (the
                // outbox row) is written by the same statement, at the transaction's clock.
                None if in_claim => {
                    let row = Fire {
                        status: FireStatus::Fired,
                        claimant: claimant.clone(),
                        token,
                        attempt: 1,
                        lease_from: open.now,
                        lease_until: until,
                        error: None,
                    };
                    self.fires.insert(*occurrence, row.clone());
                    self.effects.push(Effect {
                        occurrence: *occurrence,
                        claimant: claimant.clone(),
                        token,
                        attempt: 1,
                        lease_from: open.now,
                        lease_until: until,
                        at: open.now,
                        step: self.step,
                    });
                    self.stats.effects += 1;
                    in_claim_effects += 1;
                    (true, row)
                }
                None => {
                    let row = Fire {
                        status: FireStatus::Claimed,
                        claimant: claimant.clone(),
                        token,
                        attempt: 1,
                        lease_from: open.now,
                        lease_until: until,
                        error: None,
                    };
                    self.fires.insert(*occurrence, row.clone());
                    (true, row)
                }
                Some(row) => {
                    if in_claim && self.bug == Bug::InClaimOnExistingRow {
                        self.effects.push(Effect {
                            occurrence: *occurrence,
                            claimant: claimant.clone(),
                            token,
                            attempt: row.attempt,
                            lease_from: open.now,
                            lease_until: until,
                            at: open.now,
                            step: self.step,
                        });
                    }
                    if row.status == FireStatus::Claimed
                        && (lease_expired(row.lease_until, open.now) || take_live)
                    {
                        row.claimant = claimant.clone();
                        row.token = token;
                        row.attempt += 1;
                        row.lease_from = open.now;
                        row.lease_until = until;
                    }
                    (false, row.clone())
                }
            };
            returned.push((*occurrence, claim_row(inserted, &row)));
        }

        // UPDATE routines SET next_run_at = … in the same transaction.
        let mut stale = false;
        for (k, advance) in open.plan.advances.iter().enumerate() {
            let (index, planned_from, version) = open.read[k];
            let (_, due_plan) = &open.due[k];
            if advance.routine_id != self.routines[index].id || advance.skipped != due_plan.skipped
            {
                self.fault(format!(
                    "plan_tick's advance {advance:?} does not match its plan"
                ));
            }
            let target = match self.bug {
                Bug::DeferralDropped => due_plan.next_run_at,
                _ => advance.next_run_at,
            };
            // Which occurrences the misfire plan skipped: those it walked over and did not name.
            if due_plan.occurrences.is_empty()
                && due_plan.skipped == 0
                && due_plan
                    .next_run_at
                    .is_some_and(|next| next <= planned_from)
            {
                let what = format!(
                    "plan_due from {} at {} names nothing, skips nothing and leaves the clock at {}: \
                     the routine can never move on",
                    self.rel(planned_from),
                    self.rel(open.now),
                    due_plan.next_run_at.map_or("none".into(), |t| self.rel(t))
                );
                self.fault(what);
            }
            let walked = self.routines[index]
                .chain
                .between(planned_from, due_plan.next_run_at);
            if due_plan
                .occurrences
                .iter()
                .any(|t| walked.binary_search(t).is_err())
            {
                let what = format!(
                    "plan_due from {} names occurrences outside what it walked: {:?}",
                    self.rel(planned_from),
                    due_plan
                );
                self.fault(what);
            }
            // Lateness is judged once per routine, by its oldest owed occurrence: on time, the
            // plan skips nothing; misfired, its policy bounds what fires for everything owed.
            let grace = TimeDelta::from_std(self.rules.grace).unwrap();
            let policy = self.routines[index].policy;
            let keep = match policy {
                MisfirePolicy::FireOnce => 1,
                MisfirePolicy::CatchUp => self.rules.max_backlog,
                MisfirePolicy::Skip => 0,
            };
            let misfired = planned_from < open.now - grace;
            if (!misfired && due_plan.skipped > 0)
                || (misfired && due_plan.occurrences.len() > keep)
            {
                let what = format!(
                    "plan_due under {policy} from {} at {} ({}) fires {} and skips {}",
                    self.rel(planned_from),
                    self.rel(open.now),
                    if misfired { "misfired" } else { "on time" },
                    due_plan.occurrences.len(),
                    due_plan.skipped
                );
                self.fault(what);
            }
            let skipped: Vec<_> = walked
                .into_iter()
                .filter(|t| !due_plan.occurrences.contains(t))
                .collect();
            if skipped.len() as u64 != due_plan.skipped {
                let what = format!(
                    "plan_due from {} reports {} skipped, but walked over {} occurrences it did not name",
                    self.rel(planned_from),
                    due_plan.skipped,
                    skipped.len()
                );
                self.fault(what);
            }
            let routine = &mut self.routines[index];
            if routine.version != version {
                routine.racy = true;
                stale = true;
            }
            routine.next_run_at = match self.setup.update {
                RoutineUpdate::Plain => target,
                RoutineUpdate::Greatest => latest(routine.next_run_at, target),
            };
            routine.version += 1;
            routine.skipped_total += advance.skipped;
            routine.skipped.extend(skipped);
            self.stats.skipped += advance.skipped;
        }
        if stale {
            self.stats.stale_commits += 1;
        }
        let tick = self.ticks.len();
        self.ticks.push(TickRecord {
            claims: open.plan.claims.len(),
            dispatched: in_claim_effects,
        });
        self.log(format!(
            "{claimant} claims {} at {} (token {}), defers {}",
            open.plan.claims.len(),
            self.rel(open.now),
            token.0.as_u128(),
            open.plan.deferred
        ));

        for (occurrence, row) in returned {
            let outcome = ClaimOutcome::classify(&row, token);
            match outcome {
                ClaimOutcome::Fresh => self.stats.fresh += 1,
                ClaimOutcome::Retry { .. } => self.stats.retry += 1,
                ClaimOutcome::InFlight { .. } => self.stats.in_flight += 1,
                ClaimOutcome::Settled(_) => self.stats.settled += 1,
                ClaimOutcome::SettledInClaim(_) => self.stats.settled_in_claim += 1,
            }
            self.log(format!("  {} -> {outcome:?}", self.occ(&occurrence)));
            self.act(s, occurrence, &row, outcome, Some(tick));
        }
    }

    /// Applies what the domain says to do with a claimed row.
    fn act(
        &mut self,
        s: usize,
        occurrence: Occurrence,
        row: &ClaimRow,
        outcome: ClaimOutcome,
        tick: Option<usize>,
    ) {
        match outcome.action(self.setup.max_attempts) {
            ClaimAction::Dispatch { attempt } => {
                if attempt != row.attempt {
                    self.fault(format!(
                        "action says dispatch attempt {attempt} for a row at attempt {}",
                        row.attempt
                    ));
                }
                self.schedulers[s].items.push(Item {
                    occurrence,
                    token: row.token,
                    attempt,
                    lease_from: self.fires[&occurrence].lease_from,
                    lease_until: row.lease_expires_at,
                    tick,
                    state: ItemState::Pending,
                });
            }
            ClaimAction::Abandon { reason } => {
                self.stats.abandoned += 1;
                // The abandon settle runs in the claim's own transaction, so no crash can leave a
                // row past the attempt limit unsettled.
                self.settle(
                    occurrence,
                    row.token,
                    row.attempt,
                    Settlement::Failed(reason),
                );
            }
            ClaimAction::Leave => {}
        }
    }

    /// The backend call: the side effect happens now, under the item's lease.
    fn dispatch(&mut self, s: usize, pick: u8, ok: bool) {
        let Some(k) = self.pending_item(s, pick) else {
            return;
        };
        let now = self.now;
        let item = self.schedulers[s].items[k].clone();
        if lease_expired(item.lease_until, now) {
            self.fault("a scheduler holds a dispatch whose lease ran out".into());
            return;
        }
        self.effects.push(Effect {
            occurrence: item.occurrence,
            claimant: self.schedulers[s].instance.clone(),
            token: item.token,
            attempt: item.attempt,
            lease_from: item.lease_from,
            lease_until: item.lease_until,
            at: now,
            step: self.step,
        });
        self.stats.effects += 1;
        if let Some(tick) = item.tick {
            self.ticks[tick].dispatched += 1;
        }
        let result = if ok {
            Settlement::Fired
        } else {
            Settlement::Failed(ErrorText::new("the backend refused"))
        };
        self.log(format!(
            "  effect {} attempt {} ({result:?})",
            self.occ(&item.occurrence),
            item.attempt
        ));
        self.schedulers[s].items[k].state = ItemState::Done(result);
    }

    /// One of scheduler `s`'s claimed, not yet dispatched items, picked by `pick`.
    fn pending_item(&self, s: usize, pick: u8) -> Option<usize> {
        let pending: Vec<usize> = self.schedulers[s]
            .items
            .iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.state, ItemState::Pending))
            .map(|(k, _)| k)
            .collect();
        (!pending.is_empty()).then(|| pending[pick as usize % pending.len()])
    }

    /// The overlap check of `forbid` before a launch: an earlier run holds the routine, so the
    /// occurrence gets no effect and is settled `skipped` (by a later Settle step, fenced as
    /// every settle is).
    fn skip(&mut self, s: usize, pick: u8) {
        let Some(k) = self.pending_item(s, pick) else {
            return;
        };
        let occurrence = self.schedulers[s].items[k].occurrence;
        self.log(format!(
            "  {} skipped: an earlier run holds its routine",
            self.occ(&occurrence)
        ));
        self.schedulers[s].items[k].state = ItemState::Done(Settlement::Skipped(ErrorText::new(
            "skipped: the run of an earlier fire is still running (overlap forbid)",
        )));
    }

    /// A scheduler settles one dispatch it finished.
    fn settle_item(&mut self, s: usize, pick: u8) {
        let done: Vec<usize> = self.schedulers[s]
            .items
            .iter()
            .enumerate()
            .filter(|(_, i)| matches!(i.state, ItemState::Done(_)))
            .map(|(k, _)| k)
            .collect();
        if done.is_empty() {
            return;
        }
        let item = self.schedulers[s]
            .items
            .remove(done[pick as usize % done.len()]);
        let ItemState::Done(settlement) = item.state else {
            unreachable!("only finished dispatches are settled")
        };
        self.settle(item.occurrence, item.token, item.attempt, settlement);
    }

    /// The fenced settle: `UPDATE routine_fires SET status = …, error = … WHERE routine_id = …
    /// AND scheduled_at = … AND status = 'claimed' AND token = $token AND attempt = $attempt`.
    fn settle(
        &mut self,
        occurrence: Occurrence,
        token: ClaimToken,
        attempt: u32,
        settlement: Settlement,
    ) -> bool {
        let unfenced = self.bug == Bug::UnfencedSettle;
        let Some(row) = self.fires.get_mut(&occurrence) else {
            self.fault("a settle for an occurrence the ledger does not hold".into());
            return false;
        };
        if !(row.token == token && row.attempt == attempt || unfenced) {
            self.stats.fenced_out += 1;
            self.log(format!("  settle of {} fenced out", self.occ(&occurrence)));
            return false;
        }
        match row.status.settle(&settlement) {
            Ok(status) => {
                row.status = status;
                row.error = settlement.error().map(str::to_owned);
                self.log(format!("  {} settled {status}", self.occ(&occurrence)));
                true
            }
            Err(_) => false,
        }
    }

    /// The reaper, one statement: take over every `claimed` row whose lease ran out by the
    /// database clock (`FOR UPDATE SKIP LOCKED`), then act on each as a Retry.
    fn reap(&mut self, s: usize) {
        let token = self.fresh_token();
        let claimant = self.schedulers[s].instance.clone();
        let now = self.now;
        let until = now + self.lease;
        let take_live = self.bug == Bug::ReaperTakesLiveLease;
        let mut returned = Vec::new();
        for (occurrence, row) in self.fires.iter_mut() {
            if row.status == FireStatus::Claimed
                && (lease_expired(row.lease_until, now) || take_live)
            {
                row.claimant = claimant.clone();
                row.token = token;
                row.attempt += 1;
                row.lease_from = now;
                row.lease_until = until;
                returned.push((*occurrence, claim_row(false, row)));
            }
        }
        self.log(format!(
            "{claimant} reaps {} (token {})",
            returned.len(),
            token.0.as_u128()
        ));
        for (occurrence, row) in returned {
            self.stats.reaped += 1;
            let outcome = ClaimOutcome::classify(&row, token);
            if !matches!(outcome, ClaimOutcome::Retry { .. }) {
                self.fault(format!("a reaped row classifies as {outcome:?}, not Retry"));
            }
            self.act(s, occurrence, &row, outcome, None);
        }
    }

    /// A dispatch never outlives its lease: its timeout, shorter than the lease, stops it first.
    /// A dispatch that had not produced its effect by then never will; the scheduler settles it
    /// failed (fenced) when it gets to it.
    fn time_out(&mut self) {
        let now = self.now;
        let mut timed_out = 0;
        for scheduler in self.schedulers.iter_mut().filter(|s| s.up) {
            for item in &mut scheduler.items {
                if matches!(item.state, ItemState::Pending) && lease_expired(item.lease_until, now)
                {
                    item.state = ItemState::Done(Settlement::Failed(ErrorText::new(
                        "the dispatch timed out",
                    )));
                    timed_out += 1;
                }
            }
        }
        self.stats.timeouts += timed_out;
    }

    // -----------------------------------------------------------------------------------------
    // The invariants.
    // -----------------------------------------------------------------------------------------

    /// Checks every invariant; the error names the one that failed in brackets.
    fn check(&self) -> Result<(), String> {
        if let Some(fault) = self.faults.first() {
            return Err(format!("[domain] {fault}"));
        }
        let mut observer = self.observer.borrow_mut();
        self.check_settled(&mut observer)?;
        self.check_effects(&mut observer)?;
        self.check_attempts()?;
        self.check_cap()?;
        self.check_owed(&mut observer)?;
        Ok(())
    }

    /// Invariant 3: settled rows never change, and nothing is dispatched after its row settled.
    fn check_settled(&self, observer: &mut Observer) -> Result<(), String> {
        for (occurrence, row) in &self.fires {
            match observer.settled.get(occurrence) {
                Some((first, _)) if first != row => {
                    return Err(format!(
                        "[settled-changed] {} was settled as {first:?} and is now {row:?}",
                        self.occ(occurrence)
                    ));
                }
                Some(_) => {}
                None if row.status == FireStatus::Skipped && row.error.is_none() => {
                    return Err(format!(
                        "[skipped-reason] {} was skipped without a reason",
                        self.occ(occurrence)
                    ));
                }
                None if row.status.is_settled() => {
                    observer
                        .settled
                        .insert(*occurrence, (row.clone(), self.step));
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Invariant 1: an effect happens inside its claim's lease, and no occurrence has effects from
    /// two claims whose leases overlap. Also invariant 3's second half.
    fn check_effects(&self, observer: &mut Observer) -> Result<(), String> {
        for (n, effect) in self
            .effects
            .iter()
            .enumerate()
            .skip(observer.effects_checked)
        {
            if effect.at < effect.lease_from || lease_expired(effect.lease_until, effect.at) {
                return Err(format!(
                    "[outside-lease] {} dispatched at {} under a lease [{}, {})",
                    self.occ(&effect.occurrence),
                    self.rel(effect.at),
                    self.rel(effect.lease_from),
                    self.rel(effect.lease_until)
                ));
            }
            if let Some((row, settled_at)) = observer.settled.get(&effect.occurrence)
                && effect.step > *settled_at
            {
                return Err(format!(
                    "[dispatch-after-settle] {} dispatched by {} attempt {} at step {} after it \
                     settled {} at step {settled_at}",
                    self.occ(&effect.occurrence),
                    effect.claimant,
                    effect.attempt,
                    effect.step,
                    row.status
                ));
            }
            for earlier in self.effects[..n]
                .iter()
                .filter(|e| e.occurrence == effect.occurrence)
            {
                if earlier.token != effect.token
                    && earlier.lease_from < effect.lease_until
                    && effect.lease_from < earlier.lease_until
                {
                    return Err(format!(
                        "[overlap] {} dispatched by {} (attempt {}, lease [{}, {})) and by {} \
                         (attempt {}, lease [{}, {}))",
                        self.occ(&effect.occurrence),
                        earlier.claimant,
                        earlier.attempt,
                        self.rel(earlier.lease_from),
                        self.rel(earlier.lease_until),
                        effect.claimant,
                        effect.attempt,
                        self.rel(effect.lease_from),
                        self.rel(effect.lease_until)
                    ));
                }
                // A later effect for the same occurrence comes from a later claim of it.
                if earlier.attempt >= effect.attempt {
                    return Err(format!(
                        "[attempt-order] {} dispatched as attempt {} after attempt {}",
                        self.occ(&effect.occurrence),
                        effect.attempt,
                        earlier.attempt
                    ));
                }
            }
        }
        observer.effects_checked = self.effects.len();
        Ok(())
    }

    /// Attempts are bounded: never above `max_attempts + 1`, and a row past the limit is failed.
    fn check_attempts(&self) -> Result<(), String> {
        let max = self.setup.max_attempts;
        for (occurrence, row) in &self.fires {
            if row.attempt == 0
                || row.attempt > max + 1
                || (row.attempt > max && row.status != FireStatus::Failed)
            {
                return Err(format!(
                    "[attempts] {} is {} at attempt {} (max attempts {max})",
                    self.occ(occurrence),
                    row.status,
                    row.attempt
                ));
            }
        }
        Ok(())
    }

    /// Invariant 4: no tick claims or dispatches more than the cap.
    fn check_cap(&self) -> Result<(), String> {
        let cap = self.cap.get();
        match self
            .ticks
            .iter()
            .position(|t| t.claims > cap || t.dispatched > cap)
        {
            Some(n) => Err(format!(
                "[cap] tick {n} claimed {} and dispatched {} under a cap of {cap}",
                self.ticks[n].claims, self.ticks[n].dispatched
            )),
            None => Ok(()),
        }
    }

    /// Invariant 2, owed before the clock moves: every occurrence of a routine's schedule before
    /// its `next_run_at` is in the ledger or was skipped by its misfire policy; every ledger row
    /// is an occurrence; and when no two ticks raced on the routine, the counts add up exactly
    /// (rows + skipped = occurrences behind the clock, each row behind the clock).
    fn check_owed(&self, observer: &mut Observer) -> Result<(), String> {
        let index: HashMap<RoutineId, usize> = self
            .routines
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, i))
            .collect();
        let mut rows = vec![0usize; self.routines.len()];
        for occurrence in self.fires.keys() {
            let i = index[&occurrence.routine_id];
            rows[i] += 1;
            let routine = &self.routines[i];
            if !routine.chain.contains(occurrence.scheduled_at) {
                return Err(format!(
                    "[owed] the ledger holds {}, which is not an occurrence of its schedule",
                    self.occ(occurrence)
                ));
            }
            if !routine.racy
                && routine
                    .next_run_at
                    .is_some_and(|n| occurrence.scheduled_at >= n)
            {
                return Err(format!(
                    "[owed] the ledger holds {} at or after the routine's clock",
                    self.occ(occurrence)
                ));
            }
        }
        for (i, routine) in self.routines.iter().enumerate() {
            let behind = routine.chain.count_before(routine.next_run_at);
            for n in observer.covered[i]..behind {
                let at = routine.chain.get(n);
                let occurrence = Occurrence::new(routine.id, at);
                if !self.fires.contains_key(&occurrence) && !routine.skipped.contains(&at) {
                    return Err(format!(
                        "[owed] {} is behind the clock ({}) but neither in the ledger nor skipped",
                        self.occ(&occurrence),
                        routine.next_run_at.map_or("none".into(), |t| self.rel(t))
                    ));
                }
            }
            observer.covered[i] = observer.covered[i].max(behind);
            if !routine.racy && rows[i] as u64 + routine.skipped_total != behind as u64 {
                return Err(format!(
                    "[owed] routine r{} has {} rows and {} skipped, but {behind} occurrences are \
                     behind its clock",
                    routine.id.as_u128(),
                    rows[i],
                    routine.skipped_total
                ));
            }
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // The drain: liveness.
    // -----------------------------------------------------------------------------------------

    /// Applies one transition and checks the invariants, as a generated step would.
    fn step(&mut self, transition: Transition) -> Result<(), String> {
        self.apply(&transition);
        self.check()
    }

    /// Dispatches (successfully) and settles everything every scheduler holds.
    fn finish_in_flight(&mut self) -> Result<(), String> {
        for s in 0..self.schedulers.len() {
            while self.schedulers[s]
                .items
                .iter()
                .any(|i| matches!(i.state, ItemState::Pending))
            {
                self.step(Transition::Dispatch {
                    s,
                    pick: 0,
                    ok: true,
                })?;
            }
            while !self.schedulers[s].items.is_empty() {
                self.step(Transition::Settle { s, pick: 0 })?;
            }
        }
        Ok(())
    }

    /// Invariant 5, liveness: with every scheduler running, the ledger drains. Open ticks
    /// commit, crashed schedulers restart, in-flight dispatches finish; then the clock moves one
    /// lease on and the schedulers tick and reap until nothing is due and nothing is claimed.
    fn drain(&mut self) -> Result<(), String> {
        self.log("drain".into());
        for s in 0..self.schedulers.len() {
            if self.schedulers[s].up && self.schedulers[s].open.is_some() {
                self.step(Transition::TickCommit(s))?;
            }
            if !self.schedulers[s].up {
                self.step(Transition::Restart { s, same_id: false })?;
            }
        }
        self.finish_in_flight()?;
        self.step(Transition::AdvanceClock(LEASE_MS as u64))?;
        self.finish_in_flight()?;

        // The clock stands still now, so finitely many occurrences are owed and every tick makes
        // progress (claims one or moves a clock past skipped misfires). A bound far above what a
        // case can owe turns a routine that never progresses into a failure.
        let mut ticks = 0;
        while self
            .routines
            .iter()
            .any(|r| r.next_run_at.is_some_and(|n| n <= self.now))
        {
            ticks += 1;
            if ticks > 5_000 {
                let stuck: Vec<String> = self
                    .routines
                    .iter()
                    .filter(|r| r.next_run_at.is_some_and(|n| n <= self.now))
                    .map(|r| {
                        format!(
                            "r{} ({:?}) due at {}",
                            r.id.as_u128(),
                            r.policy,
                            self.rel(r.next_run_at.unwrap())
                        )
                    })
                    .collect();
                return Err(format!(
                    "[liveness] after {} ticks with the clock standing still, routines are still \
                     due and their clocks do not move: {}",
                    ticks - 1,
                    stuck.join(", ")
                ));
            }
            self.step(Transition::Tick(ticks % self.schedulers.len()))?;
            self.finish_in_flight()?;
        }
        self.step(Transition::Reap(0))?;
        self.finish_in_flight()?;

        if let Some((occurrence, row)) = self.fires.iter().find(|(_, r)| !r.status.is_settled()) {
            return Err(format!(
                "[liveness] after the drain {} is still claimed: {row:?}",
                self.occ(occurrence)
            ));
        }
        Ok(())
    }

    /// The last lines of the trace and the ledger, for a failure message.
    fn report(&self) -> String {
        let skip = self.trace.len().saturating_sub(80);
        let mut out = format!(
            "setup: {:?}\ntrace (last {} lines):\n",
            self.setup,
            self.trace.len() - skip
        );
        for line in &self.trace[skip..] {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("ledger:\n");
        for (occurrence, row) in &self.fires {
            out.push_str(&format!(
                "  {} {} by {} attempt {} lease [{}, {}) {}\n",
                self.occ(occurrence),
                row.status,
                row.claimant,
                row.attempt,
                self.rel(row.lease_from),
                self.rel(row.lease_until),
                row.error.as_deref().unwrap_or("")
            ));
        }
        out
    }
}

/// The row a claim or reaper statement returns.
fn claim_row(inserted: bool, row: &Fire) -> ClaimRow {
    ClaimRow {
        inserted,
        status: row.status,
        claimant: row.claimant.clone(),
        token: row.token,
        attempt: row.attempt,
        lease_expires_at: row.lease_until,
        last_error: None,
    }
}

/// The later of two clocks, where `None` (no later occurrence) is the latest.
fn latest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Wiring into proptest-state-machine, and the tests.
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// What the cases of the test running on this thread exercised.
    static STATS: RefCell<Stats> = RefCell::new(Stats::default());
}

impl StateMachineTest for ClaimProtocol {
    type SystemUnderTest = World;
    type Reference = ClaimProtocol;

    fn init_test(ref_state: &RefState) -> World {
        World::new(&ref_state.setup, Bug::None)
    }

    fn apply(mut world: World, _: &RefState, transition: Transition) -> World {
        world.apply(&transition);
        world
    }

    fn check_invariants(world: &World, _: &RefState) {
        if let Err(violation) = world.check() {
            panic!("{violation}\n{}", world.report());
        }
    }

    fn teardown(mut world: World, _: RefState) {
        if let Err(violation) = world.drain() {
            panic!("{violation}\n{}", world.report());
        }
        STATS.with(|stats| stats.borrow_mut().add(&world.stats));
    }
}

/// How many cases the main test runs unless `PROPTEST_CASES` says otherwise. A case takes about
/// ten milliseconds in a debug build, so this is some ten seconds.
const DEFAULT_CASES: u32 = 1024;

/// The main test's configuration: [`DEFAULT_CASES`] cases, or `PROPTEST_CASES` (which
/// proptest's default configuration reads), a bounded shrink, and no regression file written
/// beside the sources.
fn config() -> ProptestConfig {
    let base = ProptestConfig::default();
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            base.cases
        } else {
            DEFAULT_CASES
        },
        max_shrink_iters: 4096,
        failure_persistence: None,
        ..base
    }
}

/// What the sequential strategy generates: the initial state, the transitions, and the counter
/// of transitions run that its shrinking uses.
type Case = (RefState, Vec<Transition>, Option<Arc<AtomicUsize>>);

/// The model: random sequences of ticks, dispatches, settles, reaps, crashes, restarts and clock
/// moves over 2 to 5 schedulers and 1 to 4 routines keep every invariant after every step, and
/// drain when left running. Prints how many cases and transitions ran and which paths they took.
#[test]
fn claim_protocol_holds_for_racing_crashing_schedulers() {
    let config = config();
    let started = Instant::now();
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(
        &ClaimProtocol::sequential_strategy(1..=MAX_TRANSITIONS),
        |(state, transitions, seen): Case| {
            ClaimProtocol::test_sequential(config.clone(), state, transitions, seen);
            Ok(())
        },
    );
    if let Err(error) = result {
        panic!("{error}");
    }
    let stats = STATS.with(|stats| stats.borrow().clone());
    println!(
        "claim model: {} cases, {} transitions (generated ones and the drain's; {:.1} a case), \
         {:.1?}\n  {stats:?}",
        stats.cases,
        stats.transitions,
        stats.transitions as f64 / stats.cases.max(1) as f64,
        started.elapsed(),
    );
    // A run long enough to mean something must have reached every path of the protocol. (A
    // claim statement takes a row over only after a tick transaction stayed open for a whole
    // lease, about once in thirty cases, so shorter runs may miss it.)
    if stats.cases >= 256 {
        for (what, n) in [
            ("Fresh", stats.fresh),
            ("Retry", stats.retry),
            ("InFlight", stats.in_flight),
            ("Settled", stats.settled),
            ("SettledInClaim", stats.settled_in_claim),
            ("reaped", stats.reaped),
            ("abandoned", stats.abandoned),
            ("fenced-out settles", stats.fenced_out),
            ("timeouts", stats.timeouts),
            ("deferring ticks", stats.deferring_ticks),
            ("skipped misfires", stats.skipped),
            ("stale tick commits", stats.stale_commits),
        ] {
            assert!(n > 0, "no case exercised {what}: {stats:?}");
        }
    }
}

/// A misfire backlog longer than the walk bound (`catch-up` keeping 3 with a scan of 1, or
/// `fire-once` with a scan of 1) used to leave the routine's clock where it was on every tick,
/// so the routine never fired again; this model found it in its drain. Every plan must now
/// make progress, and repeated plans must reach the present.
#[test]
fn plan_due_moves_on_when_the_backlog_is_longer_than_the_walk() {
    let every_second = Schedule::parse("*/1 * * * * *", "UTC").unwrap();
    let start = Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap();
    let now = start + TimeDelta::seconds(60);
    for policy in [
        MisfirePolicy::CatchUp,
        MisfirePolicy::FireOnce,
        MisfirePolicy::Skip,
    ] {
        for (max_backlog, max_scan) in [(3, 1), (5, 5), (5, 2), (1, 1)] {
            let rules = MisfireRules {
                grace: Duration::ZERO,
                max_backlog,
                max_scan,
            };
            let mut due = start;
            let mut plans = 0;
            loop {
                let plan = plan_due(due, &every_second, now, policy, &rules);
                let next = plan.next_run_at.unwrap();
                assert!(
                    next > due,
                    "{policy} backlog {max_backlog} scan {max_scan}: stuck at {due}: {plan:?}"
                );
                due = next;
                plans += 1;
                if due > now {
                    break;
                }
                assert!(
                    plans <= 61,
                    "{policy} backlog {max_backlog} scan {max_scan} never caught up"
                );
            }
        }
    }
}

/// Runs one case against a world built with `bug`: the same steps and checks as
/// [`StateMachineTest::test_sequential`], with the violation returned instead of panicking,
/// beside the world it happened in.
fn run_case(
    state: &RefState,
    transitions: &[Transition],
    seen: Option<&AtomicUsize>,
    bug: Bug,
) -> (World, Result<(), String>) {
    let mut world = World::new(&state.setup, bug);
    let mut outcome = world.check();
    for transition in transitions {
        if outcome.is_err() {
            break;
        }
        if let Some(seen) = seen {
            seen.fetch_add(1, Ordering::SeqCst);
        }
        world.apply(transition);
        outcome = world.check();
    }
    let outcome = outcome.and_then(|()| world.drain());
    (world, outcome)
}

/// Searches for a sequence that the broken rule `bug` lets violate an invariant, shrinks it, and
/// returns the violation. The search is seeded, so it finds the same sequence on every run.
fn hunt(bug: Bug) -> String {
    let config = ProptestConfig {
        cases: 4096,
        max_shrink_iters: 4096,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let rng = TestRng::deterministic_rng(config.rng_algorithm);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let runs = Cell::new(0u32);
    let first_failure = Cell::new(None);
    let result = runner.run(
        &ClaimProtocol::sequential_strategy(1..=MAX_TRANSITIONS),
        |(state, transitions, seen): Case| {
            runs.set(runs.get() + 1);
            let (_, outcome) = run_case(&state, &transitions, seen.as_deref(), bug);
            if outcome.is_err() && first_failure.get().is_none() {
                first_failure.set(Some(runs.get()));
            }
            outcome.map_err(TestCaseError::fail)
        },
    );
    match result {
        Err(TestError::Fail(reason, (state, transitions, _))) => {
            let (world, again) = run_case(&state, &transitions, None, bug);
            assert!(
                again.is_err(),
                "the minimal case for {bug:?} passes when run again"
            );
            println!(
                "{bug:?}: case {} failed, {} runs with shrinking; minimal sequence ({} steps): \
                 {transitions:?}\nviolation: {reason}\n{}",
                first_failure.get().unwrap_or_default(),
                runs.get(),
                transitions.len(),
                world.report()
            );
            reason.message().to_owned()
        }
        Err(other) => panic!("the search for {bug:?} stopped: {other}"),
        Ok(()) => panic!("the model did not notice the broken rule {bug:?}"),
    }
}

/// Asserts that the model fails the world with `bug`, with one of the violations `expected`.
fn assert_caught(bug: Bug, expected: &[&str]) {
    let violation = hunt(bug);
    assert!(
        expected.iter().any(|tag| violation.starts_with(tag)),
        "{bug:?} was caught, but as {violation:?}, not one of {expected:?}"
    );
}

/// A claim statement that reads InFlight as a crash lets two live schedulers dispatch one
/// occurrence.
#[test]
fn model_catches_a_claim_that_takes_over_a_live_lease() {
    assert_caught(
        Bug::ClaimTakesLiveLease,
        &["[overlap]", "[dispatch-after-settle]"],
    );
}

/// A reaper that ignores the lease retries an occurrence its live claimant is still dispatching.
#[test]
fn model_catches_a_reaper_that_takes_over_a_live_lease() {
    assert_caught(
        Bug::ReaperTakesLiveLease,
        &["[overlap]", "[dispatch-after-settle]"],
    );
}

/// A late settle from a claimant whose lease ran out overwrites the row of the one that took it
/// over.
#[test]
fn model_catches_an_unfenced_settle() {
    assert_caught(
        Bug::UnfencedSettle,
        &["[dispatch-after-settle]", "[settled-changed]"],
    );
}

/// A tick that moves the clock past occurrences the cap deferred loses them.
#[test]
fn model_catches_a_tick_that_drops_deferred_occurrences() {
    assert_caught(Bug::DeferralDropped, &["[owed]"]);
}

/// A database-local claim that writes its message for rows that already exist doubles the
/// effect of an occurrence another tick already fired.
#[test]
fn model_catches_an_in_claim_write_for_an_existing_row() {
    assert_caught(
        Bug::InClaimOnExistingRow,
        &["[overlap]", "[dispatch-after-settle]", "[attempt-order]"],
    );
}
