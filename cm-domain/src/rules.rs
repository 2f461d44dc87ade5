//! What a schedule says beyond one cron line: an interval in absolute time (`@every`), a single
//! occurrence (`@at`), a window (`from`, `until`) and exclusions (`except`). They are written in
//! the schedule's text, after its rule, so every layer that stores, plans, claims or lists a
//! schedule reads the same rules from the same place:
//!
//! ```text
//! schedule  = rule { " except " cron } [ " jitter " duration ] [ " from " time ] [ " until " time ]
//! rule      = cron | "@every " duration [ " offset " duration ] | "@at " time
//!           | "@rrule " rfc5545-rule
//! duration  = one or more of <number><unit>, unit s, m, h or d: 90m, 1h30m, 1d
//! time      = RFC 3339 (2026-12-24T15:30:00+01:00), a wall time (2026-12-24T15:30) or a
//!             date (2026-12-24) in the schedule's zone
//! ```
//!
//! The rules, precisely:
//!
//! - `@every D offset O` fires at `1970-01-01T00:00:00Z + O + k·D` for every whole `k`: absolute
//!   time, so a daylight-saving change moves nothing (`@every 90m` is 90 minutes apart on the
//!   night the clocks change, too). `O` is below `D`; without it, 0.
//! - `@at T` fires once, at `T`.
//! - `from S` owes nothing before `S`; `until E` owes nothing after `E` (both inclusive). A
//!   wall time or date is read in the schedule's zone: the earlier instant of a wall time the
//!   clocks repeat, the first instant after a wall time a gap swallows, and a date is its first
//!   instant (midnight, or the end of a gap at midnight). So `until 2026-12-15` stops before
//!   that day begins.
//! - `except X`, with `X` a cron expression read in the schedule's zone, drops the occurrences
//!   it matches; they are not owed and are recorded nowhere. Which occurrences it matches
//!   depends on how `X` is written:
//!   - a five-field `X` whose minute and hour are `0` (`0 0 25 12 *`, `0 0 * * 6,0`) names
//!     **days**: it drops every occurrence whose wall-clock date in the zone is a day `X`
//!     matches at midnight;
//!   - any other five-field `X` names **minutes**: it drops every occurrence whose wall time,
//!     to the minute, `X` matches (`30 12 * * *` drops 12:30:00 to 12:30:59);
//!   - a six-field `X` names **seconds**: it drops occurrences at exactly the wall times it
//!     matches.
//!
//!   A wall time is the occurrence's own, so both passes through a fall-back overlap of an
//!   excluded minute are dropped, and a gap drops nothing that was not there.
//! - `jitter J` delays each occurrence by an offset in `[0, J)` drawn from the routine and the
//!   occurrence ([`crate::jitter`]): the occurrence (its idempotency key, its place in the
//!   window and the exclusions) stays the nominal instant, and it comes due at its *planned*
//!   instant, the nominal one plus the offset. `J` is at most the schedule's shortest interval
//!   (checked over its first [`JITTER_CHECKED_OCCURRENCES`] occurrences), so planned instants
//!   keep the occurrences' order; for a one-shot, at most a day.
//!
//! Every check a schedule's clauses need when it is parsed (finding its first occurrence, the
//! jitter check) counts the candidates its rule gives against one budget,
//! [`MAX_CHECKED_CANDIDATES`]; a schedule whose exclusions drop so many of them that the checks
//! would pass it is refused, so no schedule costs more than that to parse.

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, TimeDelta, TimeZone, Timelike, Utc};
use croner::Cron;

use crate::schedule::{ScheduleError, Zone, compile_cron, first_instant_after_gap};

/// The longest interval `@every` takes: a year of days.
pub const MAX_EVERY_SECONDS: i64 = 366 * 86_400;

/// How many excluded candidates [`crate::Schedule::next_after`] passes over before it gives up:
/// a schedule whose exclusions leave nothing within this many candidates is refused when
/// parsed, and stops at the first such stretch.
pub(crate) const MAX_EXCLUDED_IN_A_ROW: usize = 20_000;

/// How many occurrences of a schedule the jitter check measures gaps over.
pub const JITTER_CHECKED_OCCURRENCES: usize = 500;

