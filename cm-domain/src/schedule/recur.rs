//! RFC 5545 recurrence rules: `@rrule FREQ=MONTHLY;BYDAY=FR;BYSETPOS=-1;BYHOUR=9;BYMINUTE=0`.
//!
//! The rule is read in the schedule's zone, from its start (the `from` clause, which is the
//! rule's `DTSTART`), and expanded by the `rrule` crate on wall times alone: the crate is handed
//! the zone's wall times as if they were UTC, so it never meets a daylight-saving change, and cm
//! places each wall time in real time by the one rule every schedule follows (see
//! [`super::daylight`]). A rule with one time of day (`FREQ` daily or coarser, one `BYHOUR`,
//! `BYMINUTE` and `BYSECOND`, given or taken from its start) is *fixed-time*: a wall time in a
//! spring-forward gap fires at the first instant after the gap, and one the clocks repeat fires
//! once, at the earlier instant. Any other rule is an *interval* rule: a gap's wall times are
//! skipped and a repeated wall time fires at both its instants. (RFC 5545 moves a gap's wall
//! time forward by the gap's length instead; cm keeps one rule for cron lines and rules alike,
//! so the same routine written either way owes the same instants.)
//!
//! What is refused, each in one line:
//! - `DTSTART`, `RDATE` and `EXDATE` in the rule: the start is the `from` clause, and
//!   exclusions are `except` clauses.
//! - A rule whose occurrences depend on its start (`INTERVAL` above 1, `COUNT`, or a part the
//!   RFC fills from `DTSTART`: a `WEEKLY` rule without `BYDAY`, a daily rule without `BYHOUR`)
//!   without a `from` clause. `routine create --rrule` gives it the routine's creation.
//! - `COUNT` above [`MAX_RRULE_COUNT`]: the occurrences of a counted rule are listed when it is
//!   parsed (the count runs from the start, however long ago).
//!
//! - A `FREQ=MINUTELY` rule with `BYHOUR`, or a `FREQ=SECONDLY` one with `BYHOUR` or
//!   `BYMINUTE`, whose `INTERVAL` does not divide 60: the crate would step it off the RFC's
//!   grid of `INTERVAL`s from its start past the hours it leaves out.
//!
//! `UNTIL` is kept as an end of the schedule's window: `UNTIL=20271231T235959Z` is an instant,
//! `UNTIL=20271231T235959` a wall time in the zone, and `UNTIL=20271231` the whole of that day.
//!
//! A search for the rule's next wall time does not walk from the start: it starts at the
//! beginning of the rule's period (year, month, week, day, hour, minute or second, counted in
//! `INTERVAL`s from the start) that holds the wall time searched from, so its cost does not
//! grow with the routine's age. Within a search the crate passes over a day that holds no
//! occurrence in one step, whatever the `FREQ`, and gives up after 100,000 empty periods; the
//! longest wait a rule can have between two occurrences (29 February under `BYMONTHDAY=29` and
//! `BYMONTH=2`: eight years) is a few thousand.

use chrono::{
    DateTime, Datelike, LocalResult, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta,
    TimeZone, Timelike, Utc,
};
use rrule::{Frequency, RRule, RRuleSet, Unvalidated, Validated};

use super::daylight::fixed_time_after;
use super::{ScheduleError, Zone, first_instant_after_gap};
use crate::rules::Bounds;

/// The largest `COUNT` a rule takes.
pub const MAX_RRULE_COUNT: u32 = 1000;

/// A parsed `@rrule` rule.
#[derive(Clone)]
pub(crate) struct Recurrence {
    /// The rule, its parts filled from its start.
    rule: RRule<Validated>,
    /// Its start (`DTSTART`), a wall time in the zone.
    anchor: NaiveDateTime,
    /// Under `COUNT`, every wall time it has, in order.
    counted: Option<Vec<NaiveDateTime>>,
    /// Whether it has one time of day (see the module documentation).
    fixed_time: bool,
    /// Its days counted from the month's end (`BYMONTHDAY=-1`), which the validated rule keeps
    /// apart and does not show.
    from_month_end: Vec<i8>,
}

