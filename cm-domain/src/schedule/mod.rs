//! Cron schedules in IANA time zones, and the daylight-saving rule for their next occurrence.
//!
//! # Expressions
//!
//! A schedule is a standard five-field crontab expression (`minute hour day-of-month month
//! day-of-week`, minute precision) or a six-field one with a seconds field first. The syntax is
//! Vixie cron's: a field is a comma-separated list of items, each `*`, `*/step`, a value, a range
//! `a-b` or a stepped range `a-b/step`. Months take names (`JAN`..`DEC`), days of the week take
//! names (`SUN`..`SAT`), and both 0 and 7 are Sunday. When both day fields are restricted (as in
//! crontab(5): neither starts with `*`) a day matches if either matches; otherwise both must.
//! The macros `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight` and `@hourly`
//! are accepted; `@reboot` is not a time and is refused.
//!
//! The day fields also take Quartz's items, each alone in its list item (no range, no step):
//! in day-of-month `L` (the month's last day), `LW` (its last weekday, Monday to Friday) and
//! `15W` (the weekday nearest the 15th: a Saturday moves to the Friday before, a Sunday to the
//! Monday after, never into another month, so `1W` on a Saturday 1st is Monday the 3rd; a
//! month without a 31st has no `31W`); in day-of-week `5L` (the month's last Friday) and `5#3`
//! (its third Friday, `#1` to `#5`; a month without a fifth simply has no `#5`), with cm's
//! weekday numbers and names (`FRIL`, `FRI#3`; 0 and 7 are Sunday, not Quartz's 1). They are
//! day-of-month and day-of-week values like any other, so the two day fields combine as above:
//! `0 9 L * 5#3` fires on the last day and on the third Friday. `L` and `LW` cannot share a
//! list.
//!
//! The expression is checked by this module, field by field, before it reaches the `croner`
//! crate, so that every refusal names the field that is wrong and why, in one line. Extensions
//! croner accepts beyond these (`?`, a `+` day-of-week prefix, a year field, `5/10`, `#` on a
//! range) are refused, so that what cm accepts is exactly what an operator who knows crontab
//! and Quartz expects. A schedule that can never fire (`0 9 30 2 *`, `0 9 LW * */6`: the last
//! weekday on a Saturday or Sunday) is refused too.
//!
//! # Daylight saving
//!
//! Occurrences follow Vixie cron and the Open Cron Pattern Specification. A *fixed-time*
//! schedule (each of second, minute and hour written as one plain number) whose wall time falls
//! in a spring-forward gap fires once, at the first instant after the gap; in a fall-back overlap
//! it fires once, at the earlier instant. Any other schedule is an *interval* schedule: it skips
//! wall times in a gap and fires at both instants of an overlap. [`Schedule::next_after`] counts
//! from the exact instant it is given, so a walk that feeds each result back in stays on the
//! right pass through an overlap.
//!
//! # Where each part lives
//!
//! - this module: [`Schedule`] itself, parsed from its text ([`Schedule::parse`]), what it says
//!   about itself, the limit on its whole length, and why one is refused ([`ScheduleError`]).
//! - `zone`: [`Zone`], the IANA zone its wall times are read in.
//! - `field` and `cron`: one field of a cron expression ([`Field`]), then the whole expression,
//!   checked and compiled by croner.
//! - `occurrences`: [`Schedule::next_after`] and [`Occurrences`]: the rule, its window and its
//!   exclusions.
//! - `daylight`: a cron rule's wall times placed in real time across gaps and overlaps.
//! - `planned`: the `jitter` clause: when each occurrence comes due ([`Schedule::planned`]).
//! - `holidays`: a holiday calendar's days off, dropping or moving occurrences
//!   ([`Schedule::with_calendar`]).
//! - `words`: the schedule read as a person would say it ([`Schedule::in_words`]).
//!
//! The clauses after the rule (`@every`, `@at`, `except`, `from`, `until`, `jitter`) are read by
//! [`crate::rules`].

use std::fmt;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};

use crate::rules::{Bounds, Rule};

mod cron;
mod daylight;
mod field;
mod holidays;
mod occurrences;
mod planned;
mod recur;
mod words;
mod zone;

