//! Reading the files `routine import` takes: JSON Lines (one routine a line, the fields of
//! `routine create`) and classic crontabs. Each routine comes back with its line number, so
//! every refusal can name the line it is about. Files are read a line at a time, each line at
//! most [`crate::bounded::IMPORT_LINE`] bytes.

use std::path::PathBuf;

mod crontab;
mod json_lines;

pub use crontab::{CrontabKind, crontab, kept_as_system, machine_users};
pub use json_lines::json_lines;

/// A routine as a line of the file describes it, before the checks `routine create` makes.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutineFields {
    /// The line it is on (1-based).
    pub line: usize,
    /// The routine's name, as written (or made from a crontab entry's content).
    pub name: String,
    /// The schedule's text: a cron expression or a rule, with its clauses.
    pub schedule: String,
    /// The IANA zone the schedule is read in.
    pub timezone: String,
    /// The misfire policy, as written.
    pub misfire: String,
    /// A message routine's text.
    pub message: Option<String>,
    /// A mission routine's file, as written (read inside the import's mission root).
    pub mission: Option<PathBuf>,
    /// A mission routine's overlap policy as written (`allow`, `forbid`, `replace`, `buffer-one`, `buffer-all`); `forbid`
    /// when absent.
    pub overlap: Option<String>,
    /// Created paused.
    pub paused: bool,
    /// A run limit: at most this many scheduled occurrences fire.
    pub runs_left: Option<u32>,
    /// The holiday calendar it runs on, by name.
    pub calendar: Option<String>,
    /// What an occurrence on a day off does, as written (`skip` when absent).
    pub on_holiday: Option<String>,
    /// A deadline: an occurrence not succeeded this long after its planned instant raises
    /// `routine.deadline_missed`.
    pub deadline: Option<std::time::Duration>,
    /// How a failed outcome is tried again: its number of retries as written (checked when the
    /// routine is built) and its backoff, read already (none and `10s..10m` when absent).
    pub retry: cm_domain::RetryPolicy,
    /// The concurrency key whose limit it shares, read already.
    pub concurrency_key: Option<cm_domain::ConcurrencyKey>,
}

/// A line that cannot be imported: its number and what is wrong.
pub type LineError = (usize, String);

#[cfg(test)]
mod tests {
    use super::*;

    /// A routine read, in one line: its line, name, schedule, zone, misfire policy and action,
    /// then whatever else the line set.
    fn shown(r: &RoutineFields) -> String {
        let mut text = format!(
            "{}: {} | {} | {} | {}",
            r.line, r.name, r.schedule, r.timezone, r.misfire
        );
        if let Some(message) = &r.message {
            text += &format!(" | message {message}");
        }
        if let Some(mission) = &r.mission {
            text += &format!(" | mission {}", mission.display());
        }
        if let Some(overlap) = &r.overlap {
            text += &format!(" | overlap {overlap}");
        }
        if r.paused {
            text += " | paused";
        }
        if let Some(runs) = r.runs_left {
            text += &format!(" | {runs} runs");
        }
        if let Some(deadline) = r.deadline {
            text += &format!(" | deadline {}", deadline.as_secs());
        }
        if r.retry != cm_domain::RetryPolicy::default() {
            text += &format!(
                " | {} retries, backoff {}",
                r.retry.retries, r.retry.backoff
            );
        }
        if let Some(key) = &r.concurrency_key {
            text += &format!(" | key {key}");
        }
        text
    }

    /// What a parser made of a file: each routine on a line of its own, or the refusal as
    /// `line N: what`; then each note as `note N: what`.
    fn outcome(read: Result<Vec<RoutineFields>, LineError>, notes: &[LineError]) -> String {
        let mut lines = match read {
            Ok(routines) => routines.iter().map(shown).collect(),
            Err((line, what)) => vec![format!("line {line}: {what}")],
        };
        lines.extend(
            notes
                .iter()
                .map(|(line, what)| format!("note {line}: {what}")),
        );
        lines.join("\n")
    }

    fn check_json(input: &str, expected: &str) {
        assert_eq!(
            outcome(json_lines(input.as_bytes()), &[]),
            expected,
            "{input}"
        );
    }

    /// A per-user crontab's kind, on a machine whose users are `root` and `backup`.
    fn per_user(system_file: bool) -> CrontabKind {
        CrontabKind::User {
            users: ["root", "backup"].map(String::from).into(),
            system_file,
        }
    }

    fn check_crontab(input: &str, expected: &str) {
        check_crontab_as(&per_user(false), input, expected);
    }

