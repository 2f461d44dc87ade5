//! Property tests for Quartz's `L`, `W` and `#` in cron lines: over a whole year of a zone with
//! awkward daylight-saving rules, the occurrences `next_after` walks are exactly those a
//! day-by-day reference written here finds.
//!
//! The reference reads the day fields its own way (the last day is the day before the next
//! month's first, the nearest weekday is found by looking at the days around, the nth weekday
//! by counting the same weekdays before it) and places each matching wall time in real time by
//! the rule of docs/guide/schedules.md: a fixed-time line fires at the earlier instant of a
//! repeated wall time and at the first instant after a gap that swallowed it; an interval line
//! fires at every instant of a matching wall time and at none in a gap. Whether a line can fire
//! at all is judged by looking at every day of 28 years (every kind of year).

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, TimeZone,
    Timelike, Utc, Weekday,
};
use chrono_tz::Tz;
use cm_domain::{Schedule, ScheduleError};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// Zones whose changes land on the Sundays `L` and `#` pick, with 30-minute and day-long gaps.
const ZONES: [&str; 10] = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "America/Santiago",
    "Pacific/Chatham",
    "America/St_Johns",
    "Antarctica/Troll",
    "Africa/Casablanca",
];

const WEEKDAY_NAMES: [&str; 7] = ["SUN", "mon", "Tue", "WED", "thu", "Fri", "SAT"];

/// One item of a generated day-of-month field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DomItem {
    Day(u32),
    Last,
    LastWeekday,
    Nearest(u32),
}

/// One item of a generated day-of-week field; weekdays 0 to 7 (0 and 7 are Sunday).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DowItem {
    Day(u32),
    Last(u32),
    Nth(u32, u32),
}

/// A generated day field: `*`, `*/step` (crontab's "unrestricted", so the day fields AND) or a
/// list.
#[derive(Debug, Clone)]
enum DayField<T> {
    Star,
    StarStep(u32),
    List(Vec<T>),
}

/// A generated expression, five fields.
#[derive(Debug, Clone)]
struct Spec {
    minute: String,
    minutes: Vec<u32>,
    hour: String,
    hours: Vec<u32>,
    dom: DayField<DomItem>,
    months: Option<Vec<u32>>,
    dow: DayField<DowItem>,
    /// Weekdays written as names where they can be.
    named: bool,
}

impl Spec {
    fn text(&self) -> String {
        let dom = match &self.dom {
            DayField::Star => "*".to_owned(),
            DayField::StarStep(n) => format!("*/{n}"),
            DayField::List(items) => items
                .iter()
                .map(|i| match i {
                    DomItem::Day(d) => d.to_string(),
                    DomItem::Last => "L".to_owned(),
                    DomItem::LastWeekday => "LW".to_owned(),
                    DomItem::Nearest(d) => format!("{d}W"),
                })
                .collect::<Vec<_>>()
                .join(","),
        };
        let weekday = |w: u32| {
            if self.named {
                WEEKDAY_NAMES[(w % 7) as usize].to_owned()
            } else {
                w.to_string()
            }
        };
        let dow = match &self.dow {
            DayField::Star => "*".to_owned(),
            DayField::StarStep(n) => format!("*/{n}"),
            DayField::List(items) => items
                .iter()
                .map(|i| match *i {
                    DowItem::Day(w) => weekday(w),
                    DowItem::Last(w) => format!("{}L", weekday(w)),
                    DowItem::Nth(w, n) => format!("{}#{n}", weekday(w)),
                })
                .collect::<Vec<_>>()
                .join(","),
        };
        let months = self.months.as_ref().map_or("*".to_owned(), |ms| {
            ms.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        });
        format!("{} {} {dom} {months} {dow}", self.minute, self.hour)
    }

    fn is_fixed_time(&self) -> bool {
        self.minute.bytes().all(|b| b.is_ascii_digit())
            && self.hour.bytes().all(|b| b.is_ascii_digit())
    }

