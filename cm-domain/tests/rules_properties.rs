//! Properties of schedules beyond one cron line: whatever the rule (cron or `@every`), zone,
//! window and exclusions, the occurrences `next_after` walks are exactly the bare rule's
//! occurrences inside the window that no exclusion drops, with the exclusions judged here by an
//! oracle of their own (the wall-clock date's weekday, the wall-clock minute), in order, none
//! twice.

use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};
use cm_domain::Schedule;
use proptest::prelude::*;

pub(crate) const ZONES: &[&str] = &[
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Apia",
];

/// Days around daylight-saving changes of the zones above (and one without any).
pub(crate) const DAYS: &[(i32, u32, u32)] = &[
    (2026, 3, 8),
    (2026, 3, 28),
    (2026, 4, 4),
    (2026, 10, 3),
    (2026, 10, 24),
    (2026, 10, 31),
    (2011, 12, 29),
    (2026, 7, 1),
];

#[derive(Debug, Clone)]
enum RuleSpec {
    Cron(&'static str),
    Every { every: u32, offset: u32 },
}

impl RuleSpec {
    fn text(&self) -> String {
        match self {
            RuleSpec::Cron(c) => (*c).to_string(),
            RuleSpec::Every { every, offset } if *offset > 0 => {
                format!("@every {every}m offset {offset}m")
            }
            RuleSpec::Every { every, .. } => format!("@every {every}m"),
        }
    }
}

fn rule() -> impl Strategy<Value = RuleSpec> {
    prop_oneof![
        prop::sample::select(vec![
            "*/7 * * * *",
            "30 2 * * *",
            "0 */3 * * *",
            "15,45 1-3 * * *",
            "0 9 * * 1-5",
        ])
        .prop_map(RuleSpec::Cron),
        (1u32..200)
            .prop_flat_map(|every| (Just(every), 0..every))
            .prop_map(|(every, offset)| RuleSpec::Every { every, offset }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    rule: RuleSpec,
    zone: &'static str,
    day: (i32, u32, u32),
    /// Hours after the search's start the window opens and closes.
    from_hours: Option<u32>,
    until_hours: Option<u32>,
    /// Weekdays (0 = Sunday) excluded as whole days.
    except_days: Vec<u32>,
    /// A wall-clock minute (hour, minute) excluded every day.
    except_minute: Option<(u32, u32)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        rule(),
        prop::sample::select(ZONES.to_vec()),
        prop::sample::select(DAYS.to_vec()),
        prop::option::of(0u32..30),
        prop::option::of(10u32..60),
        prop::collection::vec(0u32..7, 0..2),
        // `0 0 * * *` names days, not the minute after midnight.
        prop::option::of(
            (0u32..24, prop::sample::select(vec![0u32, 15, 30, 45, 7]))
                .prop_filter("a minute, not a day", |hm| *hm != (0, 0)),
        ),
    )
        .prop_map(
            |(rule, zone, day, from_hours, until_hours, except_days, except_minute)| Case {
                rule,
                zone,
                day,
                from_hours,
                until_hours,
                except_days,
                except_minute,
            },
        )
}

impl Case {
    fn start(&self) -> DateTime<Utc> {
        let (y, m, d) = self.day;
        Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap()
    }

    fn from(&self) -> Option<DateTime<Utc>> {
        self.from_hours
            .map(|h| self.start() + Duration::hours(h.into()))
    }

    fn until(&self) -> Option<DateTime<Utc>> {
        self.until_hours
            .map(|h| self.start() + Duration::hours(h.into()))
    }

    fn text(&self) -> String {
        let mut text = self.rule.text();
        for d in &self.except_days {
            text += &format!(" except 0 0 * * {d}");
        }
        if let Some((h, m)) = self.except_minute {
            text += &format!(" except {m} {h} * * *");
        }
        if let Some(from) = self.from() {
            text += &format!(" from {}", from.to_rfc3339());
        }
        if let Some(until) = self.until() {
            text += &format!(" until {}", until.to_rfc3339());
        }
        text
    }

    /// The oracle: whether the occurrence at `at` is owed, judged from its wall time.
    fn owed(&self, at: DateTime<Utc>) -> bool {
        let tz: chrono_tz::Tz = self.zone.parse().unwrap();
        let wall = at.with_timezone(&tz);
        let weekday = wall.weekday().num_days_from_sunday();
        let minute_out = self
            .except_minute
            .is_some_and(|(h, m)| wall.hour() == h && wall.minute() == m);
        self.from().is_none_or(|f| at >= f)
            && self.until().is_none_or(|u| at <= u)
            && !self.except_days.contains(&weekday)
            && !minute_out
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn occurrences_are_the_rules_inside_the_window_that_no_exclusion_drops(case in case()) {
        let text = case.text();
        // The text splits into its parts and is written back the same.
        let parts = cm_domain::ScheduleText::parse(&text).unwrap();
        prop_assert_eq!(parts.to_string(), text.clone());
        prop_assert_eq!(parts.rule, case.rule.text());
        let horizon = case.start() + Duration::hours(72);
        let bare = Schedule::parse(&case.rule.text(), case.zone).unwrap();
        let expected: Vec<_> = bare
            .occurrences_after(case.start())
            .take_while(|at| *at <= horizon)
            .filter(|at| case.owed(*at))
            .collect();
        match Schedule::parse(&text, case.zone) {
            Ok(schedule) => {
                let listed: Vec<_> = schedule
                    .occurrences_after(case.start())
                    .take_while(|at| *at <= horizon)
                    .collect();
                prop_assert_eq!(&listed, &expected, "{}", text);
                prop_assert!(listed.windows(2).all(|w| w[0] < w[1]));
                // A search from inside the list resumes on the list.
                if let Some(middle) = listed.get(listed.len() / 2) {
                    let resumed: Vec<_> = schedule
                        .occurrences_after(*middle)
                        .take_while(|at| *at <= horizon)
                        .collect();
                    prop_assert_eq!(&resumed[..], &listed[listed.len() / 2 + 1..]);
                }
                if let Some(until) = case.until() {
                    prop_assert!(schedule.next_after(until).is_none());
                    prop_assert!(schedule.is_over_after(until));
                }
            }
            // Refused only when the window and the exclusions leave nothing at all.
            Err(e) => {
                // Refused only when nothing is ever owed: the oracle finds nothing in a month.
                let month = case.start() + Duration::days(30);
                let owed_in_a_month = bare
                    .occurrences_after(case.start())
                    .take_while(|at| *at <= month)
                    .any(|at| case.owed(at));
                prop_assert!(!owed_in_a_month, "{} refused: {}", text, e);
                prop_assert!(e.to_string().contains("never fires") || e.to_string().contains("ends"), "{}", e);
            }
        }
    }

    /// An interval is zone-independent: the same instants in every zone, `every` apart.
    #[test]
    fn an_interval_is_the_same_absolute_instants_in_every_zone(
        every in 1u32..500, offset_frac in 0.0f64..1.0, zone in prop::sample::select(ZONES.to_vec()),
        day in prop::sample::select(DAYS.to_vec()),
    ) {
        let offset = (f64::from(every) * offset_frac) as u32;
        let text = format!("@every {every}m offset {offset}m");
        let text = if offset == 0 { format!("@every {every}m") } else { text };
        let start = Utc.with_ymd_and_hms(day.0, day.1, day.2, 0, 0, 0).unwrap();
        let here: Vec<_> = Schedule::parse(&text, zone).unwrap().occurrences_after(start).take(50).collect();
        let utc: Vec<_> = Schedule::parse(&text, "UTC").unwrap().occurrences_after(start).take(50).collect();
        prop_assert_eq!(&here, &utc);
        for w in here.windows(2) {
            prop_assert_eq!(w[1] - w[0], Duration::minutes(every.into()));
        }
        for at in &here {
            prop_assert_eq!((at.timestamp() - i64::from(offset) * 60).rem_euclid(i64::from(every) * 60), 0);
        }
    }
}

/// `@every 90m` on the night Berlin's clocks go back: 90 minutes apart, through the repeated
/// hour.
#[test]
fn every_ninety_minutes_keeps_its_pace_through_the_fall_back_night() {
    let s = Schedule::parse("@every 90m", "Europe/Berlin").unwrap();
    let start = Utc.with_ymd_and_hms(2026, 10, 24, 23, 0, 0).unwrap();
    let got: Vec<String> = s
        .occurrences_after(start)
        .take(4)
        .map(|t| t.with_timezone(&chrono_tz::Europe::Berlin).to_rfc3339())
        .collect();
    assert_eq!(
        got,
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T04:00:00+01:00",
            "2026-10-25T05:30:00+01:00",
        ]
    );
}

/// `@at` fires once, then the schedule is over.
#[test]
fn a_one_shot_fires_once() {
    let s = Schedule::parse("@at 2026-12-24T15:30", "Europe/Berlin").unwrap();
    let before = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
    let at = Utc.with_ymd_and_hms(2026, 12, 24, 14, 30, 0).unwrap();
    assert_eq!(s.next_after(before), Some(at));
    assert_eq!(s.next_after(at), None);
    assert!(s.is_over_after(at) && !s.is_over_after(before) && s.is_one_shot());
    assert!(
        Schedule::parse("@at 2026-12-24T15:30 until 2026-12-24", "Europe/Berlin")
            .unwrap_err()
            .to_string()
            .contains("never fires")
    );
}

/// A day exclusion drops the whole wall-clock day, the day the clocks change included; a
/// minute exclusion drops both passes through a repeated minute.
#[test]
fn exclusions_drop_days_and_minutes_across_daylight_saving() {
    let berlin = chrono_tz::Europe::Berlin;
    let s = Schedule::parse("*/30 * * * * except 0 0 29 3 *", "Europe/Berlin").unwrap();
    let start = Utc.with_ymd_and_hms(2026, 3, 28, 23, 0, 0).unwrap();
    let walls: Vec<String> = s
        .occurrences_after(start)
        .take(2)
        .map(|t| t.with_timezone(&berlin).to_rfc3339())
        .collect();
    // 2026-03-28T23:00Z is 00:00 on the 29th in Berlin: the whole 29th is out.
    assert_eq!(
        walls,
        ["2026-03-30T00:00:00+02:00", "2026-03-30T00:30:00+02:00"]
    );

    let s = Schedule::parse("*/15 * * * * except 30 2 * * *", "Europe/Berlin").unwrap();
    let start = Utc.with_ymd_and_hms(2026, 10, 24, 23, 50, 0).unwrap();
    let walls: Vec<String> = s
        .occurrences_after(start)
        .take_while(|t| *t < Utc.with_ymd_and_hms(2026, 10, 25, 2, 0, 0).unwrap())
        .map(|t| t.with_timezone(&berlin).format("%H:%M%:z").to_string())
        .collect();
    assert_eq!(
        walls,
        [
            "02:00+02:00",
            "02:15+02:00",
            "02:45+02:00",
            "02:00+01:00",
            "02:15+01:00",
            "02:45+01:00",
        ]
    );
}

/// Bad clauses are refused with one line naming the clause.
#[test]
fn bad_clauses_are_refused_with_one_line_naming_them() {
    for (text, needle) in [
        ("@every 0m", "@every 0m"),
        ("@every 90m offset 90m", "offset must be shorter"),
        ("@every 5x", "not a unit"),
        ("@at next tuesday", "@at \"next tuesday\""),
        ("0 9 * * * from 2026-13-01", "from \"2026-13-01\""),
        ("0 9 * * * from 2026-12-10 until 2026-12-01", "ends"),
        ("0 9 * * * until 2026-12-01 from 2026-11-01", "order"),
        ("0 9 * * * except 61 * * * *", "except"),
        ("0 9 * * * except", "except"),
        ("* * * * * except * * * * *", "never fires"),
        ("0 9 * * * from 2026-01-01 from 2026-02-01", "twice"),
    ] {
        let e = Schedule::parse(text, "UTC").unwrap_err().to_string();
        assert!(e.contains(needle), "{text:?}: {e:?} lacks {needle:?}");
        assert!(!e.contains('\n'));
    }
}
