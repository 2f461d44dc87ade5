//! The command line at scale and at its edges: `fires` pages through a cursor, and a backfill
//! reaching past the ledger's retention is refused.

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use uuid::Uuid;

use crate::cli::{check_fails, create_args, created_id, ok};
use crate::support::TestDb;

/// Creates an hourly message routine and returns its id.
fn hourly(url: &str) -> String {
    created_id(&ok(
        url,
        &create_args("hourly", "0 * * * *", &["--message", "hi"]),
    ))
    .to_string()
}

/// The database's clock.
async fn db_now(db: &TestDb) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[tokio::test]
async fn a_backfill_reaching_past_the_retention_exits_2_and_writes_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id = hourly(url);
    let now = db_now(&db).await;
    let ago = |hours: i64| rfc3339(now - TimeDelta::hours(hours));
    let backfill = |from: String, extra: &[&str]| {
        let mut args: Vec<String> = ["routine", "backfill", &id, "--from", &from, "--to", &ago(1)]
            .map(String::from)
            .to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    for (args, fragment) in [
        // The default retention is run's: 30 days.
        (backfill(ago(31 * 24), &[]), "retention"),
        (backfill(ago(30 * 24), &[]), "retention"),
        (
            backfill(ago(3 * 24), &["--retention", "2days"]),
            "retention",
        ),
        (backfill(ago(3), &["--retention", "1h"]), "at least a day"),
        (backfill(ago(3), &["--retention", "soon"]), "soon"),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_fails(url, &args, 2, fragment);
    }
    assert_eq!(requests(&db).await, 0);

    // Inside the retention it is asked for as before.
    let args = backfill(ago(5), &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(ok(url, &args).starts_with("requested "));
    assert!(requests(&db).await >= 4);
}

async fn requests(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.routine_requests")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn fires_pages_through_a_cursor() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let id: Uuid = hourly(url).parse().unwrap();
    // Five settled fires, an hour apart.
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, status, completed_at, claimant, claim_token, lease_expires_at)
         SELECT $1, date_trunc('hour', now()) - make_interval(hours => i), 'fired', now(), 'test',
                gen_random_uuid(), now()
         FROM generate_series(1, 5) AS i",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();

    // Human form: a full page ends with the cursor of the next; the last page does not.
    let mut shown = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 5, "paging did not end: {shown:?}");
        let mut args = vec!["fires", "--limit", "2"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c]);
        }
        let out = ok(url, &args);
        let mut lines: Vec<&str> = out.lines().collect();
        cursor = match lines
            .last()
            .and_then(|l| l.strip_prefix("next page: --cursor "))
        {
            Some(next) => {
                let next = next.to_owned();
                lines.pop();
                Some(next)
            }
            None => None,
        };
        // Each page is a table of its own, under its header.
        assert!(lines[0].starts_with("SCHEDULED AT"), "{lines:?}");
        shown.extend(lines[1..].iter().map(|l| l.to_string()));
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(shown.len(), 5, "{shown:?}");
    let whole: Vec<String> = ok(url, &["fires"])
        .lines()
        .skip(1)
        .map(String::from)
        .collect();
    assert_eq!(shown, whole);

    // JSON form: the cursor is a last line of its own.
    let out = ok(url, &["fires", "--limit", "4", "--json"]);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    let next = lines[4]["next_cursor"].as_str().unwrap();
    let rest = ok(url, &["fires", "--json", "--cursor", next]);
    assert_eq!(rest.lines().count(), 1, "{rest}");

    check_fails(url, &["fires", "--cursor", "yesterday"], 2, "yesterday");
}
