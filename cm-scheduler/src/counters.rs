//! What the loop counts: fires by outcome, deferrals, misfires, reaped retries, tick errors,
//! tick duration and lateness.
//!
//! Every figure is kept twice: in this scheduler's own atomics, which the status page,
//! `/readyz` and the run summary read (several schedulers may share one process, in tests or
//! in a service embedding the loop), and in the process's [`metrics`] recorder, which
//! `/metrics` renders through `metrics-exporter-prometheus` when the binary installed one
//! ([`install_prometheus`]). Without an installed recorder the second copy costs nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// A counter: this scheduler's own value, and the same increments in the metrics recorder.
#[derive(Debug)]
pub struct Counter {
    value: AtomicU64,
    recorded: metrics::Counter,
}

impl Counter {
    fn new(name: &'static str, outcome: Option<&'static str>) -> Self {
        match outcome {
            Some(outcome) => Counter::labelled(name, "outcome", outcome),
            None => Counter::recording(metrics::counter!(name)),
        }
    }

    fn labelled(name: &'static str, label: &'static str, value: &'static str) -> Self {
        Counter::recording(metrics::counter!(name, label => value))
    }

    fn recording(recorded: metrics::Counter) -> Self {
        // Registered at zero, so a scrape lists every series from the start.
        recorded.increment(0);
        Counter {
            value: AtomicU64::new(0),
            recorded,
        }
    }
}

/// A gauge: this scheduler's current value, mirrored in the metrics recorder.
#[derive(Debug)]
pub struct Gauge {
    value: AtomicU64,
    recorded: metrics::Gauge,
}

impl Gauge {
    fn new(name: &'static str) -> Self {
        let recorded = metrics::gauge!(name);
        recorded.set(0.0);
        Gauge {
            value: AtomicU64::new(0),
            recorded,
        }
    }

    fn add(&self, delta: i64) {
        let now = if delta >= 0 {
            self.value
                .fetch_add(delta.unsigned_abs(), Ordering::Relaxed)
                + delta.unsigned_abs()
        } else {
            self.value
                .fetch_sub(delta.unsigned_abs(), Ordering::Relaxed)
                - delta.unsigned_abs()
        };
        self.recorded.set(now as f64);
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A histogram of seconds: this scheduler's count, sum and maximum, and every observation in
/// the metrics recorder (bucketed there as [`install_prometheus`] configures).
#[derive(Debug)]
pub struct Histogram {
    count: AtomicU64,
    sum_micros: AtomicU64,
    max_micros: AtomicU64,
    recorded: metrics::Histogram,
}

impl Histogram {
    fn new(name: &'static str) -> Self {
        Histogram {
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
            max_micros: AtomicU64::new(0),
            recorded: metrics::histogram!(name),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: Duration) {
        self.recorded.record(value.as_secs_f64());
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.max_micros.fetch_max(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// How many observations were recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The mean observation, if any was recorded.
    pub fn mean(&self) -> Option<Duration> {
        let count = self.count();
        (count > 0).then(|| Duration::from_micros(self.sum_micros.load(Ordering::Relaxed) / count))
    }

    /// The largest observation (zero before the first).
    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_micros.load(Ordering::Relaxed))
    }
}

/// Bucket bounds of `cm_tick_duration_seconds`.
const DURATION_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bucket bounds of `cm_fire_lateness_seconds`.
const LATENESS_BOUNDS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

const FIRES: &str = "cm_fires_total";
const TICKS: &str = "cm_ticks_total";
const TICK_ERRORS: &str = "cm_tick_errors_total";
const DEFERRED: &str = "cm_deferred_total";
const SKIPPED: &str = "cm_misfires_skipped_total";
const PRUNED: &str = "cm_pruned_total";
const PLANNED: &str = "cm_routines_planned_total";
const REAPED: &str = "cm_reaped_total";
const SATURATED: &str = "cm_ticks_saturated_total";
const OVERRUNS: &str = "cm_tick_overruns_total";
const GROUP_ERRORS: &str = "cm_group_pass_errors_total";
const DISPATCHING: &str = "cm_dispatches_in_flight";
const TICK_DURATION: &str = "cm_tick_duration_seconds";
const LATENESS: &str = "cm_fire_lateness_seconds";
const MISSION_RUNS: &str = "cm_mission_runs_total";
const MISSION_LAUNCHES: &str = "cm_mission_launches_total";
const DEADLINES_MISSED: &str = "cm_deadlines_missed_total";
const EVENTS_DELIVERED: &str = "cm_events_delivered_total";
const EVENT_DELIVERY_FAILURES: &str = "cm_event_delivery_failures_total";

/// A Prometheus recorder with cm's histogram buckets, not installed (tests record into it
/// with [`metrics::with_local_recorder`]).
pub fn prometheus_recorder() -> Result<metrics_exporter_prometheus::PrometheusRecorder, BuildError>
{
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(TICK_DURATION.into()), DURATION_BOUNDS)?
        .set_buckets_for_metric(Matcher::Full(LATENESS.into()), LATENESS_BOUNDS)?
        .build_recorder())
}

/// Installs the process-wide Prometheus recorder that `/metrics` renders, with cm's metric
/// descriptions. Call it once, before creating the scheduler whose figures it should carry.
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    let recorder = prometheus_recorder()?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    describe();
    Ok(handle)
}