impl Recurrence {
    /// Parses the text after `@rrule`, with the schedule's window (`bounds`: its start is the
    /// rule's, and `UNTIL` narrows its end) in `zone`.
    pub(crate) fn parse(
        text: &str,
        bounds: &mut Bounds,
        zone: Zone,
    ) -> Result<Recurrence, ScheduleError> {
        let written = crate::rules::blank_trimmed(text);
        let refuse = |why: String| ScheduleError::Rule {
            reason: format!("@rrule {written}: {why}"),
        };
        let upper = written.to_ascii_uppercase();
        let body = upper.strip_prefix("RRULE:").unwrap_or(&upper);
        let mut parts = Vec::new();
        let mut until = None;
        for part in body.split(';') {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| refuse(format!("{part:?} is not NAME=VALUE")))?;
            match name {
                "DTSTART" | "RDATE" | "EXDATE" | "EXRULE" => {
                    return Err(refuse(format!(
                        "{name} is not part of a rule here: the start is the schedule's \
                         from clause (--start) and exclusions are except clauses"
                    )));
                }
                "UNTIL" => until = Some(parse_until(value, zone).map_err(refuse)?),
                _ => parts.push(part),
            }
        }
        let unvalidated: RRule<Unvalidated> = parts
            .join(";")
            .parse()
            .map_err(|e: rrule::RRuleError| refuse(one_line(&e)))?;
        if let Some(count) = unvalidated.get_count()
            && count > MAX_RRULE_COUNT
        {
            return Err(refuse(format!(
                "COUNT is at most {MAX_RRULE_COUNT}; for more, leave it out and end the \
                 schedule with until (--end) or a run limit (--limit-runs)"
            )));
        }
        let tz = zone.tz();
        let anchor = match bounds.start {
            Some(start) => start.with_timezone(&tz).naive_local(),
            None if needs_start(&unvalidated) => {
                return Err(refuse(
                    "its occurrences are counted from its start (INTERVAL, COUNT, or a time \
                     or day it leaves to DTSTART): give one with from TIME (--start)"
                        .to_owned(),
                ));
            }
            // Every part is written out and the periods are single ones, so any start gives
            // the same occurrences; the epoch's midnight is as good as any.
            None => NaiveDate::from_ymd_opt(1970, 1, 1)
                .unwrap_or(NaiveDate::MIN)
                .and_time(NaiveTime::MIN),
        };
        if let Some(until) = until {
            bounds.end = Some(bounds.end.map_or(until, |end| end.min(until)));
        }
        let from_month_end: Vec<i8> = unvalidated
            .get_by_month_day()
            .iter()
            .copied()
            .filter(|d| *d < 0)
            .collect();
        let rule = unvalidated
            .validate(as_utc(anchor))
            .map_err(|e| refuse(one_line(&e)))?;
        // The crate steps a sub-daily rule that BYHOUR (or BYMINUTE) limits an hour (or a
        // minute) at a time past the hours it leaves out, which keeps the RFC's grid of
        // INTERVALs from the start only when INTERVAL divides an hour (or a minute).
        let limited_above = match rule.get_freq() {
            Frequency::Minutely => !rule.get_by_hour().is_empty(),
            Frequency::Secondly => {
                !rule.get_by_hour().is_empty() || !rule.get_by_minute().is_empty()
            }
            _ => false,
        };
        if limited_above && 60 % rule.get_interval() != 0 {
            return Err(refuse(
                "a FREQ=MINUTELY rule with BYHOUR, or a FREQ=SECONDLY one with BYHOUR or \
                 BYMINUTE, takes an INTERVAL that divides 60; write it with a coarser FREQ \
                 and lists of hours and minutes (FREQ=DAILY;BYHOUR=9,10;BYMINUTE=0,30)"
                    .to_owned(),
            ));
        }
        let fixed_time = rule.get_freq() <= Frequency::Daily
            && rule.get_by_hour().len() == 1
            && rule.get_by_minute().len() == 1
            && rule.get_by_second().len() == 1;
        let mut recurrence = Recurrence {
            rule,
            anchor,
            counted: None,
            fixed_time,
            from_month_end,
        };
        if let Some(count) = recurrence.rule.get_count() {
            let listed = RRuleSet::new(as_utc(anchor))
                .rrule(recurrence.rule.clone())
                .all(u16::try_from(count).unwrap_or(u16::MAX));
            if listed.dates.len() < count as usize && listed.limited {
                return Err(ScheduleError::TooCostly {
                    what: "listing its counted occurrences",
                });
            }
            recurrence.counted = Some(listed.dates.iter().map(|d| d.naive_utc()).collect());
        }
        Ok(recurrence)
    }

    /// The rule, its parts filled from its start.
    pub(crate) fn rule(&self) -> &RRule<Validated> {
        &self.rule
    }

    /// Its days counted from the month's end (`-1` the last), which [`Recurrence::rule`] does
    /// not show.
    pub(crate) fn days_from_month_end(&self) -> &[i8] {
        &self.from_month_end
    }

    /// Whether it has one time of day.
    pub(crate) fn is_fixed_time(&self) -> bool {
        self.fixed_time
    }

    /// Its one time of day, if it is fixed-time.
    pub(crate) fn time_of_day(&self) -> Option<NaiveTime> {
        let (h, m, s) = (
            self.rule.get_by_hour().first()?,
            self.rule.get_by_minute().first()?,
            self.rule.get_by_second().first()?,
        );
        self.fixed_time
            .then(|| NaiveTime::from_hms_opt((*h).into(), (*m).into(), (*s).into()))
            .flatten()
    }

    /// Its first wall time strictly after the wall time `wall`.
    fn next_wall_after(&self, wall: NaiveDateTime) -> Option<NaiveDateTime> {
        // Whole seconds: strictly after `wall` is at or after its next whole second.
        let wall = wall.with_nanosecond(0)? + TimeDelta::seconds(1);
        if let Some(counted) = &self.counted {
            let at = counted.partition_point(|w| *w < wall);
            return counted.get(at).copied();
        }
        let start = self.period_start(wall).max(self.anchor);
        RRuleSet::new(as_utc(start))
            .rrule(self.rule.clone())
            .after(as_utc(wall))
            .all(1)
            .dates
            .first()
            .map(|d| d.naive_utc())
    }

    /// The start of the rule's period (counted in `INTERVAL`s from its start) that holds
    /// `wall`, or its start if `wall` is in its first period or before it.
    fn period_start(&self, wall: NaiveDateTime) -> NaiveDateTime {
        let anchor = self.anchor;
        let n = i64::from(self.rule.get_interval().max(1));
        // Whole periods of `n` units between two counts of units, rounded down.
        let whole = |units: i64| units.div_euclid(n) * n;
        let midnight = |d: NaiveDate| d.and_time(NaiveTime::MIN);
        let start = match self.rule.get_freq() {
            Frequency::Yearly => {
                let years = whole(i64::from(wall.year() - anchor.year()));
                NaiveDate::from_ymd_opt(anchor.year() + years as i32, 1, 1).map(midnight)
            }
            Frequency::Monthly => {
                let months = |d: NaiveDateTime| i64::from(d.year()) * 12 + i64::from(d.month0());
                let first = NaiveDate::from_ymd_opt(anchor.year(), anchor.month(), 1);
                let step = u32::try_from(whole(months(wall) - months(anchor))).ok();
                first
                    .zip(step)
                    .and_then(|(f, s)| f.checked_add_months(Months::new(s)))
                    .map(midnight)
            }
            Frequency::Weekly => {
                let week_start = self.rule.get_week_start().num_days_from_monday();
                let back = (anchor.weekday().num_days_from_monday() + 7 - week_start) % 7;
                let first = anchor.date() - TimeDelta::days(back.into());
                let weeks = whole((wall.date() - first).num_days().div_euclid(7));
                Some(midnight(first + TimeDelta::days(weeks * 7)))
            }
            Frequency::Daily => {
                let days = whole((wall.date() - anchor.date()).num_days());
                Some(midnight(anchor.date() + TimeDelta::days(days)))
            }
            Frequency::Hourly => truncated_steps(anchor, wall, 3600, n),
            Frequency::Minutely => truncated_steps(anchor, wall, 60, n),
            Frequency::Secondly => truncated_steps(anchor, wall, 1, n),
        };
        start.filter(|s| *s > anchor).unwrap_or(anchor)
    }

    /// The rule's first instant strictly after `instant`, placed in `zone`.
    pub(crate) fn next_after(&self, zone: Zone, instant: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = zone.tz();
        let local = instant.with_timezone(&tz);
        if self.fixed_time {
            return fixed_time_after(zone, instant, |wall| self.next_wall_after(wall));
        }
        // An interval rule fires at both instants of a repeated wall time, so a wall time
        // before `instant`'s own can still have an instant after it: the search starts as far
        // back as the clocks go back in the next two days. Each wall time's earlier and later
        // instants both rise with the wall time, so the answer is the earlier instant of the
        // first wall time whose earlier instant is after `instant`, or the later instant of a
        // wall time before it, whichever is first.
        let offset = |at: DateTime<Utc>| {
            use chrono::Offset;
            tz.offset_from_utc_datetime(&at.naive_utc())
                .fix()
                .local_minus_utc()
        };
        let ahead = [24, 48].map(|h| offset(instant + TimeDelta::hours(h)));
        let back = (offset(instant) - ahead.into_iter().min().unwrap_or(0)).max(0);
        let mut wall = local.naive_local() - TimeDelta::seconds(i64::from(back) + 1);
        let mut later: Option<DateTime<Utc>> = None;
        loop {
            wall = match self.next_wall_after(wall) {
                Some(next) => next,
                None => return later,
            };
            let (earlier_at, later_at) = match tz.from_local_datetime(&wall) {
                LocalResult::Single(at) => (at, at),
                LocalResult::Ambiguous(a, b) => (a, b),
                LocalResult::None => continue,
            };
            let (earlier_at, later_at) =
                (earlier_at.with_timezone(&Utc), later_at.with_timezone(&Utc));
            if earlier_at > instant {
                return Some(later.map_or(earlier_at, |l| l.min(earlier_at)));
            }
            if later.is_none() && later_at > instant {
                later = Some(later_at);
            }
        }
    }
}

