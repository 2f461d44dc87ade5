//! Properties of holiday calendars: for every generated calendar (dates around a
//! daylight-saving change, any weekly days off), fixed-time schedule in the calendar's zone
//! and policy, the ticks owe exactly the occurrences the calendar's rule owes, each once, each
//! at the first tick at or after the instant the rule plans it at. The rule is computed here
//! on its own, from the schedule without the calendar: an occurrence on a day off is not owed
//! (`skip`), or is planned at the first instant whose wall time in the zone is at or after the
//! occurrence's wall time on the next (`next`) or previous (`previous`) business day.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Utc, Weekday};
use cm_domain::{
    Calendar, MisfirePolicy, MisfireRules, OnHoliday, Schedule, Zone, plan_routine_due,
};
use proptest::prelude::*;
use uuid::Uuid;

use crate::rules_properties::{DAYS, ZONES};

#[derive(Debug, Clone)]
struct Case {
    text: String,
    time: chrono::NaiveTime,
    zone: &'static str,
    day: (i32, u32, u32),
    /// Days off, as offsets from `day`.
    offsets: BTreeSet<i64>,
    /// Weekly days off, a bit per day from Monday.
    weekly: u8,
    policy: OnHoliday,
    routine: u128,
    /// Seconds between ticks, cycled.
    steps: Vec<i64>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (0u32..24, prop::sample::select(vec![0u32, 15, 30, 59])),
        prop::sample::select(vec!["* * *", "* * 1-5", "* * 0,3,6", "1,15,31 * *"]),
        prop::sample::select(ZONES.to_vec()),
        prop::sample::select(DAYS.to_vec()),
        prop::collection::btree_set(-6i64..14, 0..8),
        (0u8..127),
        prop::sample::select(vec![OnHoliday::Skip, OnHoliday::Next, OnHoliday::Previous]),
        any::<u128>(),
        prop::collection::vec(60i64..7200, 1..6),
    )
        .prop_map(
            |((hour, minute), days, zone, day, offsets, weekly, policy, routine, steps)| Case {
                time: chrono::NaiveTime::from_hms_opt(hour, minute, 0).unwrap(),
                text: format!("{minute} {hour} {days}"),
                zone,
                day,
                offsets,
                weekly,
                policy,
                routine,
                steps,
            },
        )
}

/// The calendar's rule, written out on its own.
struct Rule {
    tz: chrono_tz::Tz,
    dates: BTreeSet<NaiveDate>,
    weekly: u8,
    policy: OnHoliday,
    /// The schedule's time of day.
    time: chrono::NaiveTime,
}

impl Rule {
    fn is_day_off(&self, date: NaiveDate) -> bool {
        self.weekly & (1 << date.weekday().num_days_from_monday()) != 0
            || self.dates.contains(&date)
    }

    /// The first instant whose wall time is at or after `wall`, on a minute.
    fn first_at_or_after(&self, wall: NaiveDateTime) -> DateTime<Utc> {
        let mut t = wall.and_utc() - Duration::hours(16);
        while t.with_timezone(&self.tz).naive_local() < wall {
            t += Duration::minutes(1);
        }
        t
    }

    /// Where the rule plans `occurrence`, or `None` when it is not owed.
    fn planned(&self, occurrence: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let wall = occurrence.with_timezone(&self.tz).naive_local();
        // The day its wall time was written for: a gap can push it past midnight.
        let day = if wall.time() < self.time && self.policy != OnHoliday::Skip {
            wall.date() - Duration::days(1)
        } else {
            wall.date()
        };
        if !self.is_day_off(day) {
            return Some(occurrence);
        }
        let step = match self.policy {
            OnHoliday::Skip => return None,
            OnHoliday::Next => 1,
            OnHoliday::Previous => -1,
        };
        (1..=366)
            .map(|n| day + Duration::days(n * step))
            .find(|d| !self.is_day_off(*d))
            .map(|d| self.first_at_or_after(d.and_time(self.time)))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_ticks_owe_what_the_calendar_rule_owes_each_once_when_planned(case in case()) {
        let (y, m, d) = case.day;
        let day = NaiveDate::from_ymd_opt(y, m, d).unwrap();
        let dates: BTreeSet<NaiveDate> =
            case.offsets.iter().map(|n| day + Duration::days(*n)).collect();
        let weekly: Vec<Weekday> = (0..7u8)
            .filter(|b| case.weekly & (1 << b) != 0)
            .map(|b| Weekday::try_from(b).unwrap())
            .collect();
        let zone = Zone::parse(case.zone).unwrap();
        let calendar = Arc::new(Calendar::new(zone, dates.iter().copied(), &weekly).unwrap());
        let bare = Schedule::parse(&case.text, case.zone).unwrap();
        let schedule = match bare.clone().with_calendar(calendar.clone(), case.policy) {
            Ok(schedule) => schedule,
            Err(e) => {
                // Refused only when every occurrence falls on a day off.
                prop_assert!(e.to_string().contains("day off"), "{}", e);
                return Ok(());
            }
        };
        let rule = Rule {
            tz: zone.tz(),
            dates,
            weekly: case.weekly,
            policy: case.policy,
            time: case.time,
        };
        let routine = Uuid::from_u128(case.routine);
        let start = Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap() - Duration::days(4);
        let horizon = start + Duration::days(16);
        let rules = MisfireRules {
            grace: StdDuration::from_secs(86_400),
            max_backlog: 100,
            max_scan: 10_000,
        };

        let Some((_, first_clock)) = schedule.next_planned_after(routine, start) else {
            return Ok(());
        };
        let mut clock = Some(first_clock);
        let mut now = start;
        let mut owed: Vec<DateTime<Utc>> = Vec::new();
        let mut step = case.steps.iter().cycle();
        while now < horizon {
            let before = now;
            now += Duration::seconds(*step.next().unwrap());
            let Some(at) = clock else { break };
            let plan = plan_routine_due(routine, at, &schedule, now, MisfirePolicy::CatchUp, &rules);
            prop_assert_eq!(plan.skipped, 0);
            for o in &plan.occurrences {
                let expected = rule.planned(*o);
                prop_assert_eq!(Some(schedule.planned(routine, *o)), expected, "{}", o);
                let planned = expected.unwrap();
                // Never early, and at the first tick at or after its planned instant.
                prop_assert!(planned <= now, "{} planned {} claimed at {}", o, planned, now);
                prop_assert!(planned > before, "{} planned {} claimed late at {}", o, planned, now);
                owed.push(*o);
            }
            clock = plan.next_run_at;
        }
        // What the rule owes: every occurrence of the schedule without the calendar (a move
        // reaches at most the longest stretch of days off away) that the rule keeps, planned
        // after the start and by the last tick.
        let expected: Vec<DateTime<Utc>> = bare
            .occurrences_after(start - Duration::days(40))
            .take_while(|o| *o <= now + Duration::days(40))
            .filter(|o| rule.planned(*o).is_some_and(|p| p > start && p <= now))
            .collect();
        let mut sorted = owed.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), owed.len(), "an occurrence was owed twice: {:?}", owed);
        prop_assert_eq!(&sorted, &expected, "{} {:?}", case.text, case.policy);
        // And `routine show` lists the same, from the first clock.
        let listed: Vec<DateTime<Utc>> = schedule
            .runs_from_clock(routine, first_clock)
            .take_while(|(_, planned)| *planned <= now)
            .map(|(o, _)| o)
            .collect();
        prop_assert_eq!(&listed, &owed);
    }
}
