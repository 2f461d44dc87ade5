//! Scheduler settings, validated once so the rules that depend on them hold by construction.
//!
//! The one rule that matters most: a dispatch never outlives its lease. If it could, a claim
//! whose lease ran out might still be dispatching when another scheduler takes it over, and a
//! mission would start twice. [`SchedulerConfig::validate`] refuses a dispatch timeout that is
//! not shorter than the lease.

use std::num::NonZeroUsize;
use std::time::Duration;

/// The shortest retention of settled rows a scheduler accepts.
pub const MIN_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How long a claim belongs to its claimant. Never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lease(Duration);

impl Lease {
    /// A lease of `duration`; `None` for zero.
    pub fn new(duration: Duration) -> Option<Self> {
        (!duration.is_zero()).then_some(Lease(duration))
    }

    /// The lease's length.
    pub fn duration(self) -> Duration {
        self.0
    }
}

/// The most occurrences one tick dispatches. Never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FireCap(NonZeroUsize);

impl FireCap {
    /// The default cap: 25 occurrences a tick.
    pub const DEFAULT: FireCap = FireCap(NonZeroUsize::new(25).unwrap());

    /// A cap of `n`; `None` for zero.
    pub fn new(n: usize) -> Option<Self> {
        NonZeroUsize::new(n).map(FireCap)
    }

    /// The cap as a number.
    pub fn get(self) -> usize {
        self.0.get()
    }
}

impl Default for FireCap {
    fn default() -> Self {
        FireCap::DEFAULT
    }
}

/// A scheduler's settings. Build one with [`SchedulerConfig::default`], change fields, then call
/// [`SchedulerConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// How often a tick runs.
    pub tick_interval: Duration,
    /// The most occurrences one tick dispatches; the rest are deferred to the next tick.
    pub max_fires_per_tick: FireCap,
    /// How long a claim belongs to its claimant.
    pub lease: Lease,
    /// The longest one dispatch may run. Must be shorter than the lease.
    pub dispatch_timeout: Duration,
    /// The most dispatches one scheduler runs at once. A tick claims no more than it can start
    /// at once (the cap and the free room, whichever is smaller), so a claim never waits for
    /// room while its lease runs. Occurrences a database-local backend writes in the claim's
    /// own transaction take no room. At least 1.
    pub max_in_flight: usize,
    /// How many claims an occurrence may have before it is settled `failed` without dispatch.
    pub max_attempts: u32,
    /// How late an occurrence may be found and still count as on time (not a misfire).
    pub misfire_grace: Duration,
    /// Under `catch-up`, the most missed occurrences that fire; older ones coalesce (skip).
    /// At most [`SchedulerConfig::MAX_BACKLOG`].
    pub max_backlog: usize,
    /// How long settled ledger rows are kept. The ledger is the dedupe, so this must be far
    /// longer than any window in which an occurrence could be computed again (at least a day).
    pub retention: Duration,
    /// The most missions one scheduler launches in any second (`None`: no bound). Each is a
    /// container or a Job, so a burst of due missions reaches the runtime at this rate; the
    /// rest stay due, unclaimed (their lease not running), until the budget comes back.
    /// Messages are bounded only by `max_in_flight`.
    pub max_mission_launches_per_second: Option<std::num::NonZeroU32>,
    /// How many claims a tick keeps in flight at once while a backlog lasts (at least 1). A
    /// tick's first claim is one; when it comes back full (more is due), the others start
    /// beside it, each its own transaction, kept apart as two schedulers' claims are. One claim
    /// is a chain of round trips and planning during which its connection waits; several in
    /// flight keep the database busy through each other's waits. Within one routine group
    /// (Citus, `--claim-per-group`) the groups are claimed side by side instead.
    pub drain_lanes: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            tick_interval: Duration::from_secs(1),
            max_fires_per_tick: FireCap::DEFAULT,
            lease: Lease(Duration::from_secs(60)),
            dispatch_timeout: Duration::from_secs(30),
            max_in_flight: SchedulerConfig::DEFAULT_MAX_IN_FLIGHT,
            max_attempts: 3,
            misfire_grace: Duration::from_secs(60),
            max_backlog: 100,
            retention: Duration::from_secs(30 * 24 * 3600),
            max_mission_launches_per_second: std::num::NonZeroU32::new(
                SchedulerConfig::DEFAULT_MISSION_LAUNCHES_PER_SECOND,
            ),
            drain_lanes: SchedulerConfig::DEFAULT_DRAIN_LANES,
        }
    }
}

/// A setting that the scheduler refuses to run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The dispatch timeout is not shorter than the lease, so a dispatch could outlive its claim.
    #[error(
        "the dispatch timeout ({timeout:?}) must be shorter than the lease ({lease:?}), \
         or a dispatch could outlive its claim"
    )]
    TimeoutNotShorterThanLease {
        /// The configured dispatch timeout.
        timeout: Duration,
        /// The configured lease.
        lease: Duration,
    },
    /// A duration that must be positive is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// `max_attempts` is zero: no occurrence could ever be dispatched.
    #[error("max attempts must be at least 1")]
    NoAttempts,
    /// `max_in_flight` is zero: no dispatch could ever start.
    #[error("max in flight must be at least 1")]
    NoRoomInFlight,
    /// `drain_lanes` is zero: no claim could ever be made.
    #[error("the drain lanes must be at least 1")]
    NoDrainLane,
    /// The retention is shorter than a day, or not longer than the misfire grace: a pruned
    /// row could be an occurrence some scheduler still computes, and it would fire again.
    #[error(
        "the retention ({retention:?}) must be at least a day and longer than the misfire grace"
    )]
    RetentionTooShort {
        /// The configured retention.
        retention: Duration,
    },
    /// `max_backlog` is past [`SchedulerConfig::MAX_BACKLOG`]: a claim would walk that many
    /// occurrences of each late routine inside its transaction.
    #[error(
        "the max backlog ({0}) must be at most {max}: a claim walks that many occurrences of each \
         late routine inside its transaction",
        max = SchedulerConfig::MAX_BACKLOG
    )]
    BacklogTooLarge(usize),
}