pub use cron::MAX_EXPRESSION_CHARS;
pub(crate) use cron::compile_cron;
pub(crate) use daylight::first_instant_after_gap;
pub use field::Field;
pub use occurrences::Occurrences;
pub(crate) use recur::Recurrence;
pub use recur::{MAX_RRULE_COUNT, rrule_needs_start};
pub use zone::{Zone, ZoneError};

/// The longest schedule accepted, its clauses included, in characters.
pub const MAX_SCHEDULE_CHARS: usize = 1024;

/// Why an expression or zone was refused. Every message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The zone is not an IANA zone name.
    #[error(transparent)]
    Zone(#[from] ZoneError),
    /// The expression is empty or blank.
    #[error(
        "the schedule is empty: give a cron line (such as '0 9 * * *'), an interval \
         (@every 90m) or a one-shot (@at 2026-12-24T15:30)"
    )]
    Empty,
    /// The expression is longer than [`MAX_EXPRESSION_CHARS`].
    #[error(
        "invalid cron expression: it is {chars} characters long, the limit is {MAX_EXPRESSION_CHARS}"
    )]
    TooLong {
        /// The expression's length in characters.
        chars: usize,
    },
    /// The schedule, its clauses included, is longer than [`MAX_SCHEDULE_CHARS`].
    #[error("invalid schedule: it is {chars} characters long, the limit is {MAX_SCHEDULE_CHARS}")]
    ScheduleTooLong {
        /// The schedule's length in characters.
        chars: usize,
    },
    /// The expression has a character that cannot be placed in a field (the field count is
    /// wrong too, so which field it belongs to is unknown).
    #[error("invalid cron expression: unexpected character {ch:?} (U+{:04X})", u32::from(*ch))]
    Character {
        /// The character.
        ch: char,
    },
    /// The expression does not have 5 or 6 fields.
    #[error(
        "invalid cron expression: expected 5 fields (minute hour day-of-month month day-of-week) \
         or 6 (second first), found {found}"
    )]
    FieldCount {
        /// How many whitespace-separated fields the expression has.
        found: usize,
    },
    /// An `@` macro that is refused: `@reboot`, or one that does not exist.
    #[error("invalid cron expression: {name} is not supported: {reason}")]
    Macro {
        /// The macro as written.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// One field is malformed or out of range.
    #[error("invalid cron expression: {field} field {text:?}: {reason}")]
    Field {
        /// The field that is wrong.
        field: Field,
        /// The field as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Every field is valid but together they never match a date.
    #[error("invalid cron expression: the schedule never fires: {reason}")]
    NeverFires {
        /// Which fields exclude each other.
        reason: String,
    },
    /// An interval, a one-shot, a window or an exclusion is malformed.
    #[error("invalid schedule: {reason}")]
    Rule {
        /// What is wrong, naming the clause.
        reason: String,
    },
    /// The schedule's checks (its first occurrence, its jitter against its intervals) would
    /// look at more than [`crate::rules::MAX_CHECKED_CANDIDATES`] candidates: its exclusions
    /// drop too many of its rule's instants between the occurrences they keep.
    #[error(
        "invalid schedule: too costly to check: {what} looks at more than {} candidates \
         (its exclusions drop too many of its rule's instants; write the rule closer to \
         what it keeps)",
        crate::rules::MAX_CHECKED_CANDIDATES
    )]
    TooCostly {
        /// Which check ran out of its budget.
        what: &'static str,
    },
    /// The expression passed cm's checks but the cron engine refused it.
    #[error("invalid cron expression: {0}")]
    Invalid(String),
}

/// A parsed schedule in a zone: a cron expression, an interval (`@every`) or one instant
/// (`@at`), with its window and exclusions (see [`crate::rules`] for the grammar).
#[derive(Clone)]
pub struct Schedule {
    /// The schedule as given.
    expression: String,
    /// The zone its wall times are read in.
    zone: Zone,
    /// Its rule.
    rule: Rule,
    /// Its window and exclusions.
    bounds: Bounds,
    /// Its `jitter` clause: each occurrence comes due up to this much later.
    jitter: Option<TimeDelta>,
    /// How many candidates its checks looked at when it was parsed.
    checked_candidates: usize,
    /// Its holiday calendar, if it is on one ([`Schedule::with_calendar`]).
    holidays: Option<holidays::Holidays>,
}

