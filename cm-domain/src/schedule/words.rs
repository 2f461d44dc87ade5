//! A schedule read as a person would say it: `09:00 on the last Friday of the month,
//! Europe/Berlin, skipping de-holidays` ([`Schedule::in_words`]).
//!
//! The words say what the schedule does, never more: a cron line of a common shape reads
//! naturally (`every 15 minutes from 09:00 to 17:45 on weekdays`), and one too irregular for
//! that reads field by field (`at minutes 5 and 17 past hours 1-3`), still exactly. The rule
//! comes first, then its clauses in the grammar's order (`except`, `jitter`, `from`, `until`),
//! then the zone, then the calendar's policy when the schedule is on one.

use chrono::{DateTime, Timelike, Utc};

use super::Schedule;
use super::cron::{Fields, parse_fields};
use super::field::{Field, Item, ParsedField};
use crate::calendar::OnHoliday;
use crate::rules::{Rule, ScheduleText};

/// What a calendar's days off do to the occurrences, said after the zone.
const UNNAMED_CALENDAR: &str = "its calendar";

impl Schedule {
    /// The schedule in words, on one line: its rule, its clauses, its zone, and, when it is on
    /// a holiday calendar ([`Schedule::with_calendar`]), what a day off does (the calendar is
    /// called "its calendar": a [`crate::Calendar`] does not know its name; see
    /// [`Schedule::in_words_on`]).
    ///
    /// ```
    /// let s = cm_domain::Schedule::parse("0 9 * * 5L", "Europe/Berlin").unwrap();
    /// assert_eq!(s.in_words(), "09:00 on the last Friday of the month, Europe/Berlin");
    /// ```
    pub fn in_words(&self) -> String {
        let calendar = self
            .calendar()
            .map(|(_, policy)| (UNNAMED_CALENDAR, policy));
        self.words(calendar)
    }

    /// The schedule in words ([`Schedule::in_words`]), on the calendar named `calendar` with
    /// its `on_holiday` policy, whether or not the schedule itself was placed on it: `…,
    /// Europe/Berlin, skipping de-holidays`.
    pub fn in_words_on(&self, calendar: &str, on_holiday: OnHoliday) -> String {
        self.words(Some((calendar, on_holiday)))
    }

    /// The words, with the calendar's name and policy if any.
    fn words(&self, calendar: Option<(&str, OnHoliday)>) -> String {
        // The text was split and checked when the schedule was parsed.
        let parts = ScheduleText::parse(&self.expression).unwrap_or_default();
        let mut text = match &self.rule {
            Rule::Cron { .. } => cron_words(&parts.rule),
            Rule::Every { every, offset } => {
                let mut every = every_words(*every);
                if *offset > 0 {
                    every.push_str(&format!(", offset by {}", span_words(*offset)));
                }
                every
            }
            Rule::At(at) => format!("once, at {}", self.wall(*at)),
            Rule::Recur(recurrence) => {
                let written = parts.rule.split_once(' ').map_or("", |(_, rule)| rule);
                rrule::rrule_words(recurrence, written.trim())
            }
        };
        for except in &parts.except {
            text.push_str(&format!(", except {}", except_words(except)));
        }
        if let Some(jitter) = self.jitter {
            let span = span_words(jitter.num_seconds());
            text.push_str(&format!(", with up to {span} of jitter"));
        }
        if let Some(start) = self.bounds.start {
            text.push_str(&format!(", from {}", self.wall(start)));
        }
        if let Some(end) = self.bounds.end {
            text.push_str(&format!(", until {}", self.wall(end)));
        }
        text.push_str(", ");
        text.push_str(self.zone.name());
        if let Some((name, policy)) = calendar {
            text.push_str(&match policy {
                OnHoliday::Skip if name == UNNAMED_CALENDAR => {
                    format!(", skipping the days off of {name}")
                }
                OnHoliday::Skip => format!(", skipping {name}"),
                OnHoliday::Next => format!(", moved to the next business day of {name}"),
                OnHoliday::Previous => {
                    format!(", moved to the previous business day of {name}")
                }
            });
        }
        text
    }

    /// An instant as a wall time in the schedule's zone: a date alone at midnight.
    fn wall(&self, at: DateTime<Utc>) -> String {
        let wall = at.with_timezone(&self.zone.tz()).naive_local();
        let format = match (wall.hour(), wall.minute(), wall.second()) {
            (0, 0, 0) => "%Y-%m-%d",
            (_, _, 0) => "%Y-%m-%d %H:%M",
            _ => "%Y-%m-%d %H:%M:%S",
        };
        wall.format(format).to_string()
    }
}