    fn shares_l_and_lw(&self) -> bool {
        matches!(&self.dom, DayField::List(items)
            if items.contains(&DomItem::Last) && items.contains(&DomItem::LastWeekday))
    }

    /// Whether `date` matches the day and month fields.
    fn date_matches(&self, date: NaiveDate) -> bool {
        if let Some(months) = &self.months
            && !months.contains(&date.month())
        {
            return false;
        }
        let by_dom = match &self.dom {
            DayField::Star => true,
            DayField::StarStep(n) => (date.day() - 1).is_multiple_of(*n),
            DayField::List(items) => items.iter().any(|i| dom_item_matches(*i, date)),
        };
        let by_dow = match &self.dow {
            DayField::Star => true,
            DayField::StarStep(n) => {
                let w = date.weekday().num_days_from_sunday();
                w.is_multiple_of(*n) || (w == 0 && 7u32.is_multiple_of(*n))
            }
            DayField::List(items) => items.iter().any(|i| dow_item_matches(*i, date)),
        };
        // crontab(5): a field that starts with `*` is unrestricted, and the day fields AND.
        if !matches!(self.dom, DayField::List(_)) || !matches!(self.dow, DayField::List(_)) {
            by_dom && by_dow
        } else {
            by_dom || by_dow
        }
    }
}

/// The first day of the month after `date`'s.
fn next_month(date: NaiveDate) -> NaiveDate {
    let (y, m) = if date.month() == 12 {
        (date.year() + 1, 1)
    } else {
        (date.year(), date.month() + 1)
    };
    NaiveDate::from_ymd_opt(y, m, 1).unwrap()
}

fn last_day_of(date: NaiveDate) -> NaiveDate {
    next_month(date).pred_opt().unwrap()
}

fn is_weekend(date: NaiveDate) -> bool {
    matches!(date.weekday(), Weekday::Sat | Weekday::Sun)
}

/// Quartz's nearest weekday to `target`, looking at the days around it in its month: the day
/// itself if a weekday, else the closer weekday neighbour in the month (Friday before a
/// Saturday, Monday after a Sunday), else the one two days off.
fn nearest_weekday(target: NaiveDate) -> NaiveDate {
    if !is_weekend(target) {
        return target;
    }
    let same_month = |d: Option<NaiveDate>| d.filter(|d| d.month() == target.month());
    let before = same_month(target.pred_opt());
    let after = same_month(target.succ_opt());
    let first_choice = if target.weekday() == Weekday::Sat {
        before
    } else {
        after
    };
    if let Some(d) = first_choice.filter(|d| !is_weekend(*d)) {
        return d;
    }
    // The month ends (or starts) there: two days the other way.
    let two = if target.weekday() == Weekday::Sat {
        target + TimeDelta::days(2)
    } else {
        target - TimeDelta::days(2)
    };
    assert_eq!(two.month(), target.month());
    two
}

fn dom_item_matches(item: DomItem, date: NaiveDate) -> bool {
    match item {
        DomItem::Day(d) => date.day() == d,
        DomItem::Last => date == last_day_of(date),
        DomItem::LastWeekday => date == nearest_weekday(last_day_of(date)),
        DomItem::Nearest(d) => {
            NaiveDate::from_ymd_opt(date.year(), date.month(), d).map(nearest_weekday) == Some(date)
        }
    }
}

fn dow_item_matches(item: DowItem, date: NaiveDate) -> bool {
    let weekday = date.weekday().num_days_from_sunday();
    match item {
        DowItem::Day(w) => w % 7 == weekday,
        DowItem::Last(w) => w % 7 == weekday && (date + TimeDelta::days(7)).month() != date.month(),
        DowItem::Nth(w, n) => {
            let earlier = (1..date.day())
                .filter(|d| {
                    NaiveDate::from_ymd_opt(date.year(), date.month(), *d)
                        .unwrap()
                        .weekday()
                        == date.weekday()
                })
                .count() as u32;
            w % 7 == weekday && earlier + 1 == n
        }
    }
}

