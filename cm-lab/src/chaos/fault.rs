//! The faults a run injects, one module each, behind one [`Fault`] trait: the run's loop asks
//! every fault when it acts next, lets the earliest act, and at the end of the chaos has each
//! one heal what it still holds (a hung network, a pinned transaction, taken connections).
//!
//! A new fault is one new file here: its plan (when it acts, derived from the seed and the
//! run's length), what it does to the [`Chaos`] it is given, and its [`Findings`] (figures for
//! the summary and what fails the run). The ledger check and the backend's check run after
//! every run whatever the faults were.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;

use super::fleet::Fleet;
use super::forwarder::Forwarder;
use super::report::Findings;
use super::rng::Rng;

pub(super) mod autofailover;
pub(super) mod broker;
pub(super) mod dockerd;
pub(super) mod failover;
pub(super) mod hang;
pub(super) mod held;
pub(super) mod kill;
pub(super) mod limit;
pub(super) mod locks;
pub(super) mod moves;
pub(super) mod outage;
pub(super) mod pin;
pub(super) mod poison;
pub(super) mod restart;
pub(super) mod starve;
pub(super) mod terminate;
pub(super) mod worker;

/// One kind of fault.
pub(super) trait Fault {
    /// When it acts next; `None` once it has nothing left to do.
    fn next_at(&self) -> Option<Instant>;

    /// Acts, at or after [`Fault::next_at`].
    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()>;

    /// Undoes whatever it still holds when the chaos ends, before the drain.
    fn heal(&mut self, _chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        Ok(())
    }

    /// What it did and found.
    fn findings(&self) -> Findings;
}

/// What a fault acts on: the fleet, the chaos database, the network between them.
pub(super) struct Chaos<'a> {
    pub rt: &'a tokio::runtime::Runtime,
    pub fleet: Fleet,
    /// The run's own connections to the chaos database (not through the forwarder).
    pub pool: PgPool,
    /// The chaos database's name.
    pub database: String,
    /// The server the chaos database is on now (the standby's, after a failover).
    pub server_url: String,
    /// When the chaos began and when it ends.
    pub start: Instant,
    pub end: Instant,
    /// No SIGKILL before this instant: a database restart leaves the schedulers time to
    /// reconnect before the next crash.
    pub quiet_until: Instant,
    pub rng: Rng,
    /// The forwarder the schedulers reach PostgreSQL through, when a fault needs one.
    pub forwarder: Option<Forwarder>,
    /// When the standby took over, for the backend's check of what was sent again.
    pub failover_at: Option<DateTime<Utc>>,
    /// On Citus: the two-phase commits a restart left prepared on the workers are resolved
    /// after it, as the coordinator's maintenance daemon would (`.ci/citus` turns that off).
    pub citus: bool,
}

impl Chaos<'_> {
    /// A line on stderr, stamped with the time since the chaos began.
    pub fn say(&self, what: impl std::fmt::Display) {
        eprintln!("chaos: {:6.2}s {what}", self.start.elapsed().as_secs_f64());
    }

    /// How long after `at` (the database's clock) the first occurrence was settled, if one
    /// was yet.
    pub fn first_fire_after(&self, at: DateTime<Utc>) -> anyhow::Result<Option<Duration>> {
        let first: Option<DateTime<Utc>> = self.rt.block_on(
            sqlx::query_scalar(
                "SELECT min(completed_at) FROM cm.routine_fires WHERE completed_at > $1",
            )
            .bind(at)
            .fetch_one(&self.pool),
        )?;
        Ok(first.map(|f| (f - at).to_std().unwrap_or_default()))
    }

    /// The database's clock.
    pub fn db_now(&self) -> anyhow::Result<DateTime<Utc>> {
        Ok(self
            .rt
            .block_on(sqlx::query_scalar("SELECT now()").fetch_one(&self.pool))?)
    }
}

/// `count` instants spread evenly over the run from `start`, none at its ends.
pub(super) fn spread(start: Instant, duration: Duration, count: u32) -> Vec<Instant> {
    (1..=count)
        .map(|i| start + duration * i / (count + 1))
        .collect()
}

/// Each of `done` as `"{again} 1.23 s after {cause}"`, comma-separated: how long each restart
/// took to answer again.
pub(super) fn back_after(done: &[Duration], again: &str, cause: &str) -> String {
    done.iter()
        .map(|d| format!("{again} {:.2} s after {cause}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The application name of the run's own connections, so faults that act on "every other
/// connection" leave them alone.
pub(super) const OWN_APPLICATION: &str = "cm-chaos";