impl Schedule {
    /// Parses `expression` in the zone named `zone`.
    pub fn parse(expression: &str, zone: &str) -> Result<Self, ScheduleError> {
        Schedule::new(expression, Zone::parse(zone)?)
    }

    /// Parses `expression` in `zone`: a cron expression, `@every DURATION [offset DURATION]` or
    /// `@at TIME`, then any `except CRON` clauses, `from TIME` and `until TIME`.
    pub fn new(expression: &str, zone: Zone) -> Result<Self, ScheduleError> {
        let chars = expression.chars().count();
        if chars > MAX_SCHEDULE_CHARS {
            return Err(ScheduleError::ScheduleTooLong { chars });
        }
        let parts = crate::rules::ScheduleText::parse(expression)?;
        let mut bounds = crate::rules::parse_bounds(&parts, zone)?;
        let rule = match parts.rule.as_str().split_once([' ', '\t']) {
            Some((word, rest)) if word.eq_ignore_ascii_case("@every") => {
                crate::rules::parse_every(rest)?
            }
            Some((word, rest)) if word.eq_ignore_ascii_case("@rrule") => Rule::Recur(
                std::sync::Arc::new(Recurrence::parse(rest, &mut bounds, zone)?),
            ),
            Some((word, rest)) if word.eq_ignore_ascii_case("@at") => {
                Rule::At(crate::rules::parse_time(rest, zone).map_err(|reason| {
                    ScheduleError::Rule {
                        reason: format!("@at {:?}: {reason}", crate::rules::blank_trimmed(rest)),
                    }
                })?)
            }
            _ if ["@every", "@at", "@rrule"]
                .iter()
                .any(|w| parts.rule.eq_ignore_ascii_case(w)) =>
            {
                return Err(ScheduleError::Rule {
                    reason: format!("{} needs a value", parts.rule),
                });
            }
            _ => {
                if parts.rule.chars().count() > MAX_EXPRESSION_CHARS {
                    return Err(ScheduleError::TooLong {
                        chars: parts.rule.chars().count(),
                    });
                }
                let compiled = compile_cron(&parts.rule)?;
                Rule::Cron {
                    cron: std::sync::Arc::new(compiled.cron),
                    fixed_time: compiled.fixed_time,
                }
            }
        };
        let jitter = match parts.jitter.as_deref() {
            None => None,
            Some(text) => Some(TimeDelta::seconds(
                crate::rules::parse_duration(text).map_err(|reason| ScheduleError::Rule {
                    reason: format!("jitter {text:?}: {reason}"),
                })?,
            )),
        };
        let mut schedule = Schedule {
            expression: expression.to_owned(),
            zone,
            rule,
            bounds,
            jitter,
            checked_candidates: 0,
            holidays: None,
        };
        // Every check below counts the candidates it looks at against one budget.
        let mut spent = 0;
        let budget = crate::rules::MAX_CHECKED_CANDIDATES;
        let too_costly = |what| move |_| ScheduleError::TooCostly { what };
        // The calendar check is exact, so this is a second line of defence: it catches a
        // disagreement with croner, and a window or exclusions that leave nothing, before a
        // routine is stored that would never come due.
        if let Rule::Cron { .. } | Rule::Every { .. } | Rule::Recur(_) = schedule.rule {
            let reference = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
            let first = match reference {
                Some(r) => schedule
                    .next_after_counted(r, &mut spent, budget)
                    .map_err(too_costly("finding its first occurrence"))?,
                None => None,
            };
            if first.is_none() {
                let bounded =
                    schedule.bounds.end.is_some() || !schedule.bounds.exclusions.is_empty();
                return Err(ScheduleError::NeverFires {
                    reason: if bounded {
                        "no occurrence falls inside its window that its exclusions leave"
                    } else {
                        "no occurrence was found"
                    }
                    .to_owned(),
                });
            }
        } else if schedule
            .next_after_counted(schedule.start_search(), &mut spent, budget)
            .map_err(too_costly("finding its one instant"))?
            .is_none()
        {
            return Err(ScheduleError::NeverFires {
                reason: "its one instant is outside its window or excluded".to_owned(),
            });
        }
        if let Some(jitter) = schedule.jitter {
            schedule.check_jitter(jitter, &mut spent)?;
        }
        schedule.checked_candidates = spent;
        Ok(schedule)
    }

