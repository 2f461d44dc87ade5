//! The `*` patterns the env deny list and the operator's allow lists are written in.

/// Whether `text` matches `pattern`, where `*` stands for any run of characters (also none).
pub(crate) fn glob_matches(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(mut tail) = text.strip_prefix(head) else {
                return false;
            };
            // Each further `*`-free piece must appear in order; the last must end the text.
            let pieces: Vec<&str> = rest.split('*').collect();
            let (last, middle) = pieces
                .split_last()
                .expect("split yields one piece at least");
            for piece in middle {
                match tail.find(piece) {
                    Some(at) => tail = &tail[at + piece.len()..],
                    None => return false,
                }
            }
            tail.len() >= last.len() && tail.ends_with(last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_patterns() {
        for (pattern, text, matches) in [
            ("PATH", "PATH", true),
            ("PATH", "PATHS", false),
            ("LD_*", "LD_", true),
            ("LD_*", "LD_PRELOAD", true),
            ("LD_*", "XLD_", false),
            ("*_PROXY", "HTTP_PROXY", true),
            ("*_PROXY", "_PROXY", true),
            ("*_PROXY", "HTTP_PROXYX", false),
            ("A*B*C", "AxxBxxC", true),
            ("A*B*C", "ABC", true),
            ("A*B*C", "AC", false),
            ("A*A", "A", false),
            ("*", "", true),
        ] {
            assert_eq!(glob_matches(pattern, text), matches, "{pattern} {text}");
        }
    }
}
