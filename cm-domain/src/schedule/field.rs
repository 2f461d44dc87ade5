//! One field of a cron expression, checked item by item: its values, ranges, steps and names.
//!
//! A field is a comma-separated list of items (`*`, `*/step`, a value, `a-b`, `a-b/step`); each is
//! checked against the field's bounds and names here, so that a refusal names the field and says
//! what is wrong with it. The day fields also take Quartz's items: `L` (the last day of the
//! month), `LW` (its last weekday) and `15W` (the weekday nearest the 15th) in day-of-month,
//! `5L` (the last Friday) and `5#3` (the third Friday) in day-of-week; each stands alone in its
//! list item, with no range or step. The checked field ([`ParsedField`]) knows the days and
//! values it selects and how croner must be given it; [`super::cron`] puts the fields together.

use std::fmt;

use super::ScheduleError;

/// One field of a cron expression, named as error messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The seconds field (0-59), first in a six-field expression.
    Second,
    /// The minutes field (0-59).
    Minute,
    /// The hours field (0-23).
    Hour,
    /// The day-of-month field (1-31).
    DayOfMonth,
    /// The month field (1-12 or `JAN`-`DEC`).
    Month,
    /// The day-of-week field (0-7 or `SUN`-`SAT`; 0 and 7 are Sunday).
    DayOfWeek,
}

