//! Containment: a routine whose schedule costs seconds of CPU to check cannot stop the others.
//! `routine create`, `routine import` and `routine update` refuse it in one line and write
//! nothing; written through SQL
//! (`cm.create_routine`, which cannot parse it), the running scheduler's planning sets it aside,
//! paused with its reason, while an every-second routine beside it keeps firing every second.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::cli::{cm, create_args};
use crate::crash::SchedulerProcess;
use crate::support::{PATIENCE, TestDb, wait_until};

/// An every-second rule whose exclusions keep one second in five hours, with a jitter: its
/// jitter check would walk 500 occurrences of about 18,000 candidates each (seconds of CPU).
const POISON: &str = "* * * * * * except 1-59 * * * * * except * 1-59 * * * * \
                      except * * 1-4,6-9,11-14,16-19,21-23 * * * jitter 1s";

/// How many consecutive seconds of the heartbeat the test checks after the poison is written.
const WATCHED_SECONDS: i64 = 8;

async fn create_through_sql(pool: &PgPool, name: &str, schedule: &str) -> Uuid {
    sqlx::query_scalar("SELECT cm.create_routine($1, $2, 'UTC', 'hello from SQL')")
        .bind(name)
        .bind(schedule)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Asserts that the binary refuses `args` in one line naming the budget, with a non-zero exit.
fn refused_in_one_line(url: &str, args: &[&str]) {
    let refused = cm(url, args);
    assert_ne!(refused.code, Some(0), "{args:?}: {refused:?}");
    assert_eq!(
        refused.stderr.trim_end().lines().count(),
        1,
        "{args:?}: {refused:?}"
    );
    assert!(
        refused.stderr.contains("too costly to check"),
        "{args:?}: {refused:?}"
    );
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_costly_schedule_is_refused_by_the_cli_and_set_aside_from_sql_while_others_fire() {
    let db = TestDb::new().await;

    // Through the CLI, `routine create` and `routine import`: one line, a non-zero exit,
    // nothing written.
    let jsonl = std::env::temp_dir().join(format!("{}-poison.jsonl", db.name));
    std::fs::write(
        &jsonl,
        format!("{{\"name\": \"poison\", \"schedule\": \"{POISON}\", \"message\": \"never\"}}\n"),
    )
    .unwrap();
    let create = create_args("poison", POISON, &["--message", "never"]);
    let import = ["routine", "import", jsonl.to_str().unwrap()];
    for args in [&create[..], &import[..]] {
        refused_in_one_line(&db.url, args);
    }
    let _ = std::fs::remove_file(&jsonl);
    let routines: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routines")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(routines, 0);

    // An every-second routine, firing under a running scheduler.
    let heartbeat = create_through_sql(&db.pool, "heartbeat", "* * * * * *").await;
    let _scheduler = SchedulerProcess::start_with_settings(
        &db,
        "containment",
        &[
            "--tick-interval",
            "200ms",
            "--lease",
            "4s",
            "--dispatch-timeout",
            "3s",
        ],
        &[],
        &[],
    );
    let fired = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1")
            .bind(heartbeat)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    wait_until("the heartbeat to fire", PATIENCE, fired, |n| *n >= 2).await;
    // `routine update` refuses it too, and the routine keeps its schedule.
    refused_in_one_line(
        &db.url,
        &["routine", "update", "heartbeat", "--schedule", POISON],
    );
    let kept: String = sqlx::query_scalar("SELECT schedule FROM cm.routines WHERE id = $1")
        .bind(heartbeat)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(kept, "* * * * * *");

    // Through SQL, which cannot check it: the planning pass sets it aside with its reason.
    let poison = create_through_sql(&db.pool, "poison", POISON).await;
    let written = db_now(&db.pool).await;
    let set_aside = async || -> (bool, Option<String>, Option<DateTime<Utc>>) {
        sqlx::query_as("SELECT paused, paused_reason, next_run_at FROM cm.routines WHERE id = $1")
            .bind(poison)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let (_, reason, next) =
        wait_until("the poison set aside", PATIENCE, set_aside, |(p, _, _)| *p).await;
    let reason = reason.unwrap_or_default();
    assert!(
        reason.starts_with("refused when planned: ") && reason.contains("too costly to check"),
        "{reason:?}"
    );
    assert_eq!(next, None);

    // Every second after the poison was written has its heartbeat, once, and on time.
    let first = written.duration_trunc(TimeDelta::seconds(1)).unwrap() + TimeDelta::seconds(1);
    let last = first + TimeDelta::seconds(WATCHED_SECONDS - 1);
    wait_until(
        "the watched seconds to pass",
        PATIENCE,
        async || db_now(&db.pool).await,
        |now| *now > last + TimeDelta::seconds(2),
    )
    .await;
    let fires: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT scheduled_at, first_claimed_at FROM cm.routine_fires
         WHERE routine_id = $1 AND scheduled_at BETWEEN $2 AND $3 ORDER BY scheduled_at",
    )
    .bind(heartbeat)
    .bind(first)
    .bind(last)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let seconds: Vec<i64> = fires
        .iter()
        .map(|(at, _)| (*at - first).num_seconds())
        .collect();
    assert_eq!(
        seconds,
        (0..WATCHED_SECONDS).collect::<Vec<_>>(),
        "{fires:?}"
    );
    // On time: each claimed within two seconds of its slot (ticks every 200 ms). A loop held
    // by a schedule's checks claims nothing for as long as they take.
    let late: Vec<_> = fires
        .iter()
        .filter(|(at, claimed)| *claimed - *at > TimeDelta::seconds(2))
        .collect();
    assert!(late.is_empty(), "late heartbeats: {late:?}");
    // Nothing was written for the poison.
    let poison_fires: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1")
            .bind(poison)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(poison_fires, 0);
}
