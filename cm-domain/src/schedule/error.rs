//! Why a schedule is refused: one error per way a schedule can be wrong, each message one line.

use super::{Field, MAX_EXPRESSION_CHARS, MAX_SCHEDULE_CHARS, ZoneError};

/// Why an expression or zone was refused. Every message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The zone is not an IANA zone name.
    #[error(transparent)]
    Zone(#[from] ZoneError),
    /// The expression is empty or blank.
    #[error("invalid cron expression: it is empty")]
    Empty,
    /// The expression is longer than [`MAX_EXPRESSION_CHARS`].
    #[error(
        "invalid cron expression: it is {chars} characters long, the limit is {MAX_EXPRESSION_CHARS}"
    )]
    TooLong {
        /// The expression's length in characters.
        chars: usize,
    },
    /// The schedule, its clauses included, is longer than [`MAX_SCHEDULE_CHARS`].
    #[error("invalid schedule: it is {chars} characters long, the limit is {MAX_SCHEDULE_CHARS}")]
    ScheduleTooLong {
        /// The schedule's length in characters.
        chars: usize,
    },
    /// The expression has a character that cannot be placed in a field (the field count is
    /// wrong too, so which field it belongs to is unknown).
    #[error("invalid cron expression: unexpected character {ch:?} (U+{:04X})", u32::from(*ch))]
    Character {
        /// The character.
        ch: char,
    },
    /// The expression does not have 5 or 6 fields.
    #[error(
        "invalid cron expression: expected 5 fields (minute hour day-of-month month day-of-week) \
         or 6 (second first), found {found}"
    )]
    FieldCount {
        /// How many whitespace-separated fields the expression has.
        found: usize,
    },
    /// An `@` macro that is refused: `@reboot`, or one that does not exist.
    #[error("invalid cron expression: {name} is not supported: {reason}")]
    Macro {
        /// The macro as written.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// One field is malformed or out of range.
    #[error("invalid cron expression: {field} field {text:?}: {reason}")]
    Field {
        /// The field that is wrong.
        field: Field,
        /// The field as written.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Every field is valid but together they never match a date.
    #[error("invalid cron expression: the schedule never fires: {reason}")]
    NeverFires {
        /// Which fields exclude each other.
        reason: String,
    },
    /// An interval, a one-shot, a window or an exclusion is malformed.
    #[error("invalid schedule: {reason}")]
    Rule {
        /// What is wrong, naming the clause.
        reason: String,
    },
    /// The expression passed cm's checks but the cron engine refused it.
    #[error("invalid cron expression: {0}")]
    Invalid(String),
}
