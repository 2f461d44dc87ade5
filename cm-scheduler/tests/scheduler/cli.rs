//! The command line's contract (docs/guide/design.md, "The command line"): exit codes, output, writes.
//!
//! Other tests outside the repository drive the binary, so these check what they rely on: 0 on
//! success, 2 with one line on stderr and nothing on stdout for bad input, 1 when PostgreSQL
//! does not answer, and what the commands print and store.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::support::{PATIENCE, TestDb, cm_scheduler, poll, run_quietly};
// `NOWHERE`, a URL nothing answers on: commands that need no database must not try it, and
// those that do must fail with exit code 1.
pub(crate) use crate::support::{BIN, NOWHERE};

/// What one run of the binary did.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Runs the binary with `--database-url url` and `args`.
pub(crate) fn cm(url: &str, args: &[&str]) -> Run {
    let mut command = cm_scheduler();
    // The flag is what is under test; the command's DATABASE_URL is `NOWHERE`, so it cannot
    // stand in for it.
    command.arg("--database-url").arg(url).args(args);
    run(command)
}

/// Runs `command` to completion, killing it if it takes more than a minute: a command that
/// should have been refused (say `run` with bad settings) would otherwise hang the suite.
pub(crate) fn run(mut command: Command) -> Run {
    run_within(&mut command, Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "cm-scheduler {:?} did not finish within a minute",
            command.get_args().collect::<Vec<_>>()
        )
    })
}

/// Runs `command` for at most `patience`: what it did, or `None` when it was still running (it
/// is killed then).
pub(crate) fn run_within(command: &mut Command, patience: Duration) -> Option<Run> {
    let child = command
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting cm-scheduler");
    let pid = child.id();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || sender.send(child.wait_with_output()));
    match receiver.recv_timeout(patience) {
        Ok(output) => {
            let output = output.expect("waiting for cm-scheduler");
            Some(Run {
                code: output.status.code(),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        }
        Err(_) => {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
            None
        }
    }
}

/// `routine create --name NAME --schedule SCHEDULE`, then `rest`.
pub(crate) fn create_args<'a>(name: &'a str, schedule: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["routine", "create", "--name", name, "--schedule", schedule];
    args.extend_from_slice(rest);
    args
}

/// Asserts that `args` succeed and returns what they printed.
pub(crate) fn ok(url: &str, args: &[&str]) -> String {
    let out = cm(url, args);
    assert_eq!(out.code, Some(0), "cm-scheduler {args:?} failed: {out:?}");
    out.stdout
}

/// Asserts that `args` exit with `code`, print nothing on stdout, and explain why in exactly one
/// line on stderr that mentions `fragment`.
pub(crate) fn check_fails(url: &str, args: &[&str], code: i32, fragment: &str) {
    let out = cm(url, args);
    assert_eq!(
        out.code,
        Some(code),
        "cm-scheduler {args:?}: wrong exit code: {out:?}"
    );
    assert_eq!(
        out.stdout, "",
        "cm-scheduler {args:?} printed on stdout: {out:?}"
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "cm-scheduler {args:?} should print exactly one line on stderr: {out:?}"
    );
    assert!(
        lines[0].starts_with("cm-scheduler: "),
        "cm-scheduler {args:?}: {out:?}"
    );
    assert!(
        lines[0].contains(fragment),
        "cm-scheduler {args:?}: the message should mention {fragment:?}: {:?}",
        lines[0]
    );
}

/// Asserts what `schedule next` prints, without any database (the URL is one nothing answers on).
fn check_next(expr: &str, zone: &str, after: &str, expected: &[&str]) {
    let count = expected.len().to_string();
    let out = ok(
        NOWHERE,
        &[
            "schedule",
            "next",
            expr,
            "--timezone",
            zone,
            "--after",
            after,
            "--count",
            &count,
        ],
    );
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        expected,
        "schedule next {expr:?} in {zone} after {after}"
    );
    assert!(
        out.ends_with('\n'),
        "each instant should end its line: {out:?}"
    );
}

impl TestDb {
    pub(crate) async fn count(&self, table: &str) -> i64 {
        // The table names are the test's own constants, never input.
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM cm.{table}")))
            .fetch_one(&self.pool)
            .await
            .expect("counting rows")
    }

