//! Routine names: what people type to name a routine, and the rules that keep them safe to print.

use std::fmt;

/// The most characters a routine name has.
pub const MAX_NAME_CHARS: usize = 200;

/// A routine's name: trimmed, 1 to [`MAX_NAME_CHARS`] characters, with no control character
/// (a newline or an escape sequence in a name would break listings and could drive the
/// terminal that prints them), and never shaped like a UUID (commands take an id or a name,
/// and a UUID is read as an id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoutineName(String);

/// Why a routine name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RoutineNameError {
    /// Empty, or only whitespace.
    #[error("the name must not be empty")]
    Empty,
    /// Longer than [`MAX_NAME_CHARS`].
    #[error("the name must be at most {MAX_NAME_CHARS} characters (it has {0})")]
    TooLong(usize),
    /// Holds a control character (a newline, a tab, an escape, …).
    #[error("the name must not contain control characters (found {0:?})")]
    ControlCharacter(char),
    /// Reads as a UUID, which commands take as an id.
    #[error("the name must not be a UUID (commands would read it as an id)")]
    LooksLikeId,
}

impl RoutineName {
    /// Checks a name, trimming the whitespace around it.
    pub fn parse(text: &str) -> Result<RoutineName, RoutineNameError> {
        let name = text.trim();
        if name.is_empty() {
            return Err(RoutineNameError::Empty);
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(RoutineNameError::ControlCharacter(c));
        }
        let chars = name.chars().count();
        if chars > MAX_NAME_CHARS {
            return Err(RoutineNameError::TooLong(chars));
        }
        if uuid::Uuid::try_parse(name).is_ok() {
            return Err(RoutineNameError::LooksLikeId);
        }
        Ok(RoutineName(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for RoutineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<&str, RoutineNameError>) {
        assert_eq!(
            RoutineName::parse(text).as_ref().map(RoutineName::as_str),
            expected.as_ref().map(|s| *s),
            "{text:?}"
        );
    }

    #[test]
    fn names_are_trimmed_printable_and_not_ids() {
        check("standup", Ok("standup"));
        check("  nightly backup ", Ok("nightly backup"));
        check("crontab:12", Ok("crontab:12"));
        check("répétition ☕", Ok("répétition ☕"));
        check("", Err(RoutineNameError::Empty));
        check(" \t ", Err(RoutineNameError::Empty));
        check("a\nb", Err(RoutineNameError::ControlCharacter('\n')));
        check(
            "red\u{1b}[31m",
            Err(RoutineNameError::ControlCharacter('\u{1b}')),
        );
        check(
            "a\u{85}b",
            Err(RoutineNameError::ControlCharacter('\u{85}')),
        );
        check("a\u{7f}", Err(RoutineNameError::ControlCharacter('\u{7f}')));
        check(&"x".repeat(200), Ok(&"x".repeat(200)));
        check(&"x".repeat(201), Err(RoutineNameError::TooLong(201)));
        check(
            "67e55044-10b1-426f-9247-bb680e5fe0c8",
            Err(RoutineNameError::LooksLikeId),
        );
        check("67e55044-10b1-426f-9247", Ok("67e55044-10b1-426f-9247"));
    }
}
