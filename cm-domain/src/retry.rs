//! A routine's retry policy: a failed outcome (a message's failed dispatch, a mission's failed
//! or lost run) tried again as a new attempt of the same occurrence, after an exponential
//! backoff with a cap, never past the occurrence's next one nor its deadline.
//!
//! The store decides a retry in the statement that records the failure
//! (`cm-store`'s settle and run-end statements), by the same rule as [`RetryPolicy::decide`];
//! its tests hold the two to each other.
//!
//! ```
//! use std::time::Duration;
//! use cm_domain::RetryPolicy;
//!
//! let policy = RetryPolicy::new(3, Duration::from_secs(10), Duration::from_secs(25))?;
//! assert_eq!(policy.delay(1), Duration::from_secs(10));
//! assert_eq!(policy.delay(2), Duration::from_secs(20));
//! assert_eq!(policy.delay(3), Duration::from_secs(25)); // capped
//! assert_eq!(policy.to_string(), "3 retries, backoff 10s..25s");
//! assert_eq!("10s..25s".parse::<cm_domain::retry::Backoff>()?.max, Duration::from_secs(25));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The most retries a routine may ask for.
pub const MAX_RETRIES: u32 = 100;

/// The longest backoff: one day.
pub const MAX_BACKOFF_SECS: u64 = 86_400;

/// The backoff when none is given: 10 s, doubling up to 10 min.
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(10),
    max: Duration::from_secs(600),
};

/// How long to wait before a retry: `base` before the first, doubling each time, never more
/// than `max`. Written `BASE..MAX` (`10s..10m`), or `BASE` alone for a fixed wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        DEFAULT_BACKOFF
    }
}

impl Backoff {
    /// A backoff from `base` up to `max`: whole seconds, 1 s to a day, `base` at most `max`.
    pub fn new(base: Duration, max: Duration) -> Result<Backoff, RetryError> {
        for d in [base, max] {
            if d.subsec_nanos() != 0 || d.as_secs() == 0 || d.as_secs() > MAX_BACKOFF_SECS {
                return Err(RetryError::Backoff(text(d)));
            }
        }
        if base > max {
            return Err(RetryError::BackoffOrder {
                base: text(base),
                max: text(max),
            });
        }
        Ok(Backoff { base, max })
    }

    /// The wait before retry `n` (1 for the first): `base × 2^(n-1)`, at most `max`.
    pub fn delay(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(32);
        self.base
            .checked_mul(1u32 << doublings.min(31))
            .map_or(self.max, |d| d.min(self.max))
    }
}

impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.base == self.max {
            write!(f, "{}", text(self.base))
        } else {
            write!(f, "{}..{}", text(self.base), text(self.max))
        }
    }
}

impl FromStr for Backoff {
    type Err = RetryError;

    fn from_str(s: &str) -> Result<Backoff, RetryError> {
        let parse = |part: &str| {
            crate::parse_duration(part)
                .map(|secs| Duration::from_secs(secs.max(0).unsigned_abs()))
                .map_err(RetryError::BackoffText)
        };
        match s.split_once("..") {
            Some((base, max)) => Backoff::new(parse(base)?, parse(max)?),
            None => {
                let d = parse(s)?;
                Backoff::new(d, d)
            }
        }
    }
}

/// A routine's retry policy: how many times a failed occurrence is tried again, and the
/// backoff between tries. The default is no retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryPolicy {
    /// How many retries after the first attempt: 0 is none.
    pub retries: u32,
    /// The wait before each.
    pub backoff: Backoff,
}

/// Why a retry policy is refused. Each message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError {
    /// More retries than [`MAX_RETRIES`].
    #[error("retries must be 0 to {MAX_RETRIES} (it was {0})")]
    Retries(u64),
    /// A wait that is not whole seconds from 1 s to a day.
    #[error("a retry backoff must be whole seconds, 1s to 1d (it was {0})")]
    Backoff(String),
    /// A backoff whose first wait is longer than its cap.
    #[error("a retry backoff's first wait ({base}) must not be longer than its cap ({max})")]
    BackoffOrder {
        /// The first wait.
        base: String,
        /// The cap.
        max: String,
    },
    /// A backoff that does not read as `BASE..MAX` or `BASE`.
    #[error("a retry backoff is BASE..MAX or BASE, such as 10s..10m: {0}")]
    BackoffText(String),
}

/// What becomes of a failed attempt ([`RetryPolicy::decide`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again at this instant, as retry `retry` (1 for the first).
    Retry {
        /// When the retry is due.
        at: DateTime<Utc>,
        /// Which retry it is.
        retry: u32,
    },
    /// The routine asks for no retry: the failure is the occurrence's outcome.
    NoRetry,
    /// Retries were asked for but none is left, or the next would be too late: the failure is
    /// the occurrence's outcome, and the reason says why it was not tried again.
    GiveUp(String),
}

impl RetryPolicy {
    /// `retries` retries (at most [`MAX_RETRIES`]) with a backoff from `base` up to `max`.
    pub fn new(retries: u32, base: Duration, max: Duration) -> Result<RetryPolicy, RetryError> {
        if retries > MAX_RETRIES {
            return Err(RetryError::Retries(retries.into()));
        }
        Ok(RetryPolicy {
            retries,
            backoff: Backoff::new(base, max)?,
        })
    }

    /// Checks a policy built by hand (its fields are public): what [`RetryPolicy::new`] checks.
    pub fn check(&self) -> Result<(), RetryError> {
        RetryPolicy::new(self.retries, self.backoff.base, self.backoff.max).map(|_| ())
    }

    /// The wait before retry `n` (1 for the first).
    pub fn delay(&self, n: u32) -> Duration {
        self.backoff.delay(n)
    }

