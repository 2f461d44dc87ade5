//! Concurrency keys through whole processes: three mission routines sharing a key of one place,
//! on the process backend, under two schedulers of which one is SIGKILLed mid-way: never two
//! runs at once (by the runs' own record of when they started and ended), and every occurrence
//! run, none skipped for the limit.

use std::time::Duration;

use uuid::Uuid;

use crate::cli::{MissionFiles, create_args, created_id, ok};
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, eventually_within};

/// Runs of the routines, one line each when a run starts and when it ends, with the
/// nanosecond clock: `start <ns> <task>` and `end <ns> <task>`.
fn run_log(path: &str) -> Vec<(u128, bool, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut events: Vec<(u128, bool, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let what = parts.next()?;
            let at: u128 = parts.next()?.parse().ok()?;
            let task = parts.next()?.to_owned();
            Some((at, what == "start", task))
        })
        .collect();
    events.sort();
    events
}

/// The most runs that were running at once, from the run log.
fn most_at_once(events: &[(u128, bool, String)]) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for (_, start, _) in events {
        if *start {
            now += 1;
            most = most.max(now);
        } else {
            now = now.saturating_sub(1);
        }
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_missions_on_a_key_of_one_place_never_run_two_at_once_and_skip_nothing() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let log = files.write("runs.log", "");
    // Each run records its start and end around a second's work.
    let script = format!(
        r#"echo "start $(date +%s%N) $TASK" >> {log}; sleep 1; echo "end $(date +%s%N) $TASK" >> {log}"#
    );
    let backend = [
        "--mission-backend",
        "process",
        "--mission-workdir",
        &workdir,
        "--mission-env-allow",
        "TASK",
        "--mission-command",
        "/bin/sh",
        "-c",
        &script,
    ];
    let limit: bool = sqlx::query_scalar("SELECT cm.set_concurrency_limit('gpu', 1)")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(limit);

    // Three routines, every second, three runs each: nine runs of a second, one at a time.
    let mut routines: Vec<Uuid> = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let mission = files.write(
            &format!("{name}.json"),
            &format!(
                r#"{{"repository": "https://git.example.com/team/repo.git", "task": "{name}",
                    "env": {{"TASK": "{name}"}}}}"#
            ),
        );
        let id = created_id(&ok(
            &db.url,
            &create_args(
                name,
                "* * * * * *",
                &[
                    "--mission",
                    &mission,
                    "--overlap",
                    "allow",
                    "--misfire",
                    "catch-up",
                    "--limit-runs",
                    "3",
                    "--mission-env-allow",
                    "TASK",
                    "--paused",
                ],
            ),
        ));
        let set: bool = sqlx::query_scalar("SELECT cm.set_routine_concurrency_key($1, 'gpu')")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(set);
        routines.push(id);
    }
    let mut a = SchedulerProcess::start_with(&db, "a", &backend, &[]);
    let _b = SchedulerProcess::start_with(&db, "b", &backend, &[]);
    for id in &routines {
        ok(&db.url, &["routine", "resume", &id.to_string()]);
    }

    // A few runs in, one scheduler dies without a word.
    let started = eventually_within(Duration::from_secs(30), async || {
        (run_log(&log).iter().filter(|e| e.1).count() >= 3).then_some(())
    })
    .await;
    assert!(started.is_some(), "no runs started; a:\n{}", a.log());
    a.kill();

    // Every routine's three runs end, succeeded.
    let finished = eventually_within(Duration::from_secs(90), async || {
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM cm.routine_fires WHERE run_state = 'succeeded'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap_or(0);
        (ended >= 9).then_some(ended)
    })
    .await;
    let rows: Vec<(Uuid, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT routine_id, status, run_state, error FROM cm.routine_fires ORDER BY scheduled_at",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(finished.is_some(), "not all runs ended: {rows:?}");
    for id in &routines {
        let mine: Vec<_> = rows.iter().filter(|r| r.0 == *id).collect();
        assert_eq!(mine.len(), 3, "routine {id}: {mine:?}");
        assert!(
            mine.iter()
                .all(|r| r.1 == "fired" && r.2.as_deref() == Some("succeeded")),
            "routine {id}: {mine:?}"
        );
    }
    let events = run_log(&log);
    assert_eq!(events.len(), 18, "{events:?}");
    assert_eq!(most_at_once(&events), 1, "two runs at once: {events:?}");
}