    fn check_crontab_as(kind: &CrontabKind, input: &str, expected: &str) {
        let mut notes = Vec::new();
        let read = crontab(
            input.as_bytes(),
            "jobs.cron",
            "UTC",
            "fire-once",
            kind,
            &mut notes,
        );
        assert_eq!(outcome(read, &notes), expected, "{input}");
    }

    #[test]
    fn json_lines_are_read_as_routine_create_reads_its_flags() {
        check_json(
            r#"{"name": "backup", "schedule": "0 3 * * *", "message": "run"}"#,
            "1: backup | 0 3 * * * | UTC | fire-once | message run",
        );
        check_json(
            r#"{"name": "b", "every": "90m", "offset": "15m", "timezone": "Europe/Berlin", "misfire": "skip", "message": "m", "limit_runs": 3, "deadline": "2m"}"#,
            "1: b | @every 90m offset 15m | Europe/Berlin | skip | message m | 3 runs | deadline 120",
        );
        check_json(
            r#"{"name": "r", "schedule": "@hourly", "message": "m", "retries": 2, "retry_backoff": "30s..5m"}"#,
            "1: r | @hourly | UTC | fire-once | message m | 2 retries, backoff 30s..5m",
        );
        check_json(
            r#"{"name": "r", "schedule": "@hourly", "message": "m", "retries": 3}"#,
            "1: r | @hourly | UTC | fire-once | message m | 3 retries, backoff 10s..10m",
        );
        check_json(
            r#"{"name": "r", "schedule": "@hourly", "message": "m", "retry_backoff": "1m"}"#,
            "1: r | @hourly | UTC | fire-once | message m | 0 retries, backoff 1m",
        );
        check_json(
            r#"{"name": "k", "schedule": "@hourly", "message": "m", "concurrency_key": "tenant:acme"}"#,
            "1: k | @hourly | UTC | fire-once | message m | key tenant:acme",
        );
        check_json(
            r#"{"name": "once", "at": "2026-12-24T15:30", "mission": "m.json", "overlap": "replace", "paused": true}"#,
            "1: once | @at 2026-12-24T15:30 | UTC | fire-once | mission m.json | overlap replace | paused",
        );
        check_json(
            r#"{"name": "c", "schedule": "0 9 * * 1-5", "except": ["0 0 25 12 *"], "jitter": "5m", "start": "2027-01-01", "end": "2028-01-01", "message": "m"}"#,
            "1: c | 0 9 * * 1-5 except 0 0 25 12 * jitter 5m from 2027-01-01 until 2028-01-01 | UTC | fire-once | message m",
        );
        // Blank lines are skipped, and each routine keeps its own line.
        check_json(
            "\n{\"name\": \"a\", \"schedule\": \"@daily\", \"message\": \"m\"}\n  \n{\"name\": \"b\", \"schedule\": \"@hourly\", \"message\": \"m\"}\n",
            "2: a | @daily | UTC | fire-once | message m\n4: b | @hourly | UTC | fire-once | message m",
        );
        check_json("", "");
        // A name, an expression, a zone or an action is checked later, as create checks it.
        check_json(
            r#"{"name": "", "schedule": "61 * * * *", "timezone": "Mars/Olympus", "misfire": "never"}"#,
            "1:  | 61 * * * * | Mars/Olympus | never",
        );
    }

    #[test]
    fn a_bad_json_line_is_refused_with_its_line() {
        check_json("not json", "line 1: not a routine: expected ident");
        check_json("{}\n", "line 1: not a routine: missing field `name`");
        check_json(
            "\n{\"name\": \"a\", \"colour\": \"red\"}",
            "line 2: not a routine: unknown field `colour`, expected one of `name`, `schedule`, `every`, `offset`, `at`, `rrule`, `except`, `jitter`, `start`, `end`, `timezone`, `misfire`, `message`, `mission`, `overlap`, `paused`, `limit_runs`, `calendar`, `on_holiday`, `deadline`, `retries`, `retry_backoff`, `concurrency_key`",
        );
        check_json(
            r#"{"name": "a", "schedule": "@daily", "every": "1h"}"#,
            "line 1: give one of schedule, every, at and rrule",
        );
        check_json(
            r#"{"name": "a", "offset": "5m"}"#,
            "line 1: offset needs every",
        );
        check_json(
            r#"{"name": "a", "end": "2027-01-01"}"#,
            "line 1: a schedule is needed: schedule EXPR, every DURATION, at TIME or rrule RULE",
        );
        check_json(
            r#"{"name": "a", "schedule": "@daily", "retry_backoff": "1m..10s"}"#,
            "line 1: retry_backoff: a retry backoff's first wait (1m) must not be longer than its cap (10s)",
        );
        check_json(
            "\n{\"name\": \"a\", \"schedule\": \"@daily\", \"concurrency_key\": \"gpu pool\"}",
            "line 2: concurrency_key: a concurrency key is 1 to 100 letters, digits and . _ : / -, starting with a letter or digit (it was \"gpu pool\")",
        );
        check_json(
            r#"{"name": "a", "schedule": "@daily", "concurrency_key": 3}"#,
            "line 1: not a routine: invalid type: integer `3`, expected a string",
        );
        check_json(
            r#"{"name": "a", "schedule": "@daily", "retries": -1}"#,
            "line 1: not a routine: invalid value: integer `-1`, expected u32",
        );
        check_json(
            r#"{"name": "a", "paused": "yes"}"#,
            "line 1: not a routine: invalid type: string \"yes\", expected a boolean",
        );
        assert_eq!(
            outcome(json_lines(&b"{\"name\": \"\xff\"}"[..]), &[]),
            "line 1: the line is not UTF-8 text"
        );
    }

