//! The words of each shape of schedule: cron lines common and irregular, Quartz's days, seconds,
//! macros, intervals, one-shots, clauses and calendars.

use std::sync::Arc;

use chrono::{NaiveDate, Weekday};

use crate::calendar::{Calendar, OnHoliday};
use crate::schedule::{Schedule, Zone};

/// The words of `expression` in UTC, without the zone.
#[track_caller]
fn said(expression: &str) -> String {
    let words = Schedule::parse(expression, "UTC")
        .unwrap_or_else(|e| panic!("{expression:?} was refused: {e}"))
        .in_words();
    match words.strip_suffix(", UTC") {
        Some(rule) => rule.to_owned(),
        None => panic!("{expression:?} reads {words:?}, which does not end with the zone"),
    }
}

/// Asserts that each expression, in UTC, reads as its words followed by the zone.
#[track_caller]
fn says(cases: &[(&str, &str)]) {
    for (expression, words) in cases {
        assert_eq!(said(expression), *words, "{expression:?}");
    }
}

#[test]
fn common_cron_lines_read_naturally() {
    says(&[
        ("* * * * *", "every minute"),
        ("*/5 * * * *", "every 5 minutes"),
        ("0-59/15 * * * *", "every 15 minutes"),
        ("30 * * * *", "every hour at :30"),
        ("0 9 * * *", "09:00 every day"),
        ("0 9 * * 1-5", "09:00 on weekdays"),
        ("0 9 * * MON-FRI", "09:00 on weekdays"),
        ("0 9,17 * * 1,5", "09:00 and 17:00 on Monday and Friday"),
        ("0 9 * * SAT,SUN", "09:00 on Saturday and Sunday"),
        ("0 9 * * 0,6", "09:00 on Saturday and Sunday"),
        ("0 9 * * 7", "09:00 on Sunday"),
        ("0 9 * * 1-4", "09:00 on Monday to Thursday"),
        ("0 9 * * FRI-SUN", "09:00 on Friday to Sunday"),
        ("0 9 1,15 * *", "09:00 on day 1 and 15 of the month"),
        ("0 0 1 1 *", "00:00 on 1 January"),
        ("0 0 25 DEC *", "00:00 on 25 December"),
        ("0 12 * 1,7 *", "12:00 every day in January and July"),
        ("0 12 * 3-6 *", "12:00 every day from March to June"),
        (
            "0 12 1 3-6 *",
            "12:00 on day 1 of the month from March to June",
        ),
        (
            "*/15 9-17 * * 1-5",
            "every 15 minutes from 09:00 to 17:45 on weekdays",
        ),
        ("* 9 * * *", "every minute from 09:00 to 09:59"),
        ("0 9-17 * * *", "every hour from 09:00 to 17:00"),
        ("30 */3 * * *", "every 3 hours from 00:30 to 21:30"),
        ("0,30 9 * * *", "09:00 and 09:30 every day"),
        ("5,20,35,50 * * * *", "every hour at :05, :20, :35 and :50"),
    ]);
}

#[test]
fn quartz_days_read_as_days_of_the_month() {
    says(&[
        ("0 9 L * *", "09:00 on the last day of the month"),
        ("0 9 LW * *", "09:00 on the last weekday of the month"),
        (
            "0 9 15W * *",
            "09:00 on the weekday nearest the 15th of the month",
        ),
        (
            "0 9 1W * *",
            "09:00 on the weekday nearest the 1st of the month",
        ),
        ("0 9 * * 5L", "09:00 on the last Friday of the month"),
        ("0 9 * * FRIL", "09:00 on the last Friday of the month"),
        ("0 9 * * 5#3", "09:00 on the third Friday of the month"),
        ("0 9 * * 0#1", "09:00 on the first Sunday of the month"),
        (
            "0 9 * * 1,5L",
            "09:00 on Monday and the last Friday of the month",
        ),
        (
            "0 9 1,L * *",
            "09:00 on day 1 and the last day of the month",
        ),
    ]);
}