/// `wall` as the UTC instant with the same digits: the rule is expanded on wall times.
fn as_utc(wall: NaiveDateTime) -> DateTime<rrule::Tz> {
    rrule::Tz::UTC.from_utc_datetime(&wall)
}

/// The start of the `n`-unit step from `anchor` (truncated to the unit) that holds `wall`.
fn truncated_steps(
    anchor: NaiveDateTime,
    wall: NaiveDateTime,
    unit: i64,
    n: i64,
) -> Option<NaiveDateTime> {
    let base = anchor.and_utc().timestamp();
    let base = base - base.rem_euclid(unit);
    let step = unit * n;
    let steps = (wall.and_utc().timestamp() - base).div_euclid(step);
    DateTime::from_timestamp(base + steps * step, 0).map(|d| d.naive_utc())
}

/// Whether the recurrence rule `rule` (the text after `@rrule`) needs a start to say which
/// occurrences it has: an `INTERVAL` above 1, a `COUNT`, or a time or day the RFC takes from
/// `DTSTART`. A rule that does not parse does not (its error comes when it is parsed).
pub fn rrule_needs_start(rule: &str) -> bool {
    let upper = crate::rules::blank_trimmed(rule).to_ascii_uppercase();
    let body = upper.strip_prefix("RRULE:").unwrap_or(&upper);
    let kept: Vec<&str> = body
        .split(';')
        .filter(|part| !part.starts_with("UNTIL="))
        .collect();
    kept.join(";")
        .parse::<RRule<Unvalidated>>()
        .is_ok_and(|rule| needs_start(&rule))
}

