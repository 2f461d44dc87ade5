//! Routine names: what people type to name a routine, and the rules that keep them safe to print.

use std::fmt;

/// The most characters a routine name has.
pub const MAX_NAME_CHARS: usize = 200;

/// A routine's name: trimmed, 1 to [`MAX_NAME_CHARS`] characters, with no control character
/// (a newline or an escape sequence in a name would break listings and could drive the
/// terminal that prints them) and no invisible or bidirectional formatting character (a
/// right-to-left override or a zero-width space makes two names look alike, or one look like
/// another: see [`is_invisible`]), and never shaped like a UUID (commands take an id or a name,
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
    /// Holds an invisible or bidirectional formatting character ([`is_invisible`]).
    #[error(
        "the name must not contain invisible or bidirectional formatting characters (found U+{:04X})",
        *.0 as u32
    )]
    InvisibleCharacter(char),
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
        if let Some(c) = name.chars().find(|&c| is_invisible(c)) {
            return Err(RoutineNameError::InvisibleCharacter(c));
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

/// Whether `c` is invisible or reorders the text around it: a format character (Unicode's
/// general category Cf, as of Unicode 16: bidirectional embeddings, overrides and isolates,
/// zero-width spaces and joiners, the byte-order mark, tag characters, …), a line or paragraph
/// separator, or a filler that renders as nothing (Hangul fillers, the combining grapheme
/// joiner). Control characters (Cc) are `char::is_control`'s.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x034F
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x2028..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0x3164
            | 0xFEFF
            | 0xFFA0
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// `text` with every control ([`char::is_control`]) and invisible ([`is_invisible`]) character
/// written as an escape (`\n`, `\u{202e}`), so a stored text printed to a terminal or a page
/// shows what it holds and cannot reorder or hide what surrounds it.
///
/// ```
/// assert_eq!(cm_domain::name::escape_unseen("a\u{202e}b\n"), "a\\u{202e}b\\n");
/// assert_eq!(cm_domain::name::escape_unseen("plain"), "plain");
/// ```
pub fn escape_unseen(text: &str) -> std::borrow::Cow<'_, str> {
    let unseen = |c: char| c.is_control() || is_invisible(c);
    if !text.chars().any(unseen) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unseen(c) {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    std::borrow::Cow::Owned(escaped)
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

    #[test]
    fn invisible_and_bidirectional_characters_are_refused() {
        for c in [
            '\u{202E}', // right-to-left override
            '\u{202A}',
            '\u{2066}',
            '\u{2069}',
            '\u{200E}',
            '\u{200F}',
            '\u{061C}',
            '\u{200B}', // zero-width space
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{2028}',
            '\u{2029}',
            '\u{115F}',
            '\u{3164}',
            '\u{E0041}',
            '\u{180E}',
        ] {
            let text = format!("pay{c}roll");
            check(&text, Err(RoutineNameError::InvisibleCharacter(c)));
            let shown = RoutineName::parse(&text).unwrap_err().to_string();
            assert!(shown.contains(&format!("U+{:04X}", c as u32)), "{shown}");
            assert!(
                !shown.contains(c),
                "the error prints the character raw: {shown:?}"
            );
        }
        // Visible marks and emoji sequences (with their variation selectors) are names.
        check("café ☕\u{FE0F}", Ok("café ☕\u{FE0F}"));
        check("שלום", Ok("שלום"));
    }

    #[test]
    fn unseen_characters_are_escaped_for_printing() {
        assert_eq!(escape_unseen("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(escape_unseen("x\u{200b}\ty"), "x\\u{200b}\\ty");
        assert_eq!(escape_unseen("répétition ☕"), "répétition ☕");
    }
}
