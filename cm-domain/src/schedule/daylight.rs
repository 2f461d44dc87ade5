//! Daylight saving: how a cron rule's wall times become instants across gaps and overlaps.
//!
//! An *interval* schedule uses croner's zoned search, which skips wall times in a gap and fires at
//! both instants of an overlap. A *fixed-time* schedule's wall times are placed here: the earlier
//! instant of an overlap, and for a wall time a gap swallowed the first instant after the gap
//! ([`first_instant_after_gap`], which the times of `@at`, `from` and `until` use too).

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use croner::Cron;

use super::{Schedule, Zone};

impl Schedule {
    /// `next_after` for an interval schedule: croner's own zoned search, which skips gaps and
    /// walks both passes of an overlap in real-time order.
    pub(super) fn next_interval_after(
        cron: &Cron,
        zone: Zone,
        instant: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let mut from = instant.with_timezone(&zone.tz());
        // croner promises an instant strictly after its start, and the tests check that it
        // keeps the promise. This loop keeps the contract even if a future croner did not: a
        // result at or before `instant` is searched past, and the loop is bounded so a broken
        // engine cannot spin.
        for _ in 0..4 {
            let next = cron.find_next_occurrence(&from, false).ok()?;
            let next_utc = next.with_timezone(&Utc);
            if next_utc > instant {
                return Some(next_utc);
            }
            from = next;
        }
        None
    }

    /// `next_after` for a fixed-time schedule: croner finds the matching wall times, and cm
    /// places each in real time.
    ///
    /// croner's zoned search moves a fixed-time run out of a gap by stepping one second at a
    /// time for at most two hours, and fails past that: in `Pacific/Apia`, where 2011-12-30
    /// never happened, a daily job would get no next run at all and stop for good. Placing the
    /// wall times here has no such limit.
    pub(super) fn next_fixed_time_after(
        &self,
        cron: &Cron,
        instant: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        fixed_time_after(self.zone, instant, |wall| {
            // On naive wall times croner is a plain calendar search: strictly after `wall`
            // (its fraction of a second dropped), with no zone involved.
            cron.find_next_occurrence(&wall, false).ok()
        })
    }
}

/// The first instant after `instant` of a fixed-time rule whose wall times, in order,
/// `next_wall` gives (the first strictly after the wall time it is given): each placed at the
/// earlier instant of a repeated wall time, and a wall time a gap swallowed at the first
/// instant after the gap.
///
/// The wall times, in order, land on instants that never go back, so the first that lands
/// after `instant` is the answer. A wall time can land at or before `instant` only when the
/// search starts on the later pass of an overlap (the run already happened on the earlier
/// pass), and a fixed-time rule has one time of day, so a handful of steps always suffices.
pub(crate) fn fixed_time_after(
    zone: Zone,
    instant: DateTime<Utc>,
    mut next_wall: impl FnMut(NaiveDateTime) -> Option<NaiveDateTime>,
) -> Option<DateTime<Utc>> {
    let tz = zone.tz();
    let mut wall = instant.with_timezone(&tz).naive_local();
    for _ in 0..8 {
        wall = next_wall(wall)?;
        let at = match tz.from_local_datetime(&wall) {
            LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => at,
            LocalResult::None => first_instant_after_gap(tz, wall)?,
        };
        let at = at.with_timezone(&Utc);
        if at > instant {
            return Some(at);
        }
    }
    None
}

/// The first instant after the daylight-saving gap that swallowed the wall time `wall`.
///
/// That instant is the earliest of the first wall time after the gap. It is found by doubling
/// a step until a wall time exists, then halving back to the first that does: about thirty
/// zone lookups even for the 24-hour gap of `Pacific/Apia` in 2011, instead of one per second.
pub(crate) fn first_instant_after_gap(
    tz: chrono_tz::Tz,
    wall: NaiveDateTime,
) -> Option<DateTime<chrono_tz::Tz>> {
    let exists = |seconds: i64| {
        tz.from_local_datetime(&(wall + TimeDelta::seconds(seconds)))
            .earliest()
    };
    // No gap is longer than a day; two days bounds the doubling.
    let mut known_after = 1;
    while exists(known_after).is_none() {
        if known_after > 2 * 86_400 {
            return None;
        }
        known_after *= 2;
    }
    // `wall + known_before` is in the gap (offset 0 is `wall` itself), and the gap is one run
    // of wall times, so bisection finds its end.
    let mut known_before = known_after / 2;
    while known_after - known_before > 1 {
        let middle = known_before + (known_after - known_before) / 2;
        if exists(middle).is_some() {
            known_after = middle;
        } else {
            known_before = middle;
        }
    }
    exists(known_after)
}