impl Field {
    /// The field's name: `second`, `minute`, `hour`, `day-of-month`, `month` or `day-of-week`.
    pub fn name(self) -> &'static str {
        match self {
            Field::Second => "second",
            Field::Minute => "minute",
            Field::Hour => "hour",
            Field::DayOfMonth => "day-of-month",
            Field::Month => "month",
            Field::DayOfWeek => "day-of-week",
        }
    }

    /// The smallest and largest value the field accepts.
    pub fn bounds(self) -> (u32, u32) {
        match self {
            Field::Second | Field::Minute => (0, 59),
            Field::Hour => (0, 23),
            Field::DayOfMonth => (1, 31),
            Field::Month => (1, 12),
            Field::DayOfWeek => (0, 7),
        }
    }

    /// The names the field accepts for its values, indexed from its first named value.
    fn names(self) -> &'static [&'static str] {
        match self {
            Field::Month => &[
                "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
            ],
            Field::DayOfWeek => &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
            _ => &[],
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One item of a field's comma-separated list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Item {
    /// `*` or `*/step`.
    Star { step: u32 },
    /// `v`.
    Value(u32),
    /// `a-b` or `a-b/step`.
    Range { start: u32, end: u32, step: u32 },
    /// `L` in day-of-month: the month's last day.
    LastDay,
    /// `LW` in day-of-month: the month's last weekday (Monday to Friday).
    LastWeekday,
    /// `dW` in day-of-month: the weekday nearest day `d`, in the same month.
    NearestWeekday(u32),
    /// `wL` in day-of-week: the month's last weekday `w` (0 and 7 are Sunday).
    LastOf(u32),
    /// `w#n` in day-of-week: the `n`th weekday `w` of the month (1 to 5).
    Nth { weekday: u32, n: u32 },
}

/// A checked field: its items, the values they select and its canonical text.
pub(super) struct ParsedField {
    /// The items in the order written.
    items: Vec<Item>,
    /// Bit `v` is set when the field selects value `v` (day-of-week 7 is kept as 7); Quartz's
    /// items, which select days by the month they fall in, are not in it.
    pub(super) values: u64,
}

impl ParsedField {
    /// The items in the order written.
    pub(super) fn items(&self) -> &[Item] {
        &self.items
    }

    /// Whether the field is one plain number.
    pub(super) fn is_single_value(&self) -> bool {
        matches!(self.items.as_slice(), [Item::Value(_)])
    }

    /// Whether the field starts with `*`, which crontab(5) calls unrestricted when it decides
    /// how the two day fields combine.
    pub(super) fn starts_with_star(&self) -> bool {
        matches!(self.items.first(), Some(Item::Star { .. }))
    }

    /// Whether the field is exactly `*`.
    pub(super) fn is_star(&self) -> bool {
        matches!(self.items.as_slice(), [Item::Star { step: 1 }])
    }

    /// The field as croner reads it.
    pub(super) fn canonical(&self) -> String {
        let items: Vec<String> = self
            .items
            .iter()
            .map(|item| match *item {
                Item::Star { step: 1 } => "*".to_owned(),
                Item::Star { step } => format!("*/{step}"),
                Item::Value(v) => v.to_string(),
                Item::Range {
                    start,
                    end,
                    step: 1,
                } => format!("{start}-{end}"),
                Item::Range { start, end, step } => format!("{start}-{end}/{step}"),
                Item::LastDay => "L".to_owned(),
                Item::LastWeekday => "LW".to_owned(),
                Item::NearestWeekday(d) => format!("{d}W"),
                Item::LastOf(w) => format!("{}L", w % 7),
                Item::Nth { weekday, n } => format!("{}#{n}", weekday % 7),
            })
            .collect();
        items.join(",")
    }

    /// Whether a day field selects `day` of a month `length` days long, `weekday` being the
    /// day's weekday (0 is Sunday): a day-of-month field by the day's number, `L`, `LW` and
    /// `dW`; a day-of-week field by its weekday, `wL` and `w#n`.
    pub(super) fn selects_day(&self, field: Field, day: u32, length: u32, weekday: u32) -> bool {
        // The weekday of another day `d` of the same month.
        let weekday_of = |d: u32| (weekday + 7 * 5 + d - day) % 7;
        let plain = match field {
            Field::DayOfMonth => self.values & (1 << day) != 0,
            _ => self.values & (1 << weekday) != 0 || (weekday == 0 && self.values & (1 << 7) != 0),
        };
        plain
            || self.items.iter().any(|item| match *item {
                Item::LastDay => day == length,
                Item::LastWeekday => {
                    day == nearest_weekday(length, length, weekday_of(length)).unwrap_or(0)
                }
                Item::NearestWeekday(d) => {
                    d <= length && nearest_weekday(d, length, weekday_of(d)) == Some(day)
                }
                Item::LastOf(w) => w % 7 == weekday && day + 7 > length,
                Item::Nth { weekday: w, n } => w % 7 == weekday && (day - 1) / 7 + 1 == n,
                Item::Star { .. } | Item::Value(_) | Item::Range { .. } => false,
            })
    }

    /// The canonical text of a second, minute or hour field, written so that croner classifies
    /// the schedule as cm does.
    ///
    /// croner calls a field fixed when it selects one value without a wildcard or a step, so it
    /// would call `2-2` and `2,2` fixed; cm calls them interval fields, because a range or list
    /// was written. Rewriting such a field as the equivalent stepped range `v-v/2` selects the
    /// same single value and carries a step, which croner classifies as interval.
    pub(super) fn canonical_time(&self) -> String {
        let single = self.values.count_ones() == 1;
        let has_star_or_step = self.items.iter().any(|item| {
            matches!(item, Item::Star { .. })
                || matches!(item, Item::Range { step, .. } if *step > 1)
        });
        if single && !self.is_single_value() && !has_star_or_step {
            let v = self.values.trailing_zeros();
            format!("{v}-{v}/2")
        } else {
            self.canonical()
        }
    }
}

/// The weekday (Monday to Friday) nearest day `d` of a month `length` days long, `weekday` being
/// the weekday of `d` (0 is Sunday), by Quartz's rule for `W`: a Saturday moves to the Friday
/// before and a Sunday to the Monday after, but never out of the month (a Saturday 1st moves to
/// Monday the 3rd, a Sunday last day to the Friday two days before). `None` past the month's
/// end. The month's last weekday (`LW`) is the one nearest its last day.
pub(super) fn nearest_weekday(d: u32, length: u32, weekday: u32) -> Option<u32> {
    if d == 0 || d > length {
        return None;
    }
    Some(match weekday {
        6 if d == 1 => 3,
        6 => d - 1,
        0 if d == length => d - 2,
        0 => d + 1,
        _ => d,
    })
}

/// Checks one field and returns its items and values.
pub(super) fn parse_field(field: Field, text: &str) -> Result<ParsedField, ScheduleError> {
    let error = |reason: String| ScheduleError::Field {
        field,
        text: text.to_owned(),
        reason,
    };
    if let Some(ch) = text.chars().find(|c| !c.is_ascii()) {
        return Err(error(format!(
            "non-ASCII character {ch:?} (U+{:04X}); write digits as 0-9",
            u32::from(ch)
        )));
    }
    let (lo, hi) = field.bounds();
    let mut items = Vec::new();
    let mut values = 0u64;
    for part in text.split(',') {
        if part.is_empty() {
            return Err(error("empty list item".to_owned()));
        }
        let item = match parse_quartz(field, part) {
            Some(quartz) => quartz.map_err(error)?,
            None => parse_item(field, part).map_err(error)?,
        };
        let (start, end, step) = match item {
            Item::Star { step } => (lo, hi, step),
            Item::Value(v) => (v, v, 1),
            Item::Range { start, end, step } => (start, end, step),
            // Quartz's items select days by the month they fall in, not by a value.
            _ => {
                items.push(item);
                continue;
            }
        };
        let mut v = start;
        while v <= end {
            values |= 1 << v;
            v += step;
        }
        items.push(item);
    }
    if items.contains(&Item::LastDay) && items.contains(&Item::LastWeekday) {
        return Err(error(
            "`L` and `LW` cannot share a list (the cron engine would read both as LW)".to_owned(),
        ));
    }
    Ok(ParsedField { items, values })
}

/// Checks one list item of a day field written with Quartz's `L`, `W` or `#`; `None` when the
/// item is not one (it is checked as a plain item then).
fn parse_quartz(field: Field, part: &str) -> Option<Result<Item, String>> {
    let base = part.split('/').next().unwrap_or(part).to_ascii_uppercase();
    let quartz = match field {
        Field::DayOfMonth => base.contains(['L', 'W', '#']),
        // No weekday name ends with `L` or `W`, or holds a `#`.
        Field::DayOfWeek => base.contains('#') || base.ends_with('L') || base.ends_with('W'),
        _ => false,
    };
    if !quartz {
        return None;
    }
    Some(if field == Field::DayOfMonth && base.contains('#') {
        Err("`#` belongs in the day-of-week field (5#3 is the third Friday)".to_owned())
    } else if part.contains(['/', '-']) {
        Err(match base.strip_prefix("L-") {
            Some(offset) if field == Field::DayOfMonth && !part.contains('/') => format!(
                "L-{offset}: an offset from the last day is not supported (write L, LW or a \
                 day with W such as 15W)"
            ),
            _ => "`L`, `W` and `#` stand alone in a list item, with no range or step".to_owned(),
        })
    } else if field == Field::DayOfMonth {
        parse_day_of_month_quartz(&base)
    } else {
        parse_day_of_week_quartz(&base)
    })
}

/// Checks `L`, `LW` or `dW` (upper-cased) in day-of-month.
fn parse_day_of_month_quartz(item: &str) -> Result<Item, String> {
    match item {
        "L" => return Ok(Item::LastDay),
        "LW" => return Ok(Item::LastWeekday),
        "W" => {
            return Err(
                "`W` needs a day before it (15W is the weekday nearest the 15th, LW the last \
                 weekday)"
                    .to_owned(),
            );
        }
        _ => {}
    }
    match item.strip_suffix('W') {
        Some(day) if !day.is_empty() && day.bytes().all(|b| b.is_ascii_digit()) => {
            match day.parse::<u32>() {
                Ok(d) if (1..=31).contains(&d) => Ok(Item::NearestWeekday(d)),
                _ => Err(format!("{item}: the day before `W` must be 1-31")),
            }
        }
        _ => Err(format!(
            "{item:?} is not a day-of-month item (expected a number, L, LW or a day with W such \
             as 15W)"
        )),
    }
}

/// Checks `wL` or `w#n` (upper-cased) in day-of-week.
fn parse_day_of_week_quartz(item: &str) -> Result<Item, String> {
    if item.ends_with('W') {
        return Err(
            "`W` belongs in the day-of-month field (15W is the weekday nearest the 15th)"
                .to_owned(),
        );
    }
    if let Some((weekday, n)) = item.split_once('#') {
        if weekday.is_empty() {
            return Err("`#` needs a weekday before it (5#3 is the third Friday)".to_owned());
        }
        let weekday = parse_value(Field::DayOfWeek, weekday)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "`#` must be followed by 1 to 5, not {n:?} (5#3 is the third Friday)"
            ));
        }
        return match n.parse::<u32>() {
            Ok(n @ 1..=5) => Ok(Item::Nth { weekday, n }),
            _ => Err(format!(
                "#{n}: a weekday occurs 1 to 5 times in a month (write #1 to #5)"
            )),
        };
    }
    match item.strip_suffix('L') {
        Some("") | None => Err(
            "`L` in day-of-week needs a weekday before it (5L is the last Friday; the last day \
             of the month is L in day-of-month)"
                .to_owned(),
        ),
        Some(weekday) => Ok(Item::LastOf(parse_value(Field::DayOfWeek, weekday)?)),
    }
}