/// A cron line in words; its text as written if it cannot be read (it was checked when the
/// schedule was parsed, so that does not happen).
fn cron_words(text: &str) -> String {
    let Ok(fields) = parse_fields(text) else {
        return format!("cron '{text}'");
    };
    let (time, repeats) = time_words(&fields);
    let date = date_words(&fields);
    // Date words that do not start with `on` name months alone.
    match (date.is_empty(), repeats) {
        (true, true) => time,
        (true, false) => format!("{time} every day"),
        (false, false) if !date.starts_with("on ") => format!("{time} every day {date}"),
        (false, _) => format!("{time} {date}"),
    }
}

/// An `except` clause in words: a day rule (five fields, minute and hour 0) by its days
/// (`on 25 December`), any other by its times.
fn except_words(text: &str) -> String {
    let Ok(fields) = parse_fields(text) else {
        return format!("cron '{text}'");
    };
    let midnight = |f: &ParsedField| f.is_single_value() && f.values == 1;
    let day_rule =
        text.split_whitespace().count() != 6 && midnight(&fields.minute) && midnight(&fields.hour);
    match date_words(&fields) {
        date if day_rule && !date.is_empty() => date,
        _ => cron_words(text),
    }
}

/// The values a field selects, in order (day-of-week's 7 read as 0, Sunday).
fn values(field: &ParsedField, which: Field) -> Vec<u32> {
    let (lo, hi) = which.bounds();
    let mut values: Vec<u32> = (lo..=hi)
        .filter(|v| field.values & (1 << v) != 0)
        .map(|v| if which == Field::DayOfWeek { v % 7 } else { v })
        .collect();
    values.sort_unstable();
    values.dedup();
    values
}

/// Whether a field selects every value it can.
fn is_full(values: &[u32], which: Field) -> bool {
    let (lo, hi) = which.bounds();
    let count = if which == Field::DayOfWeek {
        7
    } else {
        hi - lo + 1
    };
    values.len() == count as usize
}

/// `step` when `values` are `0, step, 2·step, …` to the end of a cycle of `cycle` values.
fn every_nth(values: &[u32], cycle: u32) -> Option<u32> {
    let step = values.get(1)?.checked_sub(values[0])?;
    let regular = values[0] == 0
        && cycle.is_multiple_of(step)
        && values.len() == (cycle / step) as usize
        && values.windows(2).all(|w| w[1] - w[0] == step);
    regular.then_some(step)
}

/// Whether `values` are consecutive.
fn consecutive(values: &[u32]) -> bool {
    values.windows(2).all(|w| w[1] == w[0] + 1)
}

/// A wall time of day: `09:00`, or `09:00:30` with seconds.
fn clock(hour: u32, minute: u32, second: u32) -> String {
    if second == 0 {
        format!("{hour:02}:{minute:02}")
    } else {
        format!("{hour:02}:{minute:02}:{second:02}")
    }
}

/// Items joined as a list is said: `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    list(items, "and")
}

/// Items joined as a list is said, the last two by `word`: `a, b or c`.
fn list(items: &[String], word: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} {word} {last}", init.join(", ")),
    }
}

/// Numbers as a list: runs of three or more as `a-b`, a long regular step as `a to b in steps
/// of s`.
fn numbers(values: &[u32]) -> String {
    if values.len() >= 5 {
        let step = values[1] - values[0];
        if step > 1 && values.windows(2).all(|w| w[1] - w[0] == step) {
            let last = values[values.len() - 1];
            return format!("{} to {last} in steps of {step}", values[0]);
        }
    }
    let mut items = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let mut j = i;
        while j + 1 < values.len() && values[j + 1] == values[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            items.push(format!("{}-{}", values[i], values[j]));
        } else {
            items.extend(values[i..=j].iter().map(u32::to_string));
        }
        i = j + 1;
    }
    and_list(&items)
}

/// `1 hour 30 minutes`, `5 minutes`, `1 day`.
fn span_words(seconds: i64) -> String {
    let mut left = seconds.max(0);
    let mut parts = Vec::new();
    for (unit, size) in [
        ("day", 86_400),
        ("hour", 3_600),
        ("minute", 60),
        ("second", 1),
    ] {
        if left >= size {
            let n = left / size;
            parts.push(format!("{n} {unit}{}", if n == 1 { "" } else { "s" }));
            left %= size;
        }
    }
    if parts.is_empty() {
        "0 seconds".to_owned()
    } else {
        parts.join(" ")
    }
}

