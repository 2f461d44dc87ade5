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
//! The expression is checked here, field by field, before it reaches the `croner` crate, so
//! that every refusal names the field that is wrong and why, in one line. Extensions croner
//! accepts beyond Vixie cron (`L`, `W`, `#`, `?`, a `+` day-of-week prefix, a year field,
//! `5/10`) are refused, so that what cm accepts is exactly what an operator who knows crontab
//! expects. A schedule that can never fire (`0 9 30 2 *`) is refused too.
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

use std::fmt;

use chrono::{DateTime, Datelike, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use croner::Cron;

use crate::rules::{Bounds, Rule};
use croner::parser::{CronParser, Seconds, Year};

/// The longest cron expression accepted, in characters.
pub const MAX_EXPRESSION_CHARS: usize = 256;

/// The longest schedule accepted, its clauses included, in characters.
pub const MAX_SCHEDULE_CHARS: usize = 1024;

/// An IANA time zone, stored and shown by its name (never as an offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Zone(chrono_tz::Tz);

/// A zone name that is not an IANA zone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {0:?} (expected an IANA name such as Europe/Berlin, not an offset)")]
pub struct ZoneError(pub String);

impl Zone {
    /// Coordinated Universal Time, the default zone.
    pub const UTC: Zone = Zone(chrono_tz::Tz::UTC);

    /// The zone named `name` (for example `Europe/Berlin`).
    ///
    /// Names are matched exactly, as the IANA database spells them. A raw offset such as
    /// `+02:00` or `UTC+2` is refused: an offset has no daylight-saving rules, so a routine
    /// stored with one would silently drift by an hour twice a year. `Etc/GMT+5` is an IANA name
    /// (with the POSIX sign convention) and is accepted.
    pub fn parse(name: &str) -> Result<Self, ZoneError> {
        name.parse::<chrono_tz::Tz>()
            .map(Zone)
            .map_err(|_| ZoneError(name.to_owned()))
    }

    /// The zone's IANA name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// The chrono-tz zone.
    pub fn tz(&self) -> chrono_tz::Tz {
        self.0
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One field of a cron expression, named as error messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The seconds field (0-59), first in a six-field expression.
    Second,
    /// The minutes field (0-59).
    Minute,
    /// The hours field (0-23).
    Hour,
    /// The day-of-month field (1-31).
    DayOfMonth,
    /// The month field (1-12 or `JAN`-`DEC`).
    Month,
    /// The day-of-week field (0-7 or `SUN`-`SAT`; 0 and 7 are Sunday).
    DayOfWeek,
}

impl Field {
    /// The field's name: `second`, `minute`, `hour`, `day-of-month`, `month` or `day-of-week`.
    pub fn name(self) -> &'static str {
        match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        }
    }

    /// The smallest and largest value the field accepts.
    pub fn bounds(self) -> (u32, u32) {
        match self {
            Field::Second | Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::DayOfMonth => (1, 31),
            Field::Month => (1, 12),
            Field::DayOfWeek => (0, 7),
        }
    }

    /// The names the field accepts for its values, indexed from its first named value.
    fn names(self) -> &'static [&'static str] {
        match self {
            Field::Month => &[
                "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
            ],
            Field::DayOfWeek => &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
            _ => &[],
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an expression or zone was refused. Every message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The zone is not an IANA zone name.
    #[error(transparent)]
    Zone(#[from] ZoneError),
    /// The expression is empty or blank.
    #[error("invalid cron expression: it is empty")]
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
}

/// A cron expression that passed cm's checks, compiled by croner.
pub(crate) struct CompiledCron {
    /// The compiled expression.
    pub cron: Cron,
    /// Whether second, minute and hour are each one plain number.
    pub fixed_time: bool,
    /// Its canonical six-field form, seconds first.
    pub canonical: String,
}

/// Checks a cron expression field by field and compiles it.
pub(crate) fn compile_cron(expression: &str) -> Result<CompiledCron, ScheduleError> {
    let checked = check_expression(expression)?;
    let cron = CronParser::builder()
        .seconds(Seconds::Required)
        .year(Year::Disallowed)
        .dom_and_dow(false)
        .build()
        .parse(&checked.canonical)
        .map_err(|e| ScheduleError::Invalid(e.to_string()))?;
    Ok(CompiledCron {
        cron,
        fixed_time: checked.fixed_time,
        canonical: checked.canonical,
    })
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
        let rule = match parts.rule.as_str().split_once([' ', '\t']) {
            Some((word, rest)) if word.eq_ignore_ascii_case("@every") => {
                crate::rules::parse_every(rest)?
            }
            Some((word, rest)) if word.eq_ignore_ascii_case("@at") => {
                Rule::At(crate::rules::parse_time(rest, zone).map_err(|reason| {
                    ScheduleError::Rule {
                        reason: format!("@at {:?}: {reason}", crate::rules::blank_trimmed(rest)),
                    }
                })?)
            }
            _ if ["@every", "@at"]
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
                    cron: Box::new(compiled.cron),
                    fixed_time: compiled.fixed_time,
                }
            }
        };
        let bounds = crate::rules::parse_bounds(&parts, zone)?;
        let jitter = match parts.jitter.as_deref() {
            None => None,
            Some(text) => Some(TimeDelta::seconds(
                crate::rules::parse_duration(text).map_err(|reason| ScheduleError::Rule {
                    reason: format!("jitter {text:?}: {reason}"),
                })?,
            )),
        };
        let schedule = Schedule {
            expression: expression.to_owned(),
            zone,
            rule,
            bounds,
            jitter,
        };
        // The calendar check is exact, so this is a second line of defence: it catches a
        // disagreement with croner, and a window or exclusions that leave nothing, before a
        // routine is stored that would never come due.
        if let Rule::Cron { .. } | Rule::Every { .. } = schedule.rule {
            let reference = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
            if reference.and_then(|r| schedule.next_after(r)).is_none() {
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
        } else if schedule.next_after(schedule.start_search()).is_none() {
            return Err(ScheduleError::NeverFires {
                reason: "its one instant is outside its window or excluded".to_owned(),
            });
        }
        if let Some(jitter) = schedule.jitter {
            schedule.check_jitter(jitter)?;
        }
        Ok(schedule)
    }

    /// Refuses a jitter longer than the schedule's shortest interval (measured over its first
    /// [`crate::rules::JITTER_CHECKED_OCCURRENCES`] occurrences from its start, or from
    /// 2000-01-01), or for a one-shot longer than a day: planned instants then keep the
    /// occurrences' order.
    fn check_jitter(&self, jitter: TimeDelta) -> Result<(), ScheduleError> {
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
        let shortest = self
            .occurrences_after(from)
            .take(crate::rules::JITTER_CHECKED_OCCURRENCES)
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| w[1] - w[0])
            .min();
        match shortest {
            Some(shortest) if jitter > shortest => refuse(format!(
                "jitter {} is longer than the schedule's shortest interval, {}",
                crate::rules::duration_text(jitter),
                crate::rules::duration_text(shortest)
            )),
            _ => Ok(()),
        }
    }

    /// An instant before every occurrence a one-shot can have.
    fn start_search(&self) -> DateTime<Utc> {
        match self.rule {
            Rule::At(at) => at - TimeDelta::seconds(1),
            _ => DateTime::<Utc>::MIN_UTC,
        }
    }

    /// The `jitter` clause: each occurrence comes due up to this much after it (see
    /// [`crate::jitter`]). `None` without one.
    pub fn jitter(&self) -> Option<std::time::Duration> {
        self.jitter.and_then(|j| j.to_std().ok())
    }

    /// When occurrence `occurrence` of routine `routine` comes due: the occurrence itself, or
    /// with a `jitter` clause the occurrence plus its offset ([`crate::jitter::planned`]).
    pub fn planned(&self, routine: crate::RoutineId, occurrence: DateTime<Utc>) -> DateTime<Utc> {
        match self.jitter {
            Some(jitter) => crate::jitter::planned(routine, occurrence, jitter),
            None => occurrence,
        }
    }

    /// The routine's first occurrence strictly after `instant` and when it comes due, as a
    /// routine's clock is set when it is written or resumed: `(occurrence, planned)`.
    pub fn next_planned_after(
        &self,
        routine: crate::RoutineId,
        instant: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        let next = self.next_after(instant)?;
        Some((next, self.planned(routine, next)))
    }

    /// The occurrence a routine's clock, `planned` (its `next_run_at`), stands for: the
    /// occurrence whose planned instant it is. Without jitter, `planned` itself. With jitter,
    /// the occurrence in `(planned - jitter, planned]` planned then; a clock that no occurrence
    /// is planned at (written before the jitter was) stands for the latest occurrence in that
    /// stretch, or, with none there, the first after it. `None` when the schedule has no
    /// occurrence after `planned - jitter`: nothing is owed.
    pub fn occurrence_planned_at(
        &self,
        routine: crate::RoutineId,
        planned: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
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

    /// Whether nothing is owed after `instant`: the window closed, or the one instant passed.
    /// A routine whose schedule is over is *finished*.
    pub fn is_over_after(&self, instant: DateTime<Utc>) -> bool {
        self.next_after(instant).is_none()
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
        matches!(
            self.rule,
            Rule::Cron {
                fixed_time: true,
                ..
            }
        )
    }

    /// The first occurrence strictly after `instant`, or `None` if there is none: the rule's
    /// next instant inside the window that no exclusion drops.
    ///
    /// Occurrences are whole seconds. `None` also covers instants whose local date is outside
    /// the years 2 to 4998, which the cron engine does not search.
    pub fn next_after(&self, instant: DateTime<Utc>) -> Option<DateTime<Utc>> {
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
                return None;
            }
            let next = self.rule_after(from)?;
            if self.bounds.end.is_some_and(|end| next > end) {
                return None;
            }
            match self.bounds.excluded_through(next, self.zone) {
                None => return Some(next),
                Some(through) => from = through,
            }
        }
        None
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
        }
    }

    /// `next_after` for an interval schedule: croner's own zoned search, which skips gaps and
    /// walks both passes of an overlap in real-time order.
    fn next_interval_after(
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
    fn next_fixed_time_after(&self, cron: &Cron, instant: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = self.zone.tz();
        let mut wall = instant.with_timezone(&tz).naive_local();
        // A fixed-time schedule's wall times, in order, land on instants that never go back:
        // the earlier instant of a repeated wall time, and for a wall time swallowed by a gap
        // the first instant after the gap. So the first that lands after `instant` is the
        // answer. A wall time can land at or before `instant` only when the search starts on
        // the later pass of an overlap (the run already happened on the earlier pass), and a
        // fixed-time schedule has one time of day, so a handful of steps always suffices.
        for _ in 0..8 {
            // On naive wall times croner is a plain calendar search: strictly after `wall`
            // (its fraction of a second dropped), with no zone involved.
            wall = cron.find_next_occurrence(&wall, false).ok()?;
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

    /// The occurrences strictly after `instant`, in order, each computed from the previous one.
    pub fn occurrences_after(&self, instant: DateTime<Utc>) -> Occurrences<'_> {
        Occurrences {
            schedule: self,
            cursor: Some(instant),
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
            .finish_non_exhaustive()
    }
}

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

/// An expression that passed cm's checks, in the form handed to croner.
struct CheckedExpression {
    /// Six numeric fields, seconds first, with no names or macros.
    canonical: String,
    /// Whether second, minute and hour are each one plain number.
    fixed_time: bool,
}

/// One item of a field's comma-separated list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// `*` or `*/step`.
    Star { step: u32 },
    /// `v`.
    Value(u32),
    /// `a-b` or `a-b/step`.
    Range { start: u32, end: u32, step: u32 },
}

/// A checked field: its items, the values they select and its canonical text.
struct ParsedField {
    /// The items in the order written.
    items: Vec<Item>,
    /// Bit `v` is set when the field selects value `v` (day-of-week 7 is kept as 7).
    values: u64,
}

impl ParsedField {
    /// Whether the field is one plain number.
    fn is_single_value(&self) -> bool {
        matches!(self.items.as_slice(), [Item::Value(_)])
    }

    /// Whether the field starts with `*`, which crontab(5) calls unrestricted when it decides
    /// how the two day fields combine.
    fn starts_with_star(&self) -> bool {
        matches!(self.items.first(), Some(Item::Star { .. }))
    }

    /// Whether the field is exactly `*`.
    fn is_star(&self) -> bool {
        matches!(self.items.as_slice(), [Item::Star { step: 1 }])
    }

    /// The field as croner reads it.
    fn canonical(&self) -> String {
        let items: Vec<String> = self
            .items
            .iter()
            .map(|item| match *item {
                Item::Star { step: 1 } => "*".to_owned(),
                Item::Star { step } => format!("*/{step}"),
                Item::Value(v) => v.to_string(),
                Item::Range {
                    start,
                    end,
                    step: 1,
                } => format!("{start}-{end}"),
                Item::Range { start, end, step } => format!("{start}-{end}/{step}"),
            })
            .collect();
        items.join(",")
    }

    /// The canonical text of a second, minute or hour field, written so that croner classifies
    /// the schedule as cm does.
    ///
    /// croner calls a field fixed when it selects one value without a wildcard or a step, so it
    /// would call `2-2` and `2,2` fixed; cm calls them interval fields, because a range or list
    /// was written. Rewriting such a field as the equivalent stepped range `v-v/2` selects the
    /// same single value and carries a step, which croner classifies as interval.
    fn canonical_time(&self) -> String {
        let single = self.values.count_ones() == 1;
        let has_star_or_step = self.items.iter().any(|item| {
            matches!(item, Item::Star { .. })
                || matches!(item, Item::Range { step, .. } if *step > 1)
        });
        if single && !self.is_single_value() && !has_star_or_step {
            let v = self.values.trailing_zeros();
            format!("{v}-{v}/2")
        } else {
            self.canonical()
        }
    }
}

/// The macros accepted, and the five fields each stands for.
const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Checks an expression field by field and produces its canonical form.
fn check_expression(expression: &str) -> Result<CheckedExpression, ScheduleError> {
    let chars = expression.chars().count();
    if chars > MAX_EXPRESSION_CHARS {
        return Err(ScheduleError::TooLong { chars });
    }
    // Fields are separated by spaces and tabs only. Any other character, a newline included,
    // stays inside a field and is refused there, so a pasted line with stray text cannot be
    // half-read.
    let mut tokens: Vec<&str> = expression
        .split([' ', '\t'])
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() {
        return Err(ScheduleError::Empty);
    }
    if tokens[0].starts_with('@') {
        tokens = expand_macro(tokens[0], tokens.len())?;
    }
    if tokens.len() != 5 && tokens.len() != 6 {
        // A wrong count can come from a separator cm does not know (a no-break space, an
        // ideographic space); naming that character is more useful than the count.
        if let Some(ch) = expression
            .chars()
            .find(|c| !(c.is_ascii_graphic() || *c == ' ' || *c == '\t'))
        {
            return Err(ScheduleError::Character { ch });
        }
        return Err(ScheduleError::FieldCount {
            found: tokens.len(),
        });
    }
    let (second_text, rest) = if tokens.len() == 6 {
        (tokens[0], &tokens[1..])
    } else {
        ("0", &tokens[..])
    };
    let second = parse_field(Field::Second, second_text)?;
    let minute = parse_field(Field::Minute, rest[0])?;
    let hour = parse_field(Field::Hour, rest[1])?;
    let dom = parse_field(Field::DayOfMonth, rest[2])?;
    let month = parse_field(Field::Month, rest[3])?;
    let dow = parse_field(Field::DayOfWeek, rest[4])?;

    // crontab(5): when both day fields are restricted (neither starts with `*`) a day matches
    // if either matches; otherwise both must. croner ORs unless a day field is exactly `*`, so
    // a field such as `*/2` needs croner's per-expression AND marker, a `+` before the
    // day-of-week field.
    let days_or = !dom.starts_with_star() && !dow.starts_with_star();
    if !days_or {
        check_calendar(&dom, &month, rest[2], rest[3])?;
    }
    let and_marker = if !days_or && !dom.is_star() && !dow.is_star() {
        "+"
    } else {
        ""
    };
    let canonical = format!(
        "{} {} {} {} {} {and_marker}{}",
        second.canonical_time(),
        minute.canonical_time(),
        hour.canonical_time(),
        dom.canonical(),
        month.canonical(),
        dow.canonical(),
    );
    Ok(CheckedExpression {
        canonical,
        fixed_time: second.is_single_value() && minute.is_single_value() && hour.is_single_value(),
    })
}

/// The fields a macro stands for; `@reboot` and unknown macros are refused.
fn expand_macro(name: &str, tokens: usize) -> Result<Vec<&'static str>, ScheduleError> {
    if name.eq_ignore_ascii_case("@reboot") {
        return Err(ScheduleError::Macro {
            name: name.to_owned(),
            reason: "a routine runs at scheduled times, not when the scheduler starts",
        });
    }
    let expansion = MACROS
        .iter()
        .find(|(m, _)| m.eq_ignore_ascii_case(name))
        .map(|(_, fields)| fields)
        .ok_or_else(|| ScheduleError::Macro {
            name: name.to_owned(),
            reason: "unknown macro (expected @yearly, @annually, @monthly, @weekly, @daily, \
                     @midnight or @hourly)",
        })?;
    if tokens != 1 {
        return Err(ScheduleError::Macro {
            name: name.to_owned(),
            reason: "a macro stands alone, with no other fields",
        });
    }
    Ok(expansion.split(' ').collect())
}