#[test]
fn both_day_fields_restricted_read_as_either() {
    says(&[
        ("0 9 1 * 1", "09:00 on day 1 of the month or on Monday"),
        (
            "0 9 L * 5#3",
            "09:00 on the last day of the month or on the third Friday of the month",
        ),
    ]);
    // A day field that starts with `*` makes them both needed.
    says(&[(
        "0 9 */10 * 1,5",
        "09:00 on day 1, 11, 21 and 31 of the month when it falls on Monday or Friday",
    )]);
}

#[test]
fn seconds_are_said_when_they_are_not_zero() {
    says(&[
        ("30 0 9 * * *", "09:00:30 every day"),
        ("0 0 9 * * *", "09:00 every day"),
        ("*/20 * * * * *", "every 20 seconds"),
        ("* * * * * *", "every second"),
        ("15 */5 * * * *", "every 5 minutes, at second 15"),
        ("*/30 * 9 * * *", "every 30 seconds past hour 9"),
    ]);
}

#[test]
fn macros_read_as_what_they_stand_for() {
    says(&[
        ("@yearly", "00:00 on 1 January"),
        ("@annually", "00:00 on 1 January"),
        ("@monthly", "00:00 on day 1 of the month"),
        ("@weekly", "00:00 on Sunday"),
        ("@daily", "00:00 every day"),
        ("@midnight", "00:00 every day"),
        ("@hourly", "every hour at :00"),
    ]);
}

#[test]
fn irregular_lines_read_field_by_field() {
    says(&[
        ("5,17 1-3 * * *", "at minutes 5 and 17 past hours 1-3"),
        (
            "*/7 * * * *",
            "at minutes 0 to 56 in steps of 7 of every hour",
        ),
        (
            "0,1,2,3,4,5,6 9,12 * * *",
            "at minutes 0-6 past hours 9 and 12",
        ),
        (
            "*/15 9,12,18 * * *",
            "at minutes 0, 15, 30 and 45 past hours 9, 12 and 18",
        ),
    ]);
}

#[test]
fn intervals_and_one_shots_read_in_absolute_time() {
    says(&[
        ("@every 90m", "every 90 minutes"),
        ("@every 1h", "every hour"),
        ("@every 2h30m", "every 2 hours 30 minutes"),
        ("@every 1d", "every day"),
        ("@every 45s", "every 45 seconds"),
        ("@every 1h offset 15m", "every hour, offset by 15 minutes"),
        ("@at 2026-12-24T15:30", "once, at 2026-12-24 15:30"),
    ]);
    // An instant given with its offset is said in the schedule's zone.
    let berlin = Schedule::parse("@at 2026-12-24T14:30:00Z", "Europe/Berlin").unwrap();
    assert_eq!(
        berlin.in_words(),
        "once, at 2026-12-24 15:30, Europe/Berlin"
    );
}

#[test]
fn clauses_follow_the_rule_in_the_grammars_order() {
    says(&[
        (
            "0 9 * * * except 0 0 25 12 *",
            "09:00 every day, except on 25 December",
        ),
        (
            "0 9 * * * except 0 0 * * 6,0 except 0 0 1 1 *",
            "09:00 every day, except on Saturday and Sunday, except on 1 January",
        ),
        (
            "*/5 * * * * except 30 12 * * *",
            "every 5 minutes, except 12:30 every day",
        ),
        (
            "0 9 * * * jitter 5m",
            "09:00 every day, with up to 5 minutes of jitter",
        ),
        (
            "0 9 * * * from 2027-01-01 until 2028-01-01T12:00",
            "09:00 every day, from 2027-01-01, until 2028-01-01 12:00",
        ),
    ]);
    let berlin = Schedule::parse(
        "0 9 * * 5L except 0 0 24-26 12 * jitter 1m from 2027-01-01T00:00:00Z",
        "Europe/Berlin",
    )
    .unwrap();
    assert_eq!(
        berlin.in_words(),
        "09:00 on the last Friday of the month, except on day 24-26 of the month in \
         December, with up to 1 minute of jitter, from 2027-01-01 01:00, Europe/Berlin"
    );
}