    /// How many fires are `fired`.
    pub(crate) async fn fired(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE status = 'fired'")
            .fetch_one(&self.pool)
            .await
            .expect("counting fired rows")
    }

    async fn routine(&self, id: Uuid) -> Option<RoutineRow> {
        sqlx::query_as(
            "SELECT name, schedule, timezone, kind, payload, misfire_policy, paused, next_run_at,
                    created_at, next_run_at > now() AS in_future
             FROM cm.routines WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .expect("reading the routine")
    }
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct RoutineRow {
    name: String,
    schedule: String,
    timezone: String,
    kind: String,
    payload: serde_json::Value,
    misfire_policy: String,
    paused: bool,
    next_run_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    in_future: Option<bool>,
}

/// A directory of mission files, removed when dropped.
pub(crate) struct MissionFiles(PathBuf);

impl MissionFiles {
    pub(crate) fn new() -> MissionFiles {
        let dir = std::env::temp_dir().join(format!("cm_cli_{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("creating the mission files' directory");
        MissionFiles(dir)
    }

    pub(crate) fn write(&self, name: &str, contents: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("writing a mission file");
        path.display().to_string()
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    fn dir(&self) -> &Path {
        &self.0
    }
}

impl Drop for MissionFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Parses the one line `routine create` prints.
pub(crate) fn created_id(stdout: &str) -> Uuid {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "routine create should print one line: {stdout:?}"
    );
    lines[0].parse().unwrap_or_else(|e| {
        panic!(
            "routine create should print a UUID, not {:?}: {e}",
            lines[0]
        )
    })
}

#[test]
fn schedule_next_prints_utc_instants_without_a_database() {
    // New York springs forward on 2025-03-09: 02:30 does not exist that day and fires once at
    // 03:00 EDT, the first instant after the gap.
    check_next(
        "30 2 * * *",
        "America/New_York",
        "2025-03-07T12:00:00Z",
        &[
            "2025-03-08T07:30:00Z",
            "2025-03-09T07:00:00Z",
            "2025-03-10T06:30:00Z",
            "2025-03-11T06:30:00Z",
        ],
    );
    // It falls back on 2025-11-02: 01:30 happens twice and a fixed-time job fires at the first.
    check_next(
        "30 1 * * *",
        "America/New_York",
        "2025-11-01T00:00:00Z",
        &[
            "2025-11-01T05:30:00Z",
            "2025-11-02T05:30:00Z",
            "2025-11-03T06:30:00Z",
        ],
    );
    // Berlin moves to summer time on 2025-03-30, between a Friday and a Monday.
    check_next(
        "0 9 * * MON-FRI",
        "Europe/Berlin",
        "2025-03-27T12:00:00Z",
        &[
            "2025-03-28T08:00:00Z",
            "2025-03-31T07:00:00Z",
            "2025-04-01T07:00:00Z",
        ],
    );
    // Six fields: seconds first.
    check_next(
        "*/20 * * * * *",
        "UTC",
        "2025-01-01T00:00:00Z",
        &[
            "2025-01-01T00:00:20Z",
            "2025-01-01T00:00:40Z",
            "2025-01-01T00:01:00Z",
        ],
    );
    // The instant printed is after `--after`, never equal to it.
    check_next(
        "0 0 * * *",
        "UTC",
        "2025-01-01T00:00:00Z",
        &["2025-01-02T00:00:00Z"],
    );
    // Another zone's offset in `--after` is the same instant.
    check_next(
        "0 0 * * *",
        "UTC",
        "2025-01-01T23:30:00-01:00",
        &["2025-01-03T00:00:00Z"],
    );
}

/// Issue 48's values: Quartz's `L`, `#`, `wL` and `W` as `schedule next` lists them.
#[test]
fn schedule_next_lists_quartz_last_nth_and_nearest_days() {
    for (expr, days) in [
        ("0 9 L * *", ["2026-12-31", "2027-01-31", "2027-02-28"]),
        ("0 9 * * 5#3", ["2026-12-18", "2027-01-15", "2027-02-19"]),
        ("0 9 * * 5L", ["2026-12-25", "2027-01-29", "2027-02-26"]),
        ("0 9 15W * *", ["2026-12-15", "2027-01-15", "2027-02-15"]),
    ] {
        let expected = days.map(|d| format!("{d}T09:00:00Z"));
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        check_next(expr, "UTC", "2026-12-15T00:00:00Z", &expected);
    }
    // Berlin's last Sunday of March 2027 is its change to summer time: 02:00 does not exist,
    // and the fixed-time job fires at 03:00 CEST.
    check_next(
        "0 2 * * 0L",
        "Europe/Berlin",
        "2027-03-01T00:00:00Z",
        &["2027-03-28T01:00:00Z", "2027-04-25T00:00:00Z"],
    );
}

#[tokio::test]
async fn bad_input_exits_2_with_one_line_and_writes_nothing() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let mission = files.write(
        "mission.json",
        r#"{"repository": "https://example.invalid/r.git"}"#,
    );
    let array = files.write("array.json", "[1, 2]");
    let not_json = files.write("not-json.json", "repository: x");
    let no_repository = files.write("no-repository.json", r#"{"task": "lint"}"#);
    let missing_file = files.path("missing.json");
    let empty_token = files.write("empty.token", "");
    let dir = files.dir().display().to_string();
    let missing = Uuid::new_v4().to_string();
    let create = |rest: &[&str]| -> Vec<String> {
        ["routine", "create", "--name", "n"]
            .iter()
            .chain(rest)
            .map(|s| s.to_string())
            .collect()
    };

    // One case a line: the arguments, and a word the one line on stderr must mention.
    #[rustfmt::skip]
    let cases: Vec<(Vec<String>, &str)> = vec![
        // Schedules, zones and times.
        (argv(&["schedule", "next", "61 * * * *"]), "minute"),
        (argv(&["schedule", "next", "* * * *"]), "field"),
        (argv(&["schedule", "next", "0 0 31 2 *"]), "never"),
        (argv(&["schedule", "next", "0 0 * * 5#6"]), "#6"),
        (argv(&["schedule", "next", "0 0 15W * 5W"]), "day-of-week"),
        // What was typed, said back: a negative interval or limit, milliseconds, no schedule,
        // a run limit on a one-shot.
        (create(&["--every", "-5m", "--message", "hi"]), "negative"),
        (create(&["--schedule", "0 9 * * *", "--limit-runs", "-3", "--message", "hi"]), "from 1"),
        (create(&["--every", "500ms", "--message", "hi"]), "milliseconds"),
        (create(&["--message", "hi"]), "a schedule is needed"),
        (create(&["--at", "2030-01-01T00:00", "--limit-runs", "3", "--message", "hi"]), "one-shot"),
        (argv(&["schedule", "next", "* * * * *", "--timezone", "Mars/Olympus"]), "Mars/Olympus"),
        (argv(&["schedule", "next", "* * * * *", "--timezone", "+02:00"]), "+02:00"),
        (argv(&["schedule", "next", "* * * * *", "--after", "yesterday"]), "yesterday"),
        (argv(&["schedule", "next", "* * * * *", "--count", "many"]), "many"),
        // The command line's shape.
        (argv(&["frobnicate"]), "frobnicate"),
        (argv(&["routine", "list", "--frob"]), "--frob"),
        (argv(&[]), "command"),
        (argv(&["routine"]), "command"),
        // Routines that cannot be created.
        (create(&["--schedule", "61 * * * *", "--message", "hi"]), "minute"),
        (create(&["--schedule", "0 9 * * *", "--timezone", "Mars/Olympus", "--message", "hi"]), "Mars/Olympus"),
        (create(&["--schedule", "0 9 * * *", "--misfire", "sometimes", "--message", "hi"]), "sometimes"),
        (create(&["--schedule", "0 9 * * *", "--mission", &missing_file]), "missing.json"),
        (create(&["--schedule", "0 9 * * *", "--mission", &dir]), &dir),
        (create(&["--schedule", "0 9 * * *", "--mission", &array]), "object"),
        (create(&["--schedule", "0 9 * * *", "--mission", &not_json]), "JSON"),
        (create(&["--schedule", "0 9 * * *", "--mission", &no_repository]), "repository"),
        (create(&["--schedule", "0 9 * * *", "--message", "hi", "--mission", &mission]), "--mission"),
        (create(&["--schedule", "0 9 * * *"]), "--message"),
        (create(&["--schedule", "0 9 * * *", "--message", ""]), "message"),
        (argv(&["routine", "create", "--name", " ", "--schedule", "0 9 * * *", "--message", "hi"]), "name"),
        // Routines that do not exist.
        (argv(&["routine", "show", &missing]), &missing),
        (argv(&["routine", "pause", &missing]), &missing),
        (argv(&["routine", "resume", &missing]), &missing),
        (argv(&["routine", "delete", &missing]), &missing),
        (argv(&["routine", "show", "not-a-uuid"]), "not-a-uuid"),
        (argv(&["fires", "--status", "exploded"]), "exploded"),
        (argv(&["fires", "show", "no-such-fire"]), "no-such-fire"),
        // Scheduler settings under which a dispatch could outlive its lease, or no lease at all.
        (argv(&["run", "--lease", "1s", "--dispatch-timeout", "2s"]), "lease"),
        (argv(&["run", "--lease", "2s", "--dispatch-timeout", "2s"]), "lease"),
        (argv(&["run", "--lease", "0s"]), "lease"),
        (argv(&["run", "--tick-interval", "soon"]), "soon"),
        (argv(&["run", "--max-backlog", "10001"]), "max backlog"),
        // The status page on a non-loopback address needs a token, from a readable file.
        (argv(&["run", "--listen", "0.0.0.0:0"]), "--http-token-file"),
        (
            argv(&["run", "--listen", "0.0.0.0:0", "--http-token-file", "/nonexistent/token"]),
            "/nonexistent/token",
        ),
        (argv(&["run", "--listen", "127.0.0.1:0", "--http-token-file", &empty_token]), "empty"),
    ];
    for (args, fragment) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_fails(&db.url, &args, 2, fragment);
    }

    assert_eq!(
        db.count("routines").await,
        0,
        "bad input must write nothing"
    );
    assert_eq!(
        db.count("routine_fires").await,
        0,
        "bad input must write nothing"
    );
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn routine_commands_create_show_pause_resume_and_delete() {
    let db = TestDb::new().await;
    let url = db.url.as_str();

    let out = cm(
        url,
        &create_args(
            "n",
            "0 9 * * MON-FRI",
            &["--timezone", "Europe/Berlin", "--message", "hi"],
        ),
    );
    assert_eq!((out.code, out.stderr.as_str()), (Some(0), ""), "{out:?}");
    let id = created_id(&out.stdout);
    let row = db.routine(id).await.expect("the created routine is stored");
    assert_eq!(
        (
            row.name.as_str(),
            row.schedule.as_str(),
            row.timezone.as_str(),
            row.kind.as_str()
        ),
        ("n", "0 9 * * MON-FRI", "Europe/Berlin", "message")
    );
    assert_eq!(row.payload, serde_json::json!({ "text": "hi" }));
    assert_eq!(
        (row.misfire_policy.as_str(), row.paused, row.in_future),
        ("fire-once", false, Some(true))
    );
    // The first run is the schedule's first occurrence after the creation, as `schedule next`
    // computes it.
    let created = row
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let next = ok(
        NOWHERE,
        &[
            "schedule",
            "next",
            "0 9 * * MON-FRI",
            "--timezone",
            "Europe/Berlin",
            "--after",
            &created,
            "--count",
            "1",
        ],
    );
    let stored = row.next_run_at.expect("an unpaused routine has a next run");
    assert_eq!(
        next.trim(),
        stored.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );

    let shown: serde_json::Value =
        serde_json::from_str(&ok(url, &["routine", "show", &id.to_string(), "--json"]))
            .expect("show --json prints JSON");
    assert_eq!(shown["id"], id.to_string());
    assert_eq!(shown["payload"], serde_json::json!({ "text": "hi" }));
    assert_eq!(
        (shown["kind"].as_str(), shown["paused"].as_bool()),
        (Some("message"), Some(false))
    );
    assert!(ok(url, &["routine", "show", &id.to_string()]).contains(&id.to_string()));

    assert!(
        ok(url, &["routine", "list"])
            .lines()
            .any(|l| l.contains(&id.to_string()))
    );
    let listed: Vec<serde_json::Value> = ok(url, &["routine", "list", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("list --json prints one JSON object a line"))
        .collect();
    assert_eq!(
        listed.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        vec![serde_json::json!(id)]
    );
    // DATABASE_URL stands in for --database-url.
    let mut from_env = cm_scheduler();
    from_env.env("DATABASE_URL", url).args(["routine", "list"]);
    let out = run(from_env);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains(&id.to_string()), "{out:?}");

    ok(url, &["routine", "pause", &id.to_string()]);
    let paused = db.routine(id).await.unwrap();
    assert_eq!(
        (paused.paused, paused.next_run_at),
        (true, None),
        "a paused routine is never due"
    );
    ok(url, &["routine", "resume", &id.to_string()]);
    let resumed = db.routine(id).await.unwrap();
    assert_eq!(
        (resumed.paused, resumed.in_future),
        (false, Some(true)),
        "resume computes the next run from now"
    );

    // Nothing has fired: the ledger lists nothing, in either form.
    assert_eq!(ok(url, &["fires", "--json"]), "");
    // The table form prints its header alone.
    assert_eq!(
        ok(
            url,
            &["fires", "--routine", &id.to_string(), "--status", "failed"]
        )
        .lines()
        .count(),
        1
    );

    let paused_id = created_id(&ok(
        url,
        &create_args("p", "*/5 * * * *", &["--message", "later", "--paused"]),
    ));
    let row = db.routine(paused_id).await.unwrap();
    assert_eq!(
        (row.paused, row.next_run_at),
        (true, None),
        "--paused creates it paused"
    );

    ok(url, &["routine", "delete", &id.to_string()]);
    assert_eq!(db.routine(id).await, None, "delete removes the routine");
    check_fails(
        url,
        &["routine", "show", &id.to_string()],
        2,
        &id.to_string(),
    );
    assert_eq!(
        db.count("routines").await,
        1,
        "only the paused routine is left"
    );
}

#[tokio::test]
async fn mission_routines_store_the_file_as_their_payload() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let mission = files.write(
        "lint.json",
        r#"{"repository": "https://example.invalid/r.git", "task": "lint"}"#,
    );

    let id = created_id(&ok(
        &db.url,
        &create_args("lint", "0 3 * * *", &["--mission", &mission]),
    ));
    let row = db.routine(id).await.expect("the created routine is stored");
    assert_eq!(row.kind, "mission");
    assert_eq!(
        row.payload,
        serde_json::json!({ "repository": "https://example.invalid/r.git", "task": "lint" })
    );
    assert_eq!(
        (row.timezone.as_str(), row.paused, row.in_future),
        ("UTC", false, Some(true))
    );

    // `--json` prints the stored routine instead of its id.
    let printed: serde_json::Value = serde_json::from_str(&ok(
        &db.url,
        &create_args("lint2", "0 4 * * *", &["--mission", &mission, "--json"]),
    ))
    .expect("create --json prints JSON");
    assert_eq!(
        (printed["kind"].as_str(), printed["name"].as_str()),
        (Some("mission"), Some("lint2"))
    );
}

#[test]
fn a_database_that_does_not_answer_exits_1() {
    // Each of these waits for the pool's acquire timeout, so they run side by side.
    let cases: &[&[&str]] = &[&["routine", "list"], &["fires"], &["migrate"]];
    std::thread::scope(|scope| {
        for args in cases {
            scope.spawn(move || check_fails(NOWHERE, args, 1, "PostgreSQL"));
        }
    });
}

/// A port that is another server's: one that greets first (as MySQL and MariaDB do) is named
/// not PostgreSQL at once, without the driver's source location; one that takes the
/// connection and says nothing is told apart from a host that does not answer at all.
#[test]
fn another_servers_port_is_said_to_be_one() {
    let greeter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url =
        |l: &std::net::TcpListener| format!("postgres://postgres@{}/test", l.local_addr().unwrap());
    let (greeter_url, silent_url) = (url(&greeter), url(&silent));
    std::thread::spawn(move || {
        use std::io::Write as _;
        for mut stream in greeter.incoming().flatten() {
            let _ = stream.write_all(b"d\x00\x00\x00\x0a5.5.5-10.11.19-MariaDB");
        }
    });
    let held = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for stream in silent.incoming().flatten().take(4) {
                held.lock().unwrap().push(stream);
            }
        });
        scope.spawn(|| {
            check_fails(&greeter_url, &["routine", "list"], 1, "is not PostgreSQL");
            let out = cm(&greeter_url, &["routine", "list"]);
            assert!(!out.stderr.contains("sqlx_postgres"), "{out:?}");
        });
        check_fails(
            &silent_url,
            &["routine", "list"],
            1,
            "accepts connections but did not answer PostgreSQL's handshake",
        );
        // Wake the acceptor so the scope ends.
        for _ in 0..4 {
            let _ = std::net::TcpStream::connect(silent.local_addr().unwrap());
        }
    });
}