/// Whether the rule's occurrences depend on its start.
fn needs_start(rule: &RRule<Unvalidated>) -> bool {
    let freq = rule.get_freq();
    let days_given = !rule.get_by_week_no().is_empty()
        || !rule.get_by_year_day().is_empty()
        || !rule.get_by_month_day().is_empty()
        || !rule.get_by_weekday().is_empty();
    rule.get_interval() > 1
        || rule.get_count().is_some()
        || (freq <= Frequency::Weekly && !days_given)
        || (freq == Frequency::Yearly && rule.get_by_month().is_empty() && !days_given)
        || (freq < Frequency::Hourly && rule.get_by_hour().is_empty())
        || (freq < Frequency::Minutely && rule.get_by_minute().is_empty())
        || (freq < Frequency::Secondly && rule.get_by_second().is_empty())
}

/// `UNTIL`'s value: an instant (`…Z`), a wall time in `zone`, or a date (through its end).
fn parse_until(value: &str, zone: Zone) -> Result<DateTime<Utc>, String> {
    let bad = || format!("UNTIL={value}: expected YYYYMMDD, YYYYMMDDTHHMMSS or YYYYMMDDTHHMMSSZ");
    if let Some(utc) = value.strip_suffix('Z') {
        return NaiveDateTime::parse_from_str(utc, "%Y%m%dT%H%M%S")
            .map(|w| w.and_utc())
            .map_err(|_| bad());
    }
    let wall = match NaiveDateTime::parse_from_str(value, "%Y%m%dT%H%M%S") {
        Ok(wall) => wall,
        Err(_) => NaiveDate::parse_from_str(value, "%Y%m%d")
            .map_err(|_| bad())?
            .and_hms_opt(23, 59, 59)
            .ok_or_else(bad)?,
    };
    let tz = zone.tz();
    match tz.from_local_datetime(&wall) {
        LocalResult::Single(at) => Ok(at.with_timezone(&Utc)),
        // The end of a window is inclusive: a repeated wall time ends at its later pass.
        LocalResult::Ambiguous(_, at) => Ok(at.with_timezone(&Utc)),
        LocalResult::None => first_instant_after_gap(tz, wall)
            .map(|at| at.with_timezone(&Utc) - TimeDelta::seconds(1))
            .ok_or_else(bad),
    }
}

