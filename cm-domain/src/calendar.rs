//! Holiday calendars: named sets of days off that routines share, and what a routine on a
//! calendar does with an occurrence on a day off ([`OnHoliday`]).
//!
//! A [`Calendar`] is a zone, a set of dates and a set of weekly days off (Saturday and Sunday
//! unless told otherwise). A *day off* is one of its dates or a day of one of its weekly days
//! off; every other day is a *business day*. Days are read in the calendar's zone: an
//! occurrence is on a day off when its local date in that zone is one.
//!
//! A routine on a calendar treats an occurrence on a day off by its [`OnHoliday`] policy:
//!
//! - `skip` (the default): the occurrence is not owed;
//! - `next`: it is owed at the same wall time (in the calendar's zone) on the next business
//!   day;
//! - `previous`: it is owed at the same wall time on the previous business day.
//!
//! A moved occurrence keeps its nominal instant as its key (the ledger's `scheduled_at`) and is
//! planned at the moved instant, as a `jitter` clause's occurrences are
//! ([`crate::Schedule::planned`]). A wall time that does not exist on the business day (a
//! spring-forward gap) is planned at the first instant after the gap; one that exists twice at
//! the earlier instant, as a fixed-time schedule's wall times are.
//!
//! No business day is looked for further than [`MAX_ROLL_DAYS`] away: an occurrence with none
//! within that many days is not owed.
//!
//! The calendar applies to a schedule through [`crate::Schedule::with_calendar`].

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use chrono::{Datelike, NaiveDate, TimeDelta, Weekday};

use crate::schedule::Zone;

/// How far, in days, an occurrence on a day off is moved at most; one with no business day that
/// close is not owed.
pub const MAX_ROLL_DAYS: i64 = 366;

/// The most dates one calendar holds.
pub const MAX_CALENDAR_DATES: usize = 10_000;

/// The longest calendar name, in characters.
pub const MAX_CALENDAR_NAME_CHARS: usize = 63;

/// What a routine on a calendar does with an occurrence on a day off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnHoliday {
    /// The occurrence is not owed.
    #[default]
    Skip,
    /// The occurrence is planned at the same wall time on the next business day.
    Next,
    /// The occurrence is planned at the same wall time on the previous business day.
    Previous,
}

impl OnHoliday {
    /// The policy's name as stored and typed: `skip`, `next` or `previous`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnHoliday::Skip => "skip",
            OnHoliday::Next => "next",
            OnHoliday::Previous => "previous",
        }
    }

    /// Whether the policy moves occurrences (`next`, `previous`) rather than drop them.
    pub fn moves(self) -> bool {
        !matches!(self, OnHoliday::Skip)
    }
}

impl fmt::Display for OnHoliday {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not `skip`, `next` or `previous`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown on-holiday policy {0:?} (expected skip, next or previous)")]
pub struct ParseOnHolidayError(pub String);

impl FromStr for OnHoliday {
    type Err = ParseOnHolidayError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "skip" => Ok(OnHoliday::Skip),
            "next" => Ok(OnHoliday::Next),
            "previous" => Ok(OnHoliday::Previous),
            other => Err(ParseOnHolidayError(other.to_owned())),
        }
    }
}

/// Why a calendar, or one of its parts, was refused. Every message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalendarError {
    /// The name is empty, too long, or has a character other than letters, digits, `-`, `_`
    /// and `.`, or does not start with a letter or digit.
    #[error(
        "invalid calendar name {0:?}: 1 to {MAX_CALENDAR_NAME_CHARS} letters, digits, '-', '_' \
         or '.', starting with a letter or digit"
    )]
    Name(String),
    /// A date is not `YYYY-MM-DD`.
    #[error("invalid date {0:?}: expected YYYY-MM-DD")]
    Date(String),
    /// A weekly day off is not a day's name.
    #[error(
        "invalid day off {0:?}: expected day names such as sat,sun (mon, tue, wed, thu, fri, \
         sat, sun), or none"
    )]
    Weekday(String),
    /// Every day of the week is a day off.
    #[error("every day of the week is a day off: a calendar needs at least one business day")]
    NoBusinessDay,
    /// More than [`MAX_CALENDAR_DATES`] dates.
    #[error("a calendar holds at most {MAX_CALENDAR_DATES} dates, this one would hold {0}")]
    TooManyDates(usize),
}

