//! A whole cron expression: its field count, its macros, the calendar of its day fields, and its
//! canonical form compiled by croner.
//!
//! [`compile_cron`] splits the expression into five or six fields, expands a macro, checks each
//! field ([`super::field`]), refuses day and month fields that never meet, and hands croner one
//! canonical six-field text, so that what croner compiles is exactly what cm checked.
//!
//! croner matches Quartz's `L`, `LW`, `dW`, `wL` and `w#n` as cm documents them (the tests
//! below check it against cm's own reading of every day of 28 years), so the canonical text
//! passes them on as written, upper-cased, with Sunday as 0.

use std::sync::LazyLock;

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

/// croner's parser as cm uses it: six fields, seconds first, then a year field, which
/// [`compile_cron`] always gives as [`A_YEAR`]; a day matches when either day field does, as in
/// Vixie cron.
static PARSER: LazyLock<CronParser> = LazyLock::new(|| {
    CronParser::builder()
        .seconds(Seconds::Required)
        .year(Year::Required)
        .dom_and_dow(false)
        .build()
});

/// The year field handed to croner: a single year, cheap to compile.
const A_YEAR: &str = "2000";

/// A compiled expression whose year field is `*`: its year component is every
/// expression's. croner compiles a `*` year as one entry per year from 1 to 5000, set one at a
/// time, which was two thirds of compiling an expression (a third of `routine import`'s CPU);
/// cloning this one is a copy of those bytes.
static EVERY_YEAR: LazyLock<Cron> = LazyLock::new(|| {
    PARSER
        .parse("0 0 0 * * * *")
        .expect("croner compiles a wildcard expression")
});

/// Checks a cron expression field by field and compiles it.
///
/// croner compiles the six fields cm checked with a single year ([`A_YEAR`]), whose component
/// is then replaced by [`EVERY_YEAR`]'s: the result equals croner's own compilation of the six
/// fields with any year (`CronPattern`'s equality compares every component; a test holds them
/// equal). Only croner's copy of the text (`Cron::as_str`) shows the year, and cm reads the
/// canonical text instead.
pub(crate) fn compile_cron(expression: &str) -> Result<CompiledCron, ScheduleError> {
    let checked = check_expression(expression)?;
    let mut cron = PARSER
        .parse(&format!("{} {A_YEAR}", checked.canonical))
        .map_err(|e| ScheduleError::Invalid(e.to_string()))?;
    cron.pattern.years = EVERY_YEAR.pattern.years.clone();
    Ok(CompiledCron {
        cron,
        fixed_time: checked.fixed_time,
        canonical: checked.canonical,
    })
}

/// An expression that passed cm's checks, in the form handed to croner.
struct CheckedExpression {
    /// Six fields, seconds first, with no names or macros: numbers, and Quartz's `L`, `W` and
    /// `#` upper-cased.
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

/// The six fields of an expression, each checked, a five-field one's second being `0`.
pub(super) struct Fields<'a> {
    /// The seconds field.
    pub second: ParsedField,
    /// The minutes field.
    pub minute: ParsedField,
    /// The hours field.
    pub hour: ParsedField,
    /// The day-of-month field.
    pub dom: ParsedField,
    /// The month field.
    pub month: ParsedField,
    /// The day-of-week field.
    pub dow: ParsedField,
    /// The day-of-month, month and day-of-week fields as written (a macro's expanded).
    pub day_texts: [&'a str; 3],
}

impl Fields<'_> {
    /// Whether a day matches if either day field matches (crontab(5): both are restricted,
    /// neither starts with `*`); otherwise it must match both.
    pub(super) fn days_or(&self) -> bool {
        !self.dom.starts_with_star() && !self.dow.starts_with_star()
    }
}

/// Splits an expression into its fields, expanding a macro, and checks each field.
pub(super) fn parse_fields(expression: &str) -> Result<Fields<'_>, ScheduleError> {
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
    Ok(Fields {
        second: parse_field(Field::Second, second_text)?,
        minute: parse_field(Field::Minute, rest[0])?,
        hour: parse_field(Field::Hour, rest[1])?,
        dom: parse_field(Field::DayOfMonth, rest[2])?,
        month: parse_field(Field::Month, rest[3])?,
        dow: parse_field(Field::DayOfWeek, rest[4])?,
        day_texts: [rest[2], rest[3], rest[4]],
    })
}

