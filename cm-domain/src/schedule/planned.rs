//! The `jitter` clause: when each occurrence comes due, and which occurrence a routine's clock
//! stands for.
//!
//! With jitter, an occurrence comes due up to the jitter later, by an offset fixed per routine and
//! occurrence ([`crate::jitter`]); a routine's clock (`next_run_at`) holds that planned instant.
//! The jitter is checked when the schedule is parsed, and an offset never carries an occurrence
//! to the next one (where a zone brings two closer than the check saw), so planned instants keep
//! the occurrences' order.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};

use super::{Schedule, ScheduleError};
use crate::rules::Rule;

impl Schedule {
    /// Refuses a jitter longer than the schedule's shortest interval (measured over its first
    /// [`crate::rules::JITTER_CHECKED_OCCURRENCES`] occurrences from its start, or from
    /// 2000-01-01), or for a one-shot longer than a day: planned instants then keep the
    /// occurrences' order. The candidates the walk looks at are added to `spent`, within
    /// [`crate::rules::MAX_CHECKED_CANDIDATES`].
    pub(super) fn check_jitter(
        &self,
        jitter: TimeDelta,
        spent: &mut usize,
    ) -> Result<(), ScheduleError> {
        let refuse = |reason: String| Err(ScheduleError::Rule { reason });
        if let Rule::At(_) = self.rule {
            if jitter > TimeDelta::seconds(crate::rules::MAX_ONE_SHOT_JITTER_SECONDS) {
                return refuse(format!(
                    "jitter {}: a one-shot's jitter is at most a day",
                    crate::rules::duration_text(jitter)
                ));
            }
            return Ok(());
        }
        let from = self
            .bounds
            .start
            .or_else(|| Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single())
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
            - TimeDelta::milliseconds(1);
        let mut occurrences = Vec::with_capacity(crate::rules::JITTER_CHECKED_OCCURRENCES);
        let mut cursor = from;
        while occurrences.len() < crate::rules::JITTER_CHECKED_OCCURRENCES {
            let next = self
                .next_after_counted(cursor, spent, crate::rules::MAX_CHECKED_CANDIDATES)
                .map_err(|_| ScheduleError::TooCostly {
                    what: "the jitter check over its first occurrences",
                })?;
            let Some(next) = next else { break };
            occurrences.push(next);
            cursor = next;
        }
        let shortest = occurrences.windows(2).map(|w| w[1] - w[0]).min();
        match shortest {
            Some(shortest) if jitter > shortest => refuse(format!(
                "jitter {} is longer than the schedule's shortest interval, {}",
                crate::rules::duration_text(jitter),
                crate::rules::duration_text(shortest)
            )),
            _ => Ok(()),
        }
    }

    /// The `jitter` clause: each occurrence comes due up to this much after it (see
    /// [`crate::jitter`]). `None` without one.
    pub fn jitter(&self) -> Option<std::time::Duration> {
        self.jitter.and_then(|j| j.to_std().ok())
    }

    /// When occurrence `occurrence` of routine `routine` comes due: the occurrence itself, or
    /// with a `jitter` clause the occurrence plus its offset ([`crate::jitter::planned`]), at
    /// most a millisecond before the next occurrence, or
    /// on a calendar under `next` or `previous` and on a day off, the same wall time on the
    /// nearest business day ([`crate::calendar`]).
    pub fn planned(&self, routine: crate::RoutineId, occurrence: DateTime<Utc>) -> DateTime<Utc> {
        match self.jitter {
            Some(jitter) => {
                let planned = crate::jitter::planned(routine, occurrence, jitter);
                // The jitter check measures the schedule's first occurrences; a zone that
                // later skips a day (Samoa skipped 2011-12-30) brings two occurrences closer
                // than any it measured. An offset never carries an occurrence to the next one,
                // so planned instants keep the occurrences' order whatever the zone does.
                match self.next_after(occurrence) {
                    Some(next) if planned >= next => next - TimeDelta::milliseconds(1),
                    _ => planned,
                }
            }
            None => self.moved(occurrence),
        }
    }

    /// The routine's first occurrence strictly after `instant`, and when it comes due, as a
    /// routine's clock is set when it is written or resumed: `(occurrence, planned)`. On a
    /// calendar that moves occurrences, its first occurrence planned after `instant` (one
    /// moved from before `instant` to after it included).
    pub fn next_planned_after(
        &self,
        routine: crate::RoutineId,
        instant: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        // On a calendar that moves occurrences, the first planned after `instant`: under
        // `next`, one at or before `instant` moved past it is owed; under `previous`, one after
        // `instant` moved to or before it is not (its time has passed).
        if self.jitter.is_none() && self.moves_occurrences() {
            let first =
                self.occurrence_moved_to(instant.checked_add_signed(TimeDelta::nanoseconds(1))?)?;
            return Some((first, self.planned(routine, first)));
        }
        self.occurrences_after(instant)
            .take(crate::calendar::MAX_ROLL_DAYS as usize + 8)
            .map(|o| (o, self.planned(routine, o)))
            .find(|(_, planned)| *planned > instant)
    }

    /// The occurrence a routine's clock, `planned` (its `next_run_at`), stands for: the
    /// occurrence whose planned instant it is. Without jitter, `planned` itself. With jitter,
    /// the occurrence in `(planned - jitter, planned]` planned then; a clock that no occurrence
    /// is planned at (written before the jitter was) stands for the latest occurrence in that
    /// stretch, or, with none there, the first after it. `None` when the schedule has no
    /// occurrence after `planned - jitter`: nothing is owed. On a calendar that moves
    /// occurrences, the earliest occurrence planned at or after `planned`.
    pub fn occurrence_planned_at(
        &self,
        routine: crate::RoutineId,
        planned: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        if self.jitter.is_none() && self.moves_occurrences() {
            return self.occurrence_moved_to(planned);
        }
        let Some(jitter) = self.jitter else {
            return Some(planned);
        };
        let from = planned.checked_sub_signed(jitter)?;
        let mut latest = None;
        for occurrence in self.occurrences_after(from) {
            if occurrence > planned {
                return Some(latest.unwrap_or(occurrence));
            }
            if self.planned(routine, occurrence) == planned {
                return Some(occurrence);
            }
            latest = Some(occurrence);
        }
        latest
    }

    /// A routine's runs from its clock (`next_run_at`) on, in order: each one's occurrence and
    /// when it comes due, as the ticks will claim them (`schedule next --routine-id` and
    /// `routine show` list these).
    pub fn runs_from_clock(
        &self,
        routine: crate::RoutineId,
        clock: DateTime<Utc>,
    ) -> impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)> + '_ {
        let first = self.occurrence_planned_at(routine, clock);
        std::iter::successors(first, |at| self.next_after(*at))
            .map(move |o| (o, self.planned(routine, o)))
    }
}