/// Checks a calendar's name: 1 to [`MAX_CALENDAR_NAME_CHARS`] ASCII letters, digits, `-`, `_`
/// and `.`, the first a letter or digit.
pub fn check_calendar_name(name: &str) -> Result<(), CalendarError> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_CALENDAR_NAME_CHARS
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CalendarError::Name(
            crate::name::escape_unseen(name).into_owned(),
        ))
    }
}

/// Reads a date written `YYYY-MM-DD`.
pub fn parse_date(text: &str) -> Result<NaiveDate, CalendarError> {
    let text = text.trim();
    let well_formed = text.len() == 10
        && text.char_indices().all(|(i, c)| {
            if i == 4 || i == 7 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }
        });
    if !well_formed {
        return Err(CalendarError::Date(
            crate::name::escape_unseen(text).into_owned(),
        ));
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d").map_err(|_| CalendarError::Date(text.to_owned()))
}

/// Reads weekly days off written as a comma-separated list of day names (`sat,sun`; `mon` to
/// `sun`, any case, or their full names), or `none` for no weekly day off.
pub fn parse_days_off(text: &str) -> Result<Vec<Weekday>, CalendarError> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("none") || text.is_empty() {
        return Ok(Vec::new());
    }
    let mut days = Vec::new();
    for item in text.split(',') {
        let day = item.trim().parse::<Weekday>().map_err(|_| {
            CalendarError::Weekday(crate::name::escape_unseen(item.trim()).into_owned())
        })?;
        if !days.contains(&day) {
            days.push(day);
        }
    }
    Ok(days)
}

/// Weekly days off as written back: `sat,sun`, in week order from Monday, or `none`.
pub fn days_off_text(days: &[Weekday]) -> String {
    let mut sorted: Vec<Weekday> = days.to_vec();
    sorted.sort_by_key(|d| d.num_days_from_monday());
    sorted.dedup();
    if sorted.is_empty() {
        return "none".to_owned();
    }
    sorted
        .iter()
        .map(|d| d.to_string().to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(",")
}

/// A holiday calendar: its zone, its dates off and its weekly days off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    /// The zone its days are read in.
    zone: Zone,
    /// Its dates off.
    dates: BTreeSet<NaiveDate>,
    /// Its weekly days off, a bit per day from Monday (bit 0) to Sunday (bit 6).
    weekly: u8,
}

impl Calendar {
    /// The default weekly days off: Saturday and Sunday.
    pub const DEFAULT_DAYS_OFF: [Weekday; 2] = [Weekday::Sat, Weekday::Sun];

    /// A calendar in `zone` with `dates` off and `days_off` every week. Refused with every
    /// day of the week off, or with more than [`MAX_CALENDAR_DATES`] dates.
    pub fn new(
        zone: Zone,
        dates: impl IntoIterator<Item = NaiveDate>,
        days_off: &[Weekday],
    ) -> Result<Calendar, CalendarError> {
        let weekly = days_off
            .iter()
            .fold(0u8, |bits, d| bits | (1 << d.num_days_from_monday()));
        if weekly == 0b111_1111 {
            return Err(CalendarError::NoBusinessDay);
        }
        let dates: BTreeSet<NaiveDate> = dates.into_iter().collect();
        if dates.len() > MAX_CALENDAR_DATES {
            return Err(CalendarError::TooManyDates(dates.len()));
        }
        Ok(Calendar {
            zone,
            dates,
            weekly,
        })
    }