    #[test]
    fn crontab_entries_become_message_routines_named_by_their_content() {
        check_crontab(
            "0 3 * * * /usr/bin/backup --all",
            "1: jobs.cron: 0 3 * * * /usr/bin/backup --all | 0 3 * * * | UTC | fire-once | message /usr/bin/backup --all",
        );
        // Whitespace runs in the command read as one space in the name, not in the message.
        check_crontab(
            "*/5  *\t* * *   echo   hi",
            "1: jobs.cron: */5 * * * * echo hi | */5 * * * * | UTC | fire-once | message echo   hi",
        );
        check_crontab(
            "@daily /bin/true",
            "1: jobs.cron: @daily /bin/true | @daily | UTC | fire-once | message /bin/true",
        );
        // A `# cm: name=` comment names the entry below it; other comments and blank lines
        // are skipped.
        check_crontab(
            "# nightly\n\n#  cm:  name= backup \n0 3 * * * b",
            "4: backup | 0 3 * * * | UTC | fire-once | message b",
        );
        // CRON_TZ= sets the zone of the entries after it, and is in their names.
        check_crontab(
            "0 1 * * * a\nCRON_TZ=\"Europe/Paris\"\n0 2 * * * b",
            "1: jobs.cron: 0 1 * * * a | 0 1 * * * | UTC | fire-once | message a\n3: jobs.cron: CRON_TZ=Europe/Paris 0 2 * * * b | 0 2 * * * | Europe/Paris | fire-once | message b",
        );
        // Other assignments are left aside with a note saying why, never their value.
        check_crontab(
            "MAILTO=ops@example.com\nPATH = /usr/bin\nSECRET=s3cret\nRANDOM_DELAY=5\n0 3 * * * b",
            "5: jobs.cron: 0 3 * * * b | 0 3 * * * | UTC | fire-once | message b\n\
             note 1: MAILTO= ignored: cm sends no mail: each fire's outcome is in `fires`, on the status page and in /metrics\n\
             note 2: PATH= ignored: cm runs no shell and no command: each entry's command becomes a message's text\n\
             note 3: SECRET= ignored: cm runs no shell, so an environment variable means nothing to a message\n\
             note 4: RANDOM_DELAY= ignored: cm fires each occurrence at its instant, with no random delay",
        );
        check_crontab("# only a comment\n", "");
        // The source (the file's name, or --source) names unnamed entries; the zone and the
        // misfire policy given apply to every entry until a CRON_TZ= line.
        let mut notes = Vec::new();
        let read = crontab(
            &b"0 3 * * * b"[..],
            "backups",
            "Europe/Paris",
            "skip",
            &per_user(false),
            &mut notes,
        );
        assert_eq!(
            outcome(read, &notes),
            "1: backups: CRON_TZ=Europe/Paris 0 3 * * * b | 0 3 * * * | Europe/Paris | skip | message b"
        );
    }

