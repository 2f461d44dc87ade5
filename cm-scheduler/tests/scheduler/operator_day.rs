//! An operator's day with the command line: a crontab edited and imported again, listings
//! read through `head`, pause reasons, refusals that say what to do, logs written to files.

use std::collections::HashMap;
use std::io::Read as _;
use std::process::{Command, Stdio};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::cli::{BIN, NOWHERE, check_fails, cm, create_args, ok};
use crate::operator::create;
use crate::support::{PATIENCE, TestDb, cm_scheduler, wait_until_blocking};

/// Writes `text` to a file named `name` in a fresh directory and returns its path.
pub(crate) fn crontab_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Every routine by name: its id.
async fn routines_by_name(db: &TestDb) -> HashMap<String, Uuid> {
    sqlx::query_as::<_, (String, Uuid)>("SELECT name, id FROM cm.routines")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Writes a fired occurrence of `routine` at `at`, as a scheduler would have.
async fn record_fire(db: &TestDb, routine: Uuid, at: &str) {
    let at: DateTime<Utc> = at.parse().unwrap();
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, status, claimant, claim_token, lease_expires_at,
              completed_at)
         VALUES ($1, $2, 'fired', 'node-a', gen_random_uuid(), $2, $2)",
    )
    .bind(routine)
    .bind(at)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// How many fires each routine has, by routine id.
async fn fires_by_routine(db: &TestDb) -> HashMap<Uuid, i64> {
    sqlx::query_as::<_, (Uuid, i64)>(
        "SELECT routine_id, count(*) FROM cm.routine_fires GROUP BY routine_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

const PING: &str = "ops.cron: @hourly curl -fsS https://example.com/ping";
const ROTATE: &str = "ops.cron: 0 3 * * * rotate-logs";
const DISK: &str = "ops.cron: */5 * * * * check-disk";

#[tokio::test]
async fn a_crontab_imported_again_keeps_one_routine_per_entry_with_its_history() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let dir = tempdir();
    let v1 = "@hourly curl -fsS https://example.com/ping\n0 3 * * * rotate-logs\n";
    // A line added at the top: with names taken from lines, every entry below was renamed.
    let v2 = "*/5 * * * * check-disk\n@hourly curl -fsS https://example.com/ping\n0 3 * * * rotate-logs\n";

    // --upsert twice: the entries keep their names, so nothing is duplicated.
    let file = crontab_file(dir.path(), "ops.cron", v1);
    ok(url, &["routine", "import", "--crontab", "--upsert", &file]);
    let first = routines_by_name(&db).await;
    record_fire(&db, first[PING], "2026-01-01T10:00:00Z").await;
    record_fire(&db, first[ROTATE], "2026-01-01T03:00:00Z").await;
    let file = crontab_file(dir.path(), "ops.cron", v2);
    ok(url, &["routine", "import", "--crontab", "--upsert", &file]);
    let second = routines_by_name(&db).await;
    assert_eq!(second.len(), 3, "{second:?}");
    assert_eq!((second[PING], second[ROTATE]), (first[PING], first[ROTATE]));
    let fires = fires_by_routine(&db).await;
    assert_eq!((fires[&first[PING]], fires[&first[ROTATE]]), (1, 1));
    assert!(!fires.contains_key(&second[DISK]), "{fires:?}");

    // --sync: a routine made by hand and one from another file are left alone; a line deleted
    // deletes its routine, lines reordered and a command changed keep the others.
    create(url, "by hand", "@daily", "UTC");
    let other = crontab_file(
        dir.path(),
        "other.cron",
        "@hourly curl -fsS https://example.com/ping\n",
    );
    ok(url, &["routine", "import", "--crontab", "--sync", &other]);
    // The ping's line deleted, the other two swapped.
    let v3 = "0 3 * * * rotate-logs\n*/5 * * * * check-disk\n";
    let file = crontab_file(dir.path(), "ops.cron", v2);
    let out = ok(url, &["routine", "import", "--crontab", "--sync", &file]);
    assert!(
        out.lines().all(|l| l.starts_with("unchanged  ")),
        "the routines of --upsert recorded the file's source: {out}"
    );
    let file = crontab_file(dir.path(), "ops.cron", v3);
    let out = ok(url, &["routine", "import", "--crontab", "--sync", &file]);
    let actions: Vec<(&str, &str)> = out
        .lines()
        .map(|l| {
            let cells: Vec<&str> = l.splitn(3, "  ").collect();
            (cells[0], cells[2])
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("unchanged", ROTATE),
            ("unchanged", DISK),
            ("deleted", PING)
        ],
        "{out}"
    );
    let third = routines_by_name(&db).await;
    assert_eq!((third[DISK], third[ROTATE]), (second[DISK], first[ROTATE]));
    assert!(
        third.contains_key("by hand")
            && third.contains_key("other.cron: @hourly curl -fsS https://example.com/ping")
    );
    assert_eq!(third.len(), 4, "{third:?}");
    let fires = fires_by_routine(&db).await;
    assert!(
        !fires.contains_key(&first[PING]),
        "a deleted routine's fires go with it"
    );
    assert_eq!(fires[&first[ROTATE]], 1, "{fires:?}");
    let show = ok(url, &["routine", "show", DISK]);
    assert!(show.contains("source      ops.cron\n"), "{show}");

    // A name another source has is refused, and nothing is written.
    let clash = crontab_file(
        dir.path(),
        "ops.cron",
        "# cm: name=other.cron: @hourly curl -fsS https://example.com/ping\n@daily x\n",
    );
    check_fails(
        url,
        &["routine", "import", "--crontab", "--sync", &clash],
        2,
        "already comes from \"other.cron\"",
    );
    assert_eq!(routines_by_name(&db).await, third);
    check_fails(
        url,
        &["routine", "import", "--crontab", "--sync", "-"],
        2,
        "--source",
    );
}

/// The routines' (name, schedule) by id.
async fn schedules_by_id(db: &TestDb) -> HashMap<Uuid, (String, String)> {
    sqlx::query_as::<_, (Uuid, String, String)>("SELECT id, name, schedule FROM cm.routines")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, name, schedule)| (id, (name, schedule)))
        .collect()
}

