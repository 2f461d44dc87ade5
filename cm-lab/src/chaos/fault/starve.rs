//! `--starve-pool SECONDS`: another client takes all but two of the server's connections for
//! that long, a third of the way into the run.
//!
//! It opens connections until the server refuses one ("too many clients"), cuts the
//! schedulers' connections so their pools must open new ones, takes what they freed, and gives
//! two back. The schedulers must wait rather than crash (the fleet counts any that die on
//! their own), say why on `/readyz`, and fire everything owed once the connections are back
//! (the ledger check).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::ConnectOptions as _;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use super::terminate::terminate_others;
use super::{Chaos, Fault, OWN_APPLICATION};
use crate::chaos::fleet::{Probe, Prober, probe_digest};
use crate::chaos::report::Findings;

/// How many connections the starved server keeps free.
const LEFT_FREE: usize = 2;

/// The most connections it takes, whatever the server allows.
const MOST: usize = 2000;

/// How long the probes go on after the release.
const PROBE_AFTER: Duration = Duration::from_secs(10);

enum Phase {
    Before,
    Starving {
        held: Vec<PgConnection>,
        prober: Prober,
    },
    Released {
        prober: Prober,
        until: Instant,
    },
    Done,
}

pub(in crate::chaos) struct Starve {
    at: Instant,
    length: Duration,
    phase: Phase,
    max_connections: i64,
    taken: usize,
    cut: i64,
    /// From the prober's start.
    released_after: Option<Duration>,
    released_db: Option<DateTime<Utc>>,
    fired_during: i64,
    first_fire: Option<Duration>,
    probes: Vec<Probe>,
}

impl Starve {
    pub fn new(start: Instant, duration: Duration, length: Duration) -> Self {
        Starve {
            at: start + duration / 3,
            length,
            phase: Phase::Before,
            max_connections: 0,
            taken: 0,
            cut: 0,
            released_after: None,
            released_db: None,
            fired_during: 0,
            first_fire: None,
            probes: Vec::new(),
        }
    }
}

/// Opens connections to `server` until the server refuses one or `held` has `most`.
fn take_all(
    rt: &tokio::runtime::Runtime,
    server: &PgConnectOptions,
    held: &mut Vec<PgConnection>,
    most: usize,
) {
    while held.len() < most {
        match rt.block_on(server.connect()) {
            Ok(c) => held.push(c),
            Err(_) => break,
        }
    }
}

impl Fault for Starve {
    fn next_at(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Before => Some(self.at),
            Phase::Starving { .. } => Some(self.at + self.length),
            Phase::Released { until, .. } => Some(*until),
            Phase::Done => None,
        }
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Before => {
                let max: String = chaos
                    .rt
                    .block_on(sqlx::query_scalar("SHOW max_connections").fetch_one(&chaos.pool))?;
                self.max_connections = max.parse().unwrap_or(0);
                let server: PgConnectOptions = chaos
                    .server_url
                    .parse::<PgConnectOptions>()?
                    .application_name(&format!("{OWN_APPLICATION}-starver"));
                let prober = Prober::start(chaos.fleet.ports());
                let mut held = Vec::new();
                take_all(chaos.rt, &server, &mut held, MOST);
                self.cut = chaos.rt.block_on(terminate_others(&chaos.pool))?;
                take_all(chaos.rt, &server, &mut held, MOST);
                held.truncate(held.len().saturating_sub(LEFT_FREE));
                self.taken = held.len();
                chaos.say(format!(
                    "took {} of {} connections (the schedulers' {} cut), {LEFT_FREE} left free, for {} s",
                    self.taken,
                    self.max_connections,
                    self.cut,
                    self.length.as_secs()
                ));
                Phase::Starving { held, prober }
            }
            Phase::Starving { held, prober } => {
                drop(held);
                let released = chaos.db_now()?;
                self.released_after = Some(prober.started.elapsed());
                self.released_db = Some(released);
                let during = chrono::TimeDelta::from_std(self.length)?;
                self.fired_during = chaos.rt.block_on(
                    sqlx::query_scalar(
                        "SELECT count(*) FROM cm.routine_fires
                         WHERE completed_at > $1 - $2::interval AND completed_at <= $1",
                    )
                    .bind(released)
                    .bind(during)
                    .fetch_one(&chaos.pool),
                )?;
                chaos.say("the connections are given back");
                Phase::Released {
                    prober,
                    until: Instant::now() + PROBE_AFTER,
                }
            }
            Phase::Released { prober, .. } => {
                self.probes = prober.finish();
                if let Some(released) = self.released_db {
                    self.first_fire = chaos.first_fire_after(released)?;
                }
                Phase::Done
            }
            Phase::Done => Phase::Done,
        };
        Ok(())
    }

    fn heal(&mut self, _chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Starving { prober, .. } | Phase::Released { prober, .. } => {
                self.probes = prober.finish();
            }
            Phase::Before | Phase::Done => {}
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let released = self.released_after.unwrap_or(self.length);
        f.line(
            "pool starvation",
            format!(
                "{} s: {} of max_connections {} taken ({} scheduler connections cut first), {LEFT_FREE} left free",
                self.length.as_secs(),
                self.taken,
                self.max_connections,
                self.cut
            ),
        );
        f.line(
            "readyz starved",
            probe_digest(&self.probes, Duration::ZERO, released),
        );
        f.line(
            "readyz after",
            probe_digest(&self.probes, released, Duration::MAX),
        );
        f.line(
            "fires starved",
            format!(
                "{} settled while starved; first after the release {}",
                self.fired_during,
                self.first_fire.map_or("none".to_string(), |d| format!(
                    "{:.1} s after it",
                    d.as_secs_f64()
                ))
            ),
        );
        f.require(self.taken == 0, || {
            "the starvation took no connection".to_string()
        });
        f
    }
}
