//! Concurrency keys: routines that share a key (a tenant, a cluster, a GPU pool) share a limit,
//! at most N of their runs at once across every scheduler.
//!
//! The store counts a key's places from the ledger under a lock of the key, so the count is
//! exact across schedulers; what this module decides is which of the occurrences a claim has
//! for a key take the places left ([`admit`]): the oldest first, taking turns between the key's
//! routines, so one routine's backlog cannot starve the others. What is not admitted waits,
//! owed, never skipped for the limit.
//!
//! ```
//! use chrono::{TimeZone, Utc};
//! use cm_domain::limit::{ConcurrencyKey, admit};
//! use cm_domain::Occurrence;
//! use uuid::Uuid;
//!
//! let key: ConcurrencyKey = "gpu-pool".parse()?;
//! assert_eq!(key.as_str(), "gpu-pool");
//! let at = |m| Utc.with_ymd_and_hms(2026, 1, 1, 9, m, 0).unwrap();
//! let (busy, idle) = (Uuid::from_u128(1), Uuid::from_u128(2));
//! // `busy` owes three occurrences, `idle` one; two places are left.
//! let owed = [
//!     Occurrence::new(busy, at(0)),
//!     Occurrence::new(busy, at(1)),
//!     Occurrence::new(busy, at(2)),
//!     Occurrence::new(idle, at(2)),
//! ];
//! let admitted = admit(&owed, 2, &Default::default());
//! assert_eq!(admitted, vec![Occurrence::new(busy, at(0)), Occurrence::new(idle, at(2))]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use crate::occurrence::{Occurrence, RoutineId};

/// The most characters of a concurrency key.
pub const MAX_KEY_CHARS: usize = 100;

/// The highest limit a key may have.
pub const MAX_LIMIT: u32 = 1_000_000;

/// A concurrency key: 1 to 100 ASCII letters, digits and `. _ : / -`, starting with a letter or
/// a digit (`tenant:acme`, `gpu-pool`, `cluster/eu-1`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConcurrencyKey(String);

/// Why a text is not a concurrency key, or a number not a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// Not a key.
    #[error(
        "a concurrency key is 1 to {MAX_KEY_CHARS} letters, digits and . _ : / -, starting with a letter or digit (it was {0:?})"
    )]
    BadKey(String),
    /// A limit past [`MAX_LIMIT`].
    #[error("a concurrency limit must be 0 to {MAX_LIMIT} (it was {0})")]
    TooHigh(u64),
}

impl ConcurrencyKey {
    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ConcurrencyKey {
    type Err = LimitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let first = s.chars().next();
        let ok = first.is_some_and(|c| c.is_ascii_alphanumeric())
            && s.len() <= MAX_KEY_CHARS
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-'));
        if ok {
            Ok(ConcurrencyKey(s.to_owned()))
        } else {
            // Quoted with escapes, so an invisible character shows.
            Err(LimitError::BadKey(
                s.chars().take(MAX_KEY_CHARS + 1).collect(),
            ))
        }
    }
}

impl fmt::Display for ConcurrencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a limit: 0 (nothing of the key runs) to [`MAX_LIMIT`].
pub fn check_limit(n: u64) -> Result<u32, LimitError> {
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_LIMIT)
        .ok_or(LimitError::TooHigh(n))
}