/// `every hour`, `every 90 minutes`, `every 1 hour 30 minutes`.
fn every_words(seconds: i64) -> String {
    let span = span_words(seconds);
    match span.strip_prefix("1 ") {
        Some(unit) if !unit.contains(' ') => format!("every {unit}"),
        _ if seconds % 3_600 != 0 && seconds < 2 * 3_600 && seconds % 60 == 0 => {
            format!("every {} minutes", seconds / 60)
        }
        _ => format!("every {span}"),
    }
}

/// The time-of-day fields in words, and whether the words already say how often (`every 5
/// minutes`) rather than when (`09:00`).
fn time_words(f: &Fields<'_>) -> (String, bool) {
    let (s, m, h) = (
        values(&f.second, Field::Second),
        values(&f.minute, Field::Minute),
        values(&f.hour, Field::Hour),
    );
    let (m_full, h_full) = (is_full(&m, Field::Minute), is_full(&h, Field::Hour));
    let [second] = s[..] else {
        return (seconds_words(&s, &m, &h), true);
    };
    if m.len() * h.len() <= 4 {
        let times: Vec<String> = h
            .iter()
            .flat_map(|&hour| m.iter().map(move |&minute| clock(hour, minute, second)))
            .collect();
        return (and_list(&times), false);
    }
    let at_second = if second == 0 {
        String::new()
    } else {
        format!(", at second {second}")
    };
    let minutes = if m_full {
        Some("every minute".to_owned())
    } else {
        every_nth(&m, 60).map(|n| format!("every {n} minutes"))
    };
    let words = match (&minutes, &m[..]) {
        (Some(every), _) if h_full => format!("{every}{at_second}"),
        (_, _) if h_full && m.len() <= 6 => {
            let at: Vec<String> = m.iter().map(|m| format!(":{m:02}")).collect();
            format!("every hour at {}{at_second}", and_list(&at))
        }
        (Some(every), _) if consecutive(&h) => {
            let last_minute = m[m.len() - 1];
            format!(
                "{every} from {} to {}",
                clock(h[0], 0, second),
                clock(h[h.len() - 1], last_minute, second)
            )
        }
        (_, [minute]) if h.len() >= 2 && every_step(&h).is_some() => {
            let step = every_step(&h).unwrap_or(1);
            let every = if step == 1 {
                "every hour".to_owned()
            } else {
                format!("every {step} hours")
            };
            format!(
                "{every} from {} to {}",
                clock(h[0], *minute, second),
                clock(h[h.len() - 1], *minute, second)
            )
        }
        _ if h_full => format!("at minutes {} of every hour{at_second}", numbers(&m)),
        _ => format!(
            "at minute{} {} past hour{} {}{at_second}",
            plural(&m),
            numbers(&m),
            plural(&h),
            numbers(&h)
        ),
    };
    (words, true)
}

/// `s` when there is more than one value.
fn plural(values: &[u32]) -> &'static str {
    if values.len() == 1 { "" } else { "s" }
}

/// The common step of values in arithmetic progression.
fn every_step(values: &[u32]) -> Option<u32> {
    let step = values.get(1)? - values[0];
    values
        .windows(2)
        .all(|w| w[1] - w[0] == step)
        .then_some(step)
}

/// A seconds field of several values, with the minute and hour fields.
fn seconds_words(s: &[u32], m: &[u32], h: &[u32]) -> String {
    let (m_full, h_full) = (is_full(m, Field::Minute), is_full(h, Field::Hour));
    let seconds = if is_full(s, Field::Second) {
        "every second".to_owned()
    } else if let Some(n) = every_nth(s, 60) {
        format!("every {n} seconds")
    } else {
        format!("at seconds {} of every minute", numbers(s))
    };
    match (m_full, h_full) {
        (true, true) => seconds,
        (true, false) => format!("{seconds} past hour{} {}", plural(h), numbers(h)),
        (false, true) => format!("{seconds} in minute{} {}", plural(m), numbers(m)),
        (false, false) => format!(
            "{seconds} in minute{} {} past hour{} {}",
            plural(m),
            numbers(m),
            plural(h),
            numbers(h)
        ),
    }
}