/// The budget of a schedule's checks when it is parsed: how many candidates (instants its rule
/// gives, before its window and exclusions keep or drop them) finding its first occurrence and
/// the jitter check may look at together. A schedule whose checks need more is refused
/// ([`crate::ScheduleError::TooCostly`]), so parsing any schedule costs at most this many
/// candidates, whoever writes it and wherever it is read.
pub const MAX_CHECKED_CANDIDATES: usize = 100_000;

/// The longest jitter a one-shot (`@at`) takes: a day.
pub const MAX_ONE_SHOT_JITTER_SECONDS: i64 = 86_400;

/// What a schedule's rule is: a cron line, an interval, or one instant.
#[derive(Clone)]
pub(crate) enum Rule {
    /// A cron expression in the schedule's zone.
    Cron {
        /// The compiled expression, shared by the schedule's clones: croner keeps a byte for
        /// every year it can search, so it is some kilobytes, which a clone (a routine's
        /// schedule handed from its check to its write) does not copy.
        cron: std::sync::Arc<Cron>,
        /// Whether second, minute and hour are each one plain number.
        fixed_time: bool,
    },
    /// `@every`: `offset + k·every` seconds after the Unix epoch.
    Every {
        /// The interval, in seconds.
        every: i64,
        /// The offset, in seconds, below `every`.
        offset: i64,
    },
    /// `@at`: once.
    At(DateTime<Utc>),
    /// `@rrule`: an RFC 5545 recurrence rule in the schedule's zone (shared, as a cron line is).
    Recur(std::sync::Arc<crate::schedule::Recurrence>),
}

impl Rule {
    /// For an interval: the first `offset + k·every` strictly after `instant`.
    pub(crate) fn next_every(
        every: i64,
        offset: i64,
        instant: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        let seconds = instant.timestamp();
        let k = (seconds - offset).div_euclid(every) + 1;
        DateTime::from_timestamp(offset.checked_add(k.checked_mul(every)?)?, 0)
    }
}

/// One `except` clause.
#[derive(Clone)]
pub(crate) struct Exclusion {
    /// The compiled expression.
    cron: Cron,
    /// What it names.
    unit: ExclusionUnit,
}

/// What an exclusion's matches stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExclusionUnit {
    /// The whole wall-clock day it matches at midnight.
    Day,
    /// The wall-clock minute it matches.
    Minute,
    /// The wall-clock second it matches.
    Second,
}

impl Exclusion {
    /// Parses an `except` expression.
    fn parse(text: &str) -> Result<Exclusion, ScheduleError> {
        let compiled = compile_cron(text).map_err(|e| ScheduleError::Rule {
            reason: format!("except {text:?}: {e}"),
        })?;
        // A macro is five fields at heart: `@daily` is `0 0 * * *`, a day rule.
        let unit = if text.split_whitespace().count() == 6 {
            ExclusionUnit::Second
        } else if compiled.canonical.starts_with("0 0 0 ") {
            ExclusionUnit::Day
        } else {
            ExclusionUnit::Minute
        };
        Ok(Exclusion {
            cron: compiled.cron,
            unit,
        })
    }

    /// Whether the occurrence whose wall time is `wall` is dropped; and if it is, the last wall
    /// time the same match covers (its day's or minute's end), so a search can jump past it.
    fn covers(&self, wall: NaiveDateTime) -> Option<NaiveDateTime> {
        let (probe, last) = match self.unit {
            ExclusionUnit::Day => {
                let day = wall.date().and_hms_opt(0, 0, 0)?;
                (day, day + TimeDelta::seconds(86_399))
            }
            ExclusionUnit::Minute => {
                let minute = wall.with_second(0)?.with_nanosecond(0)?;
                (minute, minute + TimeDelta::seconds(59))
            }
            ExclusionUnit::Second => {
                let second = wall.with_nanosecond(0)?;
                (second, second)
            }
        };
        self.cron
            .is_time_matching(&probe)
            .unwrap_or(false)
            .then_some(last)
    }
}

