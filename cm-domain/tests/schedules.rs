//! Worked schedule examples: every vector is run by chaining `Schedule::next_after` from its
//! `after` instant and comparing each result with the expected one.
//!
//! `data/schedules.json` is the project's shared set of examples (copied here so the crate's
//! tests do not read outside it); `data/schedules_extra.json` adds hand-checked cases for more
//! zones and syntax, each with a `why`; `data/schedules_quartz.json` does the same for Quartz's
//! `L`, `W` and `#` across daylight-saving changes (worked by hand, then checked by a separate
//! minute-by-minute walk written with Python's `zoneinfo`, not by cm's code).

use chrono::{DateTime, Utc};
use cm_domain::Schedule;
use serde::Deserialize;

/// One worked example.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    /// Why the case is there (only in the extra file).
    #[serde(default)]
    why: String,
    /// The cron expression.
    schedule: String,
    /// The IANA zone it runs in.
    timezone: String,
    /// Where the walk starts (RFC 3339).
    after: String,
    /// The successive results of `next_after` (RFC 3339).
    next: Vec<String>,
}

/// Parses an RFC 3339 instant from a vector file.
fn instant(text: &str) -> DateTime<Utc> {
    text.parse()
        .unwrap_or_else(|e| panic!("bad instant {text:?} in a vector file: {e}"))
}

/// Runs every vector in `json` and reports all failures at once.
fn run_vectors(json: &str) -> usize {
    let vectors: Vec<Vector> = serde_json::from_str(json).expect("the vector file is valid JSON");
    assert!(!vectors.is_empty());
    let mut failures = Vec::new();
    for v in &vectors {
        let schedule = match Schedule::parse(&v.schedule, &v.timezone) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{:?} in {}: refused: {e}", v.schedule, v.timezone));
                continue;
            }
        };
        let after = instant(&v.after);
        let expected: Vec<_> = v.next.iter().map(|t| instant(t)).collect();
        let mut cursor = after;
        let mut got = Vec::new();
        for _ in &v.next {
            match schedule.next_after(cursor) {
                Some(next) => {
                    got.push(next);
                    cursor = next;
                }
                None => break,
            }
        }
        if got != expected {
            failures.push(format!(
                "{:?} in {} after {} ({}):\n  expected {:?}\n  got      {:?}",
                v.schedule, v.timezone, v.after, v.why, expected, got
            ));
        }
        // The iterator is the same walk.
        let walked: Vec<_> = schedule
            .occurrences_after(after)
            .take(v.next.len())
            .collect();
        assert_eq!(walked, got, "{:?}: occurrences_after", v.schedule);
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors failed:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
    vectors.len()
}

#[test]
fn shared_vectors_pass() {
    let n = run_vectors(include_str!("data/schedules.json"));
    assert_eq!(n, 12, "the shared file has twelve cases");
}

#[test]
fn extra_vectors_pass() {
    run_vectors(include_str!("data/schedules_extra.json"));
}

#[test]
fn quartz_vectors_pass() {
    run_vectors(include_str!("data/schedules_quartz.json"));
}

#[test]
fn rrule_vectors_pass() {
    run_vectors(include_str!("data/schedules_rrule.json"));
}

/// Issue 48's values, as `schedule next --after 2026-12-15T00:00:00Z --count 3` lists them.
#[test]
fn quartz_items_give_the_issues_values() {
    let after: DateTime<Utc> = "2026-12-15T00:00:00Z".parse().unwrap();
    for (expr, expected) in [
        ("0 9 L * *", ["2026-12-31", "2027-01-31", "2027-02-28"]),
        ("0 9 * * 5#3", ["2026-12-18", "2027-01-15", "2027-02-19"]),
        ("0 9 * * 5L", ["2026-12-25", "2027-01-29", "2027-02-26"]),
        ("0 9 15W * *", ["2026-12-15", "2027-01-15", "2027-02-15"]),
    ] {
        let schedule = Schedule::parse(expr, "UTC").unwrap_or_else(|e| panic!("{expr:?}: {e}"));
        let got: Vec<String> = schedule
            .occurrences_after(after)
            .take(3)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect();
        let expected: Vec<String> = expected.iter().map(|d| format!("{d}T09:00:00Z")).collect();
        assert_eq!(got, expected, "{expr:?}");
    }
}

#[test]
fn the_crate_example_holds() {
    // The example in the crate documentation, checked here too so a doc-test run is not the
    // only guard on it.
    let daily = Schedule::parse("30 2 * * *", "America/New_York").unwrap();
    let after: DateTime<Utc> = "2025-03-08T12:00:00Z".parse().unwrap();
    let expected: DateTime<Utc> = "2025-03-09T07:00:00Z".parse().unwrap();
    assert_eq!(daily.next_after(after), Some(expected));
}
