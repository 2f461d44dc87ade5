//! Classic crontab imports: each entry a message routine posting its command.

use std::collections::HashSet;
use std::io::{BufRead, Read as _};
use std::path::Path;

use cm_domain::{Schedule, Zone};

use super::{LineError, RoutineFields};
use crate::bounded;

/// The name of an entry without a `# cm: name=` comment: the file's label, the zone when it is
/// not UTC, the schedule and the command (whitespace runs read as one space), as in
/// `backup.cron: 0 3 * * * /usr/bin/backup`. A name longer than a routine's may be is cut, and
/// a hash of the whole keeps it apart from others cut at the same place.
pub fn content_name(label: &str, zone: &str, expression: &str, command: &str) -> String {
    let zone = if zone == "UTC" {
        String::new()
    } else {
        format!("CRON_TZ={zone} ")
    };
    let words = command.split_whitespace().collect::<Vec<_>>().join(" ");
    let name = format!("{label}: {zone}{expression} {words}");
    let max = cm_domain::name::MAX_NAME_CHARS;
    if name.chars().count() <= max {
        return name;
    }
    // FNV-1a: the same hash in every build, unlike the standard library's hasher.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let suffix = format!(" #{:08x}", hash >> 32);
    let kept: String = name.chars().take(max - suffix.len()).collect();
    format!("{}{suffix}", kept.trim_end())
}

/// The comment that names the entry below it.
const NAME_COMMENT: &str = "cm:";

/// What comes after an entry's schedule: a per-user crontab's command, or a system crontab's
/// user and command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrontabKind {
    /// A per-user crontab (what `crontab -l` prints): the command. An entry whose command
    /// starts with one of `users` (the machine's user names) and goes on is refused when
    /// `system_file` (the file is kept where system crontabs are: [`kept_as_system`]), and
    /// noted otherwise, once for the file.
    User {
        /// The user names that may begin a system crontab's entry.
        users: HashSet<String>,
        /// The file is kept where system crontabs are.
        system_file: bool,
    },
    /// A system crontab (`/etc/crontab`, `/etc/cron.d/*`, `--system`): the user, then the
    /// command. The user stays in the entry's name (its content), not in its message.
    System,
}

/// Whether `path` is kept where system crontabs are, whose sixth field is the user: a file in
/// a directory named `cron.d`, or `etc/crontab` (as written, or once its links are resolved).
pub fn kept_as_system(path: &Path) -> bool {
    let named = |p: &Path| {
        let dir = p.parent().and_then(Path::file_name);
        dir.is_some_and(|d| d == "cron.d")
            || (dir.is_some_and(|d| d == "etc") && p.file_name().is_some_and(|f| f == "crontab"))
    };
    named(path) || std::fs::canonicalize(path).is_ok_and(|p| named(&p))
}

