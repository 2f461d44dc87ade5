//! Jitter: a schedule's `jitter J` clause delays each occurrence by an offset in `[0, J)`, drawn
//! from the routine and the occurrence by a hash, not by a random call. Every process that plans
//! the occurrence (a retry, a second scheduler, a restart, `routine show`) computes the same
//! offset, so they agree on when it comes due without storing or sharing anything.
//!
//! The offset is in whole milliseconds: the first 64 bits of a SplitMix64 mix of the routine's
//! id and the occurrence's instant in microseconds, taken modulo the jitter's milliseconds. The
//! mix is written here, not taken from the standard library, whose hashers may change between
//! releases: an offset must not move when cm is upgraded, or a scheduler of the new version
//! would plan an occurrence at another instant than one of the old.

use chrono::{DateTime, TimeDelta, Utc};

use crate::RoutineId;

/// The offset of `occurrence` of `routine` under a jitter of `jitter`: at least zero and below
/// `jitter` (zero when `jitter` is below a millisecond).
pub fn offset(routine: RoutineId, occurrence: DateTime<Utc>, jitter: TimeDelta) -> TimeDelta {
    let Ok(span) = u64::try_from(jitter.num_milliseconds()) else {
        return TimeDelta::zero();
    };
    if span == 0 {
        return TimeDelta::zero();
    }
    let id = routine.as_u128();
    let mut h = mix((id >> 64) as u64);
    h = mix(h ^ id as u64);
    h = mix(h ^ occurrence.timestamp_micros() as u64);
    TimeDelta::milliseconds((h % span) as i64)
}

/// When `occurrence` of `routine` comes due under a jitter of `jitter`: the occurrence plus its
/// [`offset`].
pub fn planned(routine: RoutineId, occurrence: DateTime<Utc>, jitter: TimeDelta) -> DateTime<Utc> {
    occurrence
        .checked_add_signed(offset(routine, occurrence, jitter))
        .unwrap_or(occurrence)
}

/// SplitMix64's finaliser: every input bit moves every output bit.
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn an_offset_is_inside_the_jitter_and_the_same_every_time() {
        let jitter = TimeDelta::minutes(5);
        let at: DateTime<Utc> = "2026-12-03T09:00:00Z".parse().unwrap();
        for n in 0..1_000u128 {
            let routine = Uuid::from_u128(n * 0x1_0000_0001);
            let o = offset(routine, at, jitter);
            assert!(o >= TimeDelta::zero() && o < jitter, "{o}");
            assert_eq!(o, offset(routine, at, jitter));
        }
        assert_eq!(
            offset(Uuid::nil(), at, TimeDelta::zero()),
            TimeDelta::zero()
        );
    }

    /// The mix is part of the stored behaviour: a changed constant would move every jittered
    /// routine's occurrences between versions.
    #[test]
    fn the_offsets_do_not_change_between_versions() {
        let routine: Uuid = "0193a0c4-7d5e-7a40-9c1e-6b8f2d3e4a51".parse().unwrap();
        let at: DateTime<Utc> = "2026-12-03T09:00:00Z".parse().unwrap();
        let jitter = TimeDelta::minutes(5);
        let got: Vec<i64> = (0..4)
            .map(|day| offset(routine, at + TimeDelta::days(day), jitter).num_milliseconds())
            .collect();
        assert_eq!(got, PINNED);
    }

    const PINNED: [i64; 4] = [263_999, 169_867, 251_635, 83_994];
}
