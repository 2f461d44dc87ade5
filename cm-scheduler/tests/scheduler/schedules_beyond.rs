//! Schedules beyond one cron line, through the binary: a window, an interval with exclusions
//! and a one-shot fire exactly what `schedule next` lists for the same flags, nothing outside
//! the window and nothing excluded; a routine past its end is `finished`, and editing its end
//! revives it; bad flags write nothing.

use std::collections::BTreeSet;

use chrono::{DateTime, SecondsFormat, Timelike, Utc};
use uuid::Uuid;

use crate::cli::{check_fails, create_args, ok};
use crate::support::{PATIENCE, TestDb, run_quietly, wait_until};

fn rfc(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// What `schedule next` lists after `after` for `flags`.
fn listed(url: &str, after: DateTime<Utc>, flags: &[&str]) -> BTreeSet<DateTime<Utc>> {
    let after = rfc(after);
    let mut args = vec!["schedule", "next", "--after", &after, "--count", "100"];
    args.extend(flags);
    ok(url, &args).lines().map(|l| l.parse().unwrap()).collect()
}

async fn fired(db: &TestDb, routine: &str) -> BTreeSet<DateTime<Utc>> {
    sqlx::query_scalar::<_, DateTime<Utc>>(
        "SELECT f.scheduled_at FROM cm.routine_fires f JOIN cm.routines r ON r.id = f.routine_id
         WHERE r.name = $1 AND f.status = 'fired'",
    )
    .bind(routine)
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

/// The first occurrence `routine` owes, as its creation stored it.
async fn first_owed(db: &TestDb, routine: &str) -> Option<DateTime<Utc>> {
    sqlx::query_scalar("SELECT next_run_at FROM cm.routines WHERE name = $1")
        .bind(routine)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Waits until no routine owes anything more (each planned, with no next run) and no fire is
/// still claimed: from then on nothing can fire, so the ledger is final.
async fn await_nothing_owed(db: &TestDb) {
    await_nothing_owed_but(db, "").await;
}

// The instants are the test's clock plus a margin for creating the routines, and what each one
// owes is what `schedule next` lists from the first occurrence its creation stored: `odd` has no
// start, so it owes from its creation on, which a loaded machine puts seconds after `now`.
// Listing it from `now` expected an occurrence the routine never owed. The scheduler starts
// right after the routines exist (the refusals and the import come after), and every owed
// occurrence, however late the scheduler, fires: the misfire grace is a minute.
#[tokio::test]
async fn windows_intervals_exclusions_and_one_shots_fire_what_schedule_next_lists() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let now = Utc::now().with_nanosecond(0).unwrap();
    // The window opens 20 s on: creating four routines, each a process of its own, took more
    // than 5 s on a machine at load 10, and a window created after its start owes less.
    let (start, end, at) = (
        now + chrono::Duration::seconds(20),
        now + chrono::Duration::seconds(24),
        now + chrono::Duration::seconds(21),
    );
    let (start_s, end_s, at_s) = (rfc(start), rfc(end), rfc(at));
    let window = ["--every", "1s", "--start", &start_s, "--end", &end_s];
    let odd = [
        "--every",
        "1s",
        "--except",
        "*/2 * * * * *",
        "--end",
        &end_s,
    ];
    let once = ["--at", &at_s];
    for (name, flags) in [
        ("window", &window[..]),
        ("odd", &odd[..]),
        ("once", &once[..]),
    ] {
        let mut args = vec!["routine", "create", "--name", name, "--message", "hi"];
        args.extend(flags);
        Uuid::parse_str(ok(url, &args).trim()).unwrap();
    }
    // Through SQL, planned by the scheduler: its clauses hold as well.
    let sql_schedule = format!("@every 1s until {end_s}");
    sqlx::query("SELECT cm.create_routine('sql', $1, 'UTC', 'hi')")
        .bind(&sql_schedule)
        .execute(&db.pool)
        .await
        .unwrap();
    let odd_from = first_owed(&db, "odd")
        .await
        .expect("odd was created after its end: the machine took 24 s to create three routines");
    assert_eq!(
        first_owed(&db, "window").await,
        Some(start),
        "window was created after its start"
    );
    assert_eq!(first_owed(&db, "once").await, Some(at));

    let mut scheduler = run_quietly(url, &["--tick-interval", "100ms"]);
    let expected_window = listed(url, now, &window);
    let listed_odd = listed(url, now, &odd);
    let expected_odd = listed(url, odd_from - chrono::Duration::seconds(1), &odd);
    let expected_sql = listed(url, now, &[sql_schedule.as_str()]);
    assert_eq!(expected_window.len(), 5, "{expected_window:?}");
    assert!(expected_window.iter().all(|t| *t >= start && *t <= end));
    assert!(listed_odd.iter().all(|t| t.second() % 2 == 1 && *t <= end));
    // What odd owes is what is listed from `now`, from its first owed occurrence on.
    assert_eq!(expected_odd.first(), Some(&odd_from));
    assert_eq!(
        expected_odd,
        listed_odd
            .iter()
            .filter(|t| **t >= odd_from)
            .copied()
            .collect(),
    );
    assert_eq!(listed(url, now, &once), BTreeSet::from([at]));
    await_nothing_owed(&db).await;
    scheduler.kill().unwrap();
    let _ = scheduler.wait();

    assert_eq!(fired(&db, "window").await, expected_window);
    assert_eq!(fired(&db, "odd").await, expected_odd);
    assert_eq!(fired(&db, "once").await, BTreeSet::from([at]));
    // Planned when the scheduler first saw it, so from then on: all it lists after that.
    let from_sql = fired(&db, "sql").await;
    let sql_from = *from_sql
        .first()
        .expect("the routine written through SQL never fired");
    assert_eq!(
        from_sql,
        expected_sql
            .iter()
            .filter(|t| **t >= sql_from)
            .copied()
            .collect(),
        "every occurrence listed from its first fire on"
    );
    assert!(from_sql.iter().all(|t| *t <= end));
    let all: i64 = db.count("routine_fires").await;
    assert_eq!(
        all as usize,
        expected_window.len() + expected_odd.len() + 1 + from_sql.len(),
        "a fire outside what was listed"
    );

    // Past its end a routine is finished; an edited end revives it, keeping the rest.
    for name in ["window", "once"] {
        let shown = ok(url, &["routine", "show", name]);
        assert!(shown.contains("state       finished"), "{shown}");
    }
    let listing = ok(url, &["routine", "list"]);
    // window, odd, once and sql, each in its next-run and state columns.
    assert_eq!(listing.matches("finished").count(), 8, "{listing}");
    let later = rfc(Utc::now() + chrono::Duration::hours(1));
    ok(url, &["routine", "update", "window", "--end", &later]);
    let shown = ok(url, &["routine", "show", "window"]);
    assert!(shown.contains("state       active"), "{shown}");
    assert!(
        shown.contains(&format!(
            "schedule    @every 1s from {start_s} until {later}"
        )),
        "{shown}"
    );
    assert!(shown.contains("NEXT RUNS"), "{shown}");

    // Bad flags are refused with one line, and write nothing.
    let past = rfc(now - chrono::Duration::hours(1));
    for (args, fragment) in [
        (vec!["--at", past.as_str()], "would never fire"),
        (
            vec!["--every", "90m", "--offset", "90m"],
            "offset must be shorter",
        ),
        (vec!["--start", start_s.as_str()], "a schedule is needed"),
        (
            vec![
                "--every",
                "1s",
                "--start",
                end_s.as_str(),
                "--end",
                start_s.as_str(),
            ],
            "ends",
        ),
        (
            vec!["--schedule", "* * * * *", "--except", "* * * * *"],
            "never fires",
        ),
    ] {
        let mut full = vec!["routine", "create", "--name", "bad", "--message", "x"];
        full.extend(args);
        check_fails(url, &full, 2, fragment);
    }
    assert_eq!(db.count("routines").await, 4);

    // A JSON Lines import takes the same fields; a line with two rules is refused, whole.
    let dir = std::env::temp_dir().join(format!("cm-schedules-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = r#"{"name": "j1", "every": "1h", "offset": "15m", "except": ["0 0 25 12 *"], "end": "2027-01-01", "message": "x"}"#;
    let two_rules =
        r#"{"name": "j2", "schedule": "* * * * *", "at": "2030-01-01", "message": "x"}"#;
    let file = dir.join("bad.jsonl");
    std::fs::write(&file, format!("{good}\n{two_rules}\n")).unwrap();
    check_fails(
        url,
        &["routine", "import", file.to_str().unwrap()],
        2,
        "one of schedule, every, at and rrule",
    );
    assert_eq!(db.count("routines").await, 4);
    let file = dir.join("good.jsonl");
    std::fs::write(&file, format!("{good}\n")).unwrap();
    ok(url, &["routine", "import", file.to_str().unwrap()]);
    let shown = ok(url, &["routine", "show", "j1"]);
    assert!(
        shown.contains("schedule    @every 1h offset 15m except 0 0 25 12 * until 2027-01-01"),
        "{shown}"
    );
    assert!(
        shown.contains("ends        2027-01-01T00:00:00Z"),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// RFC 5545 rules through the binary, SQL and an import: each routine fires exactly what
/// `schedule next` lists for its schedule, and a rule that counts from its start without one
/// starts when it is created.
#[tokio::test]
async fn rrule_routines_fire_what_schedule_next_lists() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let now = Utc::now().with_nanosecond(0).unwrap();
    let (start, end) = (
        now + chrono::Duration::seconds(20),
        now + chrono::Duration::seconds(27),
    );
    let (start_s, end_s) = (rfc(start), rfc(end));
    let every_other = [
        "--rrule",
        "FREQ=SECONDLY;INTERVAL=2",
        "--start",
        &start_s,
        "--end",
        &end_s,
    ];
    let mut args = vec!["routine", "create", "--name", "cli", "--message", "hi"];
    args.extend(every_other);
    Uuid::parse_str(ok(url, &args).trim()).unwrap();
    let sql_schedule = format!("@rrule FREQ=SECONDLY;INTERVAL=3 from {start_s} until {end_s}");
    sqlx::query("SELECT cm.create_routine('sql', $1, 'UTC', 'hi')")
        .bind(&sql_schedule)
        .execute(&db.pool)
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("cm-rrule-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.jsonl");
    // Two seconds in three, whatever second the window opens at.
    let seconds: Vec<String> = (0..60)
        .filter(|s| s % 3 != 0)
        .map(|s| s.to_string())
        .collect();
    let imported_rule = format!("FREQ=MINUTELY;BYSECOND={}", seconds.join(","));
    let line = format!(
        r#"{{"name": "imported", "rrule": "{imported_rule}", "start": "{start_s}", "end": "{end_s}", "message": "x"}}"#
    );
    std::fs::write(&file, format!("{line}\n")).unwrap();
    ok(url, &["routine", "import", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();

    // Without a start, a rule that counts from one starts at its creation.
    ok(
        url,
        &[
            "routine",
            "create",
            "--name",
            "fortnightly",
            "--message",
            "x",
            "--rrule",
            "FREQ=WEEKLY;INTERVAL=2;BYDAY=MO",
            "--paused",
        ],
    );
    let shown = ok(url, &["routine", "show", "fortnightly"]);
    let stored = shown
        .lines()
        .find_map(|l| l.strip_prefix("schedule    @rrule FREQ=WEEKLY;INTERVAL=2;BYDAY=MO from "))
        .unwrap_or_else(|| panic!("no start was written: {shown}"));
    let created: DateTime<Utc> = stored.parse().unwrap();
    assert!(created >= now && created <= Utc::now(), "{stored}");
    // A rule cm cannot read is refused in one line and writes nothing.
    check_fails(
        url,
        &[
            "routine",
            "create",
            "--name",
            "bad",
            "--message",
            "x",
            "--rrule",
            "FREQ=DAILY;DTSTART=20270101T000000",
        ],
        2,
        "DTSTART is not part of a rule here",
    );
    assert_eq!(db.count("routines").await, 4);

    let mut scheduler = run_quietly(url, &["--tick-interval", "100ms"]);
    let expected_cli = listed(url, now, &every_other);
    let expected_sql = listed(url, now, &[sql_schedule.as_str()]);
    let expected_imported = listed(
        url,
        now,
        &[
            "--rrule",
            &imported_rule,
            "--start",
            &start_s,
            "--end",
            &end_s,
        ],
    );
    assert_eq!(expected_cli.len(), 4, "{expected_cli:?}");
    assert_eq!(expected_sql.len(), 3, "{expected_sql:?}");
    assert!(expected_imported.len() >= 4, "{expected_imported:?}");
    await_nothing_owed_but(&db, "fortnightly").await;
    scheduler.kill().unwrap();
    let _ = scheduler.wait();
    assert_eq!(fired(&db, "cli").await, expected_cli);
    assert_eq!(fired(&db, "sql").await, expected_sql);
    assert_eq!(fired(&db, "imported").await, expected_imported);
    let all: i64 = db.count("routine_fires").await;
    assert_eq!(
        all as usize,
        expected_cli.len() + expected_sql.len() + expected_imported.len()
    );
}

/// [`await_nothing_owed`], leaving out the routine named `paused` (it owes, but is paused).
async fn await_nothing_owed_but(db: &TestDb, paused: &str) {
    wait_until(
        "every other routine to owe nothing and every fire to be settled",
        PATIENCE,
        async || {
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT (SELECT count(*) FROM cm.routines
                          WHERE name <> $1 AND (next_run_at IS NOT NULL OR NOT planned)),
                        (SELECT count(*) FROM cm.routine_fires WHERE status = 'claimed')",
            )
            .bind(paused)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
        |(owing, claimed)| *owing == 0 && *claimed == 0,
    )
    .await;
}

/// A scheduler of the test's, killable.
fn start_scheduler(url: &str) -> std::process::Child {
    let settings = ["--tick-interval", "100ms", "--lease", "3s"];
    run_quietly(
        url,
        &[&settings[..], &["--dispatch-timeout", "1s"]].concat(),
    )
}

fn sigkill(child: &mut std::process::Child) {
    child.kill().unwrap();
    let _ = child.wait();
}

/// `--limit-runs 5` under two schedulers, each SIGKILLed and restarted while the routine fires
/// every second: exactly five occurrences are in the ledger, all fired, and the routine is
/// finished with no runs left. `routine update --limit-runs 2` revives it for two more.
#[tokio::test]
async fn a_run_limit_fires_exactly_that_many_under_two_schedulers_and_kills() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    ok(
        url,
        &create_args(
            "five",
            "* * * * * *",
            &[
                "--misfire",
                "catch-up",
                "--limit-runs",
                "5",
                "--message",
                "hi",
            ],
        ),
    );
    check_fails(
        url,
        &[
            "routine",
            "create",
            "--name",
            "zero",
            "--every",
            "1s",
            "--limit-runs",
            "0",
            "--message",
            "x",
        ],
        2,
        "--limit-runs",
    );
    let rows = || async {
        sqlx::query_as::<_, (String, i64)>(
            "SELECT status, count(*) FROM cm.routine_fires GROUP BY status ORDER BY status",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    // How many occurrences the ledger holds, and whether the routine still owes one: once it
    // owes none and none is claimed (a killed claim is retried after its 3 s lease), nothing
    // more can fire, so a sixth would show.
    let ledger = || async {
        sqlx::query_as::<_, (i64, i64, bool)>(
            "SELECT (SELECT count(*) FROM cm.routine_fires),
                    (SELECT count(*) FROM cm.routine_fires WHERE status = 'claimed'),
                    (SELECT next_run_at IS NOT NULL FROM cm.routines WHERE name = 'five')",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let settled = |(_, claimed, owing): &(i64, i64, bool)| *claimed == 0 && !*owing;
    let mut a = start_scheduler(url);
    let mut b = start_scheduler(url);
    // Each kill lands while the routine fires: after its first occurrence, then its second.
    wait_until("a first occurrence", PATIENCE, ledger, |l| l.0 >= 1).await;
    sigkill(&mut a);
    let mut a = start_scheduler(url);
    wait_until("a second occurrence", PATIENCE, ledger, |l| l.0 >= 2).await;
    sigkill(&mut b);
    let mut b = start_scheduler(url);
    wait_until("the five runs spent", PATIENCE, ledger, settled).await;
    assert_eq!(rows().await, [("fired".to_string(), 5)]);
    let shown = ok(url, &["routine", "show", "five"]);
    assert!(shown.contains("state       finished"), "{shown}");
    assert!(shown.contains("runs left   0"), "{shown}");

    ok(url, &["routine", "update", "five", "--limit-runs", "2"]);
    // The schedulers keep running, so by the time it is shown an every-second routine may
    // have spent some of its two runs already: active with 2 or 1 left, or finished with 0.
    let shown = ok(url, &["routine", "show", "five"]);
    let left = shown
        .lines()
        .find_map(|l| l.strip_prefix("runs left"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    assert!(
        (matches!(left, Some(1 | 2)) && shown.contains("state       active"))
            || (left == Some(0) && shown.contains("state       finished")),
        "{shown}"
    );
    wait_until("the two more runs spent", PATIENCE, ledger, |l| {
        l.0 == 7 && settled(l)
    })
    .await;
    sigkill(&mut a);
    sigkill(&mut b);
    assert_eq!(rows().await, [("fired".to_string(), 7)]);
    let shown = ok(url, &["routine", "show", "five"]);
    assert!(shown.contains("state       finished"), "{shown}");
}

/// Jitter through the binary: 3,000 one-shots at one instant with `jitter 20s`, imported from
/// JSON Lines, come due spread over the twenty seconds after it (the busiest second within
/// 1.5 times the mean, by when each was claimed) and all fire once; each fire keeps the
/// occurrence as its key and records its planned instant, the one `schedule next --routine-id`
/// and `routine show` list.
#[tokio::test]
async fn jittered_one_shots_come_due_spread_over_their_jitter_and_all_fire() {
    const N: usize = 3_000;
    const JITTER: i64 = 20;
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let at = Utc::now().with_nanosecond(0).unwrap() + chrono::Duration::seconds(12);
    let at_s = rfc(at);
    let dir = std::env::temp_dir().join(format!("cm-jitter-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("many.jsonl");
    let lines: String = (0..N)
        .map(|i| {
            format!(
                "{{\"name\": \"j{i}\", \"at\": \"{at_s}\", \"jitter\": \"{JITTER}s\", \"message\": \"x\"}}\n"
            )
        })
        .collect();
    std::fs::write(&file, lines).unwrap();
    ok(url, &["routine", "import", file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    // A jitter longer than a one-shot's day is refused, and writes nothing.
    check_fails(
        url,
        &[
            "routine",
            "create",
            "--name",
            "long",
            "--message",
            "x",
            "--at",
            &at_s,
            "--jitter",
            "2d",
        ],
        2,
        "at most a day",
    );
    assert_eq!(db.count("routines").await as usize, N);

    // What the CLI says one routine will do, before it runs.
    let id = ok(url, &["routine", "show", "j7"])
        .lines()
        .find_map(|l| l.strip_prefix("id").map(|v| v.trim().to_owned()))
        .unwrap();
    let next = ok(
        url,
        &[
            "schedule",
            "next",
            "--at",
            &at_s,
            "--jitter",
            "20s",
            "--routine-id",
            &id,
            "--after",
            &rfc(at - chrono::Duration::seconds(1)),
        ],
    );
    let (listed_planned, listed_occurrence) = next.trim().split_once("  occurrence ").unwrap();
    let listed_planned: DateTime<Utc> = listed_planned.parse().unwrap();
    assert_eq!(listed_occurrence, at_s);
    let shown = ok(url, &["routine", "show", "j7"]);
    assert!(
        shown.contains("jitter      up to 20s after each occurrence"),
        "{shown}"
    );
    assert!(shown.contains("OCCURRENCE (UTC)"), "{shown}");

    let mut scheduler = run_quietly(url, &["--tick-interval", "200ms"]);
    // They come due over the jitter after `at`; then the patience of any wait.
    let patience = (at + chrono::Duration::seconds(JITTER) - Utc::now())
        .to_std()
        .unwrap_or_default()
        + PATIENCE;
    wait_until(
        "every one-shot to fire",
        patience,
        async || db.fired().await,
        |n| *n as usize == N,
    )
    .await;
    scheduler.kill().unwrap();
    let _ = scheduler.wait();

    /// A fire as the check reads it: routine, occurrence, planned instant, claim, status.
    type Fire = (
        Uuid,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        DateTime<Utc>,
        String,
    );
    let rows: Vec<Fire> = sqlx::query_as(
        "SELECT routine_id, scheduled_at, planned_at, claimed_at, status FROM cm.routine_fires",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), N, "every one-shot fired once");
    // A scheduler that started late on a loaded machine claims what came due before its first
    // tick together: the spread is judged from the second after its first claim on.
    let first_claim = rows.iter().map(|r| r.3).min().expect("a fire");
    let from = ((first_claim - at).num_milliseconds() / 1000 + 1).clamp(0, JITTER - 1);
    let mut per_second = vec![0usize; JITTER as usize];
    for (routine, scheduled_at, planned_at, claimed_at, status) in &rows {
        assert_eq!(status, "fired");
        assert_eq!(*scheduled_at, at, "the occurrence is the key");
        let planned = planned_at.expect("a jittered fire records its planned instant");
        let offset = planned - at;
        assert!(
            offset >= chrono::Duration::zero() && offset < chrono::Duration::seconds(JITTER),
            "{offset}"
        );
        assert!(*claimed_at >= planned, "claimed before it was due");
        if routine.to_string() == id {
            assert_eq!(
                planned.timestamp_millis(),
                listed_planned.timestamp_millis()
            );
        }
        let second = ((*claimed_at - at).num_milliseconds() / 1000).clamp(0, JITTER - 1);
        per_second[second as usize] += 1;
    }
    let judged = &per_second[from as usize..];
    let mean = judged.iter().sum::<usize>() as f64 / judged.len() as f64;
    let busiest = *judged.iter().max().unwrap() as f64;
    assert!(
        busiest <= 1.5 * mean,
        "claims per second {per_second:?} (judged from second {from}): the busiest {busiest} \
         against a mean of {mean}"
    );
}
