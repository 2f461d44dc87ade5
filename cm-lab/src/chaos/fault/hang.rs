//! `--network-hang SECONDS`: the forwarder between the schedulers and PostgreSQL stops
//! forwarding for that long, a third of the way into the run, every socket left open; then it
//! resumes.
//!
//! The schedulers must notice within their own timeouts, tell `/readyz` probes why, never
//! dispatch past a lease they cannot renew (the ledger and backend checks find any occurrence
//! doubled), and resume by themselves within seconds of the network coming back. Recorded:
//! what `/readyz` answered during the hang (probed every 250 ms with a 1 s deadline), and how
//! long after the resume the first occurrence was settled.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{Chaos, Fault};
use crate::chaos::fleet::{Probe, Prober, Readiness, probe_digest};
use crate::chaos::report::Findings;

/// How soon after the network stops forwarding `/readyz` must answer 503: the health check's
/// own deadline (2 s) and its interval (1 s), with room for a loaded machine.
const UNREADY_WITHIN: Duration = Duration::from_secs(6);

/// How soon after the network comes back a fire must be settled.
const RESUME_WITHIN: Duration = Duration::from_secs(10);

/// How long the probes go on after the first fire, to see `/readyz` ready again.
const PROBE_AFTER: Duration = Duration::from_secs(5);

enum Phase {
    Before,
    Hung {
        prober: Prober,
    },
    Resumed {
        prober: Prober,
        resumed: Instant,
        resumed_db: DateTime<Utc>,
        poll_at: Instant,
    },
    Fired {
        prober: Prober,
        until: Instant,
    },
    Done,
}

pub(in crate::chaos) struct Hang {
    at: Instant,
    length: Duration,
    phase: Phase,
    /// From the prober's start: when the hang began (0) and ended.
    resumed_after: Option<Duration>,
    first_fire: Option<Duration>,
    probes: Vec<Probe>,
}

impl Hang {
    pub fn new(start: Instant, duration: Duration, length: Duration) -> Self {
        Hang {
            at: start + duration / 3,
            length,
            phase: Phase::Before,
            resumed_after: None,
            first_fire: None,
            probes: Vec::new(),
        }
    }
}

impl Fault for Hang {
    fn next_at(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Before => Some(self.at),
            Phase::Hung { .. } => Some(self.at + self.length),
            Phase::Resumed { poll_at, .. } => Some(*poll_at),
            Phase::Fired { until, .. } => Some(*until),
            Phase::Done => None,
        }
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let forwarder = chaos
            .forwarder
            .as_ref()
            .expect("a network hang runs behind the forwarder");
        self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Before => {
                let prober = Prober::start(chaos.fleet.ports());
                forwarder.hang();
                chaos.say(format!("the network hangs for {} s", self.length.as_secs()));
                Phase::Hung { prober }
            }
            Phase::Hung { prober } => {
                forwarder.resume();
                self.resumed_after = Some(prober.started.elapsed());
                chaos.say("the network flows again");
                Phase::Resumed {
                    prober,
                    resumed: Instant::now(),
                    resumed_db: chaos.db_now()?,
                    poll_at: Instant::now(),
                }
            }
            Phase::Resumed {
                prober,
                resumed,
                resumed_db,
                ..
            } => match chaos.first_fire_after(resumed_db)? {
                Some(after) => {
                    self.first_fire = Some(after);
                    chaos.say(format!(
                            "the first fire after the network came back was settled {after:.1?} after it"
                        ));
                    Phase::Fired {
                        prober,
                        until: Instant::now() + PROBE_AFTER,
                    }
                }
                None if resumed.elapsed() > RESUME_WITHIN * 3 => {
                    self.probes = prober.finish();
                    Phase::Done
                }
                None => Phase::Resumed {
                    prober,
                    resumed,
                    resumed_db,
                    poll_at: Instant::now() + Duration::from_millis(100),
                },
            },
            Phase::Fired { prober, .. } => {
                self.probes = prober.finish();
                Phase::Done
            }
            Phase::Done => Phase::Done,
        };
        Ok(())
    }

    fn heal(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if let Some(forwarder) = &chaos.forwarder {
            forwarder.resume();
        }
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Hung { prober }
            | Phase::Resumed { prober, .. }
            | Phase::Fired { prober, .. } => {
                self.probes = prober.finish();
            }
            Phase::Before | Phase::Done => {}
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let resumed = self.resumed_after.unwrap_or(self.length);
        f.line(
            "network hang",
            format!("{} s, every socket left open", self.length.as_secs()),
        );
        f.line(
            "readyz in hang",
            probe_digest(&self.probes, Duration::ZERO, resumed),
        );
        let ready_again = self
            .probes
            .iter()
            .find(|p| p.after >= resumed && p.readiness == Readiness::Ready);
        f.line(
            "readyz after",
            format!(
                "{}; {}",
                ready_again.map_or("never ready again while probed".to_string(), |p| format!(
                    "first 200 {:.1} s after the resume",
                    (p.after - resumed).as_secs_f64()
                )),
                probe_digest(&self.probes, resumed, Duration::MAX)
            ),
        );
        f.line(
            "first fire",
            self.first_fire.map_or("none".to_string(), |d| {
                format!("{:.1} s after the network came back", d.as_secs_f64())
            }),
        );
        f.require(self.first_fire.is_none_or(|d| d > RESUME_WITHIN), || {
            format!(
                "the schedulers did not settle a fire within {} s of the network coming back",
                RESUME_WITHIN.as_secs()
            )
        });
        // Health answers from its cache within a short deadline of its own: during the hang a
        // probe of a live scheduler gets an answer (a 503 with the reason) within the probe's
        // deadline, and the first 503 comes within a few seconds of the hang.
        let in_hang = || self.probes.iter().filter(|p| p.after < resumed);
        let unanswered = in_hang()
            .filter(|p| p.readiness == Readiness::NoAnswer)
            .count();
        f.require(unanswered > 0, || {
            format!(
                "{unanswered} /readyz probes during the hang got no answer within {} s",
                crate::chaos::fleet::PROBE_DEADLINE.as_secs()
            )
        });
        let first_unready = in_hang()
            .find(|p| matches!(p.readiness, Readiness::Unready(_)))
            .map(|p| p.after);
        f.require(first_unready.is_none_or(|d| d > UNREADY_WITHIN), || {
            format!(
                "no /readyz answered 503 within {} s of the hang (first: {first_unready:?})",
                UNREADY_WITHIN.as_secs()
            )
        });
        f
    }
}