/// Describes cm's metrics to the current recorder (the `# HELP` lines).
pub fn describe() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        FIRES,
        "Occurrences by outcome (a launched mission's is its run's: succeeded, failed, lost) or \
         by how their claim ended."
    );
    describe_counter!(TICKS, "Ticks run.");
    describe_counter!(TICK_ERRORS, "Ticks and reaper passes that failed.");
    describe_counter!(DEFERRED, "Occurrences the per-tick cap deferred.");
    describe_counter!(SKIPPED, "Misfires skipped by policy.");
    describe_counter!(PRUNED, "Settled fires deleted after their retention.");
    describe_counter!(REAPED, "Expired claims taken over by the reaper.");
    describe_counter!(
        SATURATED,
        "Ticks that claimed nothing because the in-flight set was full."
    );
    describe_counter!(OVERRUNS, "Ticks that took longer than the tick interval.");
    describe_counter!(
        GROUP_ERRORS,
        "Passes (claims, reaper, prune, automatic pause, planning, run watch) that failed in one \
         routine group, the other groups going on."
    );
    describe_counter!(
        MISSION_RUNS,
        "Mission runs by how they ended: succeeded, failed, lost; each run once, at its end."
    );
    describe_counter!(
        MISSION_LAUNCHES,
        "Mission runs launched (the runtime confirmed the start); runs going on are launches \
         minus ends."
    );
    describe_counter!(
        DEADLINES_MISSED,
        "Occurrences that had not succeeded by their routine's deadline (raised by this \
         scheduler)."
    );
    describe_counter!(EVENTS_DELIVERED, "Events a sink took.");
    describe_counter!(
        EVENT_DELIVERY_FAILURES,
        "Event posts that failed (each tried again later)."
    );
    metrics::describe_gauge!(DISPATCHING, "Dispatches running now.");
    describe_histogram!(TICK_DURATION, "Time one tick took.");
    describe_histogram!(
        LATENESS,
        "Dispatch start minus the occurrence's scheduled instant."
    );
}

/// Counters and gauges of one scheduler.
#[derive(Debug)]
pub struct Stats {
    /// Ticks attempted (failed ones included).
    pub ticks: Counter,
    /// Ticks (or reaper passes) that failed.
    pub tick_errors: Counter,
    /// Occurrences dispatched and settled `fired` with no run to watch: messages, and missions
    /// handed to the outbox. A mission this process launches is counted by its run's end.
    pub fired: Counter,
    /// Occurrences that failed: settled `failed` after a dispatch error or timeout, or
    /// launched missions whose run failed (counted when the run's end is recorded, once).
    pub failed: Counter,
    /// Launched missions whose run succeeded.
    pub succeeded: Counter,
    /// Launched missions whose run was lost (the runtime no longer knew it).
    pub lost: Counter,
    /// Occurrences settled `failed` without dispatch: too many attempts crashed.
    pub abandoned: Counter,
    /// Claims found held by another live claimant.
    pub in_flight: Counter,
    /// Claims found already settled.
    pub already_settled: Counter,
    /// Settles that matched nothing: the lease ran out and another claimant took over.
    pub lost_settles: Counter,
    /// Settles that could not be written (the database failed); the reaper retries those.
    pub settle_errors: Counter,
    /// Claims left undispatched because the claim itself used up their lease.
    pub unstarted: Counter,
    /// Dispatch tasks that panicked (their claims are retried after the lease, like a crash).
    pub dispatch_panics: Counter,
    /// Missions settled `skipped`: an earlier run of their routine was still running
    /// (overlap `forbid`).
    pub overlap_skipped: Counter,
    /// Occurrences the cap deferred.
    pub deferred: Counter,
    /// Misfires skipped by policy.
    pub skipped: Counter,
    /// Expired claims the reaper took over.
    pub reaped: Counter,
    /// Settled fires deleted after their retention.
    pub pruned: Counter,
    /// Routines written through SQL that a planning pass gave their first run.
    pub planned: Counter,
    /// Routines written through SQL that a planning pass refused and paused (a bad cron
    /// expression, zone, name or mission).
    pub refused_at_planning: Counter,
    /// Dispatches that hit a transient error of cm's own database and were left `claimed` for
    /// a retry after their lease, instead of being settled `failed`.
    pub left_for_retry: Counter,
    /// Failed attempts tried again under their routine's retry policy (a failed dispatch or
    /// launch, or a mission's failed or lost run): each is counted by its retry's outcome.
    pub retrying: Counter,
    /// Ticks that claimed nothing because every place in the in-flight set was taken.
    pub saturated_ticks: Counter,
    /// Ticks that took longer than the tick interval (the next tick waited for the next
    /// boundary).
    pub tick_overruns: Counter,
    /// Passes that failed in one routine group while the others went on (claiming per group:
    /// on Citus, a worker that is down fails only its groups).
    pub group_errors: Counter,
    /// Mission runs that reached each state, in the order of [`cm_domain::RunStateName::ALL`]:
    /// launched (`cm_mission_launches_total`), then ended `succeeded`, `failed`, `lost`
    /// (`cm_mission_runs_total{state}`).
    pub mission_runs: [Counter; 4],
    /// Occurrences this scheduler raised `routine.deadline_missed` for.
    pub deadlines_missed: Counter,
    /// Events a sink took.
    pub events_delivered: Counter,
    /// Event posts that failed.
    pub event_delivery_failures: Counter,
    /// Dispatches running now.
    pub dispatching: Gauge,
    /// Seconds each tick took.
    pub tick_duration: Histogram,
    /// Dispatch start minus `scheduled_at`.
    pub lateness: Histogram,
    last_success: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
}