/// The first instant whose wall time in `tz` is at or after `wall` (a whole minute), found by
/// walking minutes: the wall time's earlier instant, or for a wall time a gap swallowed, the
/// first instant after the gap.
fn first_instant_from(tz: Tz, wall: NaiveDateTime) -> DateTime<Utc> {
    let mut at = Utc.from_utc_datetime(&(wall - TimeDelta::hours(30)));
    while at.with_timezone(&tz).naive_local() < wall {
        at += TimeDelta::minutes(1);
    }
    at
}

/// The reference: every occurrence whose local date is in `from..=to`, in order.
fn reference(spec: &Spec, tz: Tz, from: NaiveDate, to: NaiveDate) -> Vec<DateTime<Utc>> {
    let mut found = Vec::new();
    let mut date = from;
    while date <= to {
        if spec.date_matches(date) {
            for &h in &spec.hours {
                for &m in &spec.minutes {
                    let wall = date.and_time(NaiveTime::from_hms_opt(h, m, 0).unwrap());
                    match tz.from_local_datetime(&wall) {
                        LocalResult::Single(at) => found.push(at.with_timezone(&Utc)),
                        LocalResult::Ambiguous(earlier, later) => {
                            found.push(earlier.with_timezone(&Utc));
                            if !spec.is_fixed_time() {
                                found.push(later.with_timezone(&Utc));
                            }
                        }
                        LocalResult::None => {
                            if spec.is_fixed_time() {
                                found.push(first_instant_from(tz, wall));
                            }
                        }
                    }
                }
            }
        }
        date = date.succ_opt().unwrap();
    }
    found.sort();
    found.dedup();
    found
}

/// Whether any day of 28 years (each kind of year, leap or not, starting on each weekday)
/// matches the day and month fields.
fn can_fire(spec: &Spec) -> bool {
    let mut date = NaiveDate::from_ymd_opt(2000, 1, 1).unwrap();
    while date.year() < 2028 {
        if spec.date_matches(date) {
            return true;
        }
        date = date.succ_opt().unwrap();
    }
    false
}

fn dom_item() -> impl Strategy<Value = DomItem> {
    prop_oneof![
        1 => (1..=31u32).prop_map(DomItem::Day),
        2 => Just(DomItem::Last),
        2 => Just(DomItem::LastWeekday),
        1 => prop::sample::select(vec![1u32, 2, 29, 30, 31]).prop_map(DomItem::Nearest),
        2 => (1..=31u32).prop_map(DomItem::Nearest),
    ]
}

fn dow_item() -> impl Strategy<Value = DowItem> {
    // Sunday (0 or 7) is weighted: most daylight-saving changes are on a Sunday.
    let weekday = prop_oneof![2 => prop::sample::select(vec![0u32, 7]), 3 => 0..=7u32];
    prop_oneof![
        1 => weekday.clone().prop_map(DowItem::Day),
        2 => weekday.clone().prop_map(DowItem::Last),
        3 => (weekday, 1..=5u32).prop_map(|(w, n)| DowItem::Nth(w, n)),
    ]
}

fn day_field<T: std::fmt::Debug + Clone>(
    item: impl Strategy<Value = T>,
    span: u32,
) -> impl Strategy<Value = DayField<T>> {
    prop_oneof![
        2 => Just(DayField::Star),
        1 => (2..=span).prop_map(DayField::StarStep),
        5 => prop::collection::vec(item, 1..=3).prop_map(DayField::List),
    ]
}

/// A zone, a year and an optional transition of that year whose gap or overlap pins the time.
#[derive(Debug, Clone)]
struct Place {
    zone: &'static str,
    year: i32,
    pin: Option<(usize, f64)>,
}