    /// The zone its days are read in.
    pub fn zone(&self) -> Zone {
        self.zone
    }

    /// Its dates off, in order.
    pub fn dates(&self) -> impl Iterator<Item = NaiveDate> + '_ {
        self.dates.iter().copied()
    }

    /// Its weekly days off, from Monday.
    pub fn days_off(&self) -> Vec<Weekday> {
        (0..7u8)
            .filter(|bit| self.weekly & (1 << bit) != 0)
            .filter_map(|bit| Weekday::try_from(bit).ok())
            .collect()
    }

    /// Whether `date` is a day off: one of its dates, or a weekly day off.
    pub fn is_day_off(&self, date: NaiveDate) -> bool {
        self.weekly & (1 << date.weekday().num_days_from_monday()) != 0
            || self.dates.contains(&date)
    }

    /// The first business day after `date` (`forward`) or before it, within
    /// [`MAX_ROLL_DAYS`]; `None` if there is none that close.
    pub fn business_day_from(&self, date: NaiveDate, forward: bool) -> Option<NaiveDate> {
        let step = if forward { 1 } else { -1 };
        (1..=MAX_ROLL_DAYS)
            .filter_map(|n| date.checked_add_signed(TimeDelta::days(n * step)))
            .find(|d| !self.is_day_off(*d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> NaiveDate {
        parse_date(text).unwrap()
    }

    #[test]
    fn days_off_are_dates_and_weekly_days() {
        let c = Calendar::new(Zone::UTC, [d("2027-01-01")], &Calendar::DEFAULT_DAYS_OFF).unwrap();
        assert!(c.is_day_off(d("2027-01-01")));
        assert!(c.is_day_off(d("2027-01-02")), "a Saturday");
        assert!(c.is_day_off(d("2027-01-03")), "a Sunday");
        assert!(!c.is_day_off(d("2027-01-04")), "a Monday");
        assert_eq!(
            c.business_day_from(d("2027-01-01"), true),
            Some(d("2027-01-04"))
        );
        assert_eq!(
            c.business_day_from(d("2027-01-01"), false),
            Some(d("2026-12-31"))
        );
    }

    #[test]
    fn a_calendar_needs_a_business_day() {
        let all = [
            Weekday::Mon,
            Weekday::Tue,
            Weekday::Wed,
            Weekday::Thu,
            Weekday::Fri,
            Weekday::Sat,
            Weekday::Sun,
        ];
        assert_eq!(
            Calendar::new(Zone::UTC, [], &all),
            Err(CalendarError::NoBusinessDay)
        );
        let long: Vec<NaiveDate> = (0..400)
            .map(|n| d("2027-01-01") + TimeDelta::days(n))
            .collect();
        let c = Calendar::new(Zone::UTC, long, &[]).unwrap();
        assert_eq!(c.business_day_from(d("2027-01-01"), true), None);
    }

    #[test]
    fn names_dates_and_days_are_checked() {
        assert!(check_calendar_name("de-holidays_2027.v1").is_ok());
        for bad in ["", "-x", "a b", "ä", &"x".repeat(64)] {
            assert!(check_calendar_name(bad).is_err(), "{bad:?}");
        }
        for bad in ["2027-1-01", "2027-02-30", "20270101", "2027-01-01x"] {
            let e = parse_date(bad).unwrap_err().to_string();
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
        assert_eq!(
            parse_days_off("Sat, sun,SAT").unwrap(),
            [Weekday::Sat, Weekday::Sun]
        );
        assert_eq!(parse_days_off("none").unwrap(), []);
        assert!(parse_days_off("sat,holiday").is_err());
        assert_eq!(days_off_text(&[Weekday::Sun, Weekday::Fri]), "fri,sun");
        assert_eq!(days_off_text(&[]), "none");
        assert_eq!("next".parse::<OnHoliday>(), Ok(OnHoliday::Next));
        assert!("later".parse::<OnHoliday>().is_err());
    }
}
