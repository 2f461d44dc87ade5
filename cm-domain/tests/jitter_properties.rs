//! Properties of jitter: for every generated schedule (cron or interval), zone with
//! daylight-saving changes, window, exclusion and routine, the ticks owe exactly the
//! occurrences `runs_from_clock` lists (what `schedule next --routine-id` and `routine show`
//! print), each once, each at the first tick at or after its planned instant, and every offset
//! is inside `[0, jitter)` and the same on every call.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, TimeZone, Utc};
use cm_domain::{MisfirePolicy, MisfireRules, Schedule, plan_routine_due};
use proptest::prelude::*;
use uuid::Uuid;

use crate::rules_properties::{DAYS, ZONES};

/// Rules with their shortest interval in seconds, as far as the property's days go.
fn rule() -> impl Strategy<Value = (String, i64)> {
    prop_oneof![
        prop::sample::select(vec![
            ("*/7 * * * *".to_string(), 3 * 60),
            ("0 */3 * * *".to_string(), 3 * 3600),
            ("15,45 1-3 * * *".to_string(), 30 * 60),
            ("0 9 * * 1-5".to_string(), 86_400),
            ("*/20 * * * * *".to_string(), 20),
        ]),
        (1i64..200).prop_map(|every| (format!("@every {every}m"), every * 60)),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    text: String,
    jitter_seconds: i64,
    zone: &'static str,
    day: (i32, u32, u32),
    routine: u128,
    /// Seconds between ticks, cycled.
    steps: Vec<i64>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        rule(),
        prop::sample::select(ZONES.to_vec()),
        prop::sample::select(DAYS.to_vec()),
        any::<u128>(),
        prop::collection::vec(1i64..900, 1..8),
        prop::bool::ANY,
        0.0f64..1.0,
    )
        .prop_map(|((rule, gap), zone, day, routine, steps, except, frac)| {
            // Up to the shortest interval; the cron rules above keep theirs across the days'
            // clock changes too (a gap at 02:00 does not shorten `*/7 * * * *`).
            let jitter_seconds = ((gap as f64 * frac) as i64).max(1);
            let mut text = rule;
            if except {
                text += " except 0 0 * * 0";
            }
            text += &format!(" jitter {jitter_seconds}s");
            Case {
                text,
                jitter_seconds,
                zone,
                day,
                routine,
                steps,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_ticks_owe_what_schedule_next_lists_each_once_never_early(case in case()) {
        let schedule = match Schedule::parse(&case.text, case.zone) {
            Ok(schedule) => schedule,
            // Refused only as a jitter longer than an interval, or as never firing.
            Err(e) => {
                let e = e.to_string();
                prop_assert!(e.contains("shortest interval") || e.contains("never fires"), "{}", e);
                return Ok(());
            }
        };
        let jitter = Duration::seconds(case.jitter_seconds);
        prop_assert_eq!(schedule.jitter(), Some(StdDuration::from_secs(case.jitter_seconds as u64)));
        let routine = Uuid::from_u128(case.routine);
        let (y, m, d) = case.day;
        let start = Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap();
        let horizon = start + Duration::hours(48);
        // No misfires here: every late occurrence fires (the grace covers the longest step).
        let rules = MisfireRules { grace: StdDuration::from_secs(3600), max_backlog: 100, max_scan: 10_000 };

        let Some((_, first_clock)) = schedule.next_planned_after(routine, start) else {
            return Ok(());
        };
        let mut clock = Some(first_clock);
        let mut now = start;
        let mut owed: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
        let mut step = case.steps.iter().cycle();
        while now < horizon {
            let before = now;
            now += Duration::seconds(*step.next().unwrap());
            let Some(at) = clock else { break };
            let plan = plan_routine_due(routine, at, &schedule, now, MisfirePolicy::CatchUp, &rules);
            prop_assert_eq!(plan.skipped, 0);
            for o in &plan.occurrences {
                let planned = schedule.planned(routine, *o);
                // Never early, and at the first tick at or after its planned instant.
                prop_assert!(planned <= now, "{} planned {} claimed at {}", o, planned, now);
                prop_assert!(planned > before, "{} planned {} claimed late at {}", o, planned, now);
                let offset = planned - *o;
                prop_assert!(offset >= Duration::zero() && offset < jitter);
                prop_assert_eq!(planned, schedule.planned(routine, *o));
                owed.push((*o, planned));
            }
            // The clock is the next run's planned instant, never in the past of this tick.
            if let Some(next) = plan.next_run_at {
                prop_assert!(next > now || plan.occurrences.is_empty() && next > before);
            }
            clock = plan.next_run_at;
        }
        let listed: Vec<_> = schedule
            .runs_from_clock(routine, first_clock)
            .take_while(|(_, planned)| *planned <= now)
            .collect();
        prop_assert_eq!(&owed, &listed, "{}", case.text);
        prop_assert!(owed.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
    }
}

/// Samoa skipped 2011-12-30: its weekday 09:00 occurrences of the 29th and the 30th (the day's
/// skipped 09:00 fires at the end of the gap) are 15 hours apart, closer than the day the jitter
/// check measured. An offset never carries an occurrence past the next one: planned instants
/// keep the occurrences' order, and each clock stands for its own occurrence.
#[test]
fn a_skipped_day_does_not_let_the_jitter_reorder_occurrences() {
    let schedule = Schedule::parse("0 9 * * 1-5 jitter 71212s", "Pacific/Apia").unwrap();
    let from = Utc.with_ymd_and_hms(2011, 12, 27, 0, 0, 0).unwrap();
    let occurrences: Vec<_> =
        std::iter::successors(schedule.next_after(from), |at| schedule.next_after(*at))
            .take(6)
            .collect();
    let thirtieth = Utc.with_ymd_and_hms(2011, 12, 30, 10, 0, 0).unwrap();
    assert!(occurrences.contains(&thirtieth), "{occurrences:?}");
    let mut capped = 0;
    for id in 0..200u128 {
        let routine = Uuid::from_u128(id * 0x9e37_79b9_7f4a_7c15);
        let planned: Vec<_> = occurrences
            .iter()
            .map(|o| schedule.planned(routine, *o))
            .collect();
        for (o, p) in occurrences.iter().zip(&planned) {
            assert!(
                *p >= *o && *p - *o < Duration::seconds(71_212),
                "{o} planned {p}"
            );
            assert_eq!(schedule.occurrence_planned_at(routine, *p), Some(*o));
        }
        assert!(
            planned.windows(2).all(|w| w[0] < w[1]),
            "routine {routine}: {occurrences:?} planned {planned:?}"
        );
        capped += usize::from(
            planned[occurrences.iter().position(|o| *o == thirtieth).unwrap() - 1]
                == thirtieth - Duration::milliseconds(1),
        );
    }
    assert!(
        capped > 0,
        "some routine's offset on the 29th reaches past the 30th's occurrence"
    );
}

/// A clock written before the jitter (the occurrence itself) stands for that occurrence, and
/// the plan moves it to the planned instant instead of reading it again every tick.
#[test]
fn a_clock_written_without_the_jitter_stands_for_its_occurrence() {
    let schedule = Schedule::parse("0 9 * * * jitter 5m", "Europe/Berlin").unwrap();
    let routine = Uuid::from_u128(7);
    let nine = Utc.with_ymd_and_hms(2026, 12, 3, 8, 0, 0).unwrap();
    assert_eq!(schedule.occurrence_planned_at(routine, nine), Some(nine));
    let planned = schedule.planned(routine, nine);
    assert_eq!(schedule.occurrence_planned_at(routine, planned), Some(nine));
    // A clock past every occurrence stands for none: nothing is owed, and the routine ends.
    let once = Schedule::parse("@at 2026-12-03T09:00:00Z jitter 5m", "UTC").unwrap();
    let late = Utc.with_ymd_and_hms(2026, 12, 3, 9, 5, 1).unwrap();
    assert_eq!(once.occurrence_planned_at(routine, late), None);
    let plan = plan_routine_due(
        routine,
        late,
        &once,
        late,
        MisfirePolicy::CatchUp,
        &MisfireRules::default(),
    );
    assert!(plan.occurrences.is_empty() && plan.next_run_at.is_none());
    let rules = MisfireRules::default();
    if planned > nine {
        let early = plan_routine_due(
            routine,
            nine,
            &schedule,
            nine,
            MisfirePolicy::FireOnce,
            &rules,
        );
        assert!(early.occurrences.is_empty());
        assert_eq!(early.next_run_at, Some(planned));
    }
    let due = plan_routine_due(
        routine,
        nine,
        &schedule,
        planned,
        MisfirePolicy::FireOnce,
        &rules,
    );
    assert_eq!(due.occurrences, [nine]);
}

/// Lateness is judged from the planned instant: under `fire-once`, a scheduler back after a
/// day fires only the latest occurrence whose planned instant has passed.
#[test]
fn a_misfire_is_judged_from_the_planned_instant() {
    let schedule = Schedule::parse("*/10 * * * * jitter 5m", "UTC").unwrap();
    let routine = Uuid::from_u128(42);
    let start = Utc.with_ymd_and_hms(2026, 12, 3, 0, 0, 0).unwrap();
    let (_, clock) = schedule.next_planned_after(routine, start).unwrap();
    let now = start + Duration::hours(24) + Duration::seconds(1);
    let plan = plan_routine_due(
        routine,
        clock,
        &schedule,
        now,
        MisfirePolicy::FireOnce,
        &MisfireRules::default(),
    );
    let latest = schedule
        .runs_from_clock(routine, clock)
        .take_while(|(_, planned)| *planned <= now)
        .last()
        .unwrap();
    assert_eq!(plan.occurrences, [latest.0]);
    assert!(plan.skipped > 100);
    assert!(plan.next_run_at.unwrap() > now);
}

/// A jitter longer than the shortest interval, or a one-shot's longer than a day, is refused
/// with one line; `jitter` goes after the exclusions and before the window.
#[test]
fn a_jitter_is_checked_against_the_schedule() {
    for (text, needle) in [
        ("*/5 * * * * jitter 6m", "shortest interval, 5m"),
        ("@every 90m jitter 2h", "shortest interval, 1h30m"),
        ("@at 2026-12-24T15:30 jitter 2d", "at most a day"),
        ("0 9 * * * jitter 5x", "jitter \"5x\""),
        ("0 9 * * * from 2026-01-01 jitter 5m", "order"),
        ("0 9 * * * jitter 1m jitter 2m", "twice"),
    ] {
        let e = Schedule::parse(text, "UTC").unwrap_err().to_string();
        assert!(e.contains(needle), "{text:?}: {e:?} lacks {needle:?}");
        assert!(!e.contains('\n'));
    }
    let s = Schedule::parse(
        "*/5 * * * * except 0 0 25 12 * jitter 5m until 2027-01-01",
        "UTC",
    )
    .unwrap();
    assert_eq!(s.jitter(), Some(StdDuration::from_secs(300)));
    assert!(Schedule::parse("@at 2026-12-24T15:30 jitter 1d", "UTC").is_ok());
}
