//! Property tests for `Schedule::next_after`, checked against an independent brute-force oracle.
//!
//! Expressions are generated from their parts (each field a single value, `*`, `*/n`, a range,
//! a stepped range or a list), so the test knows the set of values each field selects without
//! asking croner. The oracle walks real time minute by minute, converts each instant to wall
//! time with chrono-tz, and applies the rule of docs/guide/design.md ("Time and daylight saving"): an interval schedule fires
//! at every instant whose wall time matches; a fixed-time schedule fires at the earlier instant
//! of a matching wall time and at the first instant after a gap that swallowed its wall time.
//!
//! Start instants are drawn near real daylight-saving transitions of zones chosen for their
//! awkward rules, and fixed times are often pinned inside the gap or overlap, because a uniform
//! draw over forty years would almost never land there.

use chrono::{
    DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeDelta, TimeZone, Timelike,
    Utc,
};
use chrono_tz::Tz;
use cm_domain::{Schedule, ScheduleError};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// Zones with awkward daylight-saving rules, plus UTC.
const ZONES: [&str; 17] = [
    "UTC",
    "America/New_York",
    "America/Los_Angeles",
    "America/St_Johns",
    "America/Santiago",
    "America/Sao_Paulo",
    "America/Havana",
    "Europe/London",
    "Europe/Berlin",
    "Europe/Dublin",
    "Africa/Casablanca",
    "Asia/Tehran",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Pacific/Apia",
    "Antarctica/Troll",
];

/// How far past each start the oracle looks for a skipped occurrence.
const WINDOW: TimeDelta = TimeDelta::hours(26);

/// How many successive occurrences each case walks.
const CHAIN: usize = 4;

/// One list item of a generated field.
#[derive(Debug, Clone, Copy)]
enum Item {
    /// `*`.
    Star,
    /// `*/n`.
    StarStep(u32),
    /// `v`.
    Value(u32),
    /// `a-b`.
    Range(u32, u32),
    /// `a-b/n`.
    RangeStep(u32, u32, u32),
}

/// Which field a generated field is, for its bounds and names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Seconds, 0-59.
    Second,
    /// Minutes, 0-59.
    Minute,
    /// Hours, 0-23.
    Hour,
    /// Day of the month, 1-31.
    DayOfMonth,
    /// Month, 1-12.
    Month,
    /// Day of the week, 0-7 (both 0 and 7 are Sunday).
    DayOfWeek,
}

impl Kind {
    fn bounds(self) -> (u32, u32) {
        match self {
            Kind::Second | Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::DayOfMonth => (1, 31),
            Kind::Month => (1, 12),
            Kind::DayOfWeek => (0, 7),
        }
    }

    /// The name of value `v`, if the field has names and `v` has one.
    fn name(self, v: u32) -> Option<&'static str> {
        const MONTHS: [&str; 12] = [
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ];
        const DAYS: [&str; 7] = ["sun", "Mon", "TUE", "wed", "Thu", "FRI", "sat"];
        match self {
            Kind::Month => MONTHS.get(v as usize - 1).copied(),
            Kind::DayOfWeek => DAYS.get(v as usize).copied(),
            _ => None,
        }
    }
}

/// A generated field: its items and whether values are written as names where possible.
#[derive(Debug, Clone)]
struct FieldSpec {
    kind: Kind,
    items: Vec<Item>,
    named: bool,
}

impl FieldSpec {
    /// The field as written in the expression.
    fn text(&self) -> String {
        let value = |v: u32| match self.kind.name(v) {
            Some(name) if self.named => name.to_owned(),
            _ => v.to_string(),
        };
        let items: Vec<String> = self
            .items
            .iter()
            .map(|item| match *item {
                Item::Star => "*".to_owned(),
                Item::StarStep(n) => format!("*/{n}"),
                Item::Value(v) => value(v),
                Item::Range(a, b) => format!("{}-{}", value(a), value(b)),
                Item::RangeStep(a, b, n) => format!("{}-{}/{n}", value(a), value(b)),
            })
            .collect();
        items.join(",")
    }