/// A crate error as one line.
fn one_line(e: &rrule::RRuleError) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use crate::schedule::Schedule;
    use crate::schedule::testing::check_err;

    fn walk(text: &str, zone: &str, after: &str, n: usize) -> Vec<String> {
        let schedule = Schedule::parse(text, zone).unwrap_or_else(|e| panic!("{text}: {e}"));
        let after: DateTime<Utc> = after.parse().unwrap();
        schedule
            .occurrences_after(after)
            .take(n)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect()
    }

    #[test]
    fn the_last_friday_of_the_month_at_nine_in_berlin() {
        let rule = "@rrule FREQ=MONTHLY;BYDAY=FR;BYSETPOS=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0";
        assert_eq!(
            walk(rule, "Europe/Berlin", "2026-12-15T00:00:00Z", 4),
            [
                "2026-12-25T08:00:00Z",
                "2027-01-29T08:00:00Z",
                "2027-02-26T08:00:00Z",
                // Still winter time: Berlin's summer time begins on 28 March 2027.
                "2027-03-26T08:00:00Z",
            ]
        );
        // Lower case and an RRULE: prefix are read alike.
        assert_eq!(
            walk(
                "@rrule rrule:freq=monthly;byday=fr;bysetpos=-1;byhour=9;byminute=0;bysecond=0",
                "Europe/Berlin",
                "2026-12-15T00:00:00Z",
                1
            ),
            ["2026-12-25T08:00:00Z"]
        );
    }

    #[test]
    fn a_fixed_time_rule_leaves_a_gap_at_its_end_and_fires_once_in_an_overlap() {
        let daily = "@rrule FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0";
        // New York springs forward on 14 March 2027: 02:30 fires at 03:00 EDT.
        assert_eq!(
            walk(daily, "America/New_York", "2027-03-13T00:00:00Z", 3),
            [
                "2027-03-13T07:30:00Z",
                "2027-03-14T07:00:00Z",
                "2027-03-15T06:30:00Z"
            ]
        );
        let daily = "@rrule FREQ=DAILY;BYHOUR=1;BYMINUTE=30;BYSECOND=0";
        // It falls back on 7 November 2027: 01:30 happens twice and fires once, in EDT.
        assert_eq!(
            walk(daily, "America/New_York", "2027-11-06T12:00:00Z", 2),
            ["2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"]
        );
    }

    #[test]
    fn an_interval_rule_skips_a_gap_and_fires_on_both_passes_of_an_overlap() {
        let rule = "@rrule FREQ=DAILY;BYHOUR=1;BYMINUTE=0,30;BYSECOND=0";
        assert_eq!(
            walk(rule, "America/New_York", "2027-11-07T04:00:00Z", 5),
            [
                "2027-11-07T05:00:00Z",
                "2027-11-07T05:30:00Z",
                "2027-11-07T06:00:00Z",
                "2027-11-07T06:30:00Z",
                "2027-11-08T06:00:00Z"
            ]
        );
        let rule = "@rrule FREQ=DAILY;BYHOUR=2;BYMINUTE=0,30;BYSECOND=0";
        assert_eq!(
            walk(rule, "America/New_York", "2027-03-13T12:00:00Z", 2),
            ["2027-03-15T06:00:00Z", "2027-03-15T06:30:00Z"]
        );
    }

    #[test]
    fn a_rule_counts_from_its_start() {
        // Every other Monday from Monday 4 January 2027, in Apia (which skipped 30 December
        // 2011 and keeps no daylight saving now).
        let rule = "@rrule FREQ=WEEKLY;INTERVAL=2;BYDAY=MO;BYHOUR=9;BYMINUTE=0;BYSECOND=0 \
                    from 2027-01-04";
        assert_eq!(
            walk(rule, "Pacific/Apia", "2027-01-20T00:00:00Z", 2),
            ["2027-01-31T20:00:00Z", "2027-02-14T20:00:00Z"]
        );
        // Three in all, then finished.
        let counted = Schedule::parse(
            "@rrule FREQ=DAILY;COUNT=3;BYHOUR=12;BYMINUTE=0;BYSECOND=0 from 2027-01-01",
            "UTC",
        )
        .unwrap();
        let from: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        assert_eq!(counted.occurrences_after(from).count(), 3);
        assert!(counted.is_over_after("2027-01-03T12:00:00Z".parse().unwrap()));
    }

    #[test]
    fn until_ends_the_window_as_an_instant_a_wall_time_or_a_whole_day() {
        for (until, n) in [
            ("UNTIL=20270103T120000Z", 3),
            ("UNTIL=20270103T115959", 2),
            ("UNTIL=20270103", 3),
            ("UNTIL=20270102", 2),
        ] {
            let text = format!("@rrule FREQ=DAILY;{until};BYHOUR=12;BYMINUTE=0;BYSECOND=0");
            let schedule = Schedule::parse(&text, "UTC").unwrap();
            let from: DateTime<Utc> = "2026-12-31T23:00:00Z".parse().unwrap();
            assert_eq!(schedule.occurrences_after(from).count(), n, "{until}");
        }
    }

    #[test]
    fn what_a_rule_cannot_say_is_refused_in_one_line() {
        for (text, needle) in [
            ("@rrule FREQ=FORTNIGHTLY", "not a valid frequency"),
            ("@rrule BYHOUR=9", "@rrule BYHOUR=9"),
            ("@rrule FREQ=DAILY;DTSTART=20270101T000000", "from clause"),
            ("@rrule FREQ=DAILY;RDATE=20270101T000000", "except clauses"),
            ("@rrule FREQ=WEEKLY;BYDAY=MO", "give one with from TIME"),
            (
                "@rrule FREQ=DAILY;INTERVAL=2;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
                "from TIME",
            ),
            (
                "@rrule FREQ=DAILY;COUNT=1001 from 2027-01-01",
                "COUNT is at most 1000",
            ),
            (
                "@rrule FREQ=MINUTELY;INTERVAL=7;BYHOUR=9 from 2027-01-01",
                "divides 60",
            ),
            ("@rrule FREQ=DAILY;UNTIL=2027", "UNTIL=2027"),
            (
                "@rrule FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=0;BYMINUTE=0;BYSECOND=0",
                "never fires",
            ),
            ("@rrule", "needs a value"),
        ] {
            check_err(text, needle);
        }
        assert!(super::rrule_needs_start("FREQ=DAILY"));
        assert!(super::rrule_needs_start(
            "FREQ=DAILY;COUNT=3;BYHOUR=1;BYMINUTE=0;BYSECOND=0"
        ));
        assert!(!super::rrule_needs_start(
            "FREQ=DAILY;UNTIL=20270101;BYHOUR=1;BYMINUTE=0;BYSECOND=0"
        ));
        assert!(!super::rrule_needs_start(
            "FREQ=HOURLY;BYMINUTE=0;BYSECOND=0"
        ));
    }

    #[test]
    fn a_fixed_time_rule_moves_to_the_next_business_day_on_a_calendar() {
        use std::sync::Arc;

        use crate::calendar::{Calendar, OnHoliday};
        use crate::schedule::Zone;

        let zone = Zone::parse("Europe/Berlin").unwrap();
        let new_year = chrono::NaiveDate::from_ymd_opt(2027, 1, 1).unwrap();
        let weekend = [chrono::Weekday::Sat, chrono::Weekday::Sun];
        let calendar = Arc::new(Calendar::new(zone, [new_year], &weekend).unwrap());
        let rule = "@rrule FREQ=MONTHLY;BYMONTHDAY=1;BYHOUR=9;BYMINUTE=0;BYSECOND=0";
        let schedule = Schedule::parse(rule, "Europe/Berlin")
            .unwrap()
            .with_calendar(calendar, OnHoliday::Next)
            .unwrap();
        let routine = uuid::Uuid::nil();
        let after: DateTime<Utc> = "2026-12-15T00:00:00Z".parse().unwrap();
        let planned: Vec<String> = schedule
            .runs_from_clock(
                routine,
                schedule.next_planned_after(routine, after).unwrap().1,
            )
            .take(3)
            .map(|(_, p)| p.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect();
        assert_eq!(
            planned,
            [
                "2027-01-04T08:00:00Z",
                "2027-02-01T08:00:00Z",
                "2027-03-01T08:00:00Z"
            ]
        );
    }
}
