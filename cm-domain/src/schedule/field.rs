//! One field of a cron expression, checked item by item: its values, ranges, steps and names.
//!
//! A field is a comma-separated list of items (`*`, `*/step`, a value, `a-b`, `a-b/step`); each is
//! checked against the field's bounds and names here, so that a refusal names the field and says
//! what is wrong with it. The checked field ([`ParsedField`]) knows the values it selects and how
//! croner must be given it; [`super::cron`] puts the fields together.

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
enum Item {
    /// `*` or `*/step`.
    Star { step: u32 },
    /// `v`.
    Value(u32),
    /// `a-b` or `a-b/step`.
    Range { start: u32, end: u32, step: u32 },
}

/// A checked field: its items, the values they select and its canonical text.
pub(super) struct ParsedField {
    /// The items in the order written.
    items: Vec<Item>,
    /// Bit `v` is set when the field selects value `v` (day-of-week 7 is kept as 7).
    pub(super) values: u64,
}

impl ParsedField {
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
            })
            .collect();
        items.join(",")
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
        let item = parse_item(field, part).map_err(error)?;
        let (start, end, step) = match item {
            Item::Star { step } => (lo, hi, step),
            Item::Value(v) => (v, v, 1),
            Item::Range { start, end, step } => (start, end, step),
        };
        let mut v = start;
        while v <= end {
            values |= 1 << v;
            v += step;
        }
        items.push(item);
    }
    Ok(ParsedField { items, values })
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
    Err(format!(
        "{text:?} is not a value (expected a number{}; `L`, `W`, `#` and `?` are not supported)",
        if field.names().is_empty() {
            ""
        } else {
            " or a name"
        }
    ))
}

#[cfg(test)]
mod tests {
    use crate::schedule::testing::check_err;

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
    fn refuses_quartz_and_croner_extensions() {
        check_err("0 0 L * *", "day-of-month");
        check_err("0 0 15W * *", "day-of-month");
        check_err("0 0 * * 5L", "day-of-week");
        check_err("0 0 * * MON#2", "day-of-week");
        check_err("0 0 ? * MON", "day-of-month");
        check_err("0 0 * * ?", "day-of-week");
    }
}