    /// Whether the field selects `v`, computed from the items (day-of-week 7 is Sunday).
    fn selects(&self, v: u32) -> bool {
        let (lo, hi) = self.kind.bounds();
        let stepped =
            |a: u32, b: u32, n: u32, x: u32| a <= x && x <= b && (x - a).is_multiple_of(n);
        let hit = |x: u32| {
            self.items.iter().any(|item| match *item {
                Item::Star => true,
                Item::StarStep(n) => stepped(lo, hi, n, x),
                Item::Value(a) => a == x,
                Item::Range(a, b) => a <= x && x <= b,
                Item::RangeStep(a, b, n) => stepped(a, b, n, x),
            })
        };
        hit(v) || (self.kind == Kind::DayOfWeek && v == 0 && hit(7))
    }

    /// Whether the field is one plain number.
    fn is_single_value(&self) -> bool {
        matches!(self.items.as_slice(), [Item::Value(_)])
    }

    /// Whether the field starts with `*` (crontab(5)'s "unrestricted").
    fn starts_with_star(&self) -> bool {
        matches!(self.items.first(), Some(Item::Star | Item::StarStep(_)))
    }
}

/// A generated expression.
#[derive(Debug, Clone)]
struct Spec {
    /// `None` for a five-field expression (second 0).
    second: Option<FieldSpec>,
    minute: FieldSpec,
    hour: FieldSpec,
    dom: FieldSpec,
    month: FieldSpec,
    dow: FieldSpec,
}

impl Spec {
    fn text(&self) -> String {
        let five = format!(
            "{} {} {} {} {}",
            self.minute.text(),
            self.hour.text(),
            self.dom.text(),
            self.month.text(),
            self.dow.text()
        );
        match &self.second {
            Some(second) => format!("{} {five}", second.text()),
            None => five,
        }
    }

    fn second_matches(&self, s: u32) -> bool {
        self.second.as_ref().map_or(s == 0, |f| f.selects(s))
    }

    /// Whether the schedule is fixed-time: second, minute and hour each one plain number.
    fn is_fixed_time(&self) -> bool {
        self.second.as_ref().is_none_or(FieldSpec::is_single_value)
            && self.minute.is_single_value()
            && self.hour.is_single_value()
    }

    /// Whether the date matches (crontab(5): OR when both day fields are restricted).
    fn date_matches(&self, date: NaiveDate) -> bool {
        let dom = self.dom.selects(date.day());
        let dow = self.dow.selects(date.weekday().num_days_from_sunday());
        let days = if self.dom.starts_with_star() || self.dow.starts_with_star() {
            dom && dow
        } else {
            dom || dow
        };
        days && self.month.selects(date.month())
    }

    /// Whether the minute of `wall` matches, ignoring its second.
    fn minute_matches(&self, wall: NaiveDateTime) -> bool {
        self.minute.selects(wall.minute())
            && self.hour.selects(wall.hour())
            && self.date_matches(wall.date())
    }

    /// Whether the wall time matches every field.
    fn matches(&self, wall: NaiveDateTime) -> bool {
        self.second_matches(wall.second()) && self.minute_matches(wall)
    }

    /// Whether some date matches, by the calendar alone: with AND, a day-of-month and a month
    /// must meet (every such date falls on every weekday over the years).
    fn can_fire(&self) -> bool {
        const LONGEST: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        if !(self.dom.starts_with_star() || self.dow.starts_with_star()) {
            return true;
        }
        (1..=12).any(|m| {
            self.month.selects(m) && (1..=LONGEST[m as usize - 1]).any(|d| self.dom.selects(d))
        })
    }
}

/// The zone's offset (local minus UTC) at `at`.
fn offset(tz: Tz, at: DateTime<Utc>) -> TimeDelta {
    TimeDelta::seconds(i64::from(
        tz.offset_from_utc_datetime(&at.naive_utc())
            .fix()
            .local_minus_utc(),
    ))
}

/// The wall time at `at`.
fn wall(tz: Tz, at: DateTime<Utc>) -> NaiveDateTime {
    at.naive_utc() + offset(tz, at)
}

/// The brute-force oracle: which instants are occurrences, by the rule in docs/guide/design.md, "Time and daylight saving".
struct Oracle<'a> {
    spec: &'a Spec,
    tz: Tz,
}