/// The machine's user names, from `/etc/passwd` (none when it cannot be read).
pub fn machine_users() -> HashSet<String> {
    let mut text = String::new();
    let read = std::fs::File::open("/etc/passwd")
        .and_then(|f| f.take(bounded::IMPORT_LINE).read_to_string(&mut text));
    if read.is_err() {
        return HashSet::new();
    }
    text.lines()
        .filter_map(|line| line.split(':').next())
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Reads a classic crontab, per-user or system (`kind`): each entry becomes a message routine
/// whose text is the entry's command, named by a `# cm: name=NAME` comment above it or else by
/// its content ([`content_name`], a system crontab's user included), never by its line, so
/// adding, removing or moving lines leaves every other entry's name (and its routine's history)
/// where it was.
/// Entries are read in `zone` until a `CRON_TZ=` line names another. Other environment
/// assignments (`MAILTO=`, `SHELL=`, `PATH=`: every `crontab -l` has some) are accepted and
/// left aside, each with a note in `notes` saying why (its value is not repeated: an
/// assignment may hold a secret). `@reboot` and anything else that is not an entry are refused
/// with their line.
pub fn crontab(
    text: impl BufRead,
    label: &str,
    zone: &str,
    misfire: &str,
    kind: &CrontabKind,
    notes: &mut Vec<LineError>,
) -> Result<Vec<RoutineFields>, LineError> {
    let mut zone = zone.to_string();
    let mut routines = Vec::new();
    // The per-user entries whose command starts with a user name: the first's line and that
    // name, and how many.
    let mut like_system: Option<(usize, String)> = None;
    let mut like_system_count = 0;
    // A `# cm: name=` comment waiting for its entry: (its line, the name).
    let mut pending_name: Option<(usize, String)> = None;
    for read in bounded::lines(text, bounded::IMPORT_LINE) {
        let (line, raw) = read?;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            let Some(directive) = comment.trim_start().strip_prefix(NAME_COMMENT) else {
                continue;
            };
            let Some(name) = directive.trim().strip_prefix("name=") else {
                return Err((line, "a `# cm:` comment must read `# cm: name=NAME`".into()));
            };
            if let Some((earlier, _)) = pending_name {
                return Err((
                    line,
                    format!(
                        "a second `# cm: name=` comment; the one on line {earlier} names no entry"
                    ),
                ));
            }
            pending_name = Some((line, name.trim().to_string()));
            continue;
        }
        if let Some((variable, value)) = assignment(trimmed) {
            if variable != "CRON_TZ" {
                notes.push((line, ignored_assignment(variable)));
                continue;
            }
            let value = value.trim().trim_matches(['"', '\'']);
            Zone::parse(value).map_err(|e| (line, e.to_string()))?;
            zone = value.to_string();
            continue;
        }
        let (expression, content) = entry(trimmed).map_err(|e| (line, e))?;
        let (first, rest) = content
            .split_once(char::is_whitespace)
            .map_or((content, ""), |(first, rest)| (first, rest.trim_start()));
        let command = match kind {
            CrontabKind::System if rest.is_empty() => {
                return Err((
                    line,
                    format!("the entry has no command after its user {first:?}"),
                ));
            }
            CrontabKind::System => rest,
            CrontabKind::User { users, system_file } => {
                if !rest.is_empty() && users.contains(first) {
                    if *system_file {
                        return Err((line, user_column(first, None)));
                    }
                    like_system.get_or_insert_with(|| (line, first.to_string()));
                    like_system_count += 1;
                }
                content
            }
        };
        Schedule::parse(&expression, &zone).map_err(|e| (line, e.to_string()))?;
        let name = match pending_name.take() {
            Some((_, name)) => name,
            None => content_name(label, &zone, &expression, content),
        };
        routines.push(RoutineFields {
            line,
            name,
            schedule: expression,
            timezone: zone.clone(),
            misfire: misfire.to_string(),
            message: Some(command.to_string()),
            mission: None,
            overlap: None,
            paused: false,
            runs_left: None,
            calendar: None,
            on_holiday: None,
            deadline: None,
            retry: cm_domain::RetryPolicy::default(),
            concurrency_key: None,
        });
    }
    if let Some((line, _)) = pending_name {
        return Err((line, "this `# cm: name=` comment names no entry".into()));
    }
    if let Some((line, user)) = like_system {
        let at = notes.partition_point(|(l, _)| *l < line);
        notes.insert(at, (line, user_column(&user, Some(like_system_count - 1))));
    }
    Ok(routines)
}

/// What a per-user crontab's entry whose command starts with `user`, a user name, is told:
/// refused (`None`: the file is kept as a system crontab is), or imported as written with
/// `Some(more)` entries like it after it.
fn user_column(user: &str, noted: Option<usize>) -> String {
    let system = "whose sixth field is the user";
    match noted {
        None => format!(
            "{user:?} after the schedule is a user name, as in a system crontab (cron.d, \
             /etc/crontab), {system}: import it with --system"
        ),
        Some(more) => {
            let more = match more {
                0 => String::new(),
                1 => " (and in 1 more entry)".into(),
                n => format!(" (and in {n} more entries)"),
            };
            format!(
                "{user:?} after the schedule is a user name, kept in the message{more}: if this \
                 is a system crontab, {system}, import it with --system"
            )
        }
    }
}

/// Why a crontab's assignment of `variable` means nothing to cm, as the import reports it.
fn ignored_assignment(variable: &str) -> String {
    let why = match variable {
        "MAILTO" | "MAILFROM" => {
            "cm sends no mail: each fire's outcome is in `fires`, on the status page and in /metrics"
        }
        "SHELL" | "PATH" => {
            "cm runs no shell and no command: each entry's command becomes a message's text"
        }
        "RANDOM_DELAY" => "cm fires each occurrence at its instant, with no random delay",
        _ => "cm runs no shell, so an environment variable means nothing to a message",
    };
    format!("{variable}= ignored: {why}")
}

/// `NAME=value` (or `NAME = value`): an environment assignment, as cron reads one.
fn assignment(line: &str) -> Option<(&str, &str)> {
    let (variable, value) = line.split_once('=')?;
    let variable = variable.trim();
    let mut chars = variable.chars();
    let first = chars.next()?;
    let identifier = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    identifier.then_some((variable, value))
}

/// An entry's five time fields (or `@` shorthand) and its command.
fn entry(line: &str) -> Result<(String, &str), String> {
    if line.starts_with('@') {
        // A shorthand (`@daily`) is kept as written: the schedule parser knows them, and
        // refuses `@reboot` and unknown ones with the reason.
        let (word, command) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        return command_of(word.to_string(), command);
    }
    let mut rest = line;
    let mut fields = Vec::with_capacity(5);
    for _ in 0..5 {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        fields.push(&rest[..end]);
        rest = &rest[end..];
    }
    if fields.len() < 5 {
        return Err(
            "not a crontab entry (five time fields and a command), a comment or CRON_TZ=".into(),
        );
    }
    command_of(fields.join(" "), rest)
}

fn command_of(expression: String, command: &str) -> Result<(String, &str), String> {
    let command = command.trim();
    if command.is_empty() {
        return Err("the entry has no command".into());
    }
    Ok((expression, command))
}