/// Refuses day-of-month and month fields that never meet (`30` in `2`), when the days must
/// match by day of month.
fn check_calendar(
    dom: &ParsedField,
    month: &ParsedField,
    dom_text: &str,
    month_text: &str,
) -> Result<(), ScheduleError> {
    // The longest each month can be: February has 29 days in leap years, and every day of a
    // month meets every weekday over the years, so this is exact.
    const LONGEST: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let first_day = dom.values.trailing_zeros();
    let fits = (1..=12u32)
        .filter(|m| month.values & (1 << m) != 0)
        .any(|m| first_day <= LONGEST[(m - 1) as usize]);
    if fits {
        Ok(())
    } else {
        Err(ScheduleError::NeverFires {
            reason: format!("day-of-month {dom_text:?} never occurs in month {month_text:?}"),
        })
    }
}

/// Checks one field and returns its items and values.
fn parse_field(field: Field, text: &str) -> Result<ParsedField, ScheduleError> {
    let error = |reason: String| ScheduleError::Field {
        field,
        text: text.to_owned(),
        reason,
    };
    if let Some(ch) = text.chars().find(|c| !c.is_ascii()) {
        return Err(error(format!(
            "non-ASCII character {ch:?} (U+{:04X}); write digits as 0-9",
            u32::from(ch)
        )));
    }
    let (lo, hi) = field.bounds();
    let mut items = Vec::new();
    let mut values = 0u64;
    for part in text.split(',') {
        if part.is_empty() {
            return Err(error("empty list item".to_owned()));
        }
        let item = parse_item(field, part).map_err(error)?;
        let (start, end, step) = match item {
            Item::Star { step } => (lo, hi, step),
            Item::Value(v) => (v, v, 1),
            Item::Range { start, end, step } => (start, end, step),
        };
        let mut v = start;
        while v <= end {
            values |= 1 << v;
            v += step;
        }
        items.push(item);
    }
    Ok(ParsedField { items, values })
}

