//! How the store's connections are opened: pool size, and the server-side timeouts that keep a
//! claim from holding its locks longer than its lease.
//!
//! A claim locks up to a tick's worth of routines `FOR UPDATE`, and every other scheduler skips
//! them until it commits. Without timeouts a claim blocked on a lock, or a connection half-open
//! after a network fault, would hold those locks for as long as TCP takes to notice (minutes to
//! hours), and leases written at the claim's start would run out before anyone could use them.
//! [`StoreOptions::for_lease`] derives the timeouts from the lease so a claim either finishes
//! well inside it or fails, is logged, and leaves its routines to the next tick.

use std::time::Duration;

use cm_domain::Lease;
use sqlx::postgres::PgConnectOptions;

/// Connection settings for [`crate::PgStore::connect_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// The most connections the pool opens.
    pub max_connections: u32,
    /// How long a statement waits for a free connection before failing.
    pub acquire_timeout: Duration,
    /// `statement_timeout`: the longest one statement may run. `None` leaves the server's.
    pub statement_timeout: Option<Duration>,
    /// `lock_timeout`: the longest a statement waits for a row or table lock. `None` leaves
    /// the server's.
    pub lock_timeout: Option<Duration>,
    /// `idle_in_transaction_session_timeout`: how long a session may sit idle inside an open
    /// transaction before the server ends it (and its locks). `None` leaves the server's.
    pub idle_in_transaction_timeout: Option<Duration>,
}

impl Default for StoreOptions {
    /// Ten connections, five seconds to get one, the server's own timeouts: what
    /// [`crate::PgStore::connect`] uses, for commands that run one statement and exit.
    fn default() -> Self {
        StoreOptions {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: None,
            lock_timeout: None,
            idle_in_transaction_timeout: None,
        }
    }
}

impl StoreOptions {
    /// Timeouts for a scheduler whose claims last `lease`: a statement at most a quarter of the
    /// lease, a lock wait at most a twentieth (a claim should not wait on locks at all: it
    /// skips locked routines, so a long wait means something is wrong), and a transaction
    /// left idle at most a quarter. A claim transaction is a handful of statements, so it ends
    /// (commits or fails) well before the leases it wrote run out. Each is at least 100 ms, so a
    /// very short lease (in tests) does not make every statement fail.
    pub fn for_lease(lease: Lease) -> Self {
        let floor = Duration::from_millis(100);
        let part = |n: u32| (lease.duration() / n).max(floor);
        StoreOptions {
            statement_timeout: Some(part(4)),
            lock_timeout: Some(part(20)),
            idle_in_transaction_timeout: Some(part(4)),
            ..StoreOptions::default()
        }
    }

    /// `connect` with the timeouts set as session parameters of every connection it opens, and
    /// [`PLAN_CACHE_MODE`].
    pub fn apply(&self, connect: PgConnectOptions) -> PgConnectOptions {
        let settings = [
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
            (
                "idle_in_transaction_session_timeout",
                self.idle_in_transaction_timeout,
            ),
        ];
        // Zero means "no timeout" to PostgreSQL, so a timeout is at least a millisecond.
        connect
            .options(settings.into_iter().filter_map(|(name, timeout)| {
                timeout.map(|t| (name, format!("{}ms", t.as_millis().max(1))))
            }))
            .options([PLAN_CACHE_MODE])
    }
}

/// Every statement is planned for the values it runs with (`plan_cache_mode`), never with the
/// generic plan PostgreSQL's plan cache switches a prepared statement to after five runs.
///
/// The store's batch statements take their rows as arrays (`UNNEST($1::uuid[], …)`). A generic
/// plan cannot know an array's length and guesses ten elements, so it joins the claim's
/// common table expressions by nested loops: a claim of 2,000 occurrences then compared 4
/// million pairs twice, and took 400 ms instead of 70 (200,000 routines due at once fired at a
/// third of the rate). Planning each run costs a few tenths of a millisecond, far less than
/// one such join.
pub const PLAN_CACHE_MODE: (&str, &str) = ("plan_cache_mode", "force_custom_plan");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_the_lease() {
        let check = |lease_ms: u64, statement: u64, lock: u64| {
            let lease = Lease::new(Duration::from_millis(lease_ms)).unwrap();
            let o = StoreOptions::for_lease(lease);
            assert_eq!(o.statement_timeout, Some(Duration::from_millis(statement)));
            assert_eq!(o.lock_timeout, Some(Duration::from_millis(lock)));
            assert_eq!(o.idle_in_transaction_timeout, o.statement_timeout);
            assert!(o.statement_timeout.unwrap() < lease.duration() || lease_ms <= 100);
        };
        check(60_000, 15_000, 3_000);
        check(10_000, 2_500, 500);
        check(1_000, 250, 100);
        check(50, 100, 100);
    }

    #[test]
    fn every_connection_plans_each_statement_for_its_values() {
        let url = "postgres://cm@localhost/cm"
            .parse::<PgConnectOptions>()
            .unwrap();
        for options in [
            StoreOptions::default(),
            StoreOptions::for_lease(Lease::new(Duration::from_secs(30)).unwrap()),
        ] {
            let applied = options.apply(url.clone());
            let set = applied.get_options().unwrap();
            assert!(
                set.contains("-c plan_cache_mode=force_custom_plan"),
                "{set}"
            );
        }
    }
}
