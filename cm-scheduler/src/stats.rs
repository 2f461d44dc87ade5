//! What the loop counts: fires by outcome, deferrals, misfires, reaped retries, tick errors,
//! tick duration and lateness. Read by `/metrics`, `/readyz` and the run summary.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A fixed-bucket histogram of seconds, in the Prometheus style (cumulative on output).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: Duration) {
        let secs = value.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// How many observations were recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let total = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

const DURATION_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const LATENESS_BOUNDS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
];

/// Counters and gauges of one scheduler.
#[derive(Debug)]
pub struct Stats {
    /// Ticks attempted (failed ones included).
    pub ticks: AtomicU64,
    /// Ticks (or reaper passes) that failed.
    pub tick_errors: AtomicU64,
    /// Occurrences dispatched and settled `fired`.
    pub fired: AtomicU64,
    /// Occurrences settled `failed` after a dispatch error or timeout.
    pub failed: AtomicU64,
    /// Occurrences settled `failed` without dispatch: too many attempts crashed.
    pub abandoned: AtomicU64,
    /// Claims found held by another live claimant.
    pub in_flight: AtomicU64,
    /// Claims found already settled.
    pub already_settled: AtomicU64,
    /// Settles that matched nothing: the lease ran out and another claimant took over.
    pub lost_settles: AtomicU64,
    /// Settles that could not be written (the database failed); the reaper retries those.
    pub settle_errors: AtomicU64,
    /// Claims left undispatched because the claim itself used up their lease.
    pub unstarted: AtomicU64,
    /// Dispatch tasks that panicked (their claims are retried after the lease, like a crash).
    pub dispatch_panics: AtomicU64,
    /// Occurrences the cap deferred.
    pub deferred: AtomicU64,
    /// Misfires skipped by policy.
    pub skipped: AtomicU64,
    /// Expired claims the reaper took over.
    pub reaped: AtomicU64,
    /// Settled fires deleted after their retention.
    pub pruned: AtomicU64,
    /// Dispatches that hit a transient error of cm's own database and were left `claimed` for
    /// a retry after their lease, instead of being settled `failed`.
    pub left_for_retry: AtomicU64,
    /// Ticks that claimed nothing because every place in the in-flight set was taken.
    pub saturated_ticks: AtomicU64,
    /// Ticks that took longer than the tick interval (the next tick waited for the next
    /// boundary).
    pub tick_overruns: AtomicU64,
    /// Dispatches running now (a gauge).
    pub dispatching: AtomicU64,
    /// Seconds each tick took.
    pub tick_duration: Histogram,
    /// Dispatch start minus `scheduled_at`.
    pub lateness: Histogram,
    last_success: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ticks: AtomicU64::new(0),
            tick_errors: AtomicU64::new(0),
            fired: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            already_settled: AtomicU64::new(0),
            lost_settles: AtomicU64::new(0),
            settle_errors: AtomicU64::new(0),
            unstarted: AtomicU64::new(0),
            dispatch_panics: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
            pruned: AtomicU64::new(0),
            left_for_retry: AtomicU64::new(0),
            saturated_ticks: AtomicU64::new(0),
            tick_overruns: AtomicU64::new(0),
            dispatching: AtomicU64::new(0),
            tick_duration: Histogram::new(DURATION_BOUNDS),
            lateness: Histogram::new(LATENESS_BOUNDS),
            last_success: Mutex::new(None),
            last_error: Mutex::new(None),
        }
    }
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    /// Records a dispatch starting (the in-flight gauge).
    pub(crate) fn dispatch_started(&self) {
        add(&self.dispatching, 1);
    }

    /// Records a dispatch ending, settled or not.
    pub(crate) fn dispatch_ended(&self) {
        self.dispatching.fetch_sub(1, Ordering::Relaxed);
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
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// The counters in the Prometheus text format.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: &AtomicU64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                Stats::get(value)
            );
        };
        let _ = writeln!(
            out,
            "# HELP cm_fires_total Occurrences by how their claim ended.\n# TYPE cm_fires_total counter"
        );
        for (outcome, value) in [
            ("fired", &self.fired),
            ("failed", &self.failed),
            ("abandoned", &self.abandoned),
            ("in_flight", &self.in_flight),
            ("already_settled", &self.already_settled),
            ("lost_settle", &self.lost_settles),
            ("settle_error", &self.settle_errors),
            ("unstarted", &self.unstarted),
            ("dispatch_panic", &self.dispatch_panics),
            ("left_for_retry", &self.left_for_retry),
        ] {
            let _ = writeln!(
                out,
                "cm_fires_total{{outcome=\"{outcome}\"}} {}",
                Stats::get(value)
            );
        }
        counter(&mut out, "cm_ticks_total", "Ticks run.", &self.ticks);
        counter(
            &mut out,
            "cm_tick_errors_total",
            "Ticks and reaper passes that failed.",
            &self.tick_errors,
        );
        counter(
            &mut out,
            "cm_deferred_total",
            "Occurrences the per-tick cap deferred.",
            &self.deferred,
        );
        counter(
            &mut out,
            "cm_misfires_skipped_total",
            "Misfires skipped by policy.",
            &self.skipped,
        );
        counter(
            &mut out,
            "cm_pruned_total",
            "Settled fires deleted after their retention.",
            &self.pruned,
        );
        counter(
            &mut out,
            "cm_reaped_total",
            "Expired claims taken over by the reaper.",
            &self.reaped,
        );
        counter(
            &mut out,
            "cm_ticks_saturated_total",
            "Ticks that claimed nothing because the in-flight set was full.",
            &self.saturated_ticks,
        );
        counter(
            &mut out,
            "cm_tick_overruns_total",
            "Ticks that took longer than the tick interval.",
            &self.tick_overruns,
        );
        let _ = writeln!(
            out,
            "# HELP cm_dispatches_in_flight Dispatches running now.\n# TYPE cm_dispatches_in_flight gauge\ncm_dispatches_in_flight {}",
            Stats::get(&self.dispatching)
        );
        self.tick_duration
            .render(&mut out, "cm_tick_duration_seconds", "Time one tick took.");
        self.lateness.render(
            &mut out,
            "cm_fire_lateness_seconds",
            "Dispatch start minus the occurrence's scheduled instant.",
        );
        out
    }
}
