//! The run: the tick loop, aligned to the wall clock, and the loops beside it (the reaper
//! and maintenance, the run watch, planning, the group leases) until shutdown; then what is in
//! flight is settled.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::{RunSummary, Scheduler, TickError, TickReport};
use crate::completer::Completer;
use crate::counters::{Stats, add};

impl Scheduler {
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
            self.event_loop(stopped.clone()),
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
    /// (at least every tick interval), beside the ticks; and takes over the retries this
    /// process decided as each comes due (`retry_wake.rs`).
    async fn reap_loop(&self, mut stopped: watch::Receiver<bool>, completer: &Arc<dyn Completer>) {
        let every = (self.config.lease.duration() / 2).max(self.config.tick_interval);
        let mut beat = beat(every);
        loop {
            let beaten = tokio::select! {
                biased;
                more = next_beat(&mut beat, &mut stopped) => more,
                () = self.retries.wait() => {
                    let result = self.reap_and_start(completer, None).await;
                    self.record(result, "reaper pass (retries due)");
                    continue;
                }
            };
            if !beaten {
                break;
            }
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

    /// Renews and rebalances the group leases every third of a lease, beside the ticks (every
    /// tick interval while short of its share, [`GroupLeases::short`]), and gives them up when
    /// the scheduler stops; nothing without [`Scheduler::with_groups`].
    async fn lease_loop(&self, mut stopped: watch::Receiver<bool>) {
        let Some(leases) = &self.groups else { return };
        let every = leases.every().max(self.config.tick_interval);
        loop {
            let began = Instant::now();
            if let Err(e) = leases.rebalance().await {
                warn!(error = %e, "could not renew the group leases; claiming in free groups");
            }
            let wait = if leases.short() {
                self.config.tick_interval
            } else {
                every
            };
            if !wait_until(began + wait, &mut stopped).await {
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

    /// Plans the routines written through SQL every tick interval, beside the ticks (nothing
    /// without [`Scheduler::with_planning`]); group by group at most every
    /// [`GROUP_PLAN_EVERY`].
    async fn plan_loop(&self, mut stopped: watch::Receiver<bool>) {
        if self.planning.is_none() {
            return;
        }
        let mut beat = beat(self.config.tick_interval);
        let mut last_by_group: Option<Instant> = None;
        while next_beat(&mut beat, &mut stopped).await {
            let now = Instant::now();
            let by_group = self.maintained_groups().await.is_some();
            if !plan_now(by_group, last_by_group, now, self.config.tick_interval) {
                continue;
            }
            if by_group {
                last_by_group = Some(now);
            }
            self.plan().await;
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

/// The shortest time between two planning passes group by group. Such a pass asks each group
/// this scheduler leases for its unplanned routines, a statement each (on Citus, 64 router
/// statements a pass between two schedulers, each planned by the coordinator). At every tick
/// of a short tick interval those passes took more of the coordinator than any one statement
/// of the claims (docs/BENCHMARKS.md, "Planning group by group at most once a second"). A
/// routine written through SQL is planned within this long, or within a tick interval if that
/// is longer.
pub(super) const GROUP_PLAN_EVERY: Duration = Duration::from_secs(1);

/// Whether a planning pass runs at the beat `now` of a plan loop beating every `tick`: across
/// every group at every beat; group by group (`by_group`) when the last such pass began
/// [`GROUP_PLAN_EVERY`] before, give or take half a beat (beats a second apart then plan at
/// each, not every other one for a beat a moment early).
fn plan_now(by_group: bool, last_by_group: Option<Instant>, now: Instant, tick: Duration) -> bool {
    !by_group
        || last_by_group
            .is_none_or(|at| now.saturating_duration_since(at) + tick / 2 >= GROUP_PLAN_EVERY)
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

/// Waits until `at`; `false` once the scheduler is told to stop (which wins a tie), as
/// [`next_beat`] for a loop whose period changes.
async fn wait_until(at: Instant, stopped: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        biased;
        _ = stopped.wait_for(|stop| *stop) => false,
        () = tokio::time::sleep_until(at.into()) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn planning_across_every_group_runs_at_every_beat() {
        let start = Instant::now();
        assert!(plan_now(false, Some(start), start + MS, 10 * MS));
    }

    #[test]
    fn planning_group_by_group_runs_at_most_about_once_a_second() {
        let tick = 10 * MS;
        let start = Instant::now();
        assert!(plan_now(true, None, start, tick));
        // A beat 10 ms after a pass: too soon; 995 ms after (within half a beat): due.
        assert!(!plan_now(true, Some(start), start + tick, tick));
        assert!(!plan_now(true, Some(start), start + 990 * MS, tick));
        assert!(plan_now(true, Some(start), start + 995 * MS, tick));
        // Counting 10 ms beats from one pass to the next gives about a second between them.
        let beats = (1..)
            .find(|n| plan_now(true, Some(start), start + tick * *n, tick))
            .unwrap();
        assert_eq!(beats, 100);
    }

    #[test]
    fn planning_group_by_group_at_a_one_second_tick_runs_at_each_beat() {
        // A beat a moment early still plans: every second, not every other.
        let tick = Duration::from_secs(1);
        let start = Instant::now();
        assert!(plan_now(true, Some(start), start + tick - MS, tick));
        assert!(!plan_now(true, Some(start), start + 400 * MS, tick));
    }
}