/// Checks one list item: `*`, `*/step`, a value, `a-b` or `a-b/step`.
fn parse_item(field: Field, part: &str) -> Result<Item, String> {
    let (_, hi) = field.bounds();
    let (base, step) = match part.split_once('/') {
        Some((base, step_text)) => (base, Some(parse_step(field, step_text)?)),
        None => (part, None),
    };
    if base == "*" {
        return Ok(Item::Star {
            step: step.unwrap_or(1),
        });
    }
    match base.split_once('-') {
        Some((start_text, end_text)) => {
            let start = parse_value(field, start_text)?;
            let mut end = parse_value(field, end_text)?;
            // `FRI-SUN` means Friday to Sunday: a range that ends on Sunday by name ends on 7.
            if field == Field::DayOfWeek
                && end == 0
                && start > 0
                && end_text.eq_ignore_ascii_case("SUN")
            {
                end = 7;
            }
            if start > end {
                return Err(format!(
                    "range {start_text}-{end_text} runs backwards (its start is after its end)"
                ));
            }
            Ok(Item::Range {
                start,
                end,
                step: step.unwrap_or(1),
            })
        }
        None => {
            let value = parse_value(field, base)?;
            if step.is_some() {
                return Err(format!(
                    "a step needs `*` or a range before it (write */{s} or {value}-{hi}/{s})",
                    s = step.unwrap_or(1)
                ));
            }
            Ok(Item::Value(value))
        }
    }
}