impl Oracle<'_> {
    /// Whether `at` is an occurrence.
    fn is_occurrence(&self, at: DateTime<Utc>) -> bool {
        if at.nanosecond() != 0 {
            return false;
        }
        let here = wall(self.tz, at);
        if self.spec.matches(here) {
            if !self.spec.is_fixed_time() {
                return true;
            }
            // A fixed-time schedule runs only at the earlier instant of a repeated wall time.
            let earliest = self.tz.from_local_datetime(&here).earliest();
            if earliest.map(|e| e.with_timezone(&Utc)) == Some(at) {
                return true;
            }
        }
        self.spec.is_fixed_time() && self.gap_swallowed_a_run(at)
    }

    /// Whether `at` is the first instant after a gap that contains the fixed wall time on a
    /// matching date.
    fn gap_swallowed_a_run(&self, at: DateTime<Utc>) -> bool {
        let before = wall(self.tz, at - TimeDelta::seconds(1));
        let here = wall(self.tz, at);
        let gap_start = before + TimeDelta::seconds(1);
        if here <= gap_start {
            return false;
        }
        // The wall times [gap_start, here) never happen. A fixed-time schedule has one time of
        // day; try it on each date the gap touches.
        let value = |f: &FieldSpec| match f.items.as_slice() {
            [Item::Value(v)] => *v,
            _ => unreachable!("a fixed-time field is one value"),
        };
        let second = self.spec.second.as_ref().map_or(0, value);
        let time =
            NaiveTime::from_hms_opt(value(&self.spec.hour), value(&self.spec.minute), second)
                .unwrap();
        let mut date = gap_start.date();
        while date <= here.date() {
            let candidate = date.and_time(time);
            if gap_start <= candidate && candidate < here && self.spec.date_matches(date) {
                return true;
            }
            date = date.succ_opt().unwrap();
        }
        false
    }

    /// The first occurrence in `(after, until]`, found by walking every minute.
    fn first_between(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let seconds: Vec<u32> = (0..60).filter(|s| self.spec.second_matches(*s)).collect();
        let whole = after.timestamp() - after.timestamp().rem_euclid(60);
        let mut minute = DateTime::from_timestamp(whole, 0).unwrap();
        let mut previous_offset = offset(self.tz, minute - TimeDelta::seconds(1));
        while minute <= until {
            let off = offset(self.tz, minute);
            // Every transition the test draws falls on a whole minute, so one offset holds for
            // the whole minute, and a gap ends at the minute's first second.
            let mut candidates = Vec::new();
            if off != previous_offset {
                assert_eq!(
                    offset(self.tz, minute + TimeDelta::seconds(59)),
                    off,
                    "the oracle assumes transitions on whole minutes"
                );
                candidates.push(minute);
            }
            if self.spec.minute_matches(minute.naive_utc() + off) {
                candidates.extend(
                    seconds
                        .iter()
                        .map(|s| minute + TimeDelta::seconds(i64::from(*s))),
                );
            }
            candidates.sort();
            if let Some(found) = candidates
                .into_iter()
                .filter(|c| *c > after && *c <= until)
                .find(|c| self.is_occurrence(*c))
            {
                return Some(found);
            }
            previous_offset = off;
            minute += TimeDelta::minutes(1);
        }
        None
    }
}

/// A field of `kind`, weighted toward the shapes that matter for daylight saving.
fn field(kind: Kind, single_weight: u32) -> impl Strategy<Value = FieldSpec> {
    let (lo, hi) = kind.bounds();
    let span = hi - lo + 1;
    let value = lo..=hi;
    let range = (lo..=hi, lo..=hi).prop_map(|(a, b)| (a.min(b), a.max(b)));
    let item = prop_oneof![
        value.clone().prop_map(Item::Value),
        range.clone().prop_map(|(a, b)| Item::Range(a, b)),
    ];
    let items = prop_oneof![
        single_weight => value.prop_map(|v| vec![Item::Value(v)]),
        3 => Just(vec![Item::Star]),
        2 => (1..=span.min(20)).prop_map(|n| vec![Item::StarStep(n)]),
        1 => range.clone().prop_map(|(a, b)| vec![Item::Range(a, b)]),
        1 => (range, 1..=span).prop_map(|((a, b), n)| vec![Item::RangeStep(a, b, n)]),
        1 => prop::collection::vec(item, 2..=3),
    ];
    (items, any::<bool>()).prop_map(move |(items, named)| FieldSpec { kind, items, named })
}

/// A field that is exactly `*`.
fn star(kind: Kind) -> Just<FieldSpec> {
    Just(FieldSpec {
        kind,
        items: vec![Item::Star],
        named: false,
    })
}

