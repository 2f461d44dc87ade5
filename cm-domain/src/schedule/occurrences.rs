//! A schedule's occurrences: the first strictly after an instant, and the walk from each to the
//! next.
//!
//! [`Schedule::next_after`] asks the rule for its next instant (a cron rule's wall times are
//! placed in real time by [`super::daylight`]), then applies the window (`from`, `until`) and the
//! exclusions (`except`, see [`crate::rules`]). [`Occurrences`] chains it.

use chrono::{DateTime, Datelike, TimeDelta, Utc};

use super::Schedule;
use crate::rules::Rule;

impl Schedule {
    /// Whether nothing is owed after `instant`: the window closed, or the one instant passed.
    /// A routine whose schedule is over is *finished*.
    pub fn is_over_after(&self, instant: DateTime<Utc>) -> bool {
        self.next_after(instant).is_none()
    }

    /// The first occurrence strictly after `instant`, or `None` if there is none: the rule's
    /// next instant inside the window that no exclusion drops, nor its calendar
    /// ([`Schedule::with_calendar`]).
    ///
    /// Occurrences are whole seconds. `None` also covers instants whose local date is outside
    /// the years 2 to 4998, which the cron engine does not search.
    pub fn next_after(&self, instant: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.next_after_counted(instant, &mut 0, usize::MAX)
            .unwrap_or(None)
    }

    /// [`Schedule::next_after`], adding each candidate the rule gives to `spent`; `Err` (with
    /// nothing found) once `spent` would pass `limit`.
    pub(crate) fn next_after_counted(
        &self,
        instant: DateTime<Utc>,
        spent: &mut usize,
        limit: usize,
    ) -> Result<Option<DateTime<Utc>>, OverBudget> {
        // Converting the far ends of chrono's range to a zone can overflow, and croner searches
        // no further than the year 5000; no schedule runs there, so those instants are
        // answered before any conversion.
        let mut from = match self.bounds.start {
            // `from` is inclusive: the search starts just before it.
            Some(start) if start > instant => start - TimeDelta::milliseconds(1),
            _ => instant,
        };
        for _ in 0..crate::rules::MAX_EXCLUDED_IN_A_ROW {
            if !(2..=4998).contains(&from.year()) {
                return Ok(None);
            }
            if *spent >= limit {
                return Err(OverBudget);
            }
            *spent += 1;
            let Some(next) = self.rule_after(from) else {
                return Ok(None);
            };
            if self.bounds.end.is_some_and(|end| next > end) {
                return Ok(None);
            }
            match self.bounds.excluded_through(next, self.zone) {
                None => match self.day_off_through(next) {
                    None => return Ok(Some(next)),
                    Some(through) => from = through,
                },
                Some(through) => from = through,
            }
        }
        Ok(None)
    }

    /// The rule's first instant strictly after `instant`, window and exclusions aside.
    fn rule_after(&self, instant: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.rule {
            Rule::Cron {
                cron,
                fixed_time: true,
            } => self.next_fixed_time_after(cron, instant),
            Rule::Cron { cron, .. } => Self::next_interval_after(cron, self.zone, instant),
            Rule::Every { every, offset } => Rule::next_every(*every, *offset, instant),
            Rule::At(at) => (*at > instant).then_some(*at),
            Rule::Recur(recurrence) => recurrence.next_after(self.zone, instant),
        }
    }

    /// The occurrences strictly after `instant`, in order, each computed from the previous one.
    pub fn occurrences_after(&self, instant: DateTime<Utc>) -> Occurrences<'_> {
        Occurrences {
            schedule: self,
            cursor: Some(instant),
        }
    }
}

/// A walk that would look at more candidates than it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverBudget;

/// The occurrences of a schedule after an instant; see [`Schedule::occurrences_after`].
#[derive(Debug, Clone)]
pub struct Occurrences<'a> {
    /// The schedule walked.
    schedule: &'a Schedule,
    /// The last occurrence returned (or the start), `None` once the schedule has no more.
    cursor: Option<DateTime<Utc>>,
}

impl Iterator for Occurrences<'_> {
    type Item = DateTime<Utc>;

    fn next(&mut self) -> Option<DateTime<Utc>> {
        let next = self.schedule.next_after(self.cursor?);
        self.cursor = next;
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use chrono::TimeZone;

    #[test]
    fn next_after_is_strict_and_whole_seconds() {
        let s = Schedule::parse("0 0 * * *", "UTC").unwrap();
        let midnight = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let next_day = Utc.with_ymd_and_hms(2026, 1, 2, 0, 0, 0).unwrap();
        assert_eq!(s.next_after(midnight), Some(next_day));
        let just_before = midnight - chrono::TimeDelta::nanoseconds(1);
        assert_eq!(s.next_after(just_before), Some(midnight));
        let just_after = midnight + chrono::TimeDelta::milliseconds(500);
        assert_eq!(s.next_after(just_after), Some(next_day));
    }

    #[test]
    fn next_after_at_the_ends_of_time_is_none() {
        let s = Schedule::parse("* * * * * *", "Pacific/Kiritimati").unwrap();
        assert_eq!(s.next_after(DateTime::<Utc>::MAX_UTC), None);
        assert_eq!(s.next_after(DateTime::<Utc>::MIN_UTC), None);
    }

    #[test]
    fn occurrences_after_chains_next_after() {
        let s = Schedule::parse("0 */6 * * *", "UTC").unwrap();
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 1, 0, 0).unwrap();
        let hours: Vec<u32> = s
            .occurrences_after(start)
            .take(4)
            .map(|t| chrono::Timelike::hour(&t))
            .collect();
        assert_eq!(hours, [6, 12, 18, 0]);
    }
}