#[tokio::test]
async fn trigger_and_backfill_go_through_the_ledger() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id = created_id(&ok(
        url,
        &create_args("hourly", "0 * * * *", &["--message", "hi"]),
    ));
    let id = id.to_string();

    // A window of three past hours is asked for once; asking again asks for nothing new.
    let window = [
        "routine",
        "backfill",
        &id,
        "--from",
        "2025-06-01T10:00:00Z",
        "--to",
        "2025-06-01T12:00:00Z",
        "--retention",
        "1000days",
    ];
    assert_eq!(
        ok(url, &window).trim(),
        "requested 3 of 3 occurrences (0 already in the ledger or requested)"
    );
    assert_eq!(
        ok(url, &window).trim(),
        "requested 0 of 3 occurrences (3 already in the ledger or requested)"
    );
    let triggered: DateTime<Utc> = ok(url, &["routine", "trigger", &id])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(db.count("routine_requests").await, 4);
    assert_eq!(
        db.count("routine_fires").await,
        0,
        "nothing fires before a tick"
    );

    // Bad windows and missing routines are refused, writing nothing.
    let missing = Uuid::new_v4().to_string();
    for (args, fragment) in [
        (
            vec![
                "routine",
                "backfill",
                &id,
                "--from",
                "2025-06-01T12:00:00Z",
                "--to",
                "2025-06-01T10:00:00Z",
            ],
            "before it starts",
        ),
        (
            vec![
                "routine",
                "backfill",
                &id,
                "--from",
                "2025-06-01T10:00:00Z",
                "--to",
                "2999-01-01T00:00:00Z",
            ],
            "future",
        ),
        (
            vec![
                "routine",
                "backfill",
                &id,
                "--from",
                "2025-01-01T00:00:00Z",
                "--to",
                "2025-06-01T00:00:00Z",
            ],
            "more than 1000",
        ),
        (
            vec![
                "routine",
                "backfill",
                &id,
                "--from",
                "yesterday",
                "--to",
                "2025-06-01T00:00:00Z",
            ],
            "RFC 3339",
        ),
        (
            vec![
                "routine",
                "backfill",
                &missing,
                "--from",
                "2025-06-01T10:00:00Z",
                "--to",
                "2025-06-01T12:00:00Z",
            ],
            &missing,
        ),
        (vec!["routine", "trigger", &missing], &missing),
    ] {
        // A retention long enough for these past windows: refusing by retention is tested in
        // `cli_hardening`.
        let mut args = args;
        if args[1] == "backfill" {
            args.extend(["--retention", "1000days"]);
        }
        check_fails(url, &args, 2, fragment);
    }
    assert_eq!(db.count("routine_requests").await, 4);

    // One tick's worth of running fires all four, and the ledger holds each once.
    let mut scheduler = run_quietly(url, &["--tick-interval", "100ms"]);
    let fired = poll(PATIENCE, async || db.fired().await, |fired| *fired == 4).await;
    scheduler.kill().unwrap();
    let _ = scheduler.wait();
    assert_eq!(fired, Ok(4));
    assert_eq!(db.count("routine_requests").await, 0);
    let triggered_fired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires WHERE scheduled_at = $1 AND status = 'fired'",
    )
    .bind(triggered)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(triggered_fired, 1);
    // The backfilled window is settled now, so asking for it again finds it in the ledger.
    assert_eq!(
        ok(url, &window).trim(),
        "requested 0 of 3 occurrences (3 already in the ledger or requested)"
    );
}

