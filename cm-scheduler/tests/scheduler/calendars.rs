//! Holiday calendars through the binary: `schedule next` on a calendar under each policy, the
//! `calendar` commands and their refusals (one line, exit 2, nothing written), and a calendar
//! edited while two schedulers run its routines: they are planned again, nothing lost or
//! doubled.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

use crate::cli::{check_fails, create_args, ok};
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, wait_until};

fn rfc(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The planned instants `schedule next` prints (each line's first field).
fn planned(url: &str, policy: &str) -> Vec<String> {
    let out = ok(
        url,
        &[
            "schedule",
            "next",
            "0 9 1 * *",
            "--timezone",
            "Europe/Berlin",
            "--after",
            "2026-12-15T00:00:00Z",
            "--count",
            "3",
            "--calendar",
            "de",
            "--on-holiday",
            policy,
        ],
    );
    out.lines()
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn schedule_next_plans_a_monthly_routine_around_new_year_under_each_policy() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    assert_eq!(
        ok(
            url,
            &[
                "calendar",
                "create",
                "de",
                "--timezone",
                "Europe/Berlin",
                "--date",
                "2027-01-01"
            ]
        )
        .trim(),
        "de"
    );
    // 1 January 2027 is a holiday (a Friday); 2 and 3 January a weekend.
    assert_eq!(
        planned(url, "skip"),
        [
            "2027-02-01T08:00:00Z",
            "2027-03-01T08:00:00Z",
            "2027-04-01T07:00:00Z"
        ]
    );
    assert_eq!(
        planned(url, "next"),
        [
            "2027-01-04T08:00:00Z",
            "2027-02-01T08:00:00Z",
            "2027-03-01T08:00:00Z"
        ]
    );
    assert_eq!(
        planned(url, "previous"),
        [
            "2026-12-31T08:00:00Z",
            "2027-02-01T08:00:00Z",
            "2027-03-01T08:00:00Z"
        ]
    );
    // Without the database, the same calendar given inline.
    let inline = ok(
        url,
        &[
            "schedule",
            "next",
            "0 9 1 * *",
            "--timezone",
            "Europe/Berlin",
            "--after",
            "2026-12-15T00:00:00Z",
            "--count",
            "1",
            "--holiday",
            "2027-01-01",
            "--on-holiday",
            "next",
        ],
    );
    assert_eq!(
        inline.trim(),
        "2027-01-04T08:00:00Z  occurrence 2027-01-01T08:00:00Z"
    );
}

#[tokio::test]
async fn calendar_commands_and_their_refusals() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let dates = std::env::temp_dir().join(format!("{}-dates.txt", db.name));
    std::fs::write(
        &dates,
        "# holidays\n2027-01-01 New Year\n\n2027-12-25 Christmas\n",
    )
    .unwrap();
    let file = dates.to_str().unwrap();
    ok(
        url,
        &[
            "calendar",
            "create",
            "ops",
            "--timezone",
            "UTC",
            "--file",
            file,
            "--days-off",
            "sun",
        ],
    );
    let shown = ok(url, &["calendar", "show", "ops"]);
    assert!(shown.contains("days off    sun"), "{shown}");
    assert!(
        shown.contains("2027-01-01") && shown.contains("2027-12-25"),
        "{shown}"
    );
    let listed = ok(url, &["calendar", "list", "--json"]);
    let line: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(
        line["dates"],
        serde_json::json!(["2027-01-01", "2027-12-25"])
    );

    // Bad input: one line on stderr, exit 2, nothing written.
    check_fails(
        url,
        &[
            "calendar",
            "create",
            "x",
            "--timezone",
            "UTC",
            "--date",
            "2027-02-30",
        ],
        2,
        "YYYY-MM-DD",
    );
    check_fails(
        url,
        &["calendar", "create", "x", "--timezone", "Mars/Base"],
        2,
        "unknown time zone",
    );
    check_fails(
        url,
        &[
            "calendar",
            "create",
            "x",
            "--timezone",
            "UTC",
            "--days-off",
            "sat,fun",
        ],
        2,
        "invalid day off",
    );
    check_fails(
        url,
        &["calendar", "create", "ops", "--timezone", "UTC"],
        2,
        "already exists",
    );
    check_fails(
        url,
        &["calendar", "add-dates", "nope", "--date", "2027-05-01"],
        2,
        "no calendar",
    );
    check_fails(url, &["calendar", "add-dates", "ops"], 2, "give the dates");
    check_fails(
        url,
        &create_args("r", "0 9 * * *", &["--message", "m", "--calendar", "nope"]),
        2,
        "no calendar",
    );
    check_fails(
        url,
        &create_args(
            "r",
            "0 9 * * *",
            &["--message", "m", "--on-holiday", "next"],
        ),
        2,
        "--calendar",
    );
    check_fails(
        url,
        &create_args(
            "r",
            "*/5 * * * *",
            &[
                "--message",
                "m",
                "--calendar",
                "ops",
                "--on-holiday",
                "next",
            ],
        ),
        2,
        "use skip",
    );
    let names = |url| ok(url, &["calendar", "list"]).lines().count();
    assert_eq!(names(url), 2, "a header and ops");
    assert_eq!(ok(url, &["routine", "list", "--json"]).trim(), "");

    // From JSON Lines: the calendar and its policy as fields; an unknown calendar refuses the
    // whole file.
    let jsonl = std::env::temp_dir().join(format!("{}-routines.jsonl", db.name));
    let line = r#"{"name":"imported","schedule":"0 9 * * *","message":"m","calendar":"ops","on_holiday":"next"}"#;
    let bad = r#"{"name":"other","schedule":"0 9 * * *","message":"m","calendar":"nope"}"#;
    std::fs::write(&jsonl, format!("{line}\n{bad}\n")).unwrap();
    let jsonl_path = jsonl.to_str().unwrap();
    check_fails(url, &["routine", "import", jsonl_path], 2, "no calendar");
    assert_eq!(ok(url, &["routine", "list", "--json"]).trim(), "");
    std::fs::write(&jsonl, format!("{line}\n")).unwrap();
    ok(url, &["routine", "import", jsonl_path]);
    let imported = ok(url, &["routine", "show", "imported"]);
    assert!(
        imported.contains("calendar    ops (on holiday: next)"),
        "{imported}"
    );
    ok(url, &["routine", "delete", "imported"]);
    let _ = std::fs::remove_file(jsonl);
    ok(
        url,
        &create_args(
            "r",
            "0 9 * * *",
            &[
                "--message",
                "m",
                "--calendar",
                "ops",
                "--on-holiday",
                "previous",
            ],
        ),
    );
    let show = ok(url, &["routine", "show", "r"]);
    assert!(
        show.contains("calendar    ops (on holiday: previous)"),
        "{show}"
    );
    // The schedule in words names the calendar and what a day off does.
    let reads = show
        .lines()
        .find_map(|l| l.strip_prefix("reads       "))
        .unwrap_or_else(|| panic!("no reads line: {show}"));
    assert!(
        reads.starts_with("09:00 every day, ")
            && reads.ends_with(", moved to the previous business day of ops"),
        "{show}"
    );
    let listed = ok(url, &["routine", "list", "--json"]);
    assert!(
        listed.contains(&format!("\"schedule_words\":\"{reads}\"")),
        "{listed}"
    );
    let json = ok(url, &["routine", "show", "r", "--json"]);
    assert!(json.contains("\"on_holiday\":\"previous\""), "{json}");
    check_fails(
        url,
        &["calendar", "delete", "ops"],
        2,
        "in use by routines (r)",
    );
    ok(url, &["routine", "update", "r", "--calendar", "none"]);
    assert_eq!(
        ok(url, &["calendar", "delete", "ops"]).trim(),
        "deleted calendar ops"
    );
    assert_eq!(names(url), 1);
    let _ = std::fs::remove_file(dates);
}

/// What the ledger holds of one routine: each occurrence's planned instant and status, and
/// how many outbox messages each occurrence's dispatches wrote.
async fn ledger_of(db: &TestDb, id: Uuid) -> BTreeMap<DateTime<Utc>, (DateTime<Utc>, String, i64)> {
    sqlx::query_as::<_, (DateTime<Utc>, DateTime<Utc>, String, i64)>(
        "SELECT f.scheduled_at, coalesce(f.planned_at, f.scheduled_at), f.status,
                (SELECT count(*) FROM cm.outbox_messages m
                 WHERE m.routine_id = f.routine_id AND m.scheduled_at = f.scheduled_at)
         FROM cm.routine_fires f WHERE f.routine_id = $1",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(at, planned, status, messages)| (at, (planned, status, messages)))
    .collect()
}

fn created(out: String) -> Uuid {
    out.trim().parse().expect("routine create prints a UUID")
}

/// Two schedulers run routines on a calendar while it is edited: today is made a day off,
/// then a working day again. An every-second `skip` routine owes nothing between the edits and
/// everything before and after; a one-shot under `next` moves to tomorrow and back, and fires
/// once, at its own instant; one under `previous` moves to yesterday and fires at once, keyed
/// by its own instant. Nothing is fired twice (each occurrence's message written once) and
/// nothing settles failed.
#[tokio::test]
async fn a_calendar_edited_while_two_schedulers_run_re_plans_its_routines() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    // Far enough from midnight (UTC) that "today" is one day for the whole test.
    let start = Utc::now();
    if start.time() > chrono::NaiveTime::from_hms_opt(23, 58, 0).unwrap() {
        tokio::time::sleep(Duration::from_secs(130)).await;
    }
    ok(
        url,
        &[
            "calendar",
            "create",
            "ops",
            "--timezone",
            "UTC",
            "--days-off",
            "none",
        ],
    );
    let every = created(ok(
        url,
        &create_args(
            "every second",
            "* * * * * *",
            &[
                "--message",
                "s",
                "--calendar",
                "ops",
                "--misfire",
                "catch-up",
            ],
        ),
    ));
    let now = chrono::Timelike::with_nanosecond(&Utc::now(), 0).unwrap();
    let later = now + chrono::Duration::seconds(14);
    let once_next = created(ok(
        url,
        &create_args(
            "next",
            &format!("@at {}", rfc(later)),
            &[
                "--message",
                "n",
                "--calendar",
                "ops",
                "--on-holiday",
                "next",
            ],
        ),
    ));
    let early = now + chrono::Duration::seconds(40);
    let once_previous = created(ok(
        url,
        &create_args(
            "previous",
            &format!("@at {}", rfc(early)),
            &[
                "--message",
                "p",
                "--calendar",
                "ops",
                "--on-holiday",
                "previous",
            ],
        ),
    ));
    let today = Utc::now().date_naive().to_string();

    let mut a = SchedulerProcess::start_with(&db, "a", &[], &[]);
    let mut b = SchedulerProcess::start_with(&db, "b", &[], &[]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before_add = Utc::now();
    ok(url, &["calendar", "add-dates", "ops", "--date", &today]);
    let after_add = Utc::now();
    // `previous`: its occurrence is owed yesterday, so at once.
    wait_until(
        "the moved-back one-shot to fire",
        Duration::from_secs(20),
        async || ledger_of(&db, once_previous).await,
        |l| l.values().any(|(_, status, _)| status == "fired"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before_remove = Utc::now();
    ok(url, &["calendar", "remove-dates", "ops", "--date", &today]);
    let after_remove = Utc::now();
    assert!(
        after_remove < later,
        "the test ran too slowly to check the one-shot under next"
    );
    wait_until(
        "the one-shot under next to fire",
        Duration::from_secs(30),
        async || ledger_of(&db, once_next).await,
        |l| l.values().any(|(_, status, _)| status == "fired"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stop = Utc::now();
    a.shut_down_gracefully().await;
    b.shut_down_gracefully().await;

    let secs = |from: DateTime<Utc>, to: DateTime<Utc>| {
        let from = from.timestamp() + 1;
        (from..to.timestamp()).map(|s| DateTime::from_timestamp(s, 0).unwrap())
    };
    let every_ledger = ledger_of(&db, every).await;
    let fired: BTreeSet<DateTime<Utc>> = every_ledger.keys().copied().collect();
    let first = *fired.first().expect("the every-second routine fired");
    // Nothing lost: every second from its first fire until the day off began (an occurrence
    // due when the edit commits stays owed), and from the working day's return until the
    // schedulers stopped (less the last, maybe unclaimed).
    let missing: Vec<_> = secs(first - chrono::Duration::seconds(1), before_add)
        .chain(secs(
            after_remove + chrono::Duration::seconds(1),
            stop - chrono::Duration::seconds(2),
        ))
        .filter(|at| !fired.contains(at))
        .collect();
    assert!(missing.is_empty(), "occurrences lost: {missing:?}");
    // Nothing owed while today was a day off.
    let during: Vec<_> = secs(after_add + chrono::Duration::seconds(1), before_remove)
        .filter(|at| fired.contains(at))
        .collect();
    assert!(during.is_empty(), "fired on a day off: {during:?}");
    let next_ledger = ledger_of(&db, once_next).await;
    assert_eq!(next_ledger.len(), 1, "{next_ledger:?}");
    assert_eq!(
        next_ledger.get(&later).map(|(p, s, _)| (*p, s.as_str())),
        Some((later, "fired"))
    );
    let previous_ledger = ledger_of(&db, once_previous).await;
    assert_eq!(
        previous_ledger
            .get(&early)
            .map(|(p, s, _)| (*p, s.as_str())),
        Some((early - chrono::Duration::days(1), "fired")),
        "{previous_ledger:?}"
    );
    assert_eq!(previous_ledger.len(), 1);
    // Nothing doubled, nothing failed.
    for ledger in [&every_ledger, &next_ledger, &previous_ledger] {
        for (at, (_, status, messages)) in ledger {
            assert_eq!((status.as_str(), *messages), ("fired", 1), "{at}");
        }
    }
}