/// Checks one list item: `*`, `*/step`, a value, `a-b` or `a-b/step`.
fn parse_item(field: Field, part: &str) -> Result<Item, String> {
    let (_, hi) = field.bounds();
    let (base, step) = match part.split_once('/') {
        Some((base, step_text)) => (base, Some(parse_step(field, step_text)?)),
        None => (part, None),
    };
    if base == "*" {
        return Ok(Item::Star {
            step: step.unwrap_or(1),
        });
    }
    match base.split_once('-') {
        Some((start_text, end_text)) => {
            let start = parse_value(field, start_text)?;
            let mut end = parse_value(field, end_text)?;
            // `FRI-SUN` means Friday to Sunday: a range that ends on Sunday by name ends on 7.
            if field == Field::DayOfWeek
                && end == 0
                && start > 0
                && end_text.eq_ignore_ascii_case("SUN")
            {
                end = 7;
            }
            if start > end {
                return Err(format!(
                    "range {start_text}-{end_text} runs backwards (its start is after its end)"
                ));
            }
            Ok(Item::Range {
                start,
                end,
                step: step.unwrap_or(1),
            })
        }
        None => {
            let value = parse_value(field, base)?;
            if step.is_some() {
                return Err(format!(
                    "a step needs `*` or a range before it (write */{s} or {value}-{hi}/{s})",
                    s = step.unwrap_or(1)
                ));
            }
            Ok(Item::Value(value))
        }
    }
}