/// Checks a step: a number from 1 to the number of values in the field.
fn parse_step(field: Field, text: &str) -> Result<u32, String> {
    let (lo, hi) = field.bounds();
    if text.contains('/') {
        return Err("more than one `/` in an item".to_owned());
    }
    if text.is_empty() {
        return Err("`/` must be followed by a step".to_owned());
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("step {text:?} is not a number"));
    }
    let span = hi - lo + 1;
    match text.parse::<u32>() {
        Ok(0) => Err("step 0 is not allowed (a step is at least 1)".to_owned()),
        Ok(step) if step <= span => Ok(step),
        _ => Err(format!(
            "step {text} is larger than the {span} values in {lo}-{hi}"
        )),
    }
}

/// Checks a value: a number in the field's range, or a month or weekday name.
fn parse_value(field: Field, text: &str) -> Result<u32, String> {
    let (lo, hi) = field.bounds();
    if text.is_empty() {
        return Err("a range needs a value on each side of `-`".to_owned());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u32>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(v),
            _ => Err(format!("{text} is out of range {lo}-{hi}")),
        };
    }
    if text.bytes().all(|b| b.is_ascii_alphabetic()) {
        let names = field.names();
        if names.is_empty() {
            return Err(format!(
                "{text:?} is not a number (names are only allowed in the month and day-of-week \
                 fields)"
            ));
        }
        let first = if field == Field::Month { 1 } else { 0 };
        return names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(text))
            .map(|i| first + i as u32)
            .ok_or_else(|| {
                format!(
                    "unknown name {text:?} (expected one of {})",
                    names.join(", ")
                )
            });
    }
    if text == "?" && matches!(field, Field::DayOfMonth | Field::DayOfWeek) {
        return Err(
            "`?` is not supported: write `*` (the day fields combine as in crontab(5))".to_owned(),
        );
    }
    Err(format!(
        "{text:?} is not a value (expected a number{})",
        if field.names().is_empty() {
            ""
        } else {
            " or a name"
        }
    ))
}

#[cfg(test)]
mod tests {
    use crate::schedule::testing::{check, check_err};

    #[test]
    fn refuses_out_of_range_values_naming_the_field() {
        check_err("61 * * * *", "minute");
        check_err("61 * * * *", "61 is out of range 0-59");
        check_err("60 * * * *", "minute");
        check_err("* 24 * * *", "hour");
        check_err("* * 0 * *", "day-of-month");
        check_err("* * 32 * *", "day-of-month");
        check_err("* * * 0 *", "month");
        check_err("* * * 13 *", "month");
        check_err("* * * * 8", "day-of-week");
        check_err("60 * * * * *", "second");
        check_err("* 60 * * * *", "minute");
        check_err("0 0 1,32 * *", "day-of-month");
        check_err("0 0-24 * * *", "hour");
        check_err("99999999999999999999999 * * * *", "minute");
    }

