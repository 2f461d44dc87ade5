//! Reading the files the command line takes without ever holding more than their documented
//! limit (DESIGN.md, "secrets and bounds"): a file is read up to its limit and refused past it,
//! so `--mission /dev/zero` is an error at once, not a process that grows until it is killed.
//! Imports are read a line at a time, each line bounded.

use std::io::{BufRead, Read};
use std::path::Path;

/// A mission file (`--mission`), as `cm_domain::mission::MAX_MISSION_BYTES`.
pub const MISSION_FILE: u64 = cm_domain::mission::MAX_MISSION_BYTES as u64;
/// The operator's mission settings (`--mission-config`).
pub const MISSION_CONFIG_FILE: u64 = 256 * 1024;
/// A file of secret material: the webhook secret, the page's token, NATS credentials.
pub const SECRET_FILE: u64 = 64 * 1024;
/// One line of an import (JSON Lines or a crontab).
pub const IMPORT_LINE: u64 = 1024 * 1024;

/// `limit` in words: `256 KiB`, `1 MiB`.
pub fn size(limit: u64) -> String {
    if limit.is_multiple_of(1024 * 1024) {
        format!("{} MiB", limit / (1024 * 1024))
    } else {
        format!("{} KiB", limit / 1024)
    }
}

/// Reads at most `limit` bytes of `path` as UTF-8 text; an error (without the file's content)
/// says what is wrong: unreadable, larger than the limit, or not text.
pub fn read_file(path: &Path, limit: u64) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    read_to(file, limit)
}

/// Reads at most `limit` bytes from `reader` as UTF-8 text, refusing a longer input.
pub fn read_to(reader: impl Read, limit: u64) -> Result<String, String> {
    let mut bytes = Vec::new();
    reader
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "it is larger than {}, the most allowed",
            size(limit)
        ));
    }
    String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string())
}

/// The lines of `reader`, each at most `limit` bytes (without its line ending), numbered from
/// one. A longer line, a line that is not UTF-8 or a read error ends the lines with an error
/// naming the line.
pub fn lines(reader: impl BufRead, limit: u64) -> Lines<impl BufRead> {
    Lines {
        reader,
        limit,
        line: 0,
        done: false,
    }
}

/// The iterator [`lines`] returns: `(line number, text)`, or `(line number, what is wrong)`.
pub struct Lines<R> {
    reader: R,
    limit: u64,
    line: usize,
    done: bool,
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = Result<(usize, String), (usize, String)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        self.line += 1;
        let mut bytes = Vec::new();
        // One byte beyond the limit and its newline tells a line that is too long.
        let read = (&mut self.reader)
            .take(self.limit + 2)
            .read_until(b'\n', &mut bytes);
        let fail = |this: &mut Self, what: String| {
            this.done = true;
            Some(Err((this.line, what)))
        };
        match read {
            Err(e) => return fail(self, format!("cannot read: {e}")),
            Ok(0) => {
                self.done = true;
                return None;
            }
            Ok(_) => {}
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        if bytes.len() as u64 > self.limit {
            return fail(
                self,
                format!(
                    "the line is longer than {}, the most allowed",
                    size(self.limit)
                ),
            );
        }
        match String::from_utf8(bytes) {
            Ok(text) => Some(Ok((self.line, text))),
            Err(_) => fail(self, "the line is not UTF-8 text".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_up_to_its_limit_and_refused_past_it() {
        assert_eq!(read_to(&b"abc"[..], 3).unwrap(), "abc");
        assert!(
            read_to(&b"abcd"[..], 3)
                .unwrap_err()
                .contains("larger than")
        );
        assert!(read_to(&[0xff, 0xfe][..], 3).unwrap_err().contains("UTF-8"));
        // An endless input is read no further than the limit.
        let err = read_to(std::io::repeat(0), 1024).unwrap_err();
        assert!(err.contains("1 KiB"), "{err}");
    }

    #[test]
    fn lines_are_numbered_and_each_is_bounded() {
        let got: Vec<_> = lines(&b"a\r\n\nbc\nlast"[..], 4).collect();
        assert_eq!(
            got,
            vec![
                Ok((1, "a".into())),
                Ok((2, "".into())),
                Ok((3, "bc".into())),
                Ok((4, "last".into()))
            ]
        );
        let got: Vec<_> = lines(&b"abcd\nabcde\nx\n"[..], 4).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], Ok((1, "abcd".into())));
        assert!(matches!(&got[1], Err((2, what)) if what.contains("longer than")));
        // A line with no end in sight stops at the bound.
        let mut endless = lines(std::io::BufReader::new(std::io::repeat(b'x')), 1024);
        assert!(matches!(endless.next(), Some(Err((1, _)))));
        assert!(endless.next().is_none());
    }
}
