//! A schedule on a holiday calendar ([`crate::calendar`]): which occurrences a day off drops
//! (`skip`), and where it moves the others (`next`, `previous`).
//!
//! Under `skip`, [`Schedule::next_after`] passes over a day off like an `except` clause. Under
//! `next` and `previous`, the occurrences stay what the rule makes them (each one's key), and
//! [`Schedule::planned`] moves one on a day off to the same wall time on the nearest business
//! day (the line's time of day, even for an occurrence a gap moved; the occurrence's day is the
//! day its wall time was written for). So that a routine's clock (the planned instant of its
//! next occurrence) still says which
//! occurrence it stands for, planned instants must never go back as occurrences go forward:
//! `next` and `previous` need a schedule with at most one occurrence a day in the calendar's
//! zone, all at one wall time (a fixed-time cron line in that zone, or a one-shot), and no
//! jitter. Several occurrences can then be planned at one instant (a daily routine's Saturday,
//! Sunday and Monday occurrences all on Monday under `next`): the clock stands for the earliest
//! of them, and the claim that takes it takes them all.

use std::sync::Arc;

use chrono::{DateTime, LocalResult, NaiveDate, NaiveTime, TimeDelta, TimeZone, Utc};

use super::{Schedule, ScheduleError, first_instant_after_gap};
use crate::calendar::{Calendar, MAX_ROLL_DAYS, OnHoliday};
use crate::rules::Rule;

/// A schedule's calendar and what it does with an occurrence on a day off.
#[derive(Debug, Clone)]
pub(super) struct Holidays {
    /// The calendar.
    pub(super) calendar: Arc<Calendar>,
    /// What an occurrence on one of its days off becomes.
    pub(super) on_holiday: OnHoliday,
    /// A fixed-time cron line's one time of day, under `next` and `previous`: an occurrence
    /// moves to it, and its day is the day of the wall time it was placed for.
    pub(super) time_of_day: Option<NaiveTime>,
}

/// How many occurrences a walk that looks for a clock's occurrence goes through at most: with
/// at most one occurrence a day, a roll's reach and a little more.
const ROLL_WALK: usize = MAX_ROLL_DAYS as usize + 8;