fn place() -> impl Strategy<Value = Place> {
    (
        prop_oneof![
            6 => (prop::sample::select(&ZONES[..]), 2000..2036i32),
            1 => Just(("Pacific/Apia", 2011)),
        ],
        prop::option::weighted(0.6, (0..4usize, 0.0..1.0f64)),
    )
        .prop_map(|((zone, year), pin)| Place { zone, year, pin })
}

/// How the time fields are written: one value each (fixed time), or a few times a day.
#[derive(Debug, Clone, Copy)]
enum TimeShape {
    Fixed,
    MinuteStep(u32),
    HourPair,
}

fn spec() -> impl Strategy<Value = (Spec, TimeShape)> {
    (
        0..60u32,
        0..24u32,
        prop_oneof![
            3 => Just(TimeShape::Fixed),
            1 => prop::sample::select(vec![15u32, 20, 30]).prop_map(TimeShape::MinuteStep),
            1 => Just(TimeShape::HourPair),
        ],
        day_field(dom_item(), 31),
        prop::option::weighted(0.2, prop::collection::btree_set(1..=12u32, 1..=3)),
        day_field(dow_item(), 7),
        any::<bool>(),
    )
        .prop_map(|(minute, hour, shape, dom, months, dow, named)| {
            let mut spec = Spec {
                minute: String::new(),
                minutes: Vec::new(),
                hour: String::new(),
                hours: Vec::new(),
                dom,
                months: months.map(|m| m.into_iter().collect()),
                dow,
                named,
            };
            set_time(&mut spec, hour, minute, shape);
            (spec, shape)
        })
}

/// Writes the time fields for `hour:minute` in `shape`.
fn set_time(spec: &mut Spec, hour: u32, minute: u32, shape: TimeShape) {
    match shape {
        TimeShape::Fixed => {
            spec.minute = minute.to_string();
            spec.minutes = vec![minute];
            spec.hour = hour.to_string();
            spec.hours = vec![hour];
        }
        TimeShape::MinuteStep(n) => {
            spec.minute = format!("*/{n}");
            spec.minutes = (0..60).step_by(n as usize).collect();
            spec.hour = hour.to_string();
            spec.hours = vec![hour];
        }
        TimeShape::HourPair => {
            let other = (hour + 1) % 24;
            spec.minute = minute.to_string();
            spec.minutes = vec![minute];
            spec.hour = format!("{},{}", hour.min(other), hour.max(other));
            spec.hours = vec![hour.min(other), hour.max(other)];
        }
    }
}

