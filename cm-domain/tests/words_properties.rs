//! Property tests for `Schedule::in_words`: for any valid schedule (a generated cron line of five
//! or six fields, with Quartz's day items, names, macros, intervals and clauses) the words are
//! one non-empty line that reads the line (never the raw-text fallback) and ends with the zone,
//! then the calendar's phrase when one is named.

use cm_domain::{OnHoliday, Schedule};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// Zones the schedules are read in.
const ZONES: [&str; 4] = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"];

/// One list item of a plain field, `lo..=hi`.
fn item(lo: u32, hi: u32) -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_owned()),
        (1..=hi.max(1)).prop_map(|n| format!("*/{n}")),
        (lo..=hi).prop_map(|v| v.to_string()),
        (lo..=hi, lo..=hi).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
        (lo..=hi, lo..=hi, 1..=hi.max(1)).prop_map(|(a, b, n)| format!(
            "{}-{}/{n}",
            a.min(b),
            a.max(b)
        )),
    ]
}

/// A field of one to three items.
fn field(lo: u32, hi: u32) -> impl Strategy<Value = String> {
    prop::collection::vec(item(lo, hi), 1..=3).prop_map(|items| items.join(","))
}

/// A day-of-month field, sometimes with `L`, `LW` or `dW`.
fn day_of_month() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => field(1, 31),
        1 => Just("L".to_owned()),
        1 => Just("LW".to_owned()),
        1 => (1..=31u32).prop_map(|d| format!("{d}W")),
        1 => (1..=28u32).prop_map(|d| format!("{d},L")),
    ]
}

/// A day-of-week field, sometimes with names, `wL` or `w#n`.
fn day_of_week() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => field(0, 7),
        1 => Just("MON-FRI".to_owned()),
        1 => Just("sat,SUN".to_owned()),
        1 => (0..=7u32).prop_map(|w| format!("{w}L")),
        1 => (0..=7u32, 1..=5u32).prop_map(|(w, n)| format!("{w}#{n}")),
    ]
}

/// A month field, sometimes with names.
fn month() -> impl Strategy<Value = String> {
    prop_oneof![3 => field(1, 12), 1 => Just("JAN,jul".to_owned())]
}

/// A rule: a cron line of five or six fields, a macro, an interval or a one-shot.
fn rule() -> impl Strategy<Value = String> {
    let five = || {
        (
            field(0, 59),
            field(0, 23),
            day_of_month(),
            month(),
            day_of_week(),
        )
            .prop_map(|(m, h, dom, mon, dow)| format!("{m} {h} {dom} {mon} {dow}"))
    };
    prop_oneof![
        6 => five(),
        2 => (field(0, 59), five()).prop_map(|(s, rest)| format!("{s} {rest}")),
        1 => prop::sample::select(vec!["@yearly", "@monthly", "@weekly", "@daily", "@hourly"])
            .prop_map(str::to_owned),
        1 => (1..=2000u32, 0..=59u32).prop_map(|(m, o)| if o > 0 && o < m {
            format!("@every {m}m offset {o}m")
        } else {
            format!("@every {m}m")
        }),
        1 => (0..=23u32).prop_map(|h| format!("@at 2031-05-17T{h:02}:30")),
    ]
}

/// Clauses after the rule.
fn clauses() -> impl Strategy<Value = String> {
    (
        prop::option::of(prop::sample::select(vec![
            "0 0 25 12 *",
            "0 0 * * 6,0",
            "30 12 * * *",
            "0 0 12 * * *",
        ])),
        prop::option::of(1..=30u32),
        prop::option::of(Just(" from 2030-01-01")),
        prop::option::of(Just(" until 2040-01-01T06:00")),
    )
        .prop_map(|(except, jitter, from, until)| {
            let mut text = String::new();
            if let Some(x) = except {
                text.push_str(&format!(" except {x}"));
            }
            if let Some(j) = jitter {
                text.push_str(&format!(" jitter {j}s"));
            }
            text.push_str(from.unwrap_or(""));
            text.push_str(until.unwrap_or(""));
            text
        })
}

proptest! {
    #![proptest_config(Config {
        // PROPTEST_CASES raises the count for a deeper run; the default keeps the file fast.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    })]

    /// The words of any valid schedule are one line, read the line, and end with the zone and
    /// the calendar's phrase.
    #[test]
    fn any_schedule_reads_as_one_line_ending_with_its_zone(
        rule in rule(),
        clauses in clauses(),
        zone in prop::sample::select(ZONES.to_vec()),
        calendar in prop::option::of(prop::sample::select(vec![
            (OnHoliday::Skip, "skipping de-holidays"),
            (OnHoliday::Next, "moved to the next business day of de-holidays"),
            (OnHoliday::Previous, "moved to the previous business day of de-holidays"),
        ])),
    ) {
        let text = format!("{rule}{clauses}");
        // Lines that never fire, or whose jitter is longer than their intervals, are refused.
        let Ok(schedule) = Schedule::parse(&text, zone) else {
            return Ok(());
        };
        let (words, ending) = match calendar {
            None => (schedule.in_words(), format!(", {zone}")),
            Some((policy, phrase)) => (
                schedule.in_words_on("de-holidays", policy),
                format!(", {zone}, {phrase}"),
            ),
        };
        prop_assert!(!words.is_empty(), "{text:?}");
        prop_assert!(!words.contains(['\n', '\r']), "{text:?} reads {words:?}");
        prop_assert!(words.ends_with(&ending), "{text:?} reads {words:?}");
        prop_assert!(words.len() > ending.len(), "{text:?} reads {words:?}");
        prop_assert!(!words.contains("cron '"), "{text:?} reads {words:?}");
        prop_assert!(!words.contains("  "), "{text:?} reads {words:?}");
    }
}