impl SchedulerConfig {
    /// The default bound on dispatches in flight: enough for a slow target (a webhook that
    /// takes seconds) not to hold back other routines, small enough that one scheduler never
    /// opens hundreds of connections to a target at once.
    pub const DEFAULT_MAX_IN_FLIGHT: usize = 100;

    /// The largest `max_backlog`: the misfire plan walks one more occurrence than the backlog
    /// per late routine inside the claim's transaction, so this keeps that walk within the
    /// default scan bound ([`crate::MisfireRules::DEFAULT_MAX_SCAN`]), a few milliseconds per
    /// routine, far inside the claim's statement timeout. Ten thousand missed occurrences is a
    /// week of a routine every minute.
    pub const MAX_BACKLOG: usize = 10_000;

    /// The default number of claims in flight while a backlog lasts
    /// ([`SchedulerConfig::drain_lanes`]): with two, two processes drained a backlog at 0.96 of
    /// the lean raw SQL's rate, against 0.58 with one (docs/BENCHMARKS.md, "Two lanes of
    /// claims").
    pub const DEFAULT_DRAIN_LANES: usize = 2;

    /// The default bound on mission launches per second and scheduler.
    pub const DEFAULT_MISSION_LAUNCHES_PER_SECOND: u32 = 10;

    /// Checks the rules between settings and returns the configuration unchanged if they hold.
    pub fn validate(self) -> Result<Self, ConfigError> {
        if self.tick_interval.is_zero() {
            return Err(ConfigError::Zero("the tick interval"));
        }
        if self.dispatch_timeout.is_zero() {
            return Err(ConfigError::Zero("the dispatch timeout"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::NoAttempts);
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::NoRoomInFlight);
        }
        if self.drain_lanes == 0 {
            return Err(ConfigError::NoDrainLane);
        }
        if self.retention < MIN_RETENTION || self.retention <= self.misfire_grace {
            return Err(ConfigError::RetentionTooShort {
                retention: self.retention,
            });
        }
        if self.max_backlog > Self::MAX_BACKLOG {
            return Err(ConfigError::BacklogTooLarge(self.max_backlog));
        }
        if self.dispatch_timeout >= self.lease.duration() {
            return Err(ConfigError::TimeoutNotShorterThanLease {
                timeout: self.dispatch_timeout,
                lease: self.lease.duration(),
            });
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        lease_ms: u64,
        timeout_ms: u64,
        tick_ms: u64,
        attempts: u32,
        expected: Result<(), &str>,
    ) {
        let config = SchedulerConfig {
            lease: Lease::new(Duration::from_millis(lease_ms)).unwrap(),
            dispatch_timeout: Duration::from_millis(timeout_ms),
            tick_interval: Duration::from_millis(tick_ms),
            max_attempts: attempts,
            ..SchedulerConfig::default()
        };
        let got = config.validate().map(|_| ()).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(want)) => assert!(e.contains(want), "{e:?} does not mention {want:?}"),
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn validate() {
        check(60_000, 30_000, 1_000, 3, Ok(()));
        check(60_000, 59_999, 1_000, 1, Ok(()));
        check(60_000, 60_000, 1_000, 3, Err("shorter than the lease"));
        check(1_000, 5_000, 1_000, 3, Err("shorter than the lease"));
        check(
            60_000,
            0,
            1_000,
            3,
            Err("dispatch timeout must be greater than zero"),
        );
        check(
            60_000,
            30_000,
            0,
            3,
            Err("tick interval must be greater than zero"),
        );
        check(60_000, 30_000, 1_000, 0, Err("at least 1"));
        let no_room = SchedulerConfig {
            max_in_flight: 0,
            ..SchedulerConfig::default()
        };
        assert_eq!(no_room.validate(), Err(ConfigError::NoRoomInFlight));
        let no_lane = SchedulerConfig {
            drain_lanes: 0,
            ..SchedulerConfig::default()
        };
        assert_eq!(no_lane.validate(), Err(ConfigError::NoDrainLane));
        let short = SchedulerConfig {
            retention: Duration::from_secs(3600),
            ..SchedulerConfig::default()
        };
        assert!(matches!(
            short.validate(),
            Err(ConfigError::RetentionTooShort { .. })
        ));
        let shorter_than_grace = SchedulerConfig {
            retention: MIN_RETENTION,
            misfire_grace: MIN_RETENTION * 2,
            ..SchedulerConfig::default()
        };
        assert!(shorter_than_grace.validate().is_err());
        for (backlog, ok) in [
            (1, true),
            (SchedulerConfig::MAX_BACKLOG, true),
            (SchedulerConfig::MAX_BACKLOG + 1, false),
            (usize::MAX, false),
        ] {
            let config = SchedulerConfig {
                max_backlog: backlog,
                ..SchedulerConfig::default()
            };
            assert_eq!(config.validate().is_ok(), ok, "max backlog {backlog}");
        }
        assert!(SchedulerConfig::default().validate().is_ok());
    }

    #[test]
    fn zero_is_not_a_lease_or_a_cap() {
        assert_eq!(Lease::new(Duration::ZERO), None);
        assert_eq!(FireCap::new(0), None);
        assert_eq!(FireCap::default().get(), 25);
    }
}
