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
    /// Whether the connections go through a pooler such as PgBouncer, which hands each
    /// transaction to whichever of its server connections is free and refuses startup
    /// parameters it cannot track. Then nothing is set at connect: every transaction the store
    /// runs (every statement runs in one) begins with the timeouts and [`PLAN_CACHE_MODE`] as
    /// `SET LOCAL`, so they hold on whichever server connection it lands (see
    /// [`StoreOptions::begin_statement`]).
    pub pooled: bool,
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
            pooled: false,
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
    /// [`PLAN_CACHE_MODE`]; when [`StoreOptions::pooled`], with no startup parameter a pooler
    /// would refuse (the settings go with each transaction instead).
    pub fn apply(&self, connect: PgConnectOptions) -> PgConnectOptions {
        if self.pooled {
            // PgBouncer refuses a connection whose startup packet carries a parameter it does
            // not track, and it tracks only those PostgreSQL reports back (none of cm's
            // settings, nor sqlx's `extra_float_digits`). PostgreSQL's default since 12
            // already prints floats exactly, and cm reads its floats in binary anyway.
            return connect.extra_float_digits(None);
        }
        connect.options(self.settings()).options([PLAN_CACHE_MODE])
    }

    /// The statement that begins each of the store's transactions when [`StoreOptions::pooled`]
    /// (`None` otherwise): `BEGIN` and a `SET LOCAL` of each timeout and of
    /// [`PLAN_CACHE_MODE`], sent as one message, so beginning costs no more round trips than a
    /// plain `BEGIN` and every setting lasts exactly the transaction, on whichever server
    /// connection the pooler gave it.
    pub fn begin_statement(&self) -> Option<String> {
        if !self.pooled {
            return None;
        }
        let mut statement = String::from("BEGIN");
        for (name, value) in self
            .settings()
            .chain([(PLAN_CACHE_MODE.0, PLAN_CACHE_MODE.1.to_string())])
        {
            // The values are cm's own (a number of milliseconds, a fixed word): nothing to quote.
            statement.push_str(&format!("; SET LOCAL {name} = '{value}'"));
        }
        Some(statement)
    }

    /// The timeouts that are set, as PostgreSQL settings. Zero means "no timeout" to
    /// PostgreSQL, so a timeout is at least a millisecond.
    fn settings(&self) -> impl Iterator<Item = (&'static str, String)> {
        [
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
            (
                "idle_in_transaction_session_timeout",
                self.idle_in_transaction_timeout,
            ),
        ]
        .into_iter()
        .filter_map(|(name, timeout)| {
            timeout.map(|t| (name, format!("{}ms", t.as_millis().max(1))))
        })
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

    #[test]
    fn a_pooled_store_sends_its_settings_with_each_transaction() {
        let url = "postgres://cm@localhost/cm"
            .parse::<PgConnectOptions>()
            .unwrap();
        let lease = Lease::new(Duration::from_secs(10)).unwrap();
        let direct = StoreOptions::for_lease(lease);
        assert_eq!(direct.begin_statement(), None);
        let pooled = StoreOptions {
            pooled: true,
            ..direct
        };
        assert_eq!(pooled.apply(url.clone()).get_options(), None);
        assert_eq!(
            pooled.begin_statement().as_deref(),
            Some(
                "BEGIN; SET LOCAL statement_timeout = '2500ms'; \
                 SET LOCAL lock_timeout = '500ms'; \
                 SET LOCAL idle_in_transaction_session_timeout = '2500ms'; \
                 SET LOCAL plan_cache_mode = 'force_custom_plan'"
            )
        );
        let plain = StoreOptions {
            pooled: true,
            ..StoreOptions::default()
        };
        assert_eq!(
            plain.begin_statement().as_deref(),
            Some("BEGIN; SET LOCAL plan_cache_mode = 'force_custom_plan'")
        );
    }
}