#[tokio::test]
async fn message_backend_flags_are_checked_before_anything_is_written() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let good = files.write("good.secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n");
    let malformed = files.write("malformed.secret", "s3cr3t-canary-value");
    let bad_base64 = files.write("bad-base64.secret", "whsec_s3cr3t canary!");
    let missing = files.path("missing.secret");
    let webhook = |rest: &[&str]| -> Vec<String> {
        ["run", "--message-backend", "webhook"]
            .iter()
            .chain(rest)
            .map(|s| s.to_string())
            .collect()
    };
    #[rustfmt::skip]
    let cases: Vec<(Vec<String>, &str)> = vec![
        (webhook(&["--webhook-url", "http://127.0.0.1:9/h", "--webhook-secret-file", &missing]), "webhook secret file"),
        (webhook(&["--webhook-url", "http://127.0.0.1:9/h", "--webhook-secret-file", &malformed]), "whsec_"),
        (webhook(&["--webhook-url", "http://127.0.0.1:9/h", "--webhook-secret-file", &bad_base64]), "whsec_"),
        (webhook(&["--webhook-url", "http://127.0.0.1:9/h", "--webhook-secret-file", files.dir().to_str().unwrap()]), "webhook secret file"),
        (webhook(&["--webhook-secret-file", &good]), "--webhook-url"),
        (webhook(&["--webhook-url", "http://127.0.0.1:9/h"]), "--webhook-secret-file"),
        (webhook(&["--webhook-url", "ftp://127.0.0.1/h", "--webhook-secret-file", &good]), "--webhook-url"),
        (webhook(&["--webhook-url", "not a url", "--webhook-secret-file", &good]), "--webhook-url"),
        (argv(&["run", "--webhook-url", "http://127.0.0.1:9/h"]), "--webhook-url"),
        (argv(&["run", "--message-backend", "nats"]), "--nats-url"),
        (argv(&["run", "--message-backend", "nats", "--nats-url", "nats://127.0.0.1:4222", "--nats-credentials-file", &missing]), "credentials"),
        (argv(&["run", "--message-backend", "nats", "--nats-url", "nats://127.0.0.1:4222", "--nats-stream", "A.B"]), "stream name"),
        (argv(&["run", "--message-backend", "kafka"]), "kafka"),
    ];
    for (args, fragment) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_fails(&db.url, &args, 2, fragment);
        // The secret file's content is never repeated.
        let out = cm(&db.url, &args);
        assert!(!out.stderr.contains("s3cr3t"), "{args:?}: {}", out.stderr);
    }
    assert_eq!(db.count("routine_fires").await, 0);
}

