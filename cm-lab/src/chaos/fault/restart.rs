//! `--db-restarts N`: PostgreSQL (on Citus, the first worker) taken down under the schedulers, N
//! times spread over the run with jitter. Odd-numbered restarts are an outage (stop, 2 s, start), even-numbered ones a
//! `pg_ctlcluster restart`. The newest scheduler is given time to connect first, and no kill
//! comes within a second after the server is back.

use std::time::{Duration, Instant};

use super::{Chaos, Fault};
use crate::chaos::postgres::{self, Cluster};
use crate::chaos::report::Findings;
use crate::chaos::rng::Rng;

/// How PostgreSQL is taken down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::chaos) enum RestartMode {
    /// Stop, wait two seconds, start: an outage long enough for ticks, settles and new
    /// connections to fail, and for occurrences to pile up and be caught up.
    Outage,
    /// `pg_ctlcluster restart`: every connection is cut, but the server is back at once.
    Restart,
}

pub(in crate::chaos) struct Restarts {
    cluster: Cluster,
    plan: Vec<(Instant, RestartMode)>,
    done: Vec<(RestartMode, Duration)>,
}

impl Restarts {
    pub fn new(
        cluster: Cluster,
        rng: &mut Rng,
        start: Instant,
        duration: Duration,
        count: u32,
    ) -> Self {
        Restarts {
            cluster,
            plan: plan(rng, duration, count)
                .into_iter()
                .map(|(d, mode)| (start + d, mode))
                .collect(),
            done: Vec::new(),
        }
    }
}

/// When, after the start of the chaos, each restart happens, and how: spread evenly with some
/// jitter, alternating between an outage and a quick restart.
pub(in crate::chaos) fn plan(
    rng: &mut Rng,
    duration: Duration,
    count: u32,
) -> Vec<(Duration, RestartMode)> {
    let slot = duration / (count + 1);
    (0..count)
        .map(|i| {
            let center = slot * (i + 1);
            let jitter = rng.millis(0, (slot / 2).as_millis() as u64);
            let at = center.saturating_sub(slot / 4) + jitter;
            let mode = if i % 2 == 0 {
                RestartMode::Outage
            } else {
                RestartMode::Restart
            };
            (at, mode)
        })
        .collect()
}

impl Fault for Restarts {
    fn next_at(&self) -> Option<Instant> {
        self.plan.get(self.done.len()).map(|p| p.0)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let mode = self.plan[self.done.len()].1;
        // Leave the newest scheduler time to connect first, so the outage hits schedulers that
        // are running (one still starting waits for the database by itself).
        if let Some(spawned) = chaos.fleet.last_spawn {
            std::thread::sleep(
                (spawned + Duration::from_millis(1500)).saturating_duration_since(Instant::now()),
            );
        }
        chaos.say(format!("PostgreSQL {mode:?} begins"));
        let down = Instant::now();
        match mode {
            RestartMode::Outage => {
                self.cluster.ctl("stop", &[])?;
                std::thread::sleep(Duration::from_secs(2));
                self.cluster.start()?;
            }
            RestartMode::Restart => {
                if let Err(e) = self.cluster.ctl("restart", &[]) {
                    eprintln!("chaos: restart failed ({e:#}); starting it");
                    self.cluster.start()?;
                }
            }
        }
        // The restarted server's own port: a Citus worker's, or the server the run uses.
        let restarted = self.cluster.url(&chaos.server_url)?;
        postgres::wait_for(chaos.rt, &restarted, Duration::from_secs(30))?;
        let outage = down.elapsed();
        chaos.say(format!("PostgreSQL answers again after {outage:.1?}"));
        self.done.push((mode, outage));
        if chaos.citus {
            // Two-phase commits cut by the restart hold their rows' locks until the coordinator
            // resolves them; its maintenance daemon would, within a minute.
            let url = crate::database_url(&chaos.server_url, &chaos.database)?;
            match crate::chaos::citus::recover(chaos.rt, &url) {
                Ok(n) => chaos.say(format!("Citus: {n} prepared transactions recovered")),
                Err(e) => chaos.say(format!("Citus: recovery failed: {e:#}")),
            }
        }
        // The same reason the other way round: no process starts until the server is back and
        // settled.
        chaos.quiet_until = Instant::now() + Duration::from_secs(1);
        Ok(())
    }

    fn findings(&self) -> Findings {
        let outages = self
            .done
            .iter()
            .map(|(mode, d)| format!("{mode:?} {:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ");
        Findings::one(
            "db restarts",
            if outages.is_empty() {
                "0".to_string()
            } else {
                format!("{} ({outages})", self.done.len())
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_restarts_fall_inside_the_run_in_order() {
        let mut rng = Rng::new(3);
        let plan = plan(&mut rng, Duration::from_secs(60), 2);
        assert_eq!(plan.len(), 2);
        assert!(plan[0].0 < plan[1].0);
        assert!(plan[1].0 < Duration::from_secs(60));
        assert_eq!(plan[0].1, RestartMode::Outage);
        assert_eq!(plan[1].1, RestartMode::Restart);
    }
}
