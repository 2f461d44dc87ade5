//! A whole cron expression: its field count, its macros, the calendar of its day fields, and its
//! canonical form compiled by croner.
//!
//! [`compile_cron`] splits the expression into five or six fields, expands a macro, checks each
//! field ([`super::field`]), refuses day-of-month and month fields that never meet, and hands
//! croner one canonical six-field text, so that what croner compiles is exactly what cm checked.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use super::ScheduleError;
use super::field::{Field, ParsedField, parse_field};

/// The longest cron expression accepted, in characters.
pub const MAX_EXPRESSION_CHARS: usize = 256;

/// A cron expression that passed cm's checks, compiled by croner.
pub(crate) struct CompiledCron {
    /// The compiled expression.
    pub cron: Cron,
    /// Whether second, minute and hour are each one plain number.
    pub fixed_time: bool,
    /// Its canonical six-field form, seconds first.
    pub canonical: String,
}

/// Checks a cron expression field by field and compiles it.
pub(crate) fn compile_cron(expression: &str) -> Result<CompiledCron, ScheduleError> {
    let checked = check_expression(expression)?;
    let cron = CronParser::builder()
        .seconds(Seconds::Required)
        .year(Year::Disallowed)
        .dom_and_dow(false)
        .build()
        .parse(&checked.canonical)
        .map_err(|e| ScheduleError::Invalid(e.to_string()))?;
    Ok(CompiledCron {
        cron,
        fixed_time: checked.fixed_time,
        canonical: checked.canonical,
    })
}

/// An expression that passed cm's checks, in the form handed to croner.
struct CheckedExpression {
    /// Six numeric fields, seconds first, with no names or macros.
    canonical: String,
    /// Whether second, minute and hour are each one plain number.
    fixed_time: bool,
}

/// The macros accepted, and the five fields each stands for.
const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Checks an expression field by field and produces its canonical form.
fn check_expression(expression: &str) -> Result<CheckedExpression, ScheduleError> {
    let chars = expression.chars().count();
    if chars > MAX_EXPRESSION_CHARS {
        return Err(ScheduleError::TooLong { chars });
    }
    // Fields are separated by spaces and tabs only. Any other character, a newline included,
    // stays inside a field and is refused there, so a pasted line with stray text cannot be
    // half-read.
    let mut tokens: Vec<&str> = expression
        .split([' ', '\t'])
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() {
        return Err(ScheduleError::Empty);
    }
    if tokens[0].starts_with('@') {
        tokens = expand_macro(tokens[0], tokens.len())?;
    }
    if tokens.len() != 5 && tokens.len() != 6 {
        // A wrong count can come from a separator cm does not know (a no-break space, an
        // ideographic space); naming that character is more useful than the count.
        if let Some(ch) = expression
            .chars()
            .find(|c| !(c.is_ascii_graphic() || *c == ' ' || *c == '\t'))
        {
            return Err(ScheduleError::Character { ch });
        }
        return Err(ScheduleError::FieldCount {
            found: tokens.len(),
        });
    }
    let (second_text, rest) = if tokens.len() == 6 {
        (tokens[0], &tokens[1..])
    } else {
        ("0", &tokens[..])
    };
    let second = parse_field(Field::Second, second_text)?;
    let minute = parse_field(Field::Minute, rest[0])?;
    let hour = parse_field(Field::Hour, rest[1])?;
    let dom = parse_field(Field::DayOfMonth, rest[2])?;
    let month = parse_field(Field::Month, rest[3])?;
    let dow = parse_field(Field::DayOfWeek, rest[4])?;

    // crontab(5): when both day fields are restricted (neither starts with `*`) a day matches
    // if either matches; otherwise both must. croner ORs unless a day field is exactly `*`, so
    // a field such as `*/2` needs croner's per-expression AND marker, a `+` before the
    // day-of-week field.
    let days_or = !dom.starts_with_star() && !dow.starts_with_star();
    if !days_or {
        check_calendar(&dom, &month, rest[2], rest[3])?;
    }
    let and_marker = if !days_or && !dom.is_star() && !dow.is_star() {
        "+"
    } else {
        ""
    };
    let canonical = format!(
        "{} {} {} {} {} {and_marker}{}",
        second.canonical_time(),
        minute.canonical_time(),
        hour.canonical_time(),
        dom.canonical(),
        month.canonical(),
        dow.canonical(),
    );
    Ok(CheckedExpression {
        canonical,
        fixed_time: second.is_single_value() && minute.is_single_value() && hour.is_single_value(),
    })
}

/// The fields a macro stands for; `@reboot` and unknown macros are refused.
fn expand_macro(name: &str, tokens: usize) -> Result<Vec<&'static str>, ScheduleError> {
    if name.eq_ignore_ascii_case("@reboot") {
        return Err(ScheduleError::Macro {
            name: name.to_owned(),
            reason: "a routine runs at scheduled times, not when the scheduler starts",
        });
    }
    let expansion = MACROS
        .iter()
        .find(|(m, _)| m.eq_ignore_ascii_case(name))
        .map(|(_, fields)| fields)
        .ok_or_else(|| ScheduleError::Macro {
            name: name.to_owned(),
            reason: "unknown macro (expected @yearly, @annually, @monthly, @weekly, @daily, \
                     @midnight or @hourly)",
        })?;
    if tokens != 1 {
        return Err(ScheduleError::Macro {
            name: name.to_owned(),
            reason: "a macro stands alone, with no other fields",
        });
    }
    Ok(expansion.split(' ').collect())
}

