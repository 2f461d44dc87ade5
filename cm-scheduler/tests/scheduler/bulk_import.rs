//! A large import: every routine of a file of thousands of lines lands exactly once, and a bad
//! line anywhere (after thousands of good ones, in the middle of a chunk of the write) refuses
//! the whole file in one line that names it, with nothing written.

use crate::cli::{check_fails, create_args, ok};
use crate::support::TestDb;

/// Line `i` (from 0) of the file: a message routine with its own cron expression and zone.
fn line(i: usize) -> String {
    let zones = [
        "UTC",
        "Europe/Berlin",
        "America/New_York",
        "Asia/Tokyo",
        "Australia/Sydney",
    ];
    format!(
        r#"{{"name":"bulk-{i}","schedule":"{} {} {} * *","timezone":"{}","message":"m{i}"}}"#,
        i % 60,
        (i / 60) % 24,
        (i / 1440) % 28 + 1,
        zones[i % zones.len()]
    )
}

async fn counts(db: &TestDb) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM cm.routines), (SELECT count(DISTINCT name) FROM cm.routines),
                (SELECT count(*) FROM cm.routine_names),
                (SELECT count(*) FROM cm.routines WHERE next_run_at IS NOT NULL)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_large_import_lands_every_routine_once_or_refuses_a_bad_line_with_nothing_written() {
    let db = TestDb::new().await;
    let url = &db.url;
    let total = 12_345;
    let file = std::env::temp_dir().join(format!("{}-bulk.jsonl", db.name));
    let path = file.to_str().unwrap();

    // Line 7,777 (in the second chunk of the write) names a zone that does not exist.
    let mut lines: Vec<String> = (0..total).map(line).collect();
    lines[7_776] =
        r#"{"name":"bad","schedule":"0 3 * * *","timezone":"Mars/Olympus","message":"m"}"#.into();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    check_fails(url, &["routine", "import", path], 2, ":7777: ");
    assert_eq!(
        counts(&db).await,
        (0, 0, 0, 0),
        "a refused import writes nothing"
    );

    // A name a routine already has, on line 9,001, refuses the file with that line.
    ok(
        url,
        &create_args("bulk-9000", "@daily", &["--message", "m"]),
    );
    let lines: Vec<String> = (0..total).map(line).collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    check_fails(url, &["routine", "import", path], 2, ":9001: ");
    assert_eq!(counts(&db).await.0, 1, "a refused import writes nothing");
    ok(url, &["routine", "delete", "bulk-9000"]);

    // The good file: every routine once, each planned, and each printed once. Two calendars
    // are named first in the second chunk of the write (read then) and again in the third
    // (planned with them beside the second's write), beside routines without one.
    ok(url, &["calendar", "create", "ops", "--timezone", "UTC"]);
    ok(
        url,
        &["calendar", "create", "desk", "--timezone", "Europe/Berlin"],
    );
    let on_calendar = |i: usize| match i {
        6_000 | 12_000 => Some("ops"),
        6_001 | 12_344 => Some("desk"),
        _ => None,
    };
    let lines: Vec<String> = (0..total)
        .map(|i| match on_calendar(i) {
            Some(calendar) => line(i).replace(
                r#""message""#,
                &format!(r#""calendar":"{calendar}","message""#),
            ),
            None => line(i),
        })
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let printed = ok(url, &["routine", "import", path]);
    assert_eq!(printed.lines().count(), total);
    let n = i64::try_from(total).unwrap();
    assert_eq!(counts(&db).await, (n, n, n, n));
    let stored: Vec<(String, String, String)> =
        sqlx::query_as("SELECT name, schedule, timezone FROM cm.routines ORDER BY created_at, id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    for (i, (name, schedule, zone)) in stored.iter().enumerate() {
        let expected: serde_json::Value = serde_json::from_str(&line(i)).unwrap();
        assert_eq!(
            name,
            expected["name"].as_str().unwrap(),
            "routine {i} in file order"
        );
        assert_eq!(schedule, expected["schedule"].as_str().unwrap());
        assert_eq!(zone, expected["timezone"].as_str().unwrap());
    }
    let calendars: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, calendar FROM cm.routines WHERE calendar IS NOT NULL ORDER BY created_at, id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected: Vec<(String, String)> = (0..total)
        .filter_map(|i| on_calendar(i).map(|c| (format!("bulk-{i}"), c.to_owned())))
        .collect();
    assert_eq!(calendars, expected);
    std::fs::remove_file(&file).unwrap();
}