/// Everything of a schedule but its rule.
#[derive(Clone, Default)]
pub(crate) struct Bounds {
    /// `from`: nothing before it.
    pub start: Option<DateTime<Utc>>,
    /// `until`: nothing after it.
    pub end: Option<DateTime<Utc>>,
    /// `except` clauses.
    pub exclusions: Vec<Exclusion>,
}

impl Bounds {
    /// Whether any exclusion drops the occurrence at `at`; if so, the last instant of the
    /// stretch the exclusions drop (at least `at`), read back in `zone`.
    pub(crate) fn excluded_through(&self, at: DateTime<Utc>, zone: Zone) -> Option<DateTime<Utc>> {
        if self.exclusions.is_empty() {
            return None;
        }
        let tz = zone.tz();
        let wall = at.with_timezone(&tz).naive_local();
        let last = self
            .exclusions
            .iter()
            .filter_map(|x| x.covers(wall))
            .max()?;
        // The stretch's end in real time: as far past the occurrence as its last wall time is
        // past the occurrence's. A gap inside the stretch (a spring-forward day) makes that
        // overshoot into the next wall time by the gap's length, which is taken back; an overlap
        // (a fall-back day) makes it stop short, inside the stretch, and the search simply
        // meets the stretch again. Either way no instant after the stretch is passed over.
        let mut end = at + (last - wall);
        for _ in 0..4 {
            let overshoot = end.with_timezone(&tz).naive_local() - last;
            if overshoot <= TimeDelta::zero() {
                break;
            }
            end -= overshoot;
        }
        Some(end.max(at))
    }
}

/// A schedule's text split into its rule and its clauses, for a caller that changes one
/// clause and keeps the rest (`routine update --end`). [`ScheduleText::parse`] splits without
/// checking the parts; `Display` writes them back in the grammar's order, and
/// [`crate::Schedule::new`] checks the result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScheduleText {
    /// The rule as written: a cron expression, `@every …` or `@at …`.
    pub rule: String,
    /// The `except` expressions.
    pub except: Vec<String>,
    /// The `jitter` duration as written.
    pub jitter: Option<String>,
    /// The `from` time as written.
    pub from: Option<String>,
    /// The `until` time as written.
    pub until: Option<String>,
}

impl std::fmt::Display for ScheduleText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.rule)?;
        for x in &self.except {
            write!(f, " except {x}")?;
        }
        if let Some(jitter) = &self.jitter {
            write!(f, " jitter {jitter}")?;
        }
        if let Some(from) = &self.from {
            write!(f, " from {from}")?;
        }
        if let Some(until) = &self.until {
            write!(f, " until {until}")?;
        }
        Ok(())
    }
}

impl ScheduleText {
    /// Splits a schedule's text at its clause words. A cron expression holds no such word (its
    /// names are months and weekdays), so the split is unambiguous.
    pub fn parse(text: &str) -> Result<ScheduleText, ScheduleError> {
        let mut cuts: Vec<(usize, &str)> = Vec::new();
        for word in [" except ", " jitter ", " from ", " until "] {
            let mut search = 0;
            while let Some(at) = text[search..].find(word) {
                cuts.push((search + at, word.trim()));
                search += at + word.len();
            }
        }
        cuts.sort_unstable();
        let rule_end = cuts.first().map_or(text.len(), |(at, _)| *at);
        let mut parts = ScheduleText {
            rule: blank_trimmed(&text[..rule_end]).to_owned(),
            ..ScheduleText::default()
        };
        for (i, (at, word)) in cuts.iter().enumerate() {
            let start = at + word.len() + 2;
            let end = cuts.get(i + 1).map_or(text.len(), |(next, _)| *next);
            let value = blank_trimmed(text.get(start..end).unwrap_or("")).to_owned();
            if value.is_empty() {
                return Err(ScheduleError::Rule {
                    reason: format!("{word} needs a value"),
                });
            }
            match *word {
                "except" => parts.except.push(value),
                "jitter" if parts.jitter.is_none() => parts.jitter = Some(value),
                "from" if parts.from.is_none() => parts.from = Some(value),
                "until" if parts.until.is_none() => parts.until = Some(value),
                _ => {
                    return Err(ScheduleError::Rule {
                        reason: format!("{word} is given twice"),
                    });
                }
            }
        }
        // Clauses come in the order the grammar gives: excepts, jitter, from, until.
        let rank = |w: &str| match w {
            "except" => 0,
            "jitter" => 1,
            "from" => 2,
            _ => 3,
        };
        if cuts.windows(2).any(|w| rank(w[0].1) > rank(w[1].1)) {
            return Err(ScheduleError::Rule {
                reason: "clauses go in the order except, jitter, from, until".into(),
            });
        }
        Ok(parts)
    }
}