    #[test]
    fn a_system_crontabs_user_column_is_read_with_system_and_refused_or_noted_without() {
        let hourly = "17 * * * * root cd / && run-parts --report /etc/cron.hourly";
        // --system: the user is in the name (the entry's content), not in the message.
        check_crontab_as(
            &CrontabKind::System,
            &format!("SHELL=/bin/sh\n{hourly}\n@daily  nobody   /bin/true"),
            "2: jobs.cron: 17 * * * * root cd / && run-parts --report /etc/cron.hourly | \
             17 * * * * | UTC | fire-once | message cd / && run-parts --report /etc/cron.hourly\n\
             3: jobs.cron: @daily nobody /bin/true | @daily | UTC | fire-once | message /bin/true\n\
             note 1: SHELL= ignored: cm runs no shell and no command: each entry's command \
             becomes a message's text",
        );
        check_crontab_as(
            &CrontabKind::System,
            "0 3 * * * root",
            "line 1: the entry has no command after its user \"root\"",
        );
        // A file kept where system crontabs are, read as a per-user one: refused on the first
        // entry that starts with a user name.
        check_crontab_as(
            &per_user(true),
            &format!("0 3 * * * backup-all\n{hourly}"),
            "line 2: \"root\" after the schedule is a user name, as in a system crontab \
             (cron.d, /etc/crontab), whose sixth field is the user: import it with --system",
        );
        // Elsewhere, one note for the file, on the first such entry, after the notes above it.
        check_crontab(
            &format!("MAILTO=x\n{hourly}\n0 3 * * * backup --all\n@daily root"),
            "2: jobs.cron: 17 * * * * root cd / && run-parts --report /etc/cron.hourly | \
             17 * * * * | UTC | fire-once | message root cd / && run-parts --report /etc/cron.hourly\n\
             3: jobs.cron: 0 3 * * * backup --all | 0 3 * * * | UTC | fire-once | message backup --all\n\
             4: jobs.cron: @daily root | @daily | UTC | fire-once | message root\n\
             note 1: MAILTO= ignored: cm sends no mail: each fire's outcome is in `fires`, on the \
             status page and in /metrics\n\
             note 2: \"root\" after the schedule is a user name, kept in the message (and in 1 \
             more entry): if this is a system crontab, whose sixth field is the user, import it \
             with --system",
        );
        // A command that is a user name alone, or starts with no user's, is nobody's.
        check_crontab_as(
            &per_user(true),
            "@daily root\n0 3 * * * rooted x",
            "1: jobs.cron: @daily root | @daily | UTC | fire-once | message root\n2: jobs.cron: 0 3 * * * rooted x | 0 3 * * * | UTC | fire-once | message rooted x",
        );
    }

    #[test]
    fn system_crontabs_are_known_by_where_they_are_kept() {
        use std::path::Path;
        for (path, system) in [
            ("/etc/crontab", true),
            ("/etc/cron.d/backup", true),
            ("deploy/cron.d/backup", true),
            ("etc/crontab", true),
            ("ops.crontab", false),
            ("crontab", false),
            ("/etc/cron.daily/backup", false),
            ("/home/ops/crontab", false),
        ] {
            assert_eq!(kept_as_system(Path::new(path)), system, "{path}");
        }
    }

    #[test]
    fn a_long_crontab_name_is_cut_and_kept_apart_by_a_hash() {
        let command = "x".repeat(300);
        let name = crontab::content_name("jobs.cron", "UTC", "0 3 * * *", &command);
        assert_eq!(name.chars().count(), cm_domain::name::MAX_NAME_CHARS);
        assert!(name.starts_with("jobs.cron: 0 3 * * * xxx"), "{name}");
        let other = crontab::content_name("jobs.cron", "UTC", "0 4 * * *", &command);
        assert_ne!(name, other);
        assert_eq!(
            name,
            crontab::content_name("jobs.cron", "UTC", "0 3 * * *", &command)
        );
    }

    #[test]
    fn a_bad_crontab_line_is_refused_with_its_line() {
        check_crontab(
            "0 3 * *",
            "line 1: not a crontab entry (five time fields and a command), a comment or CRON_TZ=",
        );
        check_crontab("\n0 3 * * *   ", "line 2: the entry has no command");
        check_crontab("@daily", "line 1: the entry has no command");
        check_crontab(
            "61 * * * * b",
            "line 1: invalid cron expression: minute field \"61\": 61 is out of range 0-59",
        );
        check_crontab(
            "@reboot /bin/start",
            "line 1: invalid cron expression: @reboot is not supported: a routine runs at \
             scheduled times, not when the scheduler starts",
        );
        check_crontab(
            "CRON_TZ=Mars/Olympus",
            "line 1: unknown time zone \"Mars/Olympus\" (expected an IANA name such as \
             Europe/Berlin, not an offset)",
        );
        check_crontab(
            "# cm: label=x\n0 3 * * * b",
            "line 1: a `# cm:` comment must read `# cm: name=NAME`",
        );
        check_crontab(
            "# cm: name=a\n# cm: name=b\n0 3 * * * b",
            "line 2: a second `# cm: name=` comment; the one on line 1 names no entry",
        );
        check_crontab(
            "0 3 * * * b\n# cm: name=a\n",
            "line 2: this `# cm: name=` comment names no entry",
        );
    }
}