    #[test]
    fn refuses_reversed_ranges_and_bad_steps() {
        check_err("5-1 * * * *", "minute");
        check_err("5-1 * * * *", "runs backwards");
        check_err("* 5-1 * * *", "hour");
        check_err("0 0 * * FRI-MON", "day-of-week");
        check_err("0 0 * DEC-JAN *", "month");
        check_err("*/0 * * * *", "minute");
        check_err("*/0 * * * *", "step 0");
        check_err("0 */0 * * *", "hour");
        check_err("0 0 1-31/0 * *", "day-of-month");
        check_err("*/61 * * * *", "larger than the 60 values");
        check_err("0 */25 * * *", "hour");
        check_err("5/10 * * * *", "a step needs `*` or a range");
        check_err("/10 * * * *", "minute");
        check_err("*/ * * * *", "followed by a step");
        check_err("*/5/2 * * * *", "more than one `/`");
        check_err("1-2-3 * * * *", "minute");
        check_err("1- * * * *", "minute");
        check_err("-1 * * * *", "minute");
        check_err("*/x * * * *", "not a number");
    }

    #[test]
    fn refuses_non_ascii_digits_and_stray_characters() {
        // Arabic-Indic three, fullwidth five, Devanagari one.
        check_err("\u{663} * * * *", "minute");
        check_err("\u{663} * * * *", "non-ASCII");
        check_err("0 \u{ff15} * * *", "hour");
        check_err("0 0 \u{967} * *", "day-of-month");
        check_err("0 0 1 \u{ff11} *", "month");
        check_err("0 0 * * \u{ff11}", "day-of-week");
        check_err("\u{ff10} 0 0 * * *", "second");
        // An ideographic space is not a separator.
        check_err("0\u{3000}0 * * *", "U+3000");
        check_err("0 0 * * *\n", "day-of-week");
        check_err("0 0 * * *\n0 1 * * *", "U+000A");
        check_err("+5 * * * *", "minute");
        check_err("0 12 13 * +5", "day-of-week");
        check_err("0 0 1,,2 * *", "empty list item");
        check_err("0 0 1, * *", "empty list item");
        check_err("MON * * * *", "names are only allowed");
        check_err("0 0 * JAN MONDAY", "unknown name");
        check_err("0 0 * * JAN", "day-of-week");
        check_err("0 0 * MON *", "month");
    }

    #[test]
    fn accepts_quartz_day_items() {
        for expr in [
            "0 9 L * *",
            "0 9 l * *",
            "0 9 LW * *",
            "0 9 lw * *",
            "0 9 15W * *",
            "0 9 15w * *",
            "0 9 1W * *",
            "0 9 31W * *",
            "0 9 1,15W,L * *",
            "0 9 15W,LW * *",
            "0 9 * * 5L",
            "0 9 * * 5l",
            "0 9 * * FRIL",
            "0 9 * * fril",
            "0 9 * * 7L",
            "0 9 * * 5#3",
            "0 9 * * FRI#3",
            "0 9 * * fri#3",
            "0 9 * * 0#1",
            "0 9 * * 7#5",
            "0 9 * * SUN#5",
            "0 9 * * 1#1,1#3,5L",
            "0 9 * * MON-FRI,5L",
            "0 9 L * 5#3",
            "0 0 9 L * *",
        ] {
            check(expr, "UTC", true);
        }
        check("*/30 9 LW * *", "Europe/Berlin", false);
    }

    #[test]
    fn writes_quartz_items_for_croner_upper_cased_with_sunday_as_0() {
        let canonical = |expr: &str| {
            crate::schedule::compile_cron(expr)
                .map(|c| c.canonical)
                .unwrap_or_else(|e| panic!("{expr:?}: {e}"))
        };
        assert_eq!(canonical("0 9 l * *"), "0 0 9 L * *");
        assert_eq!(canonical("0 9 1,15w,lw * *"), "0 0 9 1,15W,LW * *");
        assert_eq!(canonical("0 9 015W * *"), "0 0 9 15W * *");
        assert_eq!(canonical("0 9 * * fri#3,SUNL,7#2"), "0 0 9 * * 5#3,0L,0#2");
        assert_eq!(canonical("0 9 */2 * 5L"), "0 0 9 */2 * +5L");
    }