impl Schedule {
    /// This schedule on `calendar`, an occurrence on a day off treated by `on_holiday`.
    ///
    /// `next` and `previous` are refused unless the schedule is a one-shot, or a fixed-time
    /// cron line in the calendar's zone, without jitter (see the module documentation). A
    /// schedule whose every occurrence falls on a day off (from 2000-01-01, or for a one-shot
    /// its instant) is refused too.
    pub fn with_calendar(
        mut self,
        calendar: Arc<Calendar>,
        on_holiday: OnHoliday,
    ) -> Result<Schedule, ScheduleError> {
        if on_holiday.moves() {
            let refuse = |why: String| {
                Err(ScheduleError::Rule {
                    reason: format!("on-holiday {on_holiday}: {why}; use skip"),
                })
            };
            if self.jitter.is_some() {
                return refuse("a moved occurrence cannot also be jittered".to_owned());
            }
            if !self.is_one_shot() {
                if !self.is_fixed_time() {
                    return refuse(
                        "it needs a fixed-time cron line or rule (one second, minute and \
                         hour), at most one occurrence a day"
                            .to_owned(),
                    );
                }
                if self.zone != calendar.zone() {
                    return refuse(format!(
                        "the schedule's zone, {}, is not the calendar's, {}",
                        self.zone,
                        calendar.zone()
                    ));
                }
            }
        }
        let time_of_day = match &self.rule {
            Rule::Cron { cron, .. } if on_holiday.moves() => {
                let from = NaiveDate::from_ymd_opt(2000, 1, 1)
                    .unwrap_or(NaiveDate::MIN)
                    .and_time(NaiveTime::MIN);
                cron.find_next_occurrence(&from, true)
                    .ok()
                    .map(|w| w.time())
            }
            Rule::Recur(recurrence) if on_holiday.moves() => recurrence.time_of_day(),
            _ => None,
        };
        self.holidays = Some(Holidays {
            calendar,
            on_holiday,
            time_of_day,
        });
        let reference = if self.is_one_shot() {
            self.start_search()
        } else {
            Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0)
                .single()
                .unwrap_or(DateTime::<Utc>::MIN_UTC)
        };
        let mut spent = 0;
        let first = self
            .next_after_counted(reference, &mut spent, crate::rules::MAX_CHECKED_CANDIDATES)
            .map_err(|_| ScheduleError::TooCostly {
                what: "finding its first occurrence on a business day",
            })?;
        if first.is_none() {
            return Err(ScheduleError::NeverFires {
                reason: "every occurrence falls on a day off of its calendar".to_owned(),
            });
        }
        Ok(self)
    }

    /// The schedule's calendar and its on-holiday policy, if it is on one.
    pub fn calendar(&self) -> Option<(&Calendar, OnHoliday)> {
        self.holidays
            .as_ref()
            .map(|h| (h.calendar.as_ref(), h.on_holiday))
    }

    /// Whether an occurrence can come due at an instant other than its own: with a `jitter`
    /// clause, or on a calendar under `next` or `previous`.
    pub fn moves_occurrences(&self) -> bool {
        self.jitter.is_some() || self.moving().is_some()
    }

    /// The calendar, when its policy moves occurrences.
    fn moving(&self) -> Option<&Holidays> {
        self.holidays.as_ref().filter(|h| h.on_holiday.moves())
    }

    /// Whether the calendar drops the occurrence at `at`; if so, the instant to search on from
    /// (strictly after it). Under `skip`, the end of the stretch of days off `at` is on; under
    /// `next` and `previous`, `at` itself when no business day is near enough to move it to.
    pub(super) fn day_off_through(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let holidays = self.holidays.as_ref()?;
        let calendar = &holidays.calendar;
        let date = holidays.day_of(at);
        if !calendar.is_day_off(date) {
            return None;
        }
        match holidays.on_holiday {
            OnHoliday::Skip => {
                let resume = calendar
                    .business_day_from(date, true)
                    .or_else(|| date.checked_add_signed(TimeDelta::days(MAX_ROLL_DAYS)))?;
                let start = start_of_day(calendar, resume)?;
                Some((start - TimeDelta::milliseconds(1)).max(at))
            }
            OnHoliday::Next | OnHoliday::Previous => {
                let forward = holidays.on_holiday == OnHoliday::Next;
                match calendar.business_day_from(date, forward) {
                    Some(_) => None,
                    None => Some(at),
                }
            }
        }
    }

    /// Where the calendar moves `occurrence`: itself unless it is on a day off under `next`
    /// or `previous`, else the same wall time in the calendar's zone on the nearest business
    /// day after or before it (a wall time a gap swallowed: the first instant after the gap;
    /// one that exists twice: the earlier).
    pub(super) fn moved(&self, occurrence: DateTime<Utc>) -> DateTime<Utc> {
        let Some(holidays) = self.moving() else {
            return occurrence;
        };
        let calendar = &holidays.calendar;
        let tz = calendar.zone().tz();
        let day = holidays.day_of(occurrence);
        if !calendar.is_day_off(day) {
            return occurrence;
        }
        let forward = holidays.on_holiday == OnHoliday::Next;
        let Some(business_day) = calendar.business_day_from(day, forward) else {
            return occurrence;
        };
        let time = holidays
            .time_of_day
            .unwrap_or_else(|| occurrence.with_timezone(&tz).time());
        let target = business_day.and_time(time);
        let at = match tz.from_local_datetime(&target) {
            LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => Some(at),
            LocalResult::None => first_instant_after_gap(tz, target),
        };
        at.map_or(occurrence, |at| at.with_timezone(&Utc))
    }

    /// The first occurrence whose moved instant is at or after `clock`, for a schedule whose
    /// calendar moves occurrences (its planned instants never go back): the occurrence a
    /// routine's clock stands for, the earliest of those planned at it. `None` when there is
    /// none within a roll's reach.
    pub(super) fn occurrence_moved_to(&self, clock: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let holidays = self.moving()?;
        let calendar = &holidays.calendar;
        // Under `previous` an occurrence is never planned after itself, so those planned at or
        // after the clock are at or after it. Under `next` one is never planned before itself,
        // so those planned at or after the clock are at or after it, or on the days off just
        // before the clock's day, which roll onto it.
        let from = match holidays.on_holiday {
            OnHoliday::Next => {
                let date = clock.with_timezone(&calendar.zone().tz()).date_naive();
                // The business day the clock is on is its own date, or the day before when the
                // clock's wall time is past a gap that swallowed that day's: the days off
                // before either.
                let mut first = date.pred_opt().unwrap_or(date);
                for _ in 0..MAX_ROLL_DAYS {
                    match first.pred_opt() {
                        Some(before) if calendar.is_day_off(before) => first = before,
                        _ => break,
                    }
                }
                // A day earlier still: an occurrence's day can be the day before its instant's
                // (a wall time a gap pushed past midnight), and a day a gap swallowed whole has
                // no start of its own.
                start_of_day(calendar, first).map_or(clock, |start| start.min(clock))
                    - TimeDelta::days(2)
            }
            _ => clock,
        };
        self.occurrences_after(from - TimeDelta::milliseconds(1))
            .take(ROLL_WALK)
            .find(|o| self.moved(*o) >= clock)
    }
}