    /// What becomes of an attempt that failed at `now`, when `done` retries of its occurrence
    /// have begun already: retried after the backoff, unless none is left, the routine is
    /// paused, or the retry would be due at or after `next` (the routine's next occurrence) or
    /// `deadline` (the occurrence's).
    pub fn decide(
        &self,
        done: u32,
        now: DateTime<Utc>,
        paused: bool,
        next: Option<DateTime<Utc>>,
        deadline: Option<DateTime<Utc>>,
    ) -> RetryDecision {
        if self.retries == 0 {
            return RetryDecision::NoRetry;
        }
        if done >= self.retries {
            return RetryDecision::GiveUp(format!("retries spent ({done} of {})", self.retries));
        }
        if paused {
            return RetryDecision::GiveUp("not retried: the routine is paused".to_owned());
        }
        let retry = done + 1;
        let at =
            now + chrono::TimeDelta::from_std(self.delay(retry)).unwrap_or(chrono::TimeDelta::MAX);
        if let Some(next) = next.filter(|next| at >= *next) {
            return RetryDecision::GiveUp(format!(
                "not retried: retry {retry} would be due at {}, not before the next occurrence at {}",
                instant(at),
                instant(next)
            ));
        }
        if let Some(deadline) = deadline.filter(|deadline| at >= *deadline) {
            return RetryDecision::GiveUp(format!(
                "not retried: retry {retry} would be due at {}, past the deadline at {}",
                instant(at),
                instant(deadline)
            ));
        }
        RetryDecision::Retry { at, retry }
    }
}

impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.retries {
            0 => write!(f, "no retries"),
            1 => write!(f, "1 retry, backoff {}", self.backoff),
            n => write!(f, "{n} retries, backoff {}", self.backoff),
        }
    }
}

/// A duration as humantime writes it.
fn text(d: Duration) -> String {
    crate::duration_text(chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX))
}

/// An instant as the ledger's reasons write it: RFC 3339, UTC, whole seconds.
fn instant(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_backoff_reads_as_written_and_refuses_the_rest() {
        let b: Backoff = "10s..10m".parse().unwrap();
        assert_eq!(
            b,
            Backoff::new(Duration::from_secs(10), Duration::from_secs(600)).unwrap()
        );
        assert_eq!(b.to_string(), "10s..10m");
        assert_eq!("30s".parse::<Backoff>().unwrap().to_string(), "30s");
        for bad in ["", "fast", "0s", "1m..10s", "500ms", "2d", "1s..x"] {
            let e = bad.parse::<Backoff>().unwrap_err().to_string();
            assert!(!e.contains('\n'), "{e}");
        }
        assert_eq!(
            "1m..10s".parse::<Backoff>().unwrap_err().to_string(),
            "a retry backoff's first wait (1m) must not be longer than its cap (10s)"
        );
        assert!(RetryPolicy::new(101, DEFAULT_BACKOFF.base, DEFAULT_BACKOFF.max).is_err());
    }

    #[test]
    fn a_retry_is_given_up_at_the_next_occurrence_and_the_deadline() {
        let p = RetryPolicy::new(2, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
        assert_eq!(
            p.decide(0, t(0), false, Some(t(11)), None),
            RetryDecision::Retry {
                at: t(10),
                retry: 1
            }
        );
        assert!(
            matches!(p.decide(0, t(0), false, Some(t(10)), None), RetryDecision::GiveUp(r) if r.contains("next occurrence"))
        );
        assert!(
            matches!(p.decide(1, t(0), false, None, Some(t(20))), RetryDecision::GiveUp(r) if r.contains("deadline"))
        );
        assert_eq!(
            p.decide(2, t(0), false, None, None),
            RetryDecision::GiveUp("retries spent (2 of 2)".into())
        );
        assert!(
            matches!(p.decide(0, t(0), true, None, None), RetryDecision::GiveUp(r) if r.contains("paused"))
        );
        assert_eq!(
            RetryPolicy::default().decide(0, t(0), false, None, None),
            RetryDecision::NoRetry
        );
    }

    proptest! {
        /// The waits never shrink, start at the base, never pass the cap, and a retry is due
        /// strictly before both limits or not at all.
        #[test]
        fn waits_grow_to_the_cap_and_retries_stay_inside_the_limits(
            base in 1u64..600, extra in 0u64..86_000, n in 1u32..200,
            done in 0u32..120, retries in 0u32..=MAX_RETRIES,
            next in proptest::option::of(0i64..100_000), deadline in proptest::option::of(0i64..100_000),
        ) {
            let max = (base + extra).min(MAX_BACKOFF_SECS);
            let p = RetryPolicy::new(retries, Duration::from_secs(base), Duration::from_secs(max)).unwrap();
            prop_assert_eq!(p.delay(1), Duration::from_secs(base));
            prop_assert!(p.delay(n) <= p.delay(n + 1));
            prop_assert!(p.delay(n) <= Duration::from_secs(max));
            match p.decide(done, t(0), false, next.map(t), deadline.map(t)) {
                RetryDecision::Retry { at, retry } => {
                    prop_assert!(done < retries);
                    prop_assert_eq!(retry, done + 1);
                    prop_assert_eq!(at, t(0) + chrono::TimeDelta::from_std(p.delay(retry)).unwrap());
                    prop_assert!(next.is_none_or(|n| at < t(n)));
                    prop_assert!(deadline.is_none_or(|d| at < t(d)));
                }
                RetryDecision::NoRetry => prop_assert_eq!(retries, 0),
                RetryDecision::GiveUp(reason) => {
                    prop_assert!(retries > 0);
                    prop_assert!(!reason.contains('\n'));
                }
            }
        }
    }
}