/// Refuses day-of-month and month fields that never meet (`30` in `2`), when the days must
/// match by day of month.
fn check_calendar(
    dom: &ParsedField,
    month: &ParsedField,
    dom_text: &str,
    month_text: &str,
) -> Result<(), ScheduleError> {
    // The longest each month can be: February has 29 days in leap years, and every day of a
    // month meets every weekday over the years, so this is exact.
    const LONGEST: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let first_day = dom.values.trailing_zeros();
    let fits = (1..=12u32)
        .filter(|m| month.values & (1 << m) != 0)
        .any(|m| first_day <= LONGEST[(m - 1) as usize]);
    if fits {
        Ok(())
    } else {
        Err(ScheduleError::NeverFires {
            reason: format!("day-of-month {dom_text:?} never occurs in month {month_text:?}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::testing::{check, check_err};

    #[test]
    fn accepts_vixie_syntax() {
        check("* * * * *", "UTC", false);
        check("0 0 * * *", "UTC", true);
        check("30 2 * * *", "America/New_York", true);
        check("*/15 * * * *", "UTC", false);
        check("0 9-17 * * MON-FRI", "Europe/Berlin", false);
        check("0 9 * * mon-fri", "Europe/Berlin", true);
        check("0 12 13 * 5", "UTC", true);
        check("0 0 1 JAN,jul *", "UTC", true);
        check("0 0 * * 0", "UTC", true);
        check("0 0 * * 7", "UTC", true);
        check("0 0 * * FRI-SUN", "UTC", true);
        check("0 0 * * SUN-SAT", "UTC", true);
        check("0 0 * * 0-7/2", "UTC", true);
        check("5,10,15-20/5 1 * * *", "UTC", false);
        check("0 0 29 2 *", "UTC", true);
        check("0 0 31 1-12 *", "UTC", true);
        check("0 0 30 2 1", "UTC", true);
        check("0 0 31 4 SAT", "UTC", true);
        check("00 09 01 01 *", "UTC", true);
        check("\t0  0 * * *  ", "UTC", true);
        check("*/59 * * * *", "UTC", false);
        check("*/60 * * * *", "UTC", false);
        check("0 */24 * * *", "UTC", false);
    }

    #[test]
    fn accepts_six_fields_with_seconds_first() {
        check("*/20 * * * * *", "UTC", false);
        check("15 30 2 * * *", "Europe/Berlin", true);
        check("0 0 0 * * *", "UTC", true);
        check("59 59 23 31 12 6", "UTC", true);
        check("0-30/10 0 0 * * *", "UTC", false);
    }

    #[test]
    fn classifies_degenerate_ranges_and_lists_as_interval() {
        check("30 2-2 * * *", "UTC", false);
        check("30,30 2 * * *", "UTC", false);
        check("0 30 2 * * *", "UTC", true);
        check("0-0 30 2 * * *", "UTC", false);
    }

    #[test]
    fn accepts_macros_but_not_reboot() {
        check("@yearly", "UTC", true);
        check("@annually", "UTC", true);
        check("@monthly", "UTC", true);
        check("@weekly", "UTC", true);
        check("@daily", "UTC", true);
        check("@MIDNIGHT", "UTC", true);
        check("@hourly", "UTC", false);
        check_err("@reboot", "@reboot is not supported");
        check_err("@REBOOT", "not when the scheduler starts");
        check_err("@every", "@every needs a value");
        check_err("@fortnightly", "unknown macro");
        check_err("@daily *", "stands alone");
        check_err("0 0 @ * *", "day-of-month");
    }

    #[test]
    fn refuses_wrong_field_counts() {
        check_err("* * * *", "found 4");
        check_err("* * * * * * *", "found 7");
        check_err("0 0 1 1 * 2030 x", "found 7");
        check_err("*", "found 1");
        check_err("", "empty");
        check_err("   ", "empty");
    }

    #[test]
    fn refuses_expressions_longer_than_the_limit() {
        let list = (0..60).map(|m| m.to_string()).collect::<Vec<_>>().join(",");
        let long = format!("{list},{list},{list} * * * *");
        assert!(long.len() > MAX_EXPRESSION_CHARS);
        check_err(&long, "characters long, the limit is 256");
        let at_limit = format!("{} * * * *", "0,".repeat(122) + "0");
        assert!(at_limit.len() <= MAX_EXPRESSION_CHARS);
        check(&at_limit, "UTC", false);
    }

    #[test]
    fn refuses_schedules_that_never_fire() {
        check_err("0 9 30 2 *", "never fires");
        check_err(
            "0 9 30 2 *",
            "day-of-month \"30\" never occurs in month \"2\"",
        );
        check_err("0 0 31 4 *", "never fires");
        check_err("0 0 31 APR,JUN,SEP,NOV *", "never fires");
        check_err("0 0 30-31 2 *", "never fires");
        check_err("0 0 31 2,4 *", "never fires");
        check_err("0 0 30 2 */2", "never fires");
    }
}