/// `text` without the spaces and tabs around it; any other character, a newline included,
/// stays and is refused where it is read, so a pasted line with stray text cannot be half-read.
pub(crate) fn blank_trimmed(text: &str) -> &str {
    text.trim_matches([' ', '\t'])
}

/// Parses the bounds of a schedule in `zone`.
pub(crate) fn parse_bounds(parts: &ScheduleText, zone: Zone) -> Result<Bounds, ScheduleError> {
    let time = |what: &str, text: &str| {
        parse_time(text, zone).map_err(|reason| ScheduleError::Rule {
            reason: format!("{what} {text:?}: {reason}"),
        })
    };
    let start = parts.from.as_deref().map(|t| time("from", t)).transpose()?;
    let end = parts
        .until
        .as_deref()
        .map(|t| time("until", t))
        .transpose()?;
    if let (Some(start), Some(end)) = (start, end)
        && end < start
    {
        return Err(ScheduleError::Rule {
            reason: format!("the window ends ({end}) before it starts ({start})"),
        });
    }
    let exclusions = parts
        .except
        .iter()
        .map(|x| Exclusion::parse(x))
        .collect::<Result<_, _>>()?;
    Ok(Bounds {
        start,
        end,
        exclusions,
    })
}

/// Parses an `@every` rule's rest: `DURATION [offset DURATION]`.
pub(crate) fn parse_every(text: &str) -> Result<Rule, ScheduleError> {
    let refuse = |reason: String| ScheduleError::Rule {
        reason: format!("@every {text}: {reason}"),
    };
    let (every, offset) = match text.split_once(" offset ") {
        Some((every, offset)) => (blank_trimmed(every), Some(blank_trimmed(offset))),
        None => (blank_trimmed(text), None),
    };
    let every = parse_duration(every).map_err(refuse)?;
    if every > MAX_EVERY_SECONDS {
        return Err(refuse(format!(
            "the interval is longer than {} days",
            MAX_EVERY_SECONDS / 86_400
        )));
    }
    let offset = match offset {
        Some(o) => parse_duration(o).map_err(refuse)?,
        None => 0,
    };
    if offset >= every {
        return Err(refuse(
            "the offset must be shorter than the interval".into(),
        ));
    }
    Ok(Rule::Every { every, offset })
}

/// A span written as [`parse_duration`] reads it (`1h30m`, `5m`, `2s`), to the second; a
/// fraction of a second left over is written in milliseconds (`1m500ms`).
pub fn duration_text(span: TimeDelta) -> String {
    let total = span.num_milliseconds().max(0);
    let (mut seconds, millis) = (total / 1000, total % 1000);
    let mut text = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if seconds >= size {
            text.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    if millis > 0 || text.is_empty() {
        text.push_str(&format!("{millis}ms"));
    }
    text
}

/// Parses a duration such as `90m`, `1h30m` or `1d` into whole seconds, at least one.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let text = blank_trimmed(text);
    if text.is_empty() {
        return Err("a duration is needed (such as 90m, 1h30m or 1d)".into());
    }
    if let Some(rest) = text.strip_prefix('-') {
        return Err(if rest.starts_with(|c: char| c.is_ascii_digit()) {
            format!("{text:?} is negative: a duration is at least one second")
        } else {
            format!("{text:?} is a flag, not a duration (was the value left out?)")
        });
    }
    let mut total: i64 = 0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        if c == 'm' && chars.peek() == Some(&'s') {
            return Err(format!(
                "{text:?} is not a duration here: it counts whole seconds (s, m, h or d), \
                 not milliseconds"
            ));
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            _ => {
                return Err(format!(
                    "{text:?} is not a duration: {c:?} is not a unit (s, m, h or d)"
                ));
            }
        };
        let n: i64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration: a unit needs a number before it"))?;
        number.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .filter(|s| *s <= 100 * MAX_EVERY_SECONDS)
            .ok_or_else(|| format!("{text:?} is too long"))?;
    }
    if !number.is_empty() {
        return Err(format!(
            "{text:?} is not a duration: {number} needs a unit (s, m, h or d)"
        ));
    }
    if total == 0 {
        return Err(format!("{text:?} is not a duration of at least one second"));
    }
    Ok(total)
}

