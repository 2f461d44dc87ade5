//! The budget of a schedule's checks: parsing any schedule looks at no more than
//! `MAX_CHECKED_CANDIDATES` candidates (counted, not timed), whatever its rule, exclusions,
//! window and jitter; one past it is refused in one line naming the budget; and the schedules
//! people write (the worked vectors, the README's and the guide's examples) stay well inside it.

use cm_domain::rules::MAX_CHECKED_CANDIDATES;
use cm_domain::{Schedule, ScheduleError};
use proptest::prelude::*;

/// A schedule whose exclusions keep one second in five hours of an every-second rule: each
/// occurrence is about 18,000 candidates past the last, so its jitter check over 500
/// occurrences would look at about nine million.
const POISON: &str = "* * * * * * except 1-59 * * * * * except * 1-59 * * * * \
                      except * * 1-4,6-9,11-14,16-19,21-23 * * * jitter 1s";

#[test]
fn a_schedule_too_costly_to_check_is_refused_in_one_line_within_the_budget() {
    let error = Schedule::parse(POISON, "UTC").expect_err("the poison schedule was accepted");
    assert!(
        matches!(error, ScheduleError::TooCostly { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("too costly to check")
            && message.contains(&format!("more than {MAX_CHECKED_CANDIDATES} candidates")),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message:?}");
    // The same rule and exclusions without the jitter cost one occurrence's walk: accepted.
    let cheap = POISON.trim_end_matches(" jitter 1s");
    let schedule = Schedule::parse(cheap, "UTC").expect("without the jitter it is cheap");
    assert!(
        schedule.checked_candidates() < 20_000,
        "{}",
        schedule.checked_candidates()
    );
}

#[test]
fn the_schedules_people_write_are_well_inside_the_budget() {
    let mut texts: Vec<(String, String)> = Vec::new();
    for json in [
        include_str!("data/schedules.json"),
        include_str!("data/schedules_extra.json"),
    ] {
        let vectors: Vec<serde_json::Value> = serde_json::from_str(json).unwrap();
        for v in vectors {
            texts.push((
                v["schedule"].as_str().unwrap().to_owned(),
                v["timezone"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for text in [
        "*/5 * * * * except 0 0 * * 6,0 jitter 1m",
        "0 9 * * 1-5 except 0 0 25 12 * jitter 10m",
        "@every 90m offset 15m jitter 5m from 2026-12-01 until 2027-01-01",
        "* * * * * * except 1-59 * * * * * jitter 1s",
        "0 * * * * * except 1-59 * * * * jitter 30s",
        "*/10 * * * * * except * * 0-8,18-23 * * * jitter 5s",
        "@at 2026-12-24T15:30 jitter 1h",
        "0 9 * * 1-5 except 0 0 25 12 * until 2027-01-01",
        "0 9 * * 1-5 jitter 5m",
    ] {
        texts.push((text.to_owned(), "Europe/Berlin".to_owned()));
    }
    for (text, zone) in texts {
        let schedule =
            Schedule::parse(&text, &zone).unwrap_or_else(|e| panic!("{text:?} refused: {e}"));
        assert!(
            schedule.checked_candidates() <= MAX_CHECKED_CANDIDATES / 2,
            "{text:?}: {} candidates",
            schedule.checked_candidates()
        );
    }
}

/// A rule that gives many candidates, exclusions that drop most of them (seconds, minutes or
/// hours, at the second or the minute), maybe a jitter.
fn costly_text() -> impl Strategy<Value = String> {
    let exclusion = prop_oneof![
        (1u32..59).prop_map(|s| format!("{s}-59 * * * * *")),
        (1u32..59).prop_map(|m| format!("* {m}-59 * * * *")),
        (1u32..23).prop_map(|h| format!("* * {h}-23 * * *")),
        (1u32..59).prop_map(|m| format!("{m}-59 * * * *")),
        (1u32..23).prop_map(|h| format!("* {h}-23 * * *")),
    ];
    (
        prop::sample::select(vec![
            "* * * * * *",
            "*/2 * * * * *",
            "* * * * *",
            "@every 1s",
        ]),
        prop::collection::vec(exclusion, 0..4),
        prop::option::of(1u32..3),
    )
        .prop_map(|(rule, exclusions, jitter)| {
            let mut text = rule.to_owned();
            for x in exclusions {
                text += &format!(" except {x}");
            }
            if let Some(j) = jitter {
                text += &format!(" jitter {j}s");
            }
            text
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn parsing_looks_at_no_more_candidates_than_the_budget(text in costly_text()) {
        match Schedule::parse(&text, "UTC") {
            Ok(schedule) => prop_assert!(
                schedule.checked_candidates() <= MAX_CHECKED_CANDIDATES,
                "{text:?}: {}", schedule.checked_candidates()
            ),
            Err(ScheduleError::TooCostly { .. }) => {}
            // Refused for another reason: a jitter longer than an interval, or never firing.
            Err(e) => prop_assert!(
                matches!(e, ScheduleError::Rule { .. } | ScheduleError::NeverFires { .. }),
                "{text:?}: {e}"
            ),
        }
    }
}