/// The instants of `year` where `tz`'s offset changes, found by bisection.
fn transitions(tz: Tz, year: i32) -> Vec<DateTime<Utc>> {
    let offset = |at: DateTime<Utc>| at.with_timezone(&tz).naive_local() - at.naive_utc();
    let mut found = Vec::new();
    let mut at = Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).unwrap();
    while at.year() == year {
        let next = at + TimeDelta::hours(6);
        if offset(at) != offset(next) {
            let (mut lo, mut hi) = (at, next);
            while hi - lo > TimeDelta::seconds(1) {
                let mid = lo + (hi - lo) / 2;
                if offset(mid) == offset(lo) {
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

fn check_case(mut spec: Spec, shape: TimeShape, place: &Place) -> Result<(), TestCaseError> {
    let tz: Tz = place.zone.parse().unwrap();
    // Pin the time inside a gap or overlap of the year, so that the days `L`, `W` and `#` pick
    // often meet one.
    let all = transitions(tz, place.year);
    if let (Some((i, fraction)), false) = (place.pin, all.is_empty()) {
        let t = all[i % all.len()];
        let before =
            (t - TimeDelta::seconds(1)).with_timezone(&tz).naive_local() + TimeDelta::seconds(1);
        let after = t.with_timezone(&tz).naive_local();
        let (from, len) = if after > before {
            (before, after - before)
        } else {
            (after, before - after)
        };
        let wall = from + TimeDelta::seconds((len.num_seconds() as f64 * fraction) as i64);
        set_time(&mut spec, wall.hour(), wall.minute(), shape);
    }
    let text = spec.text();
    let parsed = Schedule::parse(&text, place.zone);
    if spec.shares_l_and_lw() {
        let err = parsed.expect_err("L and LW in one list are refused");
        prop_assert!(
            err.to_string().contains("cannot share a list"),
            "{:?}: {}",
            text,
            err
        );
        return Ok(());
    }
    let schedule = match parsed {
        Ok(s) => s,
        Err(ScheduleError::NeverFires { .. }) if !can_fire(&spec) => return Ok(()),
        Err(e) => return Err(TestCaseError::fail(format!("{text:?} refused: {e}"))),
    };
    prop_assert!(can_fire(&spec), "{:?} was accepted but never fires", text);
    prop_assert_eq!(schedule.is_fixed_time(), spec.is_fixed_time(), "{:?}", text);

    // The year, and a day either side, in local dates; compared strictly inside, so that
    // instants moved across the edge by a gap are on both sides.
    let first = NaiveDate::from_ymd_opt(place.year, 1, 1).unwrap();
    let last = NaiveDate::from_ymd_opt(place.year, 12, 31).unwrap();
    let expected = reference(
        &spec,
        tz,
        first.pred_opt().unwrap().pred_opt().unwrap(),
        last.succ_opt().unwrap().succ_opt().unwrap(),
    );
    let midnight = |date: NaiveDate| first_instant_from(tz, date.and_hms_opt(0, 0, 0).unwrap());
    let (start, end) = (midnight(first), midnight(last.succ_opt().unwrap()));
    let expected: Vec<_> = expected
        .into_iter()
        .filter(|at| *at > start && *at <= end)
        .collect();
    let walked: Vec<_> = schedule
        .occurrences_after(start)
        .take_while(|at| *at <= end)
        .collect();
    prop_assert_eq!(
        walked,
        expected,
        "{:?} in {} over {}",
        text,
        place.zone,
        place.year
    );
    Ok(())
}

proptest! {
    #![proptest_config(Config {
        // PROPTEST_CASES raises the count for a deeper run; the default keeps the file fast.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(96),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    })]

    /// A year of occurrences of a line with `L`, `W` or `#` is the reference's, day by day,
    /// across the year's daylight-saving changes.
    #[test]
    fn quartz_days_agree_with_the_reference((spec, shape) in spec(), place in place()) {
        check_case(spec, shape, &place)?;
    }
}

/// The reference's own reading of the rules, on days worked by hand.
#[test]
fn the_reference_reads_quartz_days_as_quartz_does() {
    let date = |y, m, d| NaiveDate::from_ymd_opt(y, m, d).unwrap();
    // 1 August 2026 is a Saturday, 31 May 2026 a Sunday, 15 November 2026 a Sunday.
    assert_eq!(nearest_weekday(date(2026, 8, 1)), date(2026, 8, 3));
    assert_eq!(nearest_weekday(date(2026, 5, 31)), date(2026, 5, 29));
    assert_eq!(nearest_weekday(date(2026, 11, 15)), date(2026, 11, 16));
    assert_eq!(nearest_weekday(date(2026, 11, 14)), date(2026, 11, 13));
    assert!(dom_item_matches(DomItem::LastWeekday, date(2026, 10, 30)));
    assert!(dow_item_matches(DowItem::Nth(5, 3), date(2026, 12, 18)));
    assert!(dow_item_matches(DowItem::Last(5), date(2026, 12, 25)));
    assert!(!dow_item_matches(DowItem::Nth(5, 5), date(2027, 2, 26)));
    assert!(dow_item_matches(DowItem::Last(7), date(2027, 3, 28)));
}