impl Holidays {
    /// The day of `occurrence` in the calendar's zone: the date of the wall time it was placed
    /// for. That is its own date, except for a fixed-time line's occurrence that a gap pushed
    /// past midnight (its wall time earlier than the line's time of day): the day before.
    fn day_of(&self, occurrence: DateTime<Utc>) -> NaiveDate {
        let wall = occurrence
            .with_timezone(&self.calendar.zone().tz())
            .naive_local();
        match self.time_of_day {
            Some(time) if wall.time() < time => wall.date().pred_opt().unwrap_or(wall.date()),
            _ => wall.date(),
        }
    }
}

/// The first instant of `date` in the calendar's zone (after a gap at midnight, its end).
fn start_of_day(calendar: &Calendar, date: NaiveDate) -> Option<DateTime<Utc>> {
    let tz = calendar.zone().tz();
    let midnight = date.and_time(NaiveTime::MIN);
    let start = match tz.from_local_datetime(&midnight) {
        LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => Some(at),
        LocalResult::None => first_instant_after_gap(tz, midnight),
    };
    start.map(|at| at.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::parse_date;
    use crate::schedule::Zone;

    fn berlin_new_year() -> Arc<Calendar> {
        let zone = Zone::parse("Europe/Berlin").unwrap();
        Arc::new(
            Calendar::new(
                zone,
                [parse_date("2027-01-01").unwrap()],
                &Calendar::DEFAULT_DAYS_OFF,
            )
            .unwrap(),
        )
    }

    /// The planned instants of the first three occurrences after 2026-12-15T00:00:00Z.
    fn planned(policy: OnHoliday) -> Vec<String> {
        let s = Schedule::parse("0 9 1 * *", "Europe/Berlin")
            .unwrap()
            .with_calendar(berlin_new_year(), policy)
            .unwrap();
        let id = crate::RoutineId::nil();
        let after: DateTime<Utc> = "2026-12-15T00:00:00Z".parse().unwrap();
        let (_, clock) = s.next_planned_after(id, after).unwrap();
        s.runs_from_clock(id, clock)
            .take(3)
            .map(|(_, p)| p.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect()
    }

    #[test]
    fn the_policies_on_new_year_in_berlin() {
        assert_eq!(
            planned(OnHoliday::Skip),
            [
                "2027-02-01T08:00:00Z",
                "2027-03-01T08:00:00Z",
                "2027-04-01T07:00:00Z"
            ]
        );
        assert_eq!(
            planned(OnHoliday::Next),
            [
                "2027-01-04T08:00:00Z",
                "2027-02-01T08:00:00Z",
                "2027-03-01T08:00:00Z"
            ]
        );
        assert_eq!(
            planned(OnHoliday::Previous),
            [
                "2026-12-31T08:00:00Z",
                "2027-02-01T08:00:00Z",
                "2027-03-01T08:00:00Z"
            ]
        );
    }

    #[test]
    fn moving_policies_need_one_wall_time_a_day_in_the_calendar_s_zone() {
        let cal = berlin_new_year();
        for (text, zone) in [
            ("0 9,17 * * *", "Europe/Berlin"),
            ("@every 1h", "Europe/Berlin"),
            ("0 9 * * *", "UTC"),
            ("0 9 * * * jitter 5m", "Europe/Berlin"),
        ] {
            let s = Schedule::parse(text, zone).unwrap();
            let e = s
                .clone()
                .with_calendar(cal.clone(), OnHoliday::Next)
                .unwrap_err();
            assert!(e.to_string().contains("use skip"), "{text}: {e}");
            assert!(
                s.with_calendar(cal.clone(), OnHoliday::Skip).is_ok(),
                "{text}"
            );
        }
        let weekend = Schedule::parse("0 9 * * SAT,SUN", "Europe/Berlin").unwrap();
        let e = weekend
            .with_calendar(cal, OnHoliday::Skip)
            .unwrap_err()
            .to_string();
        assert!(e.contains("day off"), "{e}");
    }

    #[test]
    fn a_clock_stands_for_the_earliest_occurrence_planned_at_it() {
        let s = Schedule::parse("0 9 * * *", "Europe/Berlin")
            .unwrap()
            .with_calendar(berlin_new_year(), OnHoliday::Next)
            .unwrap();
        let id = crate::RoutineId::nil();
        let monday: DateTime<Utc> = "2027-01-04T08:00:00Z".parse().unwrap();
        // 1 January (a holiday), 2 and 3 (a weekend) and the 4th itself are all planned then.
        let runs: Vec<_> = s.runs_from_clock(id, monday).take(5).collect();
        let days: Vec<u32> = runs.iter().map(|(o, _)| chrono::Datelike::day(o)).collect();
        assert_eq!(days, [1, 2, 3, 4, 5]);
        assert!(runs[..4].iter().all(|(_, p)| *p == monday), "{runs:?}");
    }
}