/// Checks a step: a number from 1 to the number of values in the field.
fn parse_step(field: Field, text: &str) -> Result<u32, String> {
    let (lo, hi) = field.bounds();
    if text.contains('/') {
        return Err("more than one `/` in an item".to_owned());
    }
    if text.is_empty() {
        return Err("`/` must be followed by a step".to_owned());
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("step {text:?} is not a number"));
    }
    let span = hi - lo + 1;
    match text.parse::<u32>() {
        Ok(0) => Err("step 0 is not allowed (a step is at least 1)".to_owned()),
        Ok(step) if step <= span => Ok(step),
        _ => Err(format!(
            "step {text} is larger than the {span} values in {lo}-{hi}"
        )),
    }
}

/// Checks a value: a number in the field's range, or a month or weekday name.
fn parse_value(field: Field, text: &str) -> Result<u32, String> {
    let (lo, hi) = field.bounds();
    if text.is_empty() {
        return Err("a range needs a value on each side of `-`".to_owned());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u32>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(v),
            _ => Err(format!("{text} is out of range {lo}-{hi}")),
        };
    }
    if text.bytes().all(|b| b.is_ascii_alphabetic()) {
        let names = field.names();
        if names.is_empty() {
            return Err(format!(
                "{text:?} is not a number (names are only allowed in the month and day-of-week \
                 fields)"
            ));
        }
        let first = if field == Field::Month { 1 } else { 0 };
        return names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(text))
            .map(|i| first + i as u32)
            .ok_or_else(|| {
                format!(
                    "unknown name {text:?} (expected one of {})",
                    names.join(", ")
                )
            });
    }
    Err(format!(
        "{text:?} is not a value (expected a number{}; `L`, `W`, `#` and `?` are not supported)",
        if field.names().is_empty() {
            ""
        } else {
            " or a name"
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `expr` parses in `zone` and that its fixed-time classification is
    /// `fixed`.
    #[track_caller]
    fn check(expr: &str, zone: &str, fixed: bool) {
        match Schedule::parse(expr, zone) {
            Ok(s) => assert_eq!(s.is_fixed_time(), fixed, "{expr:?} fixed-time"),
            Err(e) => panic!("{expr:?} in {zone} was refused: {e}"),
        }
    }

    /// Asserts that `expr` is refused in UTC with a one-line message containing `needle`.
    #[track_caller]
    fn check_err(expr: &str, needle: &str) {
        match Schedule::parse(expr, "UTC") {
            Ok(_) => panic!("{expr:?} was accepted"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(needle), "{expr:?}: {msg:?} lacks {needle:?}");
                assert!(!msg.contains('\n'), "{expr:?}: {msg:?} is not one line");
            }
        }
    }

    /// Asserts that the zone name is refused.
    #[track_caller]
    fn check_zone_err(zone: &str) {
        let err = Schedule::parse("0 0 * * *", zone).unwrap_err();
        assert!(matches!(err, ScheduleError::Zone(_)), "{zone:?}: {err}");
        assert!(err.to_string().contains("unknown time zone"), "{err}");
    }

    #[test]
    fn accepts_vixie_syntax() {
        check("* * * * *", "UTC", false);
        check("0 0 * * *", "UTC", true);
        check("30 2 * * *", "America/New_York", true);
        check("*/15 * * * *", "UTC", false);
        check("0 9-17 * * MON-FRI", "Europe/Berlin", false);
        check("0 9 * * mon-fri", "Europe/Berlin", true);
        check("0 12 13 * 5", "UTC", true);
        check("0 0 1 JAN,jul *", "UTC", true);
        check("0 0 * * 0", "UTC", true);
        check("0 0 * * 7", "UTC", true);
        check("0 0 * * FRI-SUN", "UTC", true);
        check("0 0 * * SUN-SAT", "UTC", true);
        check("0 0 * * 0-7/2", "UTC", true);
        check("5,10,15-20/5 1 * * *", "UTC", false);
        check("0 0 29 2 *", "UTC", true);
        check("0 0 31 1-12 *", "UTC", true);
        check("0 0 30 2 1", "UTC", true);
        check("0 0 31 4 SAT", "UTC", true);
        check("00 09 01 01 *", "UTC", true);
        check("\t0  0 * * *  ", "UTC", true);
        check("*/59 * * * *", "UTC", false);
        check("*/60 * * * *", "UTC", false);
        check("0 */24 * * *", "UTC", false);
    }

    #[test]
    fn accepts_six_fields_with_seconds_first() {
        check("*/20 * * * * *", "UTC", false);
        check("15 30 2 * * *", "Europe/Berlin", true);
        check("0 0 0 * * *", "UTC", true);
        check("59 59 23 31 12 6", "UTC", true);
        check("0-30/10 0 0 * * *", "UTC", false);
    }

    #[test]
    fn classifies_degenerate_ranges_and_lists_as_interval() {
        check("30 2-2 * * *", "UTC", false);
        check("30,30 2 * * *", "UTC", false);
        check("0 30 2 * * *", "UTC", true);
        check("0-0 30 2 * * *", "UTC", false);
    }

    #[test]
    fn accepts_macros_but_not_reboot() {
        check("@yearly", "UTC", true);
        check("@annually", "UTC", true);
        check("@monthly", "UTC", true);
        check("@weekly", "UTC", true);
        check("@daily", "UTC", true);
        check("@MIDNIGHT", "UTC", true);
        check("@hourly", "UTC", false);
        check_err("@reboot", "@reboot is not supported");
        check_err("@REBOOT", "not when the scheduler starts");
        check_err("@every", "@every needs a value");
        check_err("@fortnightly", "unknown macro");
        check_err("@daily *", "stands alone");
        check_err("0 0 @ * *", "day-of-month");
    }

    #[test]
    fn refuses_out_of_range_values_naming_the_field() {
        check_err("61 * * * *", "minute");
        check_err("61 * * * *", "61 is out of range 0-59");
        check_err("60 * * * *", "minute");
        check_err("* 24 * * *", "hour");
        check_err("* * 0 * *", "day-of-month");
        check_err("* * 32 * *", "day-of-month");
        check_err("* * * 0 *", "month");
        check_err("* * * 13 *", "month");
        check_err("* * * * 8", "day-of-week");
        check_err("60 * * * * *", "second");
        check_err("* 60 * * * *", "minute");
        check_err("0 0 1,32 * *", "day-of-month");
        check_err("0 0-24 * * *", "hour");
        check_err("99999999999999999999999 * * * *", "minute");
    }

    #[test]
    fn refuses_reversed_ranges_and_bad_steps() {
        check_err("5-1 * * * *", "minute");
        check_err("5-1 * * * *", "runs backwards");
        check_err("* 5-1 * * *", "hour");
        check_err("0 0 * * FRI-MON", "day-of-week");
        check_err("0 0 * DEC-JAN *", "month");
        check_err("*/0 * * * *", "minute");
        check_err("*/0 * * * *", "step 0");
        check_err("0 */0 * * *", "hour");
        check_err("0 0 1-31/0 * *", "day-of-month");
        check_err("*/61 * * * *", "larger than the 60 values");
        check_err("0 */25 * * *", "hour");
        check_err("5/10 * * * *", "a step needs `*` or a range");
        check_err("/10 * * * *", "minute");
        check_err("*/ * * * *", "followed by a step");
        check_err("*/5/2 * * * *", "more than one `/`");
        check_err("1-2-3 * * * *", "minute");
        check_err("1- * * * *", "minute");
        check_err("-1 * * * *", "minute");
        check_err("*/x * * * *", "not a number");
    }

    #[test]
    fn refuses_wrong_field_counts() {
        check_err("* * * *", "found 4");
        check_err("* * * * * * *", "found 7");
        check_err("0 0 1 1 * 2030 x", "found 7");
        check_err("*", "found 1");
        check_err("", "empty");
        check_err("   ", "empty");
    }

    #[test]
    fn refuses_non_ascii_digits_and_stray_characters() {
        // Arabic-Indic three, fullwidth five, Devanagari one.
        check_err("\u{663} * * * *", "minute");
        check_err("\u{663} * * * *", "non-ASCII");
        check_err("0 \u{ff15} * * *", "hour");
        check_err("0 0 \u{967} * *", "day-of-month");
        check_err("0 0 1 \u{ff11} *", "month");
        check_err("0 0 * * \u{ff11}", "day-of-week");
        check_err("\u{ff10} 0 0 * * *", "second");
        // An ideographic space is not a separator.
        check_err("0\u{3000}0 * * *", "U+3000");
        check_err("0 0 * * *\n", "day-of-week");
        check_err("0 0 * * *\n0 1 * * *", "U+000A");
        check_err("+5 * * * *", "minute");
        check_err("0 12 13 * +5", "day-of-week");
        check_err("0 0 1,,2 * *", "empty list item");
        check_err("0 0 1, * *", "empty list item");
        check_err("MON * * * *", "names are only allowed");
        check_err("0 0 * JAN MONDAY", "unknown name");
        check_err("0 0 * * JAN", "day-of-week");
        check_err("0 0 * MON *", "month");
    }

    #[test]
    fn refuses_quartz_and_croner_extensions() {
        check_err("0 0 L * *", "day-of-month");
        check_err("0 0 15W * *", "day-of-month");
        check_err("0 0 * * 5L", "day-of-week");
        check_err("0 0 * * MON#2", "day-of-week");
        check_err("0 0 ? * MON", "day-of-month");
        check_err("0 0 * * ?", "day-of-week");
    }

    #[test]
    fn refuses_expressions_longer_than_the_limit() {
        let list = (0..60).map(|m| m.to_string()).collect::<Vec<_>>().join(",");
        let long = format!("{list},{list},{list} * * * *");
        assert!(long.len() > MAX_EXPRESSION_CHARS);
        check_err(&long, "characters long, the limit is 256");
        let at_limit = format!("{} * * * *", "0,".repeat(122) + "0");
        assert!(at_limit.len() <= MAX_EXPRESSION_CHARS);
        check(&at_limit, "UTC", false);
    }

    #[test]
    fn refuses_schedules_that_never_fire() {
        check_err("0 9 30 2 *", "never fires");
        check_err(
            "0 9 30 2 *",
            "day-of-month \"30\" never occurs in month \"2\"",
        );
        check_err("0 0 31 4 *", "never fires");
        check_err("0 0 31 APR,JUN,SEP,NOV *", "never fires");
        check_err("0 0 30-31 2 *", "never fires");
        check_err("0 0 31 2,4 *", "never fires");
        check_err("0 0 30 2 */2", "never fires");
    }

    #[test]
    fn accepts_and_refuses_zones() {
        check("0 0 * * *", "UTC", true);
        check("0 0 * * *", "Europe/London", true);
        check("0 0 * * *", "Australia/Lord_Howe", true);
        check("0 0 * * *", "Etc/GMT+5", true);
        check("0 0 * * *", "America/Argentina/Buenos_Aires", true);
        check_zone_err("+02:00");
        check_zone_err("UTC+2");
        check_zone_err("GMT+5");
        check_zone_err("Mars/Olympus_Mons");
        check_zone_err("");
        check_zone_err("Europe/Berlin ");
    }

    #[test]
    fn zone_keeps_its_name() {
        let zone = Zone::parse("Europe/Berlin").unwrap();
        assert_eq!(zone.name(), "Europe/Berlin");
        assert_eq!(zone.to_string(), "Europe/Berlin");
        assert_eq!(zone.tz(), chrono_tz::Europe::Berlin);
        assert_eq!(Zone::UTC.name(), "UTC");
        let s = Schedule::new("@daily", zone).unwrap();
        assert_eq!(s.expression(), "@daily");
        assert_eq!(s.zone(), zone);
    }

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