    /// How many candidates (instants its rule gave, before its window and exclusions kept or
    /// dropped them) its checks looked at when it was parsed: never more than
    /// [`crate::rules::MAX_CHECKED_CANDIDATES`].
    pub fn checked_candidates(&self) -> usize {
        self.checked_candidates
    }

    /// An instant before every occurrence a one-shot can have.
    fn start_search(&self) -> DateTime<Utc> {
        match self.rule {
            Rule::At(at) => at - TimeDelta::seconds(1),
            _ => DateTime::<Utc>::MIN_UTC,
        }
    }

    /// When the window opens (`from`), if it has a start.
    pub fn start(&self) -> Option<DateTime<Utc>> {
        self.bounds.start
    }

    /// When the window closes (`until`), if it has an end.
    pub fn end(&self) -> Option<DateTime<Utc>> {
        self.bounds.end
    }

    /// Whether the schedule is one instant (`@at`).
    pub fn is_one_shot(&self) -> bool {
        matches!(self.rule, Rule::At(_))
    }

    /// Whether the schedule is an interval in absolute time (`@every`).
    pub fn is_interval(&self) -> bool {
        matches!(self.rule, Rule::Every { .. })
    }

    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The zone.
    pub fn zone(&self) -> Zone {
        self.zone
    }

    /// Whether this is a fixed-time schedule: second, minute and hour are each one plain number
    /// (a five-field expression has second 0). Fixed-time schedules move a run out of a
    /// daylight-saving gap and run once in an overlap; all others skip the gap and run twice in
    /// the overlap. A degenerate range or list such as `2-2` or `2,2` is still a range or list,
    /// so it makes an interval schedule.
    pub fn is_fixed_time(&self) -> bool {
        match &self.rule {
            Rule::Cron { fixed_time, .. } => *fixed_time,
            Rule::Recur(recurrence) => recurrence.is_fixed_time(),
            Rule::Every { .. } | Rule::At(_) => false,
        }
    }
}

impl fmt::Debug for Schedule {
    // croner's compiled pattern prints thousands of bits (one per year it can search), which
    // would drown any log line or test failure that shows a schedule; the expression says it all.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("expression", &self.expression)
            .field("zone", &self.zone.name())
            .field("fixed_time", &self.is_fixed_time())
            .field(
                "on_holiday",
                &self.holidays.as_ref().map(|h| h.on_holiday.as_str()),
            )
            .finish_non_exhaustive()
    }
}

/// The checks the tests of each part share.
#[cfg(test)]
mod testing {
    use super::Schedule;

    /// Asserts that `expr` parses in `zone` and that its fixed-time classification is
    /// `fixed`.
    #[track_caller]
    pub(super) fn check(expr: &str, zone: &str, fixed: bool) {
        match Schedule::parse(expr, zone) {
            Ok(s) => assert_eq!(s.is_fixed_time(), fixed, "{expr:?} fixed-time"),
            Err(e) => panic!("{expr:?} in {zone} was refused: {e}"),
        }
    }

    /// Asserts that `expr` is refused in UTC with a one-line message containing `needle`.
    #[track_caller]
    pub(super) fn check_err(expr: &str, needle: &str) {
        match Schedule::parse(expr, "UTC") {
            Ok(_) => panic!("{expr:?} was accepted"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(needle), "{expr:?}: {msg:?} lacks {needle:?}");
                assert!(!msg.contains('\n'), "{expr:?}: {msg:?} is not one line");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_is_short() {
        let s = Schedule::parse("*/5 * * * *", "Europe/Berlin").unwrap();
        let debug = format!("{s:?}");
        assert!(
            debug.contains("*/5 * * * *") && debug.contains("Europe/Berlin"),
            "{debug}"
        );
        assert!(debug.len() < 120, "{debug}");
    }

    #[test]
    fn schedule_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync + Clone + fmt::Debug>() {}
        assert_send_sync::<Schedule>();
    }
}
