//! Every `routine import` records its source (the file's name, or `--source`), so a later
//! `--sync` deletes the routines of lines deleted before it; a dry run says what the import would
//! do in the import's own words; a system crontab's user column is read with `--system`, and
//! without it is refused (in a file kept where system crontabs are) or noted.

use crate::cli::{check_fails, cm, create_args, ok};
use crate::operator_day::{crontab_file, tempdir};
use crate::support::TestDb;

/// The first cell (the action) of each line `routine import` printed.
fn actions(out: &str) -> Vec<String> {
    out.lines()
        .map(|l| l.split("  ").next().unwrap().trim().to_string())
        .collect()
}

/// Each line's action and name (its third cell).
fn actions_and_names(out: &str) -> Vec<(String, String)> {
    out.lines()
        .map(|l| {
            let cells: Vec<&str> = l.splitn(3, "  ").collect();
            (cells[0].trim().to_string(), cells[2].trim().to_string())
        })
        .collect()
}

/// Whether a routine of that name exists.
async fn exists(db: &TestDb, name: &str) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM cm.routines WHERE name = $1)")
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

const ROTATE: &str = "ops.crontab: 30 4 * * 0 rotate-logs";

#[tokio::test]
async fn a_plain_import_records_its_source_so_a_sync_deletes_the_lines_deleted_since() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let dir = tempdir();
    // A plain import of three lines; one line deleted before the first --sync.
    let v1 = "*/10 * * * * check-disk\n@hourly ping\n30 4 * * 0 rotate-logs\n";
    let file = crontab_file(dir.path(), "ops.crontab", v1);
    ok(url, &["routine", "import", "--crontab", &file]);
    let file = crontab_file(
        dir.path(),
        "ops.crontab",
        "*/10 * * * * check-disk\n@hourly ping\n",
    );
    let out = ok(url, &["routine", "import", "--crontab", "--sync", &file]);
    assert_eq!(
        actions_and_names(&out),
        [
            (
                "unchanged".into(),
                "ops.crontab: */10 * * * * check-disk".into()
            ),
            ("unchanged".into(), "ops.crontab: @hourly ping".into()),
            ("deleted".into(), ROTATE.into()),
        ],
        "{out}"
    );
    assert!(
        !exists(&db, ROTATE).await,
        "the deleted line's routine is gone"
    );
    let show = ok(url, &["routine", "show", "ops.crontab: @hourly ping"]);
    assert!(show.contains("source      ops.crontab\n"), "{show}");

    // JSON Lines alike, and --upsert and --source too: the upsert's routines are the
    // source's, so the sync deletes the one its file lost.
    let jsonl = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                format!("{{\"name\": \"{n}\", \"schedule\": \"@daily\", \"message\": \"m\"}}\n")
            })
            .collect::<String>()
    };
    let file = crontab_file(dir.path(), "team.jsonl", &jsonl(&["standup", "retro"]));
    ok(url, &["routine", "import", &file]);
    ok(
        url,
        &["routine", "import", "--upsert", "--source", "team", &file],
    );
    let file = crontab_file(dir.path(), "team.jsonl", &jsonl(&["standup"]));
    let out = ok(
        url,
        &["routine", "import", "--sync", "--source", "team", &file],
    );
    assert_eq!(actions(&out), ["unchanged", "deleted"], "{out}");
    assert!(exists(&db, "standup").await && !exists(&db, "retro").await);
}