/// A whole expression: five fields, or six with seconds first.
fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::option::weighted(0.3, field(Kind::Second, 6)),
        field(Kind::Minute, 6),
        field(Kind::Hour, 6),
        // Day fields are mostly `*`, so that most schedules fire within the oracle's window.
        prop_oneof![6 => star(Kind::DayOfMonth), 2 => field(Kind::DayOfMonth, 2)],
        prop_oneof![6 => star(Kind::Month), 1 => field(Kind::Month, 2)],
        prop_oneof![6 => star(Kind::DayOfWeek), 2 => field(Kind::DayOfWeek, 2)],
    )
        .prop_map(|(second, minute, hour, dom, month, dow)| Spec {
            second,
            minute,
            hour,
            dom,
            month,
            dow,
        })
}

/// The transitions (instants where the offset changes) of `tz` in `year`.
fn transitions(tz: Tz, year: i32) -> Vec<DateTime<Utc>> {
    let start = Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).unwrap();
    let mut found = Vec::new();
    let step = TimeDelta::hours(12);
    let mut at = start;
    while at.year() == year {
        let next = at + step;
        if offset(tz, at) != offset(tz, next) {
            // Bisect to the first second of the new offset.
            let (mut lo, mut hi) = (at, next);
            while hi - lo > TimeDelta::seconds(1) {
                let mid = lo + (hi - lo) / 2;
                let mid = DateTime::from_timestamp(mid.timestamp(), 0).unwrap();
                if offset(tz, mid) == offset(tz, lo) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            found.push(hi);
        }
        at = next;
    }
    found
}

/// How a case picks its start instant.
#[derive(Debug, Clone)]
struct Start {
    zone: &'static str,
    year: i32,
    /// Which transition of the year, modulo their number.
    transition: usize,
    /// Seconds from the transition (or from the start of the year, if it has none).
    seconds: i64,
    /// Nanoseconds past the second, to check that fractions are handled.
    nanos: u32,
    /// Where in the gap or overlap to pin the time fields, as a fraction of its length, and
    /// whether to make every time field a single value (a fixed-time schedule) first.
    pin: Option<(f64, bool)>,
}

/// A zone, a year and a start near one of the year's transitions.
fn start() -> impl Strategy<Value = Start> {
    (
        // Pacific/Apia skipped 2011-12-30 entirely, the longest gap in the range; it gets its
        // own share of cases because a uniform draw would rarely reach it.
        prop_oneof![
            7 => (prop::sample::select(&ZONES[..]), 2000..2040i32),
            1 => Just(("Pacific/Apia", 2011)),
        ],
        0..4usize,
        prop_oneof![3 => -4 * 3600..4 * 3600i64, 1 => 0..365 * 86_400i64],
        prop_oneof![3 => Just(0u32), 1 => 0..1_000_000_000u32],
        prop::option::weighted(0.5, (0.0..1.0f64, any::<bool>())),
    )
        .prop_map(|((zone, year), transition, seconds, nanos, pin)| Start {
            zone,
            year,
            transition,
            seconds,
            nanos,
            pin,
        })
}

/// Pins the single-value time fields of `spec` to `wall`; with `force`, makes every time field
/// a single value first.
fn pin_time(spec: &mut Spec, wall: NaiveDateTime, force: bool) {
    let pin = |field: &mut FieldSpec, value: u32| {
        if force || field.is_single_value() {
            field.items = vec![Item::Value(value)];
        }
    };
    pin(&mut spec.hour, wall.hour());
    pin(&mut spec.minute, wall.minute());
    if let Some(second) = spec.second.as_mut() {
        pin(second, wall.second());
    } else if wall.second() != 0 && force {
        spec.second = Some(FieldSpec {
            kind: Kind::Second,
            items: vec![Item::Value(wall.second())],
            named: false,
        });
    }
}