    #[test]
    fn refuses_quartz_items_that_make_no_sense() {
        for (expr, field, words) in [
            ("0 0 L/2 * *", "day-of-month", "no range or step"),
            ("0 0 15W/2 * *", "day-of-month", "no range or step"),
            ("0 0 1-15W * *", "day-of-month", "no range or step"),
            ("0 0 L-3 * *", "day-of-month", "offset from the last day"),
            (
                "0 0 0W * *",
                "day-of-month",
                "0W: the day before `W` must be 1-31",
            ),
            (
                "0 0 32W * *",
                "day-of-month",
                "32W: the day before `W` must be 1-31",
            ),
            ("0 0 W * *", "day-of-month", "`W` needs a day before it"),
            ("0 0 WL * *", "day-of-month", "not a day-of-month item"),
            ("0 0 5L * *", "day-of-month", "not a day-of-month item"),
            (
                "0 0 5#3 * *",
                "day-of-month",
                "`#` belongs in the day-of-week field",
            ),
            (
                "0 0 L,LW * *",
                "day-of-month",
                "`L` and `LW` cannot share a list",
            ),
            (
                "0 0 * * 5W",
                "day-of-week",
                "`W` belongs in the day-of-month field",
            ),
            (
                "0 0 * * LW",
                "day-of-week",
                "`W` belongs in the day-of-month field",
            ),
            ("0 0 * * L", "day-of-week", "needs a weekday before it"),
            (
                "0 0 * * 5#0",
                "day-of-week",
                "#0: a weekday occurs 1 to 5 times",
            ),
            (
                "0 0 * * 5#6",
                "day-of-week",
                "#6: a weekday occurs 1 to 5 times",
            ),
            (
                "0 0 * * 5#",
                "day-of-week",
                "`#` must be followed by 1 to 5",
            ),
            (
                "0 0 * * 5#+3",
                "day-of-week",
                "`#` must be followed by 1 to 5",
            ),
            ("0 0 * * #3", "day-of-week", "`#` needs a weekday before it"),
            ("0 0 * * 8#1", "day-of-week", "8 is out of range 0-7"),
            ("0 0 * * FRIDAY#1", "day-of-week", "unknown name"),
            ("0 0 * * 8L", "day-of-week", "8 is out of range 0-7"),
            ("0 0 * * 1-5#2", "day-of-week", "no range or step"),
            ("0 0 * * 5#3/2", "day-of-week", "no range or step"),
            ("0 0 * * 5L/2", "day-of-week", "no range or step"),
            (
                "0 0 * * 5#1#2",
                "day-of-week",
                "`#` must be followed by 1 to 5",
            ),
            ("0 0 ? * MON", "day-of-month", "`?` is not supported"),
            ("0 0 * * ?", "day-of-week", "`?` is not supported"),
            ("L 0 * * *", "minute", "not a number"),
            ("0 0 * L *", "month", "unknown name"),
        ] {
            check_err(expr, &format!("{field} field"));
            check_err(expr, words);
        }
    }

    #[test]
    fn refuses_croner_extensions() {
        check_err("0 0 * * +5", "day-of-week");
        check_err("0 0 1 1 * 2030 x", "found 7");
        check_err("5/10 * * * *", "a step needs `*` or a range");
    }

    #[test]
    fn nearest_weekday_follows_quartz() {
        use super::nearest_weekday;
        // (day, month length, weekday of the day) -> the day W picks.
        for (d, length, weekday, picked) in [
            (15, 31, 3, Some(15)), // a Wednesday stays
            (15, 31, 6, Some(14)), // a Saturday moves to Friday
            (15, 31, 0, Some(16)), // a Sunday moves to Monday
            (1, 31, 6, Some(3)),   // a Saturday 1st: Monday the 3rd, not the month before
            (1, 31, 0, Some(2)),   // a Sunday 1st: Monday the 2nd
            (31, 31, 0, Some(29)), // a Sunday 31st: Friday the 29th, not the month after
            (31, 31, 6, Some(30)), // a Saturday 31st: Friday the 30th
            (28, 28, 0, Some(26)), // a Sunday 28 February: Friday the 26th
            (30, 30, 1, Some(30)),
            (31, 30, 1, None), // no 31st
        ] {
            assert_eq!(nearest_weekday(d, length, weekday), picked, "{d}W");
        }
    }
}