#[tokio::test]
async fn a_plain_import_then_a_sync_of_the_edited_crontab_converges_and_a_dry_run_writes_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let dir = tempdir();
    // What `crontab -l` prints: variables first, then entries.
    let v1 = "MAILTO=ops@example.invalid\nSHELL=/bin/bash\nPATH=/usr/bin:/bin\n\
              */15 * * * * check-disk\n0 3 * * * rotate-logs\n";
    let file = crontab_file(dir.path(), "ops.cron", v1);
    let out = cm(url, &["routine", "import", "--crontab", &file]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // Each variable is accepted and reported on its line, its value not repeated.
    for (line, variable) in [(1, "MAILTO"), (2, "SHELL"), (3, "PATH")] {
        assert!(
            out.stderr
                .contains(&format!("ops.cron:{line}: {variable}= ignored: cm ")),
            "{}",
            out.stderr
        );
    }
    assert!(
        !out.stderr.contains("ops@example.invalid"),
        "{}",
        out.stderr
    );
    let before = routines_by_name(&db).await;
    let disk = before["ops.cron: */15 * * * * check-disk"];
    let rotate = before[ROTATE];
    record_fire(&db, disk, "2026-01-01T10:15:00Z").await;

    // The entry's schedule edited, one line added, and a routine made by hand with the same
    // command, which no sync may take.
    ok(
        url,
        &create_args("disk by hand", "*/15 * * * *", &["--message", "check-disk"]),
    );
    let v2 = "MAILTO=ops@example.invalid\n*/10 * * * * check-disk\n0 3 * * * rotate-logs\n\
              @hourly ping\n";
    let file = crontab_file(dir.path(), "ops.cron", v2);

    // A dry run says what the sync would do and writes nothing.
    let stored = schedules_by_id(&db).await;
    let fires = fires_by_routine(&db).await;
    let out = cm(
        url,
        &[
            "routine",
            "import",
            "--crontab",
            "--sync",
            "--dry-run",
            &file,
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let plan: Vec<(String, String)> = out
        .stdout
        .lines()
        .map(|l| {
            let cells: Vec<&str> = l.splitn(3, "  ").collect();
            (cells[0].trim().to_string(), cells[2].to_string())
        })
        .collect();
    assert_eq!(
        plan,
        [
            ("update".into(), "ops.cron: */10 * * * * check-disk".into()),
            ("unchanged".into(), ROTATE.into()),
            ("create".into(), "ops.cron: @hourly ping".into()),
        ],
        "{}",
        out.stdout
    );
    assert!(
        out.stderr.contains("dry run: nothing was written"),
        "{}",
        out.stderr
    );
    assert_eq!(schedules_by_id(&db).await, stored);
    assert_eq!(fires_by_routine(&db).await, fires);
    assert_eq!(db.count("routines").await, 3);

    // The sync itself: the */15 routine becomes the */10 one, its id and history kept; nothing
    // stale is left firing beside it, and the routine made by hand is left alone.
    let out = ok(url, &["routine", "import", "--crontab", "--sync", &file]);
    let after = schedules_by_id(&db).await;
    assert_eq!(
        after[&disk],
        (
            "ops.cron: */10 * * * * check-disk".to_string(),
            "*/10 * * * *".to_string()
        ),
        "{out}"
    );
    assert_eq!(after[&rotate].0, ROTATE);
    assert_eq!(after.len(), 4, "{after:?}");
    assert!(
        after.values().any(|(name, _)| name == "disk by hand"),
        "{after:?}"
    );
    let mut every_15: Vec<&str> = after
        .values()
        .filter(|(_, schedule)| schedule == "*/15 * * * *")
        .map(|(name, _)| name.as_str())
        .collect();
    every_15.sort_unstable();
    assert_eq!(every_15, ["disk by hand"], "{after:?}");
    assert_eq!(fires_by_routine(&db).await[&disk], 1);

    // The entry deleted: a dry run names the deletion, then the sync deletes it.
    let v3 = "0 3 * * * rotate-logs\n@hourly ping\n";
    let file = crontab_file(dir.path(), "ops.cron", v3);
    let out = ok(
        url,
        &[
            "routine",
            "import",
            "--crontab",
            "--sync",
            "--dry-run",
            &file,
        ],
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("delete") && l.contains(&disk.to_string())),
        "{out}"
    );
    assert!(schedules_by_id(&db).await.contains_key(&disk));
    ok(url, &["routine", "import", "--crontab", "--sync", &file]);
    assert!(!schedules_by_id(&db).await.contains_key(&disk));

    // A plain import's dry run names what it would create, and still refuses a taken name.
    let extra = crontab_file(dir.path(), "extra.cron", "@daily report\n");
    let out = ok(
        url,
        &["routine", "import", "--crontab", "--dry-run", &extra],
    );
    assert!(
        out.starts_with("create  -  extra.cron: @daily report"),
        "{out}"
    );
    assert!(
        !routines_by_name(&db)
            .await
            .contains_key("extra.cron: @daily report")
    );
    check_fails(
        url,
        &["routine", "import", "--crontab", "--dry-run", &file],
        2,
        "already exists",
    );
}

#[tokio::test]
async fn listings_keep_creation_order_and_show_why_a_routine_is_paused() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    // An empty listing still has its header.
    let out = ok(url, &["routine", "list"]);
    assert!(
        out.starts_with("ID  ") && out.lines().count() == 1,
        "{out:?}"
    );
    let out = ok(url, &["fires"]);
    assert!(
        out.starts_with("SCHEDULED AT (UTC)  ") && out.lines().count() == 1,
        "{out:?}"
    );
    assert_eq!(ok(url, &["routine", "list", "--json"]), "");

    // One import's routines share their creation time; they list in the file's order.
    let dir = tempdir();
    let names: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let lines: String = names
        .iter()
        .map(|n| format!("{{\"name\":\"{n}\",\"schedule\":\"@hourly\",\"message\":\"m\"}}\n"))
        .collect();
    let file = crontab_file(dir.path(), "jobs.jsonl", &lines);
    ok(url, &["routine", "import", &file]);
    let listed: Vec<String> = ok(url, &["routine", "list", "--json"])
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(listed, names);

    // A routine cm paused shows why, in the list and in show.
    let reason = "paused by cm: its last 5 fires failed; the latest: connection refused";
    sqlx::query("UPDATE cm.routines SET paused = true, next_run_at = NULL, paused_reason = $1 WHERE name = 'job-03'")
        .bind(reason)
        .execute(&db.pool)
        .await
        .unwrap();
    ok(url, &["routine", "pause", "job-04"]);
    let out = ok(url, &["routine", "list"]);
    let row = |name: &str| {
        out.lines()
            .find(|l| l.contains(&format!("  {name}  ")))
            .unwrap()
            .to_string()
    };
    assert!(row("job-03").ends_with(reason), "{out}");
    assert!(row("job-04").ends_with("  paused"), "{out}");
    assert!(row("job-05").ends_with("  active"), "{out}");
    let show = ok(url, &["routine", "show", "job-03"]);
    assert!(show.contains(&format!("state       {reason}\n")), "{show}");

    // --json is one object a line everywhere.
    for args in [
        &["routine", "show", "job-03", "--json"][..],
        &create_args("j", "@daily", &["--message", "m", "--json"])[..],
    ] {
        let out = ok(url, args);
        assert_eq!(out.lines().count(), 1, "{args:?}: {out}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
    }
}

/// Starts the binary on `url` with `args`, its standard error piped.
fn spawn(url: &str, args: &[&str], stdout: Stdio) -> std::process::Child {
    cm_scheduler()
        .env_remove("RUST_LOG")
        .arg("--database-url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` to end and returns its exit code and what it wrote on stderr.
fn finish(mut child: std::process::Child) -> (Option<i32>, String) {
    let mut stderr = String::new();
    let mut pipe = child.stderr.take().unwrap();
    pipe.read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap().code(), stderr)
}

/// Runs the binary with its standard output closed before it writes: it must exit 0 without a
/// word, as `cm-scheduler … | head -1` needs.
fn check_quiet_on_a_closed_pipe(url: &str, args: &[&str]) {
    let mut child = spawn(url, args, Stdio::piped());
    drop(child.stdout.take());
    assert_eq!(finish(child), (Some(0), String::new()), "{args:?}");
}

#[tokio::test]
async fn a_reader_that_goes_away_ends_the_command_quietly() {
    let db = TestDb::new().await;
    create(&db.url, "a", "@daily", "UTC");
    check_quiet_on_a_closed_pipe(
        NOWHERE,
        &["schedule", "next", "* * * * * *", "--count", "100000"],
    );
    check_quiet_on_a_closed_pipe(NOWHERE, &["completions", "bash"]);
    check_quiet_on_a_closed_pipe(&db.url, &["routine", "list"]);
    check_quiet_on_a_closed_pipe(&db.url, &["fires"]);
}

#[tokio::test]
async fn refusals_say_what_is_wrong_in_words_that_can_be_used_again() {
    check_fails(NOWHERE, &["fires", "--limit", "0"], 2, "--limit");
    check_fails(
        NOWHERE,
        &["schedule", "next", "@daily", "--count", "0"],
        2,
        "--count",
    );
    check_fails(
        NOWHERE,
        &["run", "--lease", "banana"],
        2,
        "not a duration (a number and a unit, such as 30s",
    );
    check_fails(
        "foo",
        &["routine", "list"],
        2,
        "invalid --database-url foo: relative URL without a base (expected postgres://",
    );
    check_fails(
        "http://127.0.0.1/cm",
        &["fires"],
        2,
        "the scheme is \"http\", not postgres",
    );
    check_fails(
        "postgres://cm:s3cret@/cm",
        &["migrate"],
        2,
        "postgres://cm:***@/cm: empty host",
    );
    check_fails(
        "postgres://nohost.invalid/cm",
        &["routine", "list"],
        1,
        "the host is not known",
    );
    // The flag is offered where it is used.
    for (args, shown) in [
        (&["schedule", "next", "--help"][..], false),
        (&["completions", "--help"][..], false),
        (&["routine", "list", "--help"][..], true),
        (&["--help"][..], true),
    ] {
        let help = ok(NOWHERE, args);
        assert_eq!(help.contains("--database-url"), shown, "{args:?}: {help}");
    }

    // The earliest start a backfill may have is printed in RFC 3339, so it can be given back.
    let db = TestDb::new().await;
    let url = db.url.as_str();
    create(url, "h", "@hourly", "UTC");
    let backfill = |from: &str, to: &str| {
        let args = ["routine", "backfill", "h", "--from", from, "--to", to];
        cm(url, &[&args[..], &["--retention", "2days"]].concat())
    };
    let out = backfill("2000-01-01T00:00:00Z", "2000-01-02T00:00:00Z");
    assert_eq!(out.code, Some(2), "{out:?}");
    let earliest = out
        .stderr
        .split("start the window at ")
        .nth(1)
        .and_then(|rest| rest.split(" or later").next())
        .unwrap_or_else(|| panic!("{out:?}"));
    // As printed it parses; a minute later (the earliest start moves with the clock) is taken.
    let earliest = DateTime::parse_from_rfc3339(earliest)
        .unwrap_or_else(|e| panic!("{earliest:?}: {e}"))
        + chrono::TimeDelta::minutes(1);
    let earliest = earliest.to_rfc3339();
    let now = Utc::now().to_rfc3339();
    let out = backfill(&earliest, &now);
    assert!(
        out.code == Some(0) || out.stderr.contains("future"),
        "{out:?}"
    );
}

#[test]
fn logs_written_to_a_file_have_no_colour_codes() {
    let dir = tempdir();
    let log = dir.path().join("log");
    let mut child = cm_scheduler()
        .env_remove("RUST_LOG")
        .args(["--database-url", NOWHERE, "run", "--no-migrate"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // Its first line (a warning: nothing answers at NOWHERE), then SIGTERM, which it logs.
    wait_until_blocking("a line in the log file", PATIENCE, read, |log| {
        log.contains('\n')
    });
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    let stderr = read();
    assert!(stderr.contains("INFO"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

/// A directory removed when dropped.
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory under the system's temporary one.
pub(crate) fn tempdir() -> TempDir {
    let dir = std::env::temp_dir().join(format!("cm_day_{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// Runs `script` in `shell` with the binary on the PATH and `url` as its database; returns what
/// it printed.
fn in_shell(shell: &str, args: &[&str], script: &str, url: &str) -> String {
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = match Command::new(shell)
        .args(args)
        .arg(script)
        .env("PATH", path)
        .env("DATABASE_URL", url)
        .env("HOME", std::env::temp_dir())
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!("cannot run {shell} ({e}): install it (apt-get install {shell})"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{shell}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A database with three routines to complete, and a directory holding `shell`'s completion
/// script (its path returned).
async fn completion_fixture(shell: &str) -> (TestDb, TempDir, String) {
    let db = TestDb::new().await;
    for name in ["nightly backup", "nightly report", "standup"] {
        create(&db.url, name, "@daily", "UTC");
    }
    let dir = tempdir();
    let path = dir.path().join(format!("cm-scheduler.{shell}"));
    std::fs::write(&path, ok(NOWHERE, &["completions", shell])).unwrap();
    let path = path.display().to_string();
    (db, dir, path)
}

#[tokio::test]
async fn bash_completes_subcommands_flags_and_routine_names() {
    let (db, _dir, script) = completion_fixture("bash").await;
    let url = db.url.as_str();

    // bash: the function `complete` registered, called as bash calls it on <TAB>.
    let bash = format!(
        r#"source {}
fn=$(complete -p cm-scheduler | sed 's/.* -F \([^ ]*\) .*/\1/')
comp() {{
    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()
    "$fn" cm-scheduler "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
    echo "$*|${{COMPREPLY[*]}}"
}}
comp cm-scheduler rou
comp cm-scheduler routine sh
comp cm-scheduler fires --st
comp cm-scheduler routine show night
comp cm-scheduler fires --routine st
"#,
        script
    );
    let out = in_shell("bash", &["-c"], &bash, url);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "cm-scheduler rou|routine",
            "cm-scheduler routine sh|show",
            "cm-scheduler fires --st|--status",
            r"cm-scheduler routine show night|nightly\ backup nightly\ report",
            "cm-scheduler fires --routine st|standup",
        ],
        "{out}"
    );

    // Without a database, a name completes to nothing, quietly.
    let out = cm(NOWHERE, &["__complete-routine", "night"]);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (Some(0), "", "")
    );
}

#[tokio::test]
#[ignore = "needs fish: apt-get install fish"]
async fn fish_completes_subcommands_flags_and_routine_names() {
    let (db, _dir, script) = completion_fixture("fish").await;
    let url = db.url.as_str();
    // fish: `complete -C` completes a command line as fish would on <TAB>.
    let fish = format!(
        "source {}\n\
         complete -C 'cm-scheduler routine sh'\n\
         complete -C 'cm-scheduler fires --st'\n\
         complete -C 'cm-scheduler routine pause night'\n\
         complete -C 'cm-scheduler fires --routine st'\n",
        script
    );
    let out = in_shell("fish", &["--no-config", "-c"], &fish, url);
    let words: Vec<&str> = out.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(
        words,
        [
            "show",
            "--status",
            "nightly backup",
            "nightly report",
            "standup"
        ],
        "{out}"
    );
}

#[tokio::test]
#[ignore = "needs zsh: apt-get install zsh"]
async fn zsh_completes_routine_names() {
    let (db, dir, script) = completion_fixture("zsh").await;
    let url = db.url.as_str();
    // zsh: the script loads under compinit, and the function its routine arguments name offers
    // the routines (compadd, which only a completion widget may call, prints what it is given).
    let zsh = format!(
        "autoload -U compinit; compinit -u -d {}/zcompdump\n\
         source {}\n\
         compadd() {{ print -l -- \"${{(@P)2}}\"; }}\n\
         PREFIX=night; _cm_scheduler_routines\n\
         functions _cm-scheduler | grep -c _cm_scheduler_routines\n",
        dir.path().display(),
        script
    );
    let out = in_shell("zsh", &["-f", "-c"], &zsh, url);
    let lines: Vec<&str> = out.lines().collect();
    // Seven `routine` subcommands take a routine, `fires --routine` one and `events --routine`
    // one.
    assert_eq!(lines, ["nightly backup", "nightly report", "9"], "{out}");
}
