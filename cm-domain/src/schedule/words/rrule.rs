//! An RFC 5545 rule in words: `09:00 on the last Friday of the month`, `15:00 on Thursday,
//! every 2 weeks`, `every 7 hours at :05 and :35`. A rule whose parts say more than these
//! words can (`BYWEEKNO`, `BYYEARDAY`, several `BYSETPOS`) reads as the rule itself.

use rrule::{Frequency, NWeekday, RRule, Validated};

use crate::schedule::Recurrence;

use super::{MONTHS, WEEKDAYS, and_list, clock, months_words, numbers, ordinal};

/// The rule in words.
pub(super) fn rrule_words(recurrence: &Recurrence, written: &str) -> String {
    words(recurrence.rule(), recurrence.days_from_month_end())
        .unwrap_or_else(|| format!("by the rule {written}"))
}

/// The words, or `None` when the rule says more than they can.
fn words(rule: &RRule<Validated>, from_month_end: &[i8]) -> Option<String> {
    if !rule.get_by_week_no().is_empty() || !rule.get_by_year_day().is_empty() {
        return None;
    }
    let freq = rule.get_freq();
    let n = u32::from(rule.get_interval().max(1));
    let unit = match freq {
        Frequency::Yearly => "year",
        Frequency::Monthly => "month",
        Frequency::Weekly => "week",
        Frequency::Daily => "day",
        Frequency::Hourly => "hour",
        Frequency::Minutely => "minute",
        Frequency::Secondly => "second",
    };
    let every = if n == 1 {
        format!("every {unit}")
    } else {
        format!("every {n} {unit}s")
    };
    let days = days_words(rule, from_month_end)?;
    let months: Vec<u32> = rule.get_by_month().iter().map(|m| u32::from(*m)).collect();
    let mut text = if freq <= Frequency::Daily {
        // A time of day, or a few.
        let times = times_words(rule)?;
        match (freq, days.is_empty()) {
            (Frequency::Monthly, false) if n == 1 => format!("{times} on {days} of the month"),
            (Frequency::Monthly, false) => format!("{times} on {days} of the month, {every}"),
            (Frequency::Yearly, false) if months.len() == 1 && n == 1 => {
                format!("{times} on {days} of {}", MONTHS[months[0] as usize - 1])
            }
            (_, false) if n == 1 => format!("{times} on {days}"),
            (_, false) => format!("{times} on {days}, {every}"),
            (_, true) => format!("{times} {every}"),
        }
    } else {
        let mut text = every;
        let minutes: Vec<u32> = rule.get_by_minute().iter().map(|m| u32::from(*m)).collect();
        let seconds: Vec<u32> = rule.get_by_second().iter().map(|s| u32::from(*s)).collect();
        let hours: Vec<u32> = rule.get_by_hour().iter().map(|h| u32::from(*h)).collect();
        if freq == Frequency::Hourly && !minutes.is_empty() {
            let at: Vec<String> = minutes.iter().map(|m| format!(":{m:02}")).collect();
            text.push_str(&format!(" at {}", and_list(&at)));
        } else if !minutes.is_empty() {
            text.push_str(&format!(" in minutes {}", numbers(&minutes)));
        }
        if seconds.iter().any(|s| *s != 0) {
            text.push_str(&format!(", at seconds {}", numbers(&seconds)));
        }
        if !hours.is_empty() {
            text.push_str(&format!(" during hours {}", numbers(&hours)));
        }
        if !days.is_empty() {
            text.push_str(&format!(" on {days}"));
        }
        text
    };
    let yearly_named = freq == Frequency::Yearly && months.len() == 1 && !days.is_empty();
    if !months.is_empty() && !yearly_named {
        text.push_str(&format!(" {}", months_words(&months)));
    }
    if let Some(count) = rule.get_count() {
        text.push_str(&format!(", {count} times"));
    }
    Some(text)
}

/// The rule's times of day, when it has at most four: `09:00`, `08:00 and 20:00`.
fn times_words(rule: &RRule<Validated>) -> Option<String> {
    let (h, m, s) = (
        rule.get_by_hour(),
        rule.get_by_minute(),
        rule.get_by_second(),
    );
    if h.len() * m.len() * s.len() > 4 {
        return None;
    }
    let mut times = Vec::new();
    for hour in h {
        for minute in m {
            for second in s {
                times.push(clock((*hour).into(), (*minute).into(), (*second).into()));
            }
        }
    }
    Some(and_list(&times))
}

/// The days the rule keeps, without `on`: `the last Friday`, `day 1 and 15`, `weekdays`;
/// empty for every day; `None` when a set position picks among what words cannot list.
fn days_words(rule: &RRule<Validated>, from_month_end: &[i8]) -> Option<String> {
    let weekdays = rule.get_by_weekday();
    let month_days = rule.get_by_month_day();
    let set_pos = rule.get_by_set_pos();
    let name = |w: &chrono::Weekday| WEEKDAYS[w.num_days_from_sunday() as usize];
    let mut every: Vec<u32> = Vec::new();
    let mut items = Vec::new();
    for day in weekdays {
        match day {
            NWeekday::Every(w) => every.push(w.num_days_from_sunday()),
            NWeekday::Nth(k, w) => items.push(format!("the {} {}", position(*k)?, name(w))),
        }
    }
    every.sort_unstable();
    let weekdays_named = if every == [1, 2, 3, 4, 5] {
        "weekdays".to_owned()
    } else {
        and_list(
            &every
                .iter()
                .map(|d| WEEKDAYS[*d as usize].to_owned())
                .collect::<Vec<_>>(),
        )
    };
    match set_pos {
        [] => {
            if !every.is_empty() {
                items.insert(0, weekdays_named);
            }
        }
        // One position among the days named: `the last weekday`, `the second Friday`.
        [k] if !every.is_empty()
            && month_days.is_empty()
            && from_month_end.is_empty()
            && items.is_empty() =>
        {
            let one = if every == [1, 2, 3, 4, 5] {
                "weekday".to_owned()
            } else if every.len() == 1 {
                weekdays_named
            } else {
                format!("of {weekdays_named}")
            };
            items.push(format!("the {} {one}", position((*k).try_into().ok()?)?));
        }
        _ => return None,
    }
    let from_start: Vec<u32> = month_days
        .iter()
        .filter_map(|d| u32::try_from(*d).ok())
        .collect();
    if !from_start.is_empty() {
        items.push(format!("day {}", numbers(&from_start)));
    }
    for d in from_month_end.iter().map(|d| i16::from(*d)) {
        items.push(match d {
            -1 => "the last day".to_owned(),
            d => format!("the {} day", position(d)?),
        });
    }
    Some(and_list(&items))
}

/// `first`, `third`, `last`, `second-to-last`, `10th`.
fn position(k: i16) -> Option<String> {
    const NAMED: [&str; 5] = ["first", "second", "third", "fourth", "fifth"];
    let nth = |n: u16| match NAMED.get(usize::from(n) - 1) {
        Some(word) => (*word).to_owned(),
        None => ordinal(n.into()),
    };
    match k {
        -1 => Some("last".to_owned()),
        k if k < 0 => Some(format!("{}-to-last", nth(k.unsigned_abs()))),
        k if k > 0 => Some(nth(k.unsigned_abs())),
        _ => None,
    }
}