/// Runs one case: parses, then walks `CHAIN` occurrences, checking each against the oracle.
fn check_case(mut spec: Spec, start: &Start) -> Result<(), TestCaseError> {
    let tz: Tz = start.zone.parse().unwrap();
    let all = transitions(tz, start.year);
    let (base, before) = if all.is_empty() {
        (
            Utc.with_ymd_and_hms(start.year, 1, 1, 0, 0, 0).unwrap(),
            false,
        )
    } else {
        let t = all[start.transition % all.len()];
        if let Some((fraction, force)) = start.pin {
            // A wall time inside the gap (wall times that never happen) or the overlap (wall
            // times that happen twice) of this transition.
            let before = wall(tz, t - TimeDelta::seconds(1)) + TimeDelta::seconds(1);
            let after = wall(tz, t);
            let (from, len) = if after > before {
                (before, after - before)
            } else {
                (after, before - after)
            };
            let into = TimeDelta::seconds((len.num_seconds() as f64 * fraction) as i64);
            pin_time(&mut spec, from + into, force);
        }
        (t, start.pin.is_some())
    };
    // A pinned schedule runs in the transition's gap or overlap, so its walk starts up to a
    // day before the transition (and a little after) to reach that run.
    let seconds = if before {
        start.seconds.rem_euclid(28 * 3600) - 26 * 3600
    } else {
        start.seconds
    };
    let after = base + TimeDelta::seconds(seconds) + TimeDelta::nanoseconds(start.nanos.into());

    let text = spec.text();
    let schedule = match Schedule::parse(&text, start.zone) {
        Ok(s) => s,
        Err(ScheduleError::NeverFires { .. }) if !spec.can_fire() => return Ok(()),
        Err(e) => return Err(TestCaseError::fail(format!("{text:?} refused: {e}"))),
    };
    prop_assert!(spec.can_fire(), "{text:?} was accepted but can never fire");
    prop_assert_eq!(schedule.is_fixed_time(), spec.is_fixed_time(), "{:?}", text);

    let oracle = Oracle { spec: &spec, tz };
    let mut cursor = after;
    for step in 0..CHAIN {
        let next = schedule.next_after(cursor);
        let next = match next {
            Some(n) => n,
            None => {
                return Err(TestCaseError::fail(format!(
                    "{text:?} in {tz}: no occurrence after {cursor}"
                )));
            }
        };
        prop_assert!(
            next > cursor,
            "{:?} in {}: {} is not after {}",
            text,
            tz,
            next,
            cursor
        );
        prop_assert!(
            oracle.is_occurrence(next),
            "{:?} in {}: {} (wall {}) is not an occurrence (step {}, from {})",
            text,
            tz,
            next,
            wall(tz, next),
            step,
            cursor
        );
        // Nothing between the cursor and the result (within the window) was skipped.
        let until = next.min(cursor + WINDOW);
        let first = oracle.first_between(cursor, until);
        let expected = if next <= cursor + WINDOW {
            Some(next)
        } else {
            None
        };
        prop_assert_eq!(
            first,
            expected,
            "{:?} in {}: the oracle's first occurrence after {} differs (next_after gave {})",
            text,
            tz,
            cursor,
            next
        );
        cursor = next;
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config {
        // PROPTEST_CASES raises the count for a deeper run; the default keeps the file fast.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    })]

    /// next_after is strictly after its input, increases along a walk, lands only on
    /// occurrences, and skips none, near real daylight-saving transitions.
    #[test]
    fn next_after_agrees_with_the_oracle(spec in spec(), start in start()) {
        check_case(spec, &start)?;
    }

    /// A valid expression with one field broken (a value out of range, a reversed range or a
    /// step of 0) is refused with a message that names that field.
    #[test]
    fn a_broken_field_is_named(spec in spec(), which in 0..6usize, fault in 0..3u32) {
        let mut fields: Vec<FieldSpec> = [
            spec.second.clone().unwrap_or(FieldSpec { kind: Kind::Second, items: vec![Item::Value(0)], named: false }),
            spec.minute, spec.hour, spec.dom, spec.month, spec.dow,
        ]
        .into();
        let (lo, hi) = fields[which].kind.bounds();
        let broken = match fault {
            0 => Item::Value(hi + 1),
            1 => Item::Range(hi, hi - 1),
            _ => Item::RangeStep(lo, hi, 0),
        };
        fields[which].items.push(broken);
        let text: Vec<String> = fields.iter().map(FieldSpec::text).collect();
        let err = Schedule::parse(&text.join(" "), "UTC").unwrap_err().to_string();
        let name = ["second", "minute", "hour", "day-of-month", "month", "day-of-week"][which];
        prop_assert!(err.contains(&format!("{name} field")), "{:?}: {}", text, err);
    }
}