/// Which of `owed` (one key's occurrences a claim has, any order) take the `room` places left:
/// routine by routine in turns, each turn taking each routine's oldest occurrence not yet
/// taken, the routines in the order of their oldest owed occurrence, then of when they last
/// ran (`last_ran`; one never run first), then by id. So the key's oldest occurrence is always
/// admitted first, no routine takes a second place while another of the key's routines waits
/// for its first, and between routines owing the same instant the turn goes to the one that
/// waited longest since it ran. Returns the admitted occurrences, in the order they were
/// admitted.
pub fn admit(
    owed: &[Occurrence],
    room: usize,
    last_ran: &HashMap<RoutineId, DateTime<Utc>>,
) -> Vec<Occurrence> {
    let mut by_routine: BTreeMap<RoutineId, Vec<DateTime<Utc>>> = BTreeMap::new();
    for o in owed {
        by_routine
            .entry(o.routine_id)
            .or_default()
            .push(o.scheduled_at);
    }
    let mut queues: Vec<(RoutineId, Vec<DateTime<Utc>>)> = by_routine
        .into_iter()
        .map(|(id, mut at)| {
            at.sort_unstable();
            at.dedup();
            at.reverse(); // popped from the end: oldest first
            (id, at)
        })
        .collect();
    queues.sort_by_key(|(id, at)| (at.last().copied(), last_ran.get(id).copied(), *id));
    let mut admitted = Vec::with_capacity(room.min(owed.len()));
    while admitted.len() < room {
        let mut took = false;
        for (id, at) in &mut queues {
            if admitted.len() == room {
                break;
            }
            if let Some(t) = at.pop() {
                admitted.push(Occurrence::new(*id, t));
                took = true;
            }
        }
        if !took {
            break;
        }
    }
    admitted
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn at(minute: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(minute)
    }

    #[test]
    fn keys() {
        for good in ["a", "tenant:acme", "gpu-pool", "cluster/eu-1", "A.b_c"] {
            assert_eq!(good.parse::<ConcurrencyKey>().unwrap().as_str(), good);
        }
        for bad in ["", "-x", "a b", "é", "a\u{200b}", &"x".repeat(101)] {
            assert!(bad.parse::<ConcurrencyKey>().is_err(), "{bad:?}");
        }
        assert!("x".repeat(100).parse::<ConcurrencyKey>().is_ok());
        assert_eq!(check_limit(0), Ok(0));
        assert!(check_limit(1_000_001).is_err());
    }

    #[test]
    fn between_routines_owing_one_instant_the_turn_goes_to_who_ran_longest_ago() {
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let owed = [
            Occurrence::new(a, at(5)),
            Occurrence::new(b, at(5)),
            Occurrence::new(c, at(5)),
        ];
        let ran = HashMap::from([(a, at(4)), (b, at(1))]);
        assert_eq!(
            admit(&owed, 2, &ran),
            vec![Occurrence::new(c, at(5)), Occurrence::new(b, at(5))]
        );
        // An older occurrence still goes first, whoever ran last.
        let owed = [Occurrence::new(a, at(3)), Occurrence::new(c, at(5))];
        assert_eq!(admit(&owed, 1, &ran), vec![Occurrence::new(a, at(3))]);
    }

    proptest! {
        /// Whatever is owed: the admitted are at most the room and all owed; as many as both
        /// allow; the key's oldest occurrence first; each routine's admitted are its oldest;
        /// and no routine has two more admitted than another that still waits.
        #[test]
        fn admission_is_oldest_first_and_takes_turns(
            owed in proptest::collection::vec((0u128..5, 0i64..30), 0..40),
            room in 0usize..20,
        ) {
            let owed: Vec<Occurrence> = owed
                .into_iter()
                .map(|(r, m)| Occurrence::new(Uuid::from_u128(r), at(m)))
                .collect();
            let mut distinct = owed.clone();
            distinct.sort_unstable();
            distinct.dedup();
            let admitted = admit(&owed, room, &HashMap::new());
            prop_assert_eq!(admitted.len(), room.min(distinct.len()));
            for a in &admitted {
                prop_assert!(distinct.contains(a));
            }
            if let (Some(first), Some(oldest)) = (admitted.first(), distinct.iter().min_by_key(|o| o.scheduled_at)) {
                prop_assert_eq!(first.scheduled_at, oldest.scheduled_at);
            }
            let count = |r: RoutineId, set: &[Occurrence]| set.iter().filter(|o| o.routine_id == r).count();
            let routines: Vec<RoutineId> = {
                let mut r: Vec<_> = distinct.iter().map(|o| o.routine_id).collect();
                r.sort_unstable();
                r.dedup();
                r
            };
            for r in &routines {
                let mine: Vec<_> = distinct.iter().filter(|o| o.routine_id == *r).collect();
                let n = count(*r, &admitted);
                for (i, o) in mine.iter().enumerate() {
                    prop_assert_eq!(admitted.contains(o), i < n, "a routine's oldest are admitted");
                }
            }
            for a in &routines {
                for b in &routines {
                    let (na, nb) = (count(*a, &admitted), count(*b, &admitted));
                    if count(*b, &distinct) > nb {
                        prop_assert!(na <= nb + 1, "{a} took {na} while {b} waits with {nb}");
                    }
                }
            }
        }
    }
}
