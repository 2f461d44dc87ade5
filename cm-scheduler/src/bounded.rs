//! Reading the files the command line takes without ever holding more than their documented
//! limit (docs/guide/design.md, "Secrets and bounds"): a file is read up to its limit and refused past it,
//! so `--mission /dev/zero` is an error at once, not a process that grows until it is killed.
//! Imports are read a line at a time, each line bounded.
//!
//! A file the command line names (a mission file, `--mission-config`, `--database-url-file`,
//! `--http-token-file`, `--webhook-secret-file`, `--nats-credentials-file`) is opened only when
//! it is a regular file ([`open_regular`]): a FIFO, a socket or a device is refused at once,
//! never waited on. A mission file named by an import line is opened only
//! inside its mission root ([`open_inside`]): the file an operator imports may be a routine
//! author's, and must not make the operator's command open any other file they can read.

use std::fs::File;
use std::io::{BufRead, Read};
use std::path::{Component, Path, PathBuf};

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

/// Reads at most `limit` bytes of `path` as UTF-8 text, if it is a regular file
/// ([`open_regular`]); an error (without the file's content) says what is wrong: unreadable,
/// not a regular file, larger than the limit, or not text.
pub fn read_file(path: &Path, limit: u64) -> Result<String, String> {
    read_to(open_regular(path)?, limit)
}

/// What a file that is not a regular file is, in words.
fn kind_of(file_type: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Refuses `file_type` unless it is a regular file's.
fn regular(file_type: std::fs::FileType) -> Result<(), String> {
    if file_type.is_file() {
        Ok(())
    } else {
        Err(format!(
            "it is {}, not a regular file: only a regular file is read",
            kind_of(file_type)
        ))
    }
}

/// Opens `path` for reading if it is a regular file (symbolic links followed), without ever
/// blocking: its metadata is checked before it is opened (a FIFO, a socket, a device or a
/// directory is refused unopened), it is opened with `O_NONBLOCK` (a FIFO put in its place in
/// between does not hang the open) and `O_NOCTTY`, and the opened file's own metadata is
/// checked again. `follow` false refuses a symbolic link as the last component (`O_NOFOLLOW`).
fn open_checked(path: &Path, follow: bool) -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    regular(
        std::fs::metadata(path)
            .map_err(|e| e.to_string())?
            .file_type(),
    )?;
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| e.to_string())?;
    regular(file.metadata().map_err(|e| e.to_string())?.file_type())?;
    Ok(file)
}

/// Opens `path`, given by the operator (absolute or relative to the current directory), for
/// reading if it is a regular file; see [`open_checked`].
pub fn open_regular(path: &Path) -> Result<File, String> {
    open_checked(path, true)
}

/// Opens `relative`, a path an import line names, inside the directory `root`, if it is a
/// regular file there: an absolute path and one whose `..` climbs above `root` are refused
/// before anything is opened; the path with its symbolic links resolved must still be inside
/// `root` (its links resolved too), and so must the file that was opened (as the kernel names
/// it, when `/proc` is there: a link swapped in after the check is caught). Returns the file
/// and its resolved path.
pub fn open_inside(root: &Path, relative: &Path) -> Result<(File, PathBuf), String> {
    let root_real = std::fs::canonicalize(root)
        .map_err(|e| format!("cannot open the mission root {}: {e}", root.display()))?;
    let mut depth = 0usize;
    for component in relative.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => {
                return Err(
                    "it is an absolute path: a mission path in an import is relative to the \
                     import file's directory (or to --mission-root)"
                        .into(),
                );
            }
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!(
                        "it climbs out of the mission root {} through `..`",
                        root_real.display()
                    )
                })?;
            }
            Component::Normal(_) => depth += 1,
        }
    }
    if depth == 0 {
        return Err("it names the mission root itself, not a file in it".into());
    }
    let outside = |real: &Path| {
        format!(
            "it resolves to {}, outside the mission root {} (through a symbolic link)",
            real.display(),
            root_real.display()
        )
    };
    let real = std::fs::canonicalize(root_real.join(relative)).map_err(|e| e.to_string())?;
    if !real.starts_with(&root_real) {
        return Err(outside(&real));
    }
    let file = open_checked(&real, false)?;
    let opened = {
        use std::os::fd::AsRawFd as _;
        std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
    };
    if let Ok(opened) = opened
        && !opened.starts_with(&root_real)
    {
        return Err(outside(&opened));
    }
    Ok((file, real))
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
    fn a_path_inside_the_root_opens_and_one_leaving_it_does_not() {
        let root = std::env::temp_dir().join(format!("cm-inside-{}", std::process::id()));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/m.json"), "{}").unwrap();
        std::fs::write(root.with_extension("outside"), "{}").unwrap();
        let _ = std::os::unix::fs::symlink(root.with_extension("outside"), root.join("out"));
        let _ = std::os::unix::fs::symlink("sub/m.json", root.join("in"));
        let opened = |path: &str| open_inside(&root, Path::new(path)).map(|(_, real)| real);
        let real = std::fs::canonicalize(root.join("sub/m.json")).unwrap();
        for inside in ["sub/m.json", "./sub/m.json", "sub/../sub/m.json", "in"] {
            assert_eq!(opened(inside).as_ref(), Ok(&real), "{inside}");
        }
        for (outside, why) in [
            ("/etc/passwd", "absolute"),
            ("../cm.outside", "climbs out"),
            ("sub/../../x", "climbs out"),
            ("", "the mission root itself"),
            ("sub/..", "the mission root itself"),
            ("out", "outside the mission root"),
            ("sub", "a directory"),
        ] {
            let err = opened(outside).unwrap_err();
            assert!(err.contains(why), "{outside:?}: {err}");
        }
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_file(root.with_extension("outside")).unwrap();
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