/// Checks an expression field by field and produces its canonical form.
fn check_expression(expression: &str) -> Result<CheckedExpression, ScheduleError> {
    let f = parse_fields(expression)?;
    let (second, minute, hour) = (&f.second, &f.minute, &f.hour);
    let (dom, month, dow) = (&f.dom, &f.month, &f.dow);

    // crontab(5): when both day fields are restricted (neither starts with `*`) a day matches
    // if either matches; otherwise both must. croner ORs unless a day field is exactly `*`, so
    // a field such as `*/2` needs croner's per-expression AND marker, a `+` before the
    // day-of-week field.
    let days_or = f.days_or();
    if !days_or {
        check_calendar(dom, month, dow, f.day_texts)?;
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

/// Refuses day fields and a month field that never meet, when a day must match both day
/// fields: a day of the month no month selected has (`30` in `2`, `31W` in `4`), or one that
/// never falls on a weekday the day-of-week field selects (`LW` on a Sunday, `*/31` (the 1st)
/// on a second Friday).
///
/// Every month starts on every weekday over the years, and February does in leap years and in
/// others, so trying each month the field selects, at each length it can have, starting on
/// each weekday, is exact.
fn check_calendar(
    dom: &ParsedField,
    month: &ParsedField,
    dow: &ParsedField,
    [dom_text, month_text, dow_text]: [&str; 3],
) -> Result<(), ScheduleError> {
    let meets = |with_dow: bool| {
        (1..=12u32)
            .filter(|m| month.values & (1 << m) != 0)
            .flat_map(|m| match m {
                2 => vec![28, 29],
                4 | 6 | 9 | 11 => vec![30],
                _ => vec![31],
            })
            .any(|length| {
                (0..7).any(|first| {
                    (1..=length).any(|day| {
                        let weekday = (first + day - 1) % 7;
                        dom.selects_day(Field::DayOfMonth, day, length, weekday)
                            && (!with_dow
                                || dow.selects_day(Field::DayOfWeek, day, length, weekday))
                    })
                })
            })
    };
    if !meets(false) {
        return Err(ScheduleError::NeverFires {
            reason: format!("day-of-month {dom_text:?} never occurs in month {month_text:?}"),
        });
    }
    if !meets(true) {
        return Err(ScheduleError::NeverFires {
            reason: format!(
                "day-of-month {dom_text:?} never falls on day-of-week {dow_text:?} in month \
                 {month_text:?}"
            ),
        });
    }
    Ok(())
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

    #[test]
    fn refuses_quartz_days_that_never_fire() {
        check_err(
            "0 9 31W 2 *",
            "day-of-month \"31W\" never occurs in month \"2\"",
        );
        check_err("0 9 30W 2 *", "never occurs");
        check_err("0 9 31W 4,6 *", "never occurs");
        // `*/6` is Sunday and Saturday; a `W` day is Monday to Friday.
        check_err(
            "0 9 LW * */6",
            "day-of-month \"LW\" never falls on day-of-week \"*/6\" in month \"*\"",
        );
        check_err("0 9 15W * */6", "never falls on");
        // `*/31` is the 1st, never a second Friday; `*/15` (1, 16, 31) misses February's last
        // seven days.
        check_err("0 9 */31 * 5#2", "never falls on");
        check_err("0 9 */15 2 5L", "never falls on");
        for expr in [
            "0 9 L 2 */7",
            "0 9 */15 * 5L",
            "0 9 31W * *",
            "0 9 */31 * 5#1",
            "0 9 LW * */5",
            "0 9 */2 2 5#5",
        ] {
            check(expr, "UTC", true);
        }
    }

    /// Every day of 28 years (each kind of year: leap or not, starting on each weekday) as
    /// croner matches it and as cm reads the day fields, Quartz's items included.
    #[test]
    fn croner_matches_quartz_days_as_cm_reads_them() {
        use chrono::{Datelike, NaiveDate};
        let fields = [
            ("L", "*"),
            ("LW", "*"),
            ("1W", "*"),
            ("15W", "*"),
            ("29W", "*"),
            ("30W", "*"),
            ("31W", "*"),
            ("1W,31W,L", "*"),
            ("2,LW,16W", "*"),
            ("*", "5L"),
            ("*", "0L,7L"),
            ("*", "5#3"),
            ("*", "1#5,6#1"),
            ("*", "MON-WED,5L,0#2"),
            ("L", "5#3"),
            ("LW", "1"),
            ("15W", "0#5"),
            ("*/2", "5L"),
            ("L", "*/2"),
            ("*/5,LW", "1-5"),
            ("1W", "*/3,6L"),
        ];
        for (dom_text, dow_text) in fields {
            let expr = format!("0 0 {dom_text} * {dow_text}");
            let cron = compile_cron(&expr).unwrap().cron;
            let dom = parse_field(Field::DayOfMonth, dom_text).unwrap();
            let dow = parse_field(Field::DayOfWeek, dow_text).unwrap();
            let or = !dom.starts_with_star() && !dow.starts_with_star();
            let mut date = NaiveDate::from_ymd_opt(2000, 1, 1).unwrap();
            while date.year() < 2028 {
                let next_month = date.with_day(1).unwrap() + chrono::Months::new(1);
                let length = (next_month - date.with_day(1).unwrap()).num_days() as u32;
                let weekday = date.weekday().num_days_from_sunday();
                let by_dom = dom.selects_day(Field::DayOfMonth, date.day(), length, weekday);
                let by_dow = dow.selects_day(Field::DayOfWeek, date.day(), length, weekday);
                let expected = if or {
                    by_dom || by_dow
                } else {
                    by_dom && by_dow
                };
                let midnight = date.and_hms_opt(0, 0, 0).unwrap();
                assert_eq!(
                    cron.is_time_matching(&midnight).unwrap(),
                    expected,
                    "{expr:?} on {date}"
                );
                date = date.succ_opt().unwrap();
            }
        }
    }

    /// A field of numbers from `low` to `high`: `*`, a step, one value, a range, a stepped
    /// range or a list; some are out of order or out of range, for the checks to refuse.
    fn numbers(low: u32, high: u32) -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let value = low..=high;
        prop_oneof![
            Just("*".to_owned()),
            (1..=high).prop_map(|n| format!("*/{n}")),
            value.clone().prop_map(|a| a.to_string()),
            (value.clone(), value.clone()).prop_map(|(a, b)| format!("{a}-{b}")),
            (value.clone(), value.clone(), 1..=high).prop_map(|(a, b, n)| format!("{a}-{b}/{n}")),
            (value.clone(), value).prop_map(|(a, b)| format!("{a},{b}")),
        ]
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// The compilation with the shared year component equals croner's own compilation of
        /// the same six fields, for every expression cm accepts: plain fields, Quartz's day
        /// items and macros.
        #[test]
        fn the_shared_year_compiles_as_croner_does(
            second in numbers(0, 59),
            minute in numbers(0, 59),
            hour in numbers(0, 23),
            dom in proptest::prop_oneof![
                numbers(1, 31),
                proptest::strategy::Just("L".to_owned()),
                proptest::strategy::Just("LW".to_owned()),
                (1u32..=31).prop_map(|d| format!("{d}W")),
            ],
            month in numbers(1, 12),
            dow in proptest::prop_oneof![
                numbers(0, 7),
                (0u32..=7).prop_map(|w| format!("{w}L")),
                (0u32..=7, 1u32..=5).prop_map(|(w, n)| format!("{w}#{n}")),
            ],
            form in 0..MACROS.len() + 4,
        ) {
            use proptest::prelude::*;
            let expression = match MACROS.get(form) {
                Some((name, _)) => (*name).to_owned(),
                None if form == MACROS.len() => format!("{minute} {hour} {dom} {month} {dow}"),
                None => format!("{second} {minute} {hour} {dom} {month} {dow}"),
            };
            let Ok(checked) = check_expression(&expression) else {
                return Ok(());
            };
            let plain = CronParser::builder()
                .seconds(Seconds::Required)
                .year(Year::Disallowed)
                .dom_and_dow(false)
                .build()
                .parse(&checked.canonical);
            let shared = compile_cron(&expression);
            prop_assert_eq!(plain.is_ok(), shared.is_ok(), "{}", expression);
            if let (Ok(plain), Ok(shared)) = (plain, shared) {
                prop_assert!(plain.pattern == shared.cron.pattern, "{}", expression);
            }
        }
    }
}