#[tokio::test]
async fn an_import_dry_run_says_what_it_would_do_in_the_words_the_import_prints() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let dir = tempdir();
    let v1 = "*/10 * * * * check-disk\n@hourly ping\n30 4 * * 0 rotate-logs\n";
    let file = crontab_file(dir.path(), "ops.crontab", v1);
    ok(url, &["routine", "import", "--crontab", &file]);
    // A routine made by hand that a line of the next version names.
    ok(
        url,
        &create_args(
            "ops.crontab: @daily report",
            "@daily",
            &["--message", "report"],
        ),
    );
    // Every action at once: a schedule edited, a line kept, the routine made by hand named,
    // a line added, a line deleted.
    let v2 = "*/15 * * * * check-disk\n@hourly ping\n@daily report\n0 5 * * * vacuum\n";
    let file = crontab_file(dir.path(), "ops.crontab", v2);
    let sync = ["routine", "import", "--crontab", "--sync"];
    let planned = cm(url, &[&sync[..], &["--dry-run", &file]].concat());
    assert_eq!(planned.code, Some(0), "{}", planned.stderr);
    assert!(planned.stderr.contains("dry run: nothing was written"));
    let done = ok(url, &[&sync[..], &[file.as_str()]].concat());
    let words = |out: &str| -> Vec<(String, String)> {
        out.lines()
            .map(|l| {
                let cells: Vec<&str> = l.split("  ").map(str::trim).collect();
                (cells[0].to_string(), cells.last().unwrap().to_string())
            })
            .collect()
    };
    assert_eq!(
        words(&planned.stdout),
        [
            ("update", "ops.crontab: */15 * * * * check-disk"),
            ("unchanged", "ops.crontab: @hourly ping"),
            ("adopt", "ops.crontab: @daily report"),
            ("create", "ops.crontab: 0 5 * * * vacuum"),
            ("delete", ROTATE),
        ]
        .map(|(a, n)| (a.to_string(), n.to_string())),
        "{}",
        planned.stdout
    );
    assert_eq!(
        actions(&done),
        ["updated", "unchanged", "adopted", "created", "deleted"],
        "{done}"
    );
}

/// A system crontab's entry: its sixth field is the user.
const HOURLY: &str = "17 * * * * root cd / && run-parts --report /etc/cron.hourly\n";

#[tokio::test]
async fn a_system_crontab_import_reads_the_user_column_with_system_and_refuses_it_without() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let dir = tempdir();
    // Kept where system crontabs are (a cron.d directory): refused, naming the line and the flag.
    std::fs::create_dir(dir.path().join("cron.d")).unwrap();
    let file = crontab_file(
        &dir.path().join("cron.d"),
        "hourly",
        &format!("# the hourly jobs\n{HOURLY}"),
    );
    check_fails(
        url,
        &["routine", "import", "--crontab", &file],
        2,
        "hourly:2: \"root\" after the schedule is a user name",
    );
    check_fails(
        url,
        &["routine", "import", "--crontab", &file],
        2,
        "--system",
    );
    assert_eq!(db.count("routines").await, 0);

    // --system: the user is in the routine's name (the line's content), not in its message.
    let out = ok(url, &["routine", "import", "--crontab", "--system", &file]);
    let name = "hourly: 17 * * * * root cd / && run-parts --report /etc/cron.hourly";
    assert!(
        out.starts_with("created  ") && out.ends_with(&format!("{name}\n")),
        "{out}"
    );
    let show = ok(url, &["routine", "show", name]);
    assert!(
        show.contains("message     cd / && run-parts --report /etc/cron.hourly\n"),
        "{show}"
    );

    // Elsewhere, the same line imports as a per-user crontab's, with one line saying why the
    // message starts with a user name and what to do if the file is a system crontab.
    let daily = "25 6 * * * root test -x /usr/sbin/anacron || run-parts /etc/cron.daily\n";
    let file = crontab_file(dir.path(), "ops.crontab", &format!("{HOURLY}{daily}"));
    let out = cm(url, &["routine", "import", "--crontab", &file]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let warned: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(warned.len(), 1, "{}", out.stderr);
    assert!(
        warned[0].starts_with("ops.crontab:1: ") || warned[0].contains("/ops.crontab:1: "),
        "{}",
        out.stderr
    );
    assert!(warned[0].contains("--system"), "{}", out.stderr);
    let show = ok(
        url,
        &[
            "routine",
            "show",
            "ops.crontab: 17 * * * * root cd / && run-parts --report /etc/cron.hourly",
        ],
    );
    assert!(
        show.contains("message     root cd / && run-parts"),
        "{show}"
    );
}