#[test]
fn a_calendar_is_said_after_the_zone() {
    let zone = Zone::parse("Europe/Berlin").unwrap();
    let calendar = Arc::new(
        Calendar::new(
            zone,
            [NaiveDate::from_ymd_opt(2027, 1, 1).unwrap()],
            &[Weekday::Sat, Weekday::Sun],
        )
        .unwrap(),
    );
    let schedule = Schedule::new("0 9 * * 5L", zone).unwrap();
    for (policy, words) in [
        (OnHoliday::Skip, "skipping de-holidays"),
        (
            OnHoliday::Next,
            "moved to the next business day of de-holidays",
        ),
        (
            OnHoliday::Previous,
            "moved to the previous business day of de-holidays",
        ),
    ] {
        assert_eq!(
            schedule.in_words_on("de-holidays", policy),
            format!("09:00 on the last Friday of the month, Europe/Berlin, {words}")
        );
        let on = schedule
            .clone()
            .with_calendar(calendar.clone(), policy)
            .unwrap();
        assert!(
            on.in_words().ends_with(&format!(
                "Europe/Berlin, {}",
                words.replace("de-holidays", "its calendar").replace(
                    "skipping its calendar",
                    "skipping the days off of its calendar"
                )
            )),
            "{policy}: {}",
            on.in_words()
        );
    }
    assert_eq!(
        schedule.in_words(),
        "09:00 on the last Friday of the month, Europe/Berlin"
    );
}

#[test]
fn rrules_read_as_their_cron_lines_do_or_as_the_rule() {
    says(&[
        (
            "@rrule FREQ=MONTHLY;BYDAY=FR;BYSETPOS=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
            "09:00 on the last Friday of the month",
        ),
        (
            "@rrule FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
            "09:00 on the last Friday of the month",
        ),
        (
            "@rrule FREQ=MONTHLY;BYDAY=3FR;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
            "09:00 on the third Friday of the month",
        ),
        (
            "@rrule FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-2;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
            "09:00 on the second-to-last weekday of the month",
        ),
        (
            "@rrule FREQ=MONTHLY;BYMONTHDAY=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
            "09:00 on the last day of the month",
        ),
        (
            "@rrule FREQ=MONTHLY;BYMONTHDAY=1,15;BYHOUR=8,20;BYMINUTE=0;BYSECOND=0",
            "08:00 and 20:00 on day 1 and 15 of the month",
        ),
        (
            "@rrule FREQ=WEEKLY;INTERVAL=2;BYDAY=TH;BYHOUR=15;BYMINUTE=0;BYSECOND=0 \
             from 2027-01-07",
            "15:00 on Thursday, every 2 weeks, from 2027-01-07",
        ),
        (
            "@rrule FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=9;BYMINUTE=30;BYSECOND=0",
            "09:30 on weekdays",
        ),
        (
            "@rrule FREQ=DAILY;BYHOUR=2;BYMINUTE=30;BYSECOND=0",
            "02:30 every day",
        ),
        (
            "@rrule FREQ=YEARLY;BYMONTH=12;BYMONTHDAY=24;BYHOUR=18;BYMINUTE=0;BYSECOND=0",
            "18:00 on day 24 of December",
        ),
        (
            "@rrule FREQ=HOURLY;INTERVAL=7;BYMINUTE=5,35;BYSECOND=0 from 2027-01-01",
            "every 7 hours at :05 and :35, from 2027-01-01",
        ),
        (
            "@rrule FREQ=MINUTELY;INTERVAL=15;BYHOUR=9,10,11;BYSECOND=0 from 2027-01-01",
            "every 15 minutes during hours 9-11, from 2027-01-01",
        ),
        (
            "@rrule FREQ=DAILY;COUNT=3;BYHOUR=12;BYMINUTE=0;BYSECOND=0 from 2027-01-01",
            "12:00 every day, 3 times, from 2027-01-01",
        ),
        (
            "@rrule FREQ=YEARLY;BYWEEKNO=1;BYDAY=MO;BYHOUR=6;BYMINUTE=0;BYSECOND=0",
            "by the rule FREQ=YEARLY;BYWEEKNO=1;BYDAY=MO;BYHOUR=6;BYMINUTE=0;BYSECOND=0",
        ),
    ]);
}