/// The day and month fields in words (`on the last Friday of the month`), empty for every
/// day.
fn date_words(f: &Fields<'_>) -> String {
    let months = values(&f.month, Field::Month);
    let month_words = if is_full(&months, Field::Month) {
        String::new()
    } else {
        format!(" {}", months_words(&months))
    };
    let (dom_r, dow_r) = (!f.dom.is_star(), !f.dow.is_star());
    let days = values(&f.dom, Field::DayOfMonth);
    if dom_r
        && !dow_r
        && months.len() == 1
        && let ([Item::Value(_)], [day]) = (f.dom.items(), &days[..])
    {
        return format!("on {day} {}", MONTHS[months[0] as usize - 1]);
    }
    let days = match (dom_r, dow_r) {
        (false, false) => return month_words.trim_start().to_owned(),
        (true, false) => format!("on {}", dom_words(&f.dom)),
        (false, true) => format!("on {}", dow_words(&f.dow, "and")),
        (true, true) if f.days_or() => format!(
            "on {} or on {}",
            dom_words(&f.dom),
            dow_words(&f.dow, "and")
        ),
        (true, true) => format!(
            "on {} when it falls on {}",
            dom_words(&f.dom),
            dow_words(&f.dow, "or")
        ),
    };
    format!("{days}{month_words}")
}

/// Month names, from January.
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Weekday names, from Sunday (0).
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `in January and July`, `from March to June`.
fn months_words(months: &[u32]) -> String {
    let name = |m: &u32| MONTHS[*m as usize - 1].to_owned();
    if months.len() >= 3 && consecutive(months) {
        return format!(
            "from {} to {}",
            name(&months[0]),
            name(&months[months.len() - 1])
        );
    }
    format!(
        "in {}",
        and_list(&months.iter().map(name).collect::<Vec<_>>())
    )
}

/// `1st`, `2nd`, `15th`, `22nd`.
fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A restricted day-of-month field: `day 1 and 15 of the month`, `the last weekday of the
/// month`.
fn dom_words(field: &ParsedField) -> String {
    let days = values(field, Field::DayOfMonth);
    let mut items = Vec::new();
    if !days.is_empty() {
        items.push(format!("day {}", numbers(&days)));
    }
    for item in field.items() {
        match *item {
            Item::LastDay => items.push("the last day".to_owned()),
            Item::LastWeekday => items.push("the last weekday".to_owned()),
            Item::NearestWeekday(d) => {
                items.push(format!("the weekday nearest the {}", ordinal(d)));
            }
            _ => {}
        }
    }
    format!("{} of the month", and_list(&items))
}

/// A restricted day-of-week field: `weekdays`, `Monday and Friday`, `the third Friday of the
/// month`, the last two items joined by `word`.
fn dow_words(field: &ParsedField, word: &str) -> String {
    let days = values(field, Field::DayOfWeek);
    // From Monday, Sunday last, as a week is said.
    let week: Vec<u32> = [1, 2, 3, 4, 5, 6, 0]
        .into_iter()
        .filter(|d| days.contains(d))
        .collect();
    let mut items = Vec::new();
    if week.len() == 7 {
        items.push("any day".to_owned());
    } else if week == [1, 2, 3, 4, 5] {
        items.push("weekdays".to_owned());
    } else {
        let position = |d: u32| (d + 6) % 7;
        let mut i = 0;
        while i < week.len() {
            let mut j = i;
            while j + 1 < week.len() && position(week[j + 1]) == position(week[j]) + 1 {
                j += 1;
            }
            if j >= i + 2 {
                items.push(format!(
                    "{} to {}",
                    WEEKDAYS[week[i] as usize], WEEKDAYS[week[j] as usize]
                ));
            } else {
                items.extend(week[i..=j].iter().map(|d| WEEKDAYS[*d as usize].to_owned()));
            }
            i = j + 1;
        }
    }
    let mut of_month = false;
    for item in field.items() {
        let (which, weekday) = match *item {
            Item::LastOf(w) => ("last".to_owned(), w),
            Item::Nth { weekday, n } => (
                ["first", "second", "third", "fourth", "fifth"][n as usize - 1].to_owned(),
                weekday,
            ),
            _ => continue,
        };
        of_month = true;
        items.push(format!("the {which} {}", WEEKDAYS[(weekday % 7) as usize]));
    }
    let mut words = list(&items, word);
    if of_month {
        words.push_str(" of the month");
    }
    words
}

mod rrule;
#[cfg(test)]
mod tests;