impl Default for Stats {
    fn default() -> Self {
        let outcome = |name| Counter::new(FIRES, Some(name));
        Stats {
            ticks: Counter::new(TICKS, None),
            tick_errors: Counter::new(TICK_ERRORS, None),
            fired: outcome("fired"),
            failed: outcome("failed"),
            succeeded: outcome("succeeded"),
            lost: outcome("lost"),
            abandoned: outcome("abandoned"),
            in_flight: outcome("in_flight"),
            already_settled: outcome("already_settled"),
            lost_settles: outcome("lost_settle"),
            settle_errors: outcome("settle_error"),
            unstarted: outcome("unstarted"),
            dispatch_panics: outcome("dispatch_panic"),
            overlap_skipped: outcome("skipped"),
            deferred: Counter::new(DEFERRED, None),
            skipped: Counter::new(SKIPPED, None),
            reaped: Counter::new(REAPED, None),
            pruned: Counter::new(PRUNED, None),
            planned: Counter::new(PLANNED, Some("planned")),
            refused_at_planning: Counter::new(PLANNED, Some("refused")),
            left_for_retry: outcome("left_for_retry"),
            retrying: outcome("retrying"),
            saturated_ticks: Counter::new(SATURATED, None),
            tick_overruns: Counter::new(OVERRUNS, None),
            group_errors: Counter::new(GROUP_ERRORS, None),
            mission_runs: cm_domain::RunStateName::ALL.map(|state| match state {
                cm_domain::RunStateName::Running => Counter::new(MISSION_LAUNCHES, None),
                ended => Counter::labelled(MISSION_RUNS, "state", ended.as_str()),
            }),
            deadlines_missed: Counter::new(DEADLINES_MISSED, None),
            events_delivered: Counter::new(EVENTS_DELIVERED, None),
            event_delivery_failures: Counter::new(EVENT_DELIVERY_FAILURES, None),
            dispatching: Gauge::new(DISPATCHING),
            tick_duration: Histogram::new(TICK_DURATION),
            lateness: Histogram::new(LATENESS),
            last_success: Mutex::new(None),
            last_error: Mutex::new(None),
        }
    }
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &Counter, n: u64) {
    counter.value.fetch_add(n, Ordering::Relaxed);
    counter.recorded.increment(n);
}

impl Stats {
    /// Records a dispatch starting (the in-flight gauge).
    pub(crate) fn dispatch_started(&self) {
        self.dispatching.add(1);
    }

    /// Records a dispatch ending, settled or not.
    pub(crate) fn dispatch_ended(&self) {
        self.dispatching.add(-1);
    }

    /// Records a mission run reaching `state`.
    pub(crate) fn run_reached(&self, state: cm_domain::RunStateName) {
        add(&self.mission_runs[state as usize], 1);
    }

    /// Counts a launched mission's fire by its run's end: succeeded, failed or lost.
    pub(crate) fn fire_ended(&self, run: &cm_domain::RunState) {
        match run {
            cm_domain::RunState::Running => {}
            cm_domain::RunState::Succeeded => add(&self.succeeded, 1),
            cm_domain::RunState::Failed { .. } => add(&self.failed, 1),
            cm_domain::RunState::Lost { .. } => add(&self.lost, 1),
        }
    }

    /// Records a tick that succeeded.
    pub(crate) fn tick_succeeded(&self) {
        *self.last_success.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Records a tick that failed, keeping its error for health and the run summary.
    pub(crate) fn tick_failed(&self, error: String) {
        add(&self.tick_errors, 1);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
    }

    /// When a tick last succeeded.
    pub fn last_success(&self) -> Option<Instant> {
        *self.last_success.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest tick error, if any tick failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A counter's value.
    pub fn get(counter: &Counter) -> u64 {
        counter.value.load(Ordering::Relaxed)
    }
}
