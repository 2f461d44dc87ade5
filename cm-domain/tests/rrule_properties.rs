//! Properties of RFC 5545 rules (`@rrule`):
//!
//! - a rule that says what a cron line says owes, tick by tick over the daylight-saving days of
//!   the zones of the other properties, exactly the occurrences the cron line's `next_after`
//!   lists, and exactly what the rule's own `next_after` (`schedule next`) lists, each once, at
//!   the first tick at or after it (the cron line's own walk is checked against references of
//!   its own elsewhere);
//! - a rule no cron line can say (`INTERVAL`, `BYSETPOS`, `BYWEEKNO`, `COUNT`, `WKST`), walked
//!   with `next_after` from any instant long after its start, lists exactly what the `rrule`
//!   crate expands from the start in UTC, where a wall time is its instant.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use cm_domain::{MisfirePolicy, MisfireRules, Schedule, plan_routine_due};
use proptest::prelude::*;
use uuid::Uuid;

use crate::rules_properties::{DAYS, ZONES};

/// A cron line and a rule that say the same.
const PAIRS: &[(&str, &str)] = &[
    ("30 2 * * *", "FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0"),
    ("0 9 * * *", "FREQ=DAILY;BYHOUR=9;BYMINUTE=0;BYSECOND=0"),
    ("0 0 * * *", "FREQ=DAILY;BYHOUR=0;BYMINUTE=0;BYSECOND=0"),
    ("0 * * * *", "FREQ=HOURLY;BYMINUTE=0;BYSECOND=0"),
    (
        "*/15 1-3 * * *",
        "FREQ=DAILY;BYHOUR=1,2,3;BYMINUTE=0,15,30,45;BYSECOND=0",
    ),
    (
        "*/10 * * * *",
        "FREQ=MINUTELY;INTERVAL=10;BYSECOND=0 from 2000-01-01T00:00:00Z",
    ),
    (
        "0 9 * * 1-5",
        "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "30 2 * * 0",
        "FREQ=WEEKLY;BYDAY=SU;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
    ),
    (
        "0 2 * * 5L",
        "FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=2;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "0 3 * * 0#1",
        "FREQ=MONTHLY;BYDAY=1SU;BYHOUR=3;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "0 9 * * 5#3",
        "FREQ=MONTHLY;BYDAY=3FR;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "0 9 L * *",
        "FREQ=MONTHLY;BYMONTHDAY=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "0 9 LW * *",
        "FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "15 1 1,15 * *",
        "FREQ=MONTHLY;BYMONTHDAY=1,15;BYHOUR=1;BYMINUTE=15;BYSECOND=0",
    ),
    (
        "0 */6 * 3,10 *",
        "FREQ=DAILY;BYMONTH=3,10;BYHOUR=0,6,12,18;BYMINUTE=0;BYSECOND=0",
    ),
    (
        "0 0 29 2 *",
        "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYHOUR=0;BYMINUTE=0;BYSECOND=0",
    ),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_rule_owes_tick_by_tick_what_the_cron_line_saying_the_same_lists(
        pair in prop::sample::select(PAIRS.to_vec()),
        zone in prop::sample::select(ZONES.to_vec()),
        day in prop::sample::select(DAYS.to_vec()),
        routine in any::<u128>(),
        steps in prop::collection::vec(1i64..900, 1..6),
    ) {
        let (cron, rule) = pair;
        let line = Schedule::parse(cron, zone).unwrap();
        let schedule = Schedule::parse(&format!("@rrule {rule}"), zone).unwrap();
        prop_assert_eq!(schedule.is_fixed_time(), line.is_fixed_time(), "{}", rule);
        let (y, m, d) = day;
        let start = Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap() - Duration::days(1);
        let horizon = start + Duration::days(3);
        let routine = Uuid::from_u128(routine);
        let rules = MisfireRules {
            grace: StdDuration::from_secs(86_400),
            max_backlog: 1_000,
            max_scan: 10_000,
        };
        let mut clock = schedule.next_after(start);
        let mut now = start;
        let mut owed = Vec::new();
        let mut step = steps.iter().cycle();
        while now < horizon {
            let before = now;
            now += Duration::seconds(*step.next().unwrap());
            let Some(at) = clock else { break };
            let plan = plan_routine_due(routine, at, &schedule, now, MisfirePolicy::CatchUp, &rules);
            prop_assert_eq!(plan.skipped, 0);
            for o in &plan.occurrences {
                prop_assert!(*o <= now && *o > before, "{} claimed at {}", o, now);
                owed.push(*o);
            }
            clock = plan.next_run_at;
        }
        let listed: Vec<DateTime<Utc>> = line
            .occurrences_after(start)
            .take_while(|o| *o <= now)
            .collect();
        prop_assert_eq!(&owed, &listed, "{} in {} against {}", rule, zone, cron);
        // And what `schedule next` lists for the rule itself.
        let own: Vec<DateTime<Utc>> = schedule
            .occurrences_after(start)
            .take_while(|o| *o <= now)
            .collect();
        prop_assert_eq!(&owed, &own, "{} in {}", rule, zone);
    }

    #[test]
    fn a_rule_walks_from_any_instant_what_the_crate_expands_from_its_start(
        rule in prop::sample::select(vec![
            "FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,TH;BYHOUR=9;BYMINUTE=30;BYSECOND=0",
            "FREQ=WEEKLY;INTERVAL=3;WKST=SU;BYDAY=SU,SA",
            "FREQ=MONTHLY;INTERVAL=2;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-2",
            "FREQ=MONTHLY;BYMONTHDAY=-3,10;BYHOUR=8,20",
            "FREQ=YEARLY;BYWEEKNO=1,27;BYDAY=MO;BYHOUR=6;BYMINUTE=0;BYSECOND=0",
            "FREQ=YEARLY;INTERVAL=2;BYYEARDAY=-1,100",
            "FREQ=DAILY;INTERVAL=5",
            "FREQ=HOURLY;INTERVAL=7;BYMINUTE=5,35",
            "FREQ=MINUTELY;INTERVAL=97;BYSECOND=0,30",
            "FREQ=MINUTELY;INTERVAL=20;BYHOUR=10,11,23",
            "FREQ=SECONDLY;INTERVAL=15;BYMINUTE=7,8;BYHOUR=3",
            "FREQ=SECONDLY;INTERVAL=7001",
            "FREQ=MONTHLY;COUNT=40;BYDAY=2TU",
            "FREQ=DAILY;COUNT=500;INTERVAL=3",
            "FREQ=WEEKLY;UNTIL=20340101T000000Z;BYDAY=WE",
        ]),
        start_days in 0i64..4_000,
        start_secs in 0i64..86_400,
        after_days in 0i64..3_000,
        after_secs in 0i64..86_400,
    ) {
        let anchor = NaiveDate::from_ymd_opt(2021, 1, 1).unwrap().and_hms_opt(0, 0, 0).unwrap()
            + Duration::days(start_days) + Duration::seconds(start_secs);
        let text = format!("@rrule {rule} from {}", anchor.format("%Y-%m-%dT%H:%M:%S"));
        let schedule = match Schedule::parse(&text, "UTC") {
            Ok(schedule) => schedule,
            // An UNTIL before the start leaves nothing.
            Err(e) => {
                prop_assert!(rule.contains("UNTIL") && e.to_string().contains("never"), "{}", e);
                return Ok(());
            }
        };
        let from = anchor.and_utc() + Duration::days(after_days) + Duration::seconds(after_secs);
        let walked: Vec<DateTime<Utc>> = schedule.occurrences_after(from).take(30).collect();
        let dt_start = rrule::Tz::UTC.from_utc_datetime(&anchor);
        let reference: rrule::RRule<rrule::Unvalidated> = rule.parse().unwrap();
        let expanded: Vec<DateTime<Utc>> = reference
            .build(dt_start)
            .unwrap()
            .after(rrule::Tz::UTC.from_utc_datetime(&(from + Duration::seconds(1)).naive_utc()))
            .all(30)
            .dates
            .iter()
            .map(|d| d.with_timezone(&Utc))
            .filter(|d| *d > from)
            .collect();
        prop_assert_eq!(&walked, &expanded, "{} from {}", text, from);
    }
}
