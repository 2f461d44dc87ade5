//! The operator's command line: `routine update` and `routine import` (JSON Lines and
//! crontabs), names as handles, `routine show`, the tables of `routine list` and `fires`,
//! completions, and errors as a person reads them (with the database URL's secrets redacted).
//!
//! Every refusal checks that nothing was written: the routines, ledger and request tables are
//! the same, row for row, before and after.

use chrono::{DateTime, Duration, Timelike, Utc};
use sqlx::Connection as _;
use uuid::Uuid;

use crate::cli::{MissionFiles, NOWHERE, check_fails, cm, create_args, created_id, ok, run};
use crate::support::{SERVER, TestDb, cm_scheduler, drop_database};

impl TestDb {
    /// Every row of the tables a command could write, to compare before and after a refusal.
    async fn snapshot(&self) -> Vec<serde_json::Value> {
        sqlx::query_scalar(
            "SELECT to_jsonb(r) FROM cm.routines r
             UNION ALL (SELECT to_jsonb(f) FROM cm.routine_fires f)
             UNION ALL (SELECT to_jsonb(q) FROM cm.routine_requests q)
             ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await
        .expect("reading every row")
    }

    pub(crate) async fn stored(&self, name: &str) -> serde_json::Value {
        sqlx::query_scalar("SELECT to_jsonb(r) FROM cm.routines r WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("no routine named {name:?}: {e}"))
    }

    async fn now(&self) -> DateTime<Utc> {
        sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Writes a settled fire of `routine` at `at`, as a scheduler would have.
    async fn fire(&self, routine: Uuid, at: DateTime<Utc>, error: Option<&str>) {
        sqlx::query(
            "INSERT INTO cm.routine_fires
                 (routine_id, scheduled_at, status, error, claimant, claim_token,
                  lease_expires_at, completed_at)
             VALUES ($1, $2, CASE WHEN $3::text IS NULL THEN 'fired' ELSE 'failed' END, $3,
                     'node-a', gen_random_uuid(), $2, $2)",
        )
        .bind(routine)
        .bind(at)
        .bind(error)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// Creates `count` routines named `bulk-N` directly in the database.
    async fn bulk(&self, count: i64) {
        sqlx::query(
            "INSERT INTO cm.routines (id, name, schedule, kind, payload, next_run_at, created_at)
             SELECT gen_random_uuid(), 'bulk-' || n, '0 0 1 1 *', 'message', '{\"text\": \"x\"}',
                    now() + interval '1 year', now() - make_interval(secs => ($1 - n)::float8)
             FROM generate_series(1, $1::int) AS n",
        )
        .bind(count)
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// Asserts that every one of `cases` (arguments, a fragment of the one line on stderr) exits 2
/// and writes nothing.
pub(crate) async fn check_refused(db: &TestDb, cases: &[(Vec<String>, String)]) {
    let before = db.snapshot().await;
    for (args, fragment) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_fails(&db.url, &args, 2, fragment);
        assert_eq!(db.snapshot().await, before, "{args:?} wrote something");
    }
}

pub(crate) fn case(args: &[&str], fragment: &str) -> (Vec<String>, String) {
    (
        args.iter().map(|s| s.to_string()).collect(),
        fragment.to_string(),
    )
}

pub(crate) fn create(url: &str, name: &str, schedule: &str, zone: &str) -> Uuid {
    created_id(&ok(
        url,
        &create_args(name, schedule, &["--timezone", zone, "--message", "hi"]),
    ))
}

#[tokio::test]
async fn update_changes_settings_in_place_and_keeps_history() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id = create(url, "report", "0 9 1 1 *", "UTC");
    let past = db.now().await - Duration::hours(1);
    db.fire(id, past, None).await;
    ok(
        url,
        &[
            "routine",
            "backfill",
            "report",
            "--from",
            "2020-01-01T09:00:00Z",
            "--to",
            "2020-01-01T09:00:00Z",
            "--retention",
            "4000days",
        ],
    );
    let before = db.stored("report").await;

    // A new name only: the clock does not move.
    let out = ok(
        url,
        &["routine", "update", "report", "--name", "weekly report"],
    );
    assert_eq!(out.trim(), id.to_string(), "update prints the id");
    let renamed = db.stored("weekly report").await;
    assert_eq!(renamed["next_run_at"], before["next_run_at"]);
    assert_eq!(renamed["created_at"], before["created_at"]);

    // Schedule, zone, policy and action: the next run is the new schedule's first after now.
    let now = db.now().await;
    ok(
        url,
        &[
            "routine",
            "update",
            &id.to_string(),
            "--schedule",
            "*/5 * * * *",
            "--timezone",
            "Asia/Kolkata",
            "--misfire",
            "skip",
            "--message",
            "new text",
        ],
    );
    let updated = db.stored("weekly report").await;
    assert_eq!(
        (
            &updated["schedule"],
            &updated["timezone"],
            &updated["misfire_policy"],
            &updated["payload"]
        ),
        (
            &serde_json::json!("*/5 * * * *"),
            &serde_json::json!("Asia/Kolkata"),
            &serde_json::json!("skip"),
            &serde_json::json!({ "text": "new text" })
        )
    );
    let next: DateTime<Utc> = serde_json::from_value(updated["next_run_at"].clone()).unwrap();
    assert!(
        next > now && next <= now + Duration::minutes(5),
        "{next} after {now}"
    );
    assert_eq!(next.minute() % 5, 0);
    // The history and the pending request are kept.
    assert_eq!(db.count("routine_fires").await, 1);
    assert_eq!(db.count("routine_requests").await, 1);

    // A mission file replaces the message.
    let files = MissionFiles::new();
    let mission = files.write(
        "m.json",
        r#"{"repository": "https://example.invalid/r.git", "task": "lint"}"#,
    );
    ok(
        url,
        &["routine", "update", "weekly report", "--mission", &mission],
    );
    let mission_row = db.stored("weekly report").await;
    assert_eq!(mission_row["kind"], "mission");
    assert_eq!(mission_row["next_run_at"], updated["next_run_at"]);

    // A paused routine stays paused, without a next run, when its schedule changes.
    ok(url, &["routine", "pause", "weekly report"]);
    ok(
        url,
        &[
            "routine",
            "update",
            "weekly report",
            "--schedule",
            "0 * * * *",
        ],
    );
    let paused = db.stored("weekly report").await;
    assert_eq!(
        (&paused["paused"], &paused["next_run_at"]),
        (&serde_json::json!(true), &serde_json::Value::Null)
    );

    create(url, "other", "0 0 * * *", "UTC");
    let missing = Uuid::new_v4().to_string();
    let bad_mission = files.write("bad.json", r#"{"task": "lint"}"#);
    let update = |rest: &[&str], fragment: &str| {
        let args: Vec<&str> = ["routine", "update", "weekly report"]
            .iter()
            .chain(rest)
            .copied()
            .collect();
        case(&args, fragment)
    };
    #[rustfmt::skip]
    let cases = vec![
        update(&["--schedule", "61 * * * *"], "minute"),
        update(&["--timezone", "Mars/Olympus"], "Mars/Olympus"),
        update(&["--misfire", "sometimes"], "sometimes"),
        update(&["--name", "other"], "already exists"),
        update(&["--name", "a\nb"], "control"),
        update(&["--name", "red\u{1b}[31m"], "control"),
        update(&["--name", &missing], "UUID"),
        update(&["--name", " "], "empty"),
        update(&["--message", ""], "message"),
        update(&["--message", "x", "--mission", &mission], "--mission"),
        update(&["--mission", &bad_mission], "repository"),
        update(&[], "nothing to change"),
        case(&["routine", "update", "nobody", "--misfire", "skip"], "nobody"),
        case(&["routine", "update", &missing, "--misfire", "skip"], &missing),
    ];
    check_refused(&db, &cases).await;
}

#[tokio::test]
async fn import_reads_json_lines_all_or_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    files.write(
        "lint.json",
        r#"{"repository": "https://example.invalid/r.git", "task": "lint"}"#,
    );
    let good = files.write(
        "routines.jsonl",
        concat!(
            r#"{"name": "standup", "schedule": "0 9 * * MON-FRI", "timezone": "Europe/Berlin", "message": "standup in 5"}"#,
            "\n\n",
            r#"{"name": "lint", "schedule": "0 3 * * *", "mission": "lint.json", "misfire": "skip", "paused": true}"#,
            "\n",
        ),
    );
    let out = ok(url, &["routine", "import", &good]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("created") && lines[0].ends_with("standup"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("created") && lines[1].ends_with("lint"),
        "{out}"
    );
    let standup = db.stored("standup").await;
    assert_eq!(
        (
            &standup["timezone"],
            &standup["payload"],
            &standup["misfire_policy"]
        ),
        (
            &serde_json::json!("Europe/Berlin"),
            &serde_json::json!({ "text": "standup in 5" }),
            &serde_json::json!("fire-once")
        )
    );
    let lint = db.stored("lint").await;
    assert_eq!(
        (&lint["kind"], &lint["paused"], &lint["payload"]["task"]),
        (
            &serde_json::json!("mission"),
            &serde_json::json!(true),
            &serde_json::json!("lint")
        )
    );

    // Each bad file has two good lines before its bad one: nothing of it is written.
    let head = concat!(
        r#"{"name": "a", "schedule": "* * * * *", "message": "a"}"#,
        "\n",
        r#"{"name": "b", "schedule": "* * * * *", "message": "b"}"#,
        "\n"
    );
    let bad = |file: &str, third: &str| files.write(file, &format!("{head}{third}\n"));
    let cases = [
        (bad("syntax.jsonl", "{\"name\": "), ":3: not a routine"),
        (
            bad(
                "unknown.jsonl",
                r#"{"name": "c", "schedule": "* * * * *", "message": "c", "colour": "red"}"#,
            ),
            "colour",
        ),
        (
            bad(
                "schedule.jsonl",
                r#"{"name": "c", "schedule": "61 * * * *", "message": "c"}"#,
            ),
            ":3: ",
        ),
        (
            bad(
                "zone.jsonl",
                r#"{"name": "c", "schedule": "* * * * *", "timezone": "Mars/Olympus", "message": "c"}"#,
            ),
            "Mars/Olympus",
        ),
        (
            bad(
                "both.jsonl",
                r#"{"name": "c", "schedule": "* * * * *", "message": "c", "mission": "lint.json"}"#,
            ),
            "exactly one",
        ),
        (
            bad("neither.jsonl", r#"{"name": "c", "schedule": "* * * * *"}"#),
            "exactly one",
        ),
        (
            bad(
                "no-file.jsonl",
                r#"{"name": "c", "schedule": "* * * * *", "mission": "missing.json"}"#,
            ),
            "missing.json",
        ),
        (
            bad(
                "dup.jsonl",
                r#"{"name": "a", "schedule": "* * * * *", "message": "again"}"#,
            ),
            "also on line 1",
        ),
        (
            bad(
                "control.jsonl",
                r#"{"name": "c\u001b[2J", "schedule": "* * * * *", "message": "c"}"#,
            ),
            "control",
        ),
        (
            bad(
                "exists.jsonl",
                r#"{"name": "standup", "schedule": "* * * * *", "message": "c"}"#,
            ),
            ":3: a routine named \"standup\" already exists",
        ),
        (files.write("empty.jsonl", "\n"), "no routine"),
        (files.path("absent.jsonl"), "cannot read"),
    ];
    let cases: Vec<_> = cases
        .iter()
        .map(|(file, fragment)| case(&["routine", "import", file], fragment))
        .collect();
    check_refused(&db, &cases).await;

    // --upsert updates the routine of that name and creates the others.
    let upsert = files.write(
        "upsert.jsonl",
        concat!(
            r#"{"name": "standup", "schedule": "30 9 * * MON-FRI", "timezone": "Europe/Berlin", "message": "later"}"#,
            "\n",
            r#"{"name": "new", "schedule": "0 0 * * *", "message": "n"}"#,
        ),
    );
    let out = ok(url, &["routine", "import", &upsert, "--upsert"]);
    assert!(
        out.starts_with(&format!(
            "updated  {}  standup",
            standup["id"].as_str().unwrap()
        )),
        "{out}"
    );
    let updated = db.stored("standup").await;
    assert_eq!(updated["schedule"], "30 9 * * MON-FRI");
    assert_eq!(updated["id"], standup["id"]);
    assert_eq!(db.count("routines").await, 3);
}

#[tokio::test]
async fn import_reads_a_crontab() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    let crontab = files.write(
        "ops.crontab",
        "# m h dom mon dow command\n\
         # cm: name=nightly backup\n\
         30 2 * * * /usr/local/bin/backup --all\n\
         \n\
         */15 * * * *   curl -s https://example.invalid/ping   \n\
         CRON_TZ=America/New_York\n\
         @daily echo 'daily 100%'\n\
         0 9 * * MON-FRI echo standup\n",
    );
    let out = ok(url, &["routine", "import", "--crontab", &crontab]);
    assert_eq!(out.lines().count(), 4, "{out}");
    let check = async |name: &str, schedule: &str, zone: &str, text: &str| {
        let row = db.stored(name).await;
        assert_eq!(
            (
                &row["schedule"],
                &row["timezone"],
                &row["payload"],
                &row["kind"]
            ),
            (
                &serde_json::json!(schedule),
                &serde_json::json!(zone),
                &serde_json::json!({ "text": text }),
                &serde_json::json!("message")
            ),
            "{name}"
        );
    };
    check(
        "nightly backup",
        "30 2 * * *",
        "UTC",
        "/usr/local/bin/backup --all",
    )
    .await;
    check(
        "ops.crontab: */15 * * * * curl -s https://example.invalid/ping",
        "*/15 * * * *",
        "UTC",
        "curl -s https://example.invalid/ping",
    )
    .await;
    check(
        "ops.crontab: CRON_TZ=America/New_York @daily echo 'daily 100%'",
        "@daily",
        "America/New_York",
        "echo 'daily 100%'",
    )
    .await;
    check(
        "ops.crontab: CRON_TZ=America/New_York 0 9 * * MON-FRI echo standup",
        "0 9 * * MON-FRI",
        "America/New_York",
        "echo standup",
    )
    .await;

    let bad = |file: &str, text: &str| files.write(file, &format!("0 * * * * echo fine\n{text}\n"));
    let cases = [
        (
            bad("reboot.crontab", "@reboot /bin/start"),
            ":2: invalid cron expression: @reboot is not supported",
        ),
        (bad("tz.crontab", "CRON_TZ=Mars/Olympus"), "Mars/Olympus"),
        (bad("fields.crontab", "61 * * * * echo"), ":2: "),
        (bad("short.crontab", "* * * *"), ":2: not a crontab entry"),
        (bad("command.crontab", "* * * * *   "), ":2: "),
        (bad("every.crontab", "@every 5m echo"), "@every"),
        (
            bad("dangling.crontab", "# cm: name=orphan"),
            ":2: this `# cm: name=` comment names no entry",
        ),
        (
            bad("twice.crontab", "# cm: name=a\n# cm: name=b\n* * * * * x"),
            ":3: ",
        ),
        (
            bad("directive.crontab", "# cm: colour=red\n* * * * * x"),
            ":2: ",
        ),
        (
            bad(
                "uuid.crontab",
                "# cm: name=67e55044-10b1-426f-9247-bb680e5fe0c8\n* * * * * x",
            ),
            ":3: ",
        ),
        (crontab.clone(), "already exists"),
    ];
    let cases: Vec<_> = cases
        .iter()
        .map(|(file, fragment)| case(&["routine", "import", "--crontab", file], fragment))
        .collect();
    check_refused(&db, &cases).await;
    assert_eq!(db.count("routines").await, 4);
}

#[tokio::test]
async fn names_are_unique_printable_handles() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id = create(url, "hourly", "0 * * * *", "UTC");
    let missing = Uuid::new_v4().to_string();
    let create = |name: &str, fragment: &str| {
        case(
            &create_args(name, "* * * * *", &["--message", "x"]),
            fragment,
        )
    };
    #[rustfmt::skip]
    let cases = vec![
        create("hourly", "already exists"),
        create("evil\u{1b}]0;pwned\u{7}", "control"),
        create("two\nlines", "control"),
        create(&missing, "UUID"),
        case(&["routine", "show", "nobody"], "no routine is named \"nobody\""),
        case(&["routine", "pause", "nobody"], "nobody"),
        case(&["routine", "resume", "nobody"], "nobody"),
        case(&["routine", "delete", "nobody"], "nobody"),
        case(&["routine", "trigger", "nobody"], "nobody"),
        case(&["routine", "backfill", "nobody", "--from", "2025-01-01T00:00:00Z", "--to", "2025-01-01T01:00:00Z"], "nobody"),
        // A name given with an escape is quoted with the escape spelt out.
        case(&["routine", "show", "x\u{1b}[2J"], "\\u{1b}"),
        // A missing routine is bad input for fires too, by id or by name.
        case(&["fires", "--routine", &missing], &missing),
        case(&["fires", "--routine", "nobody"], "nobody"),
    ];
    check_refused(&db, &cases).await;

    // Every command that takes an id takes the name.
    assert!(ok(url, &["routine", "show", "hourly"]).contains(&id.to_string()));
    ok(url, &["routine", "pause", "hourly"]);
    assert_eq!(db.stored("hourly").await["paused"], true);
    ok(url, &["routine", "resume", " hourly "]);
    assert_eq!(db.stored("hourly").await["paused"], false);
    ok(url, &["routine", "trigger", "hourly"]);
    ok(
        url,
        &[
            "routine",
            "backfill",
            "hourly",
            "--from",
            "2025-01-01T00:00:00Z",
            "--to",
            "2025-01-01T01:00:00Z",
            "--retention",
            "4000days",
        ],
    );
    assert_eq!(db.count("routine_requests").await, 3);
    db.fire(id, "2025-01-01T00:00:00Z".parse().unwrap(), None)
        .await;
    let by_name = ok(url, &["fires", "--routine", "hourly", "--json"]);
    let by_id = ok(url, &["fires", "--routine", &id.to_string(), "--json"]);
    assert_eq!(by_name, by_id);
    assert_eq!(by_name.lines().count(), 1);
    // Each fire names its routine beside its id: in the table, the JSON and `fires show`.
    let line: serde_json::Value = serde_json::from_str(&by_name).unwrap();
    assert_eq!(
        (line["routine_name"].as_str(), line["routine_id"].as_str()),
        (Some("hourly"), Some(id.to_string().as_str())),
        "{by_name}"
    );
    let table = ok(url, &["fires", "--routine", "hourly"]);
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        table.starts_with("SCHEDULED AT (UTC)    ROUTINE  ROUTINE ID")
            && row.contains("  hourly   ")
            && row.contains(&id.to_string()),
        "{table}"
    );
    let shown = ok(url, &["fires", "show", "hourly@2025-01-01T00:00:00Z"]);
    assert!(
        shown.contains(&format!("routine     hourly ({id})")),
        "{shown}"
    );
    // The key `fires show` takes is in the JSON and the table, and `fires show` takes it.
    let key = line["key"]
        .as_str()
        .unwrap_or_else(|| panic!("no key: {by_name}"));
    assert!(row.split_whitespace().any(|cell| cell == key), "{table}");
    assert_eq!(ok(url, &["fires", "show", key]), shown);
    ok(url, &["routine", "delete", "hourly"]);
    assert_eq!(db.count("routines").await, 0);
}

#[tokio::test]
async fn show_prints_settings_next_runs_requests_and_fires() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id = created_id(&ok(
        url,
        &create_args(
            "standup",
            "0 9 * * *",
            &[
                "--timezone",
                "Europe/Berlin",
                "--message",
                "standup\u{1b}[2J in 5",
            ],
        ),
    ));
    db.fire(
        id,
        "2025-01-01T08:00:00Z".parse().unwrap(),
        Some("backend said no\nat all"),
    )
    .await;
    db.fire(id, "2025-01-02T08:00:00Z".parse().unwrap(), None)
        .await;
    ok(url, &["routine", "trigger", "standup"]);
    ok(
        url,
        &[
            "routine",
            "backfill",
            "standup",
            "--from",
            "2025-01-03T00:00:00Z",
            "--to",
            "2025-01-03T23:00:00Z",
            "--retention",
            "4000days",
        ],
    );

    let out = ok(url, &["routine", "show", "standup"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&format!("id          {id}").as_str()),
        "{out}"
    );
    assert!(lines.contains(&"name        standup"), "{out}");
    assert!(lines.contains(&"timezone    Europe/Berlin"), "{out}");
    assert!(lines.contains(&"state       active"), "{out}");
    // Control characters in the message are spelt out, never sent to the terminal.
    assert!(
        lines.contains(&"message     standup\\u{1b}[2J in 5"),
        "{out}"
    );
    assert!(!out.contains('\u{1b}'), "{out:?}");
    // The next five runs, local and UTC: 09:00 in Berlin, 08:00 or 07:00 UTC.
    let header = lines
        .iter()
        .position(|l| l.starts_with("NEXT RUNS (LOCAL)"))
        .expect(&out);
    let runs = &lines[header + 1..header + 6];
    for run in runs {
        assert!(run.contains(" 09:00:00 CE"), "{run}");
        assert!(run.ends_with(":00:00Z"), "{run}");
    }
    assert_eq!(lines[header + 6], "", "{out}");
    let pending = lines
        .iter()
        .position(|l| l.starts_with("PENDING REQUESTS"))
        .expect(&out);
    // Oldest occurrence first: the backfilled one, then the trigger (now).
    assert!(lines[pending + 1].starts_with("backfill "), "{out}");
    assert!(
        lines[pending + 1].contains("  2025-01-03T08:00:00Z  "),
        "{out}"
    );
    assert!(lines[pending + 2].starts_with("trigger "), "{out}");
    let fires = lines
        .iter()
        .position(|l| l.starts_with("SCHEDULED AT (UTC)"))
        .expect(&out);
    assert!(
        lines[fires + 1].starts_with("2025-01-02T08:00:00Z  fired"),
        "{out}"
    );
    assert!(
        lines[fires + 2].starts_with("2025-01-01T08:00:00Z  failed"),
        "{out}"
    );
    assert!(
        lines[fires + 2].ends_with("backend said no\\nat all"),
        "{out}"
    );

    // Paused: no next runs; a mission shows its repository, not the rest of its file.
    ok(url, &["routine", "pause", "standup"]);
    assert!(ok(url, &["routine", "show", "standup"]).contains("next runs: none while paused"));
    let files = MissionFiles::new();
    let mission = files.write(
        "m.json",
        r#"{"repository": "https://example.invalid/r.git", "task": "a secret plan"}"#,
    );
    ok(
        url,
        &["routine", "update", "standup", "--mission", &mission],
    );
    let out = ok(url, &["routine", "show", "standup"]);
    assert!(
        out.contains("repository  https://example.invalid/r.git"),
        "{out}"
    );
    assert!(!out.contains("a secret plan"), "{out}");
}

/// Asserts that the column `header` names starts at the same character in the header line and
/// in every row (the last column is the ragged one, so this checks the padding before it).
fn check_aligned(out: &str, header: &str) {
    let lines: Vec<&str> = out.lines().collect();
    let at = lines[0]
        .find(header)
        .unwrap_or_else(|| panic!("no {header} column: {out}"));
    for line in &lines[1..] {
        if line.chars().count() <= at {
            // An empty last column.
            continue;
        }
        let before: String = line.chars().take(at).collect();
        assert!(
            before.ends_with("  ") || at == 0,
            "column {header} is not aligned in {line:?}:\n{out}"
        );
        assert_ne!(line.chars().nth(at), Some(' '), "{line:?}:\n{out}");
    }
}

#[tokio::test]
async fn listings_are_aligned_tables_read_a_page_at_a_time() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    // More than one page of `routine list` (1,000 routines).
    db.bulk(1203).await;
    create(
        url,
        "a much longer name than the others",
        "0 9 * * MON-FRI",
        "America/Argentina/Buenos_Aires",
    );
    let out = ok(url, &["routine", "list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1 + 1204);
    assert!(lines[0].starts_with("ID  "), "{}", lines[0]);
    for column in [
        "KIND",
        "NEXT RUN (UTC)",
        "MISFIRE",
        "TIMEZONE",
        "SCHEDULE",
        "READS",
        "NAME",
    ] {
        check_aligned(&lines[..1000].join("\n"), column);
    }
    // Each schedule is also said in words, in its zone, beside the expression.
    assert!(
        lines[1204]
            .contains("  0 9 * * MON-FRI  09:00 on weekdays, America/Argentina/Buenos_Aires  "),
        "{}",
        lines[1204]
    );
    // Creation order, every routine once.
    let name_and_state = |line: &str| {
        let cells: Vec<&str> = line
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        cells[cells.len() - 2..].join("|")
    };
    assert_eq!(name_and_state(lines[1]), "bulk-1|active");
    assert_eq!(name_and_state(lines[1203]), "bulk-1203|active");
    assert_eq!(
        name_and_state(lines[1204]),
        "a much longer name than the others|active"
    );
    let json = ok(url, &["routine", "list", "--json"]);
    let ids: std::collections::HashSet<String> = json
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 1204);
    let last: serde_json::Value = serde_json::from_str(json.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["schedule_words"],
        "09:00 on weekdays, America/Argentina/Buenos_Aires"
    );
    assert_eq!(last["schedule"], "0 9 * * MON-FRI");

    let id = create(url, "hourly", "0 * * * *", "UTC");
    db.fire(id, "2025-01-01T00:00:00Z".parse().unwrap(), Some("refused"))
        .await;
    db.fire(id, "2025-01-01T01:00:00Z".parse().unwrap(), None)
        .await;
    let out = ok(url, &["fires"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.starts_with("SCHEDULED AT (UTC)  "), "{out}");
    for column in [
        "ROUTINE", "STATUS", "ORIGIN", "ATTEMPT", "CLAIMANT", "ERROR",
    ] {
        check_aligned(&out, column);
    }
    // Where each fire came from: these were scheduled.
    assert!(
        out.lines().skip(1).all(|l| l.contains("  schedule  ")),
        "{out}"
    );
    let failed = out.lines().nth(2).unwrap();
    assert!(
        failed.contains("  node-a  ") && failed.ends_with("  refused"),
        "{out}"
    );
    // JSON lines are as before: one object a line, the ledger's fields.
    let json = ok(url, &["fires", "--json", "--status", "failed"]);
    let fire: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(
        (fire["status"].as_str(), fire["error"].as_str()),
        (Some("failed"), Some("refused"))
    );
    assert_eq!(fire["origin"].as_str(), Some("schedule"));
    // `routine show` lists the origin too.
    let show = ok(url, &["routine", "show", "hourly"]);
    assert!(show.contains("ORIGIN"), "{show}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = ok(NOWHERE, &["completions", shell]);
        assert!(out.contains("cm-scheduler"), "{shell}: {out}");
        assert!(out.contains("backfill"), "{shell}: {out}");
    }
    check_fails(NOWHERE, &["completions", "tcsh"], 2, "tcsh");
}

#[tokio::test]
async fn errors_say_what_to_do_and_keep_secrets() {
    // A refused connection says so (not that a pool timed out).
    check_fails(NOWHERE, &["routine", "list"], 1, "connection refused");
    check_fails(NOWHERE, &["fires"], 1, "connection refused");

    // A database without the schema says to migrate, and no PostgreSQL internals leak.
    let name = format!("cm_test_{}", Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&format!("{SERVER}/postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut admin)
        .await
        .unwrap();
    let empty = format!("{SERVER}/{name}");
    for args in [
        &["routine", "list"][..],
        &["fires"],
        &["routine", "show", "x"],
        &["run", "--no-migrate"],
    ] {
        let out = cm(&empty, args);
        assert_eq!(out.code, Some(1), "{out:?}");
        assert!(out.stderr.contains("cm-scheduler migrate"), "{out:?}");
        assert!(!out.stderr.contains(" at line "), "{out:?}");
    }
    drop_database(&name);
    let out = cm(
        &format!("{SERVER}/cm_test_never_created"),
        &["routine", "list"],
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("does not exist") && out.stderr.contains("migrate"),
        "{out:?}"
    );

    // No secret of the URL reaches any message, whichever part of it holds them.
    let secret_urls = [
        "postgres://postgres:hunter2@127.0.0.1:1/x?password=swordfish&sslpassword=opensesame",
        "postgres://nobody:hunter2@127.0.0.1:5432/postgres?sslpassword=opensesame&application_name=cm",
        "postgres://postgres@127.0.0.1:5432/postgres?password=swordfish&sslmode=bogus",
        "postgres://postgres:hunter2@127.0.0.1:notaport/x",
        "postgres://nobody@127.0.0.1:5432/postgres?Password=swordfish",
    ];
    for url in secret_urls {
        for args in [
            &["routine", "list"][..],
            &["migrate"],
            &["fires", "--routine", "x"],
        ] {
            let out = cm(url, args);
            assert_ne!(out.code, Some(0), "{url} {args:?}: {out:?}");
            for secret in ["hunter2", "swordfish", "opensesame"] {
                assert!(!out.stderr.contains(secret), "{url} {args:?}: {out:?}");
            }
        }
        // Through DATABASE_URL as well.
        let mut command = cm_scheduler();
        command.env("DATABASE_URL", url).args(["routine", "list"]);
        let out = run(command);
        assert_ne!(out.code, Some(0));
        for secret in ["hunter2", "swordfish", "opensesame"] {
            assert!(!out.stderr.contains(secret), "{url}: {out:?}");
        }
    }
}