/// Parses a time: RFC 3339, or a wall time or date in `zone`.
pub fn parse_time(text: &str, zone: Zone) -> Result<DateTime<Utc>, String> {
    let text = blank_trimmed(text);
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    let wall = [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
    .or_else(|| {
        NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .ok()
            .and_then(|d| d.and_hms_opt(0, 0, 0))
    })
    .ok_or_else(|| {
        "not a time: expected RFC 3339 (2026-12-24T15:30:00+01:00), a wall time \
             (2026-12-24T15:30) or a date (2026-12-24)"
            .to_string()
    })?;
    if !(2..=4998).contains(&chrono::Datelike::year(&wall)) {
        return Err("the year is outside 2 to 4998".into());
    }
    let tz = zone.tz();
    let at = match tz.from_local_datetime(&wall) {
        LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => at,
        LocalResult::None => first_instant_after_gap(tz, wall)
            .ok_or_else(|| "the wall time is in a gap with no end".to_string())?,
    };
    Ok(at.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("90m"), Ok(5_400));
        assert_eq!(parse_duration("1h30m"), Ok(5_400));
        assert_eq!(parse_duration("1d2h3m4s"), Ok(93_784));
        assert_eq!(parse_duration("45s"), Ok(45));
        for bad in ["", "0s", "90", "m", "1.5h", "1w", "-5m", "1h 30m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was taken");
        }
        // Refusals say what is wrong with what was typed.
        let said = |bad| parse_duration(bad).unwrap_err();
        assert!(said("-5m").contains("negative"), "{}", said("-5m"));
        assert!(said("--name").contains("flag"), "{}", said("--name"));
        assert!(said("500ms").contains("milliseconds"), "{}", said("500ms"));
        assert!(
            said("1m500ms").contains("milliseconds"),
            "{}",
            said("1m500ms")
        );
    }

    #[test]
    fn times_are_rfc3339_or_read_in_the_zone() {
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        let at = |s: &str| parse_time(s, berlin).unwrap().to_rfc3339();
        assert_eq!(at("2026-12-24T15:30:00Z"), "2026-12-24T15:30:00+00:00");
        assert_eq!(at("2026-12-24T15:30"), "2026-12-24T14:30:00+00:00");
        assert_eq!(at("2026-12-24"), "2026-12-23T23:00:00+00:00");
        // 02:30 on 2026-03-29 does not exist in Berlin: the first instant after the gap.
        assert_eq!(at("2026-03-29T02:30"), "2026-03-29T01:00:00+00:00");
        // 02:30 on 2026-10-25 happens twice: the earlier.
        assert_eq!(at("2026-10-25T02:30"), "2026-10-25T00:30:00+00:00");
        assert!(parse_time("tomorrow", berlin).is_err());
        assert!(parse_time("2026-02-30", berlin).is_err());
    }

    #[test]
    fn an_interval_counts_from_the_epoch_plus_its_offset() {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let next = |every, offset, at| Rule::next_every(every, offset, t(at)).unwrap().to_rfc3339();
        for (every, offset, after, expected) in [
            (
                5_400,
                0,
                "2026-12-03T00:00:00Z",
                "2026-12-03T01:30:00+00:00",
            ),
            (
                5_400,
                900,
                "2026-12-03T00:00:00Z",
                "2026-12-03T00:15:00+00:00",
            ),
            (60, 0, "2026-12-03T00:00:59.5Z", "2026-12-03T00:01:00+00:00"),
            (60, 0, "2026-12-03T00:01:00Z", "2026-12-03T00:02:00+00:00"),
        ] {
            assert_eq!(
                next(every, offset, after),
                expected,
                "{every} {offset} {after}"
            );
        }
    }
}