#[tokio::test]
async fn outbox_shows_what_consumers_have_not_acknowledged() {
    let db = TestDb::new().await;
    let empty = ok(&db.url, &["outbox"]);
    assert_eq!(empty.lines().next(), Some("pending 0  leased 0  oldest -"));
    for (minute, acked) in [(0, true), (1, false), (2, false)] {
        sqlx::query(
            "INSERT INTO cm.outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload, acked_at)
             VALUES ($1, '2026-01-01T00:00:00Z'::timestamptz + make_interval(mins => $2), $3, 1, '{}',
                     CASE WHEN $4 THEN now() END)",
        )
        .bind(Uuid::new_v4())
        .bind(minute)
        .bind(format!("key-{minute}"))
        .bind(acked)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let json: serde_json::Value =
        serde_json::from_str(&ok(&db.url, &["outbox", "--json"])).unwrap();
    assert_eq!(json["pending"], 2);
    assert_eq!(json["leased"], 0);
    let keys: Vec<_> = json["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["idempotency_key"].clone())
        .collect();
    assert_eq!(keys, ["key-1", "key-2"]);
    let text = ok(&db.url, &["outbox", "--limit", "1"]);
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("pending 2  leased 0  oldest 20"),
        "{text}"
    );
    assert!(lines[1].contains("2026-01-01T00:01:00Z"), "{text}");
}
