//! Retry policies through the binary: `routine create --retries N --retry-backoff D` on a real
//! engine. A webhook answering 503 twice, then 200, is delivered once, every attempt under the
//! occurrence's one `webhook-id`, after the backoff each time; a mission (the process backend,
//! two schedulers) failing twice then succeeding ends succeeded on attempt 3 with three runs of
//! three names and is not paused; a retry is never made at or after the next occurrence. The
//! schedulers' lease is a minute, so their reaper's beat is 30 s: each retry is taken over when
//! due because the process that decided it is woken for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::cli::{MissionFiles, create_args, created_id, ok};
use crate::operate::Running;
use crate::support::{TestDb, eventually_within};
use crate::trace::Hook;

/// One request the receiver took: its `webhook-id`, its body's attempt, when it arrived and
/// what it answered.
#[derive(Debug, Clone)]
struct Request {
    id: String,
    attempt: i64,
    scheduled_at: DateTime<Utc>,
    arrived: DateTime<Utc>,
    answered: u16,
}

/// A webhook receiver that answers 503 to every send of an occurrence's attempts before
/// `succeed_from` (by the body's `attempt`; `None`: to every send), then 204. The webhook
/// backend sends again within one attempt while its dispatch timeout allows, so a failed
/// attempt is several sends; the routine's retries are the attempts after it.
#[derive(Clone)]
struct Flaky {
    succeed_from: Option<i64>,
    requests: Arc<Mutex<Vec<Request>>>,
}

async fn flaky(State(f): State<Flaky>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    let attempt = body["data"]["attempt"].as_i64().unwrap_or_default();
    let answer = match f.succeed_from {
        Some(n) if attempt >= n => StatusCode::NO_CONTENT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    f.requests.lock().unwrap().push(Request {
        id,
        attempt,
        scheduled_at: body["data"]["scheduled_at"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_default(),
        arrived: Utc::now(),
        answered: answer.as_u16(),
    });
    answer
}

/// The first and last send of each attempt among `requests`, by attempt.
fn attempts(requests: &[Request]) -> Vec<(i64, DateTime<Utc>, DateTime<Utc>)> {
    let mut spans: Vec<(i64, DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for r in requests {
        match spans.iter_mut().find(|(a, _, _)| *a == r.attempt) {
            Some(span) => {
                span.1 = span.1.min(r.arrived);
                span.2 = span.2.max(r.arrived);
            }
            None => spans.push((r.attempt, r.arrived, r.arrived)),
        }
    }
    spans.sort_by_key(|s| s.0);
    spans
}

/// The ledger's row of the occurrences of `routine`, oldest first: status, attempt, retry,
/// error, the run's state, and its earlier tries.
type Row = (
    DateTime<Utc>,
    String,
    i32,
    i16,
    Option<String>,
    Option<String>,
    Option<Value>,
);

async fn rows(db: &TestDb, routine: Uuid) -> Vec<Row> {
    sqlx::query_as(
        "SELECT scheduled_at, status, attempt, retry, error, run_state, tries
         FROM cm.routine_fires WHERE routine_id = $1 ORDER BY scheduled_at",
    )
    .bind(routine)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// The schedulers' flags: a lease of a minute (the reaper's beat 30 s), a dispatch timeout of a
/// second (the webhook's sends of one attempt end within it).
const SLOW_REAPER: [&str; 4] = ["--lease", "60s", "--dispatch-timeout", "1s"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_answering_503_twice_is_delivered_once_on_the_third_attempt() {
    let db = TestDb::new().await;
    let receiver = Flaky {
        succeed_from: Some(3),
        requests: Arc::default(),
    };
    let hook = Hook::serve(
        &db,
        "retries",
        Router::new().fallback(flaky).with_state(receiver.clone()),
    )
    .await;
    let id = created_id(&ok(
        &db.url,
        &create_args(
            "ping",
            "0 0 1 1 *",
            &[
                "--message",
                "hello",
                "--retries",
                "2",
                "--retry-backoff",
                "1s..10s",
            ],
        ),
    ));
    let mut flags: Vec<&str> = hook.args().to_vec();
    flags.extend(SLOW_REAPER);
    let scheduler = Running::start_with(&db.url, &flags, &[]);
    ok(&db.url, &["routine", "trigger", "ping"]);
    let settled = eventually_within(Duration::from_secs(30), async || {
        let rows = rows(&db, id).await;
        (rows.len() == 1 && rows[0].1 != "claimed").then_some(rows)
    })
    .await
    .unwrap_or_else(|| panic!("not settled within 30 s:\n{}", scheduler.log()));
    let (_, status, attempt, retry, error, _, tries) = &settled[0];
    assert_eq!(
        (status.as_str(), *attempt, *retry, error),
        ("fired", 3, 2, &None)
    );
    let tries = tries.clone().unwrap();
    assert_eq!(tries.as_array().unwrap().len(), 2, "{tries}");
    assert!(
        tries[0]["error"].as_str().unwrap().contains("503"),
        "{tries}"
    );

    let requests = receiver.requests.lock().unwrap().clone();
    assert!(
        requests.iter().all(|r| r.id == requests[0].id),
        "one webhook-id on every attempt: {requests:?}"
    );
    let delivered: Vec<&Request> = requests.iter().filter(|r| r.answered == 204).collect();
    assert_eq!(delivered.len(), 1, "delivered once: {requests:?}");
    assert_eq!(delivered[0].attempt, 3, "{requests:?}");
    // Each retry after its backoff (1 s, then 2 s) from the attempt before it, and woken for
    // it: well before the reaper's 30 s beat.
    let spans = attempts(&requests);
    assert_eq!(
        spans.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2, 3],
        "{requests:?}"
    );
    for (k, backoff) in [(1, 1.0), (2, 2.0)] {
        let gap = (spans[k].1 - spans[k - 1].2).as_seconds_f64();
        assert!(
            gap >= backoff - 0.2 && gap < backoff + 5.0,
            "attempt {} began {gap} s after attempt {k}'s last send: {requests:?}",
            k + 1
        );
    }
    let show = ok(&db.url, &["routine", "show", "ping"]);
    assert!(show.contains("retries"), "{show}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_before_the_next_occurrence() {
    let db = TestDb::new().await;
    let receiver = Flaky {
        succeed_from: None,
        requests: Arc::default(),
    };
    let hook = Hook::serve(
        &db,
        "retries-stop",
        Router::new().fallback(flaky).with_state(receiver.clone()),
    )
    .await;
    // Every 6 s, each attempt's sends ending within its 1 s timeout, a retry 2 s after each
    // failure, five allowed: the first retry (about 3 s in) is due before the next occurrence,
    // and by the third at the latest (about 9 s in) one would not be.
    let id = created_id(&ok(
        &db.url,
        &create_args(
            "every-four",
            "*/6 * * * * *",
            &[
                "--message",
                "hello",
                "--retries",
                "5",
                "--retry-backoff",
                "2s..2s",
            ],
        ),
    ));
    let mut flags: Vec<&str> = hook.args().to_vec();
    flags.extend(SLOW_REAPER);
    let scheduler = Running::start_with(&db.url, &flags, &[]);
    let failed = eventually_within(Duration::from_secs(40), async || {
        let failed: Vec<Row> = rows(&db, id)
            .await
            .into_iter()
            .filter(|r| r.1 == "failed")
            .collect();
        (failed.len() >= 3).then_some(failed)
    })
    .await
    .unwrap_or_else(|| panic!("no three failed occurrences in 40 s:\n{}", scheduler.log()));
    drop(scheduler);
    for (at, _, attempt, retry, error, _, tries) in &failed {
        let error = error.as_deref().unwrap_or_default();
        assert!(
            error.contains(&format!("not retried: retry {} would be due at", retry + 1))
                && error.contains("not before the next occurrence at"),
            "{at}: {error}; all: {failed:?}"
        );
        assert!(*retry >= 1, "{at}: the first retry fits: {error}");
        assert_eq!(*attempt, i32::from(*retry) + 1, "{at}: {error}");
        // Every retry was due before the next occurrence.
        let next = *at + chrono::TimeDelta::seconds(6);
        for t in tries
            .as_ref()
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let due: DateTime<Utc> = t["retry_at"].as_str().unwrap().parse().unwrap();
            assert!(due < next, "{at}: a retry due at {due}: {t}");
        }
    }
    // Each attempt began (its first send) by the next occurrence, give or take the reaper's
    // wake-up and a busy machine's delays (its retry was due before it, as checked above, which
    // is the rule); its sends may go on within its dispatch timeout.
    let requests = receiver.requests.lock().unwrap().clone();
    for at in requests.iter().map(|r| r.scheduled_at) {
        let mine: Vec<Request> = requests
            .iter()
            .filter(|r| r.scheduled_at == at)
            .cloned()
            .collect();
        for (attempt, began, _) in attempts(&mine) {
            assert!(
                began < at + chrono::TimeDelta::milliseconds(8_000),
                "{at}: attempt {attempt} began at {began}"
            );
        }
    }
    let settled: std::collections::HashSet<DateTime<Utc>> = failed.iter().map(|r| r.0).collect();
    for at in &settled {
        let mine: Vec<Request> = requests
            .iter()
            .filter(|r| r.scheduled_at == *at)
            .cloned()
            .collect();
        let spans: Vec<i64> = attempts(&mine).iter().map(|s| s.0).collect();
        let attempt = failed
            .iter()
            .find(|r| r.0 == *at)
            .map_or(0, |r| i64::from(r.2));
        assert_eq!(spans, (1..=attempt).collect::<Vec<_>>(), "{at}");
    }
}

/// A mission that fails (exit 3) on its first two attempts and succeeds on the third, by
/// `CM_ATTEMPT`; each says which attempt it is.
const FLAKY_SCRIPT: &str = r#"echo "attempt ${CM_ATTEMPT} of ${CM_IDEMPOTENCY_KEY}"; if [ "${CM_ATTEMPT}" -lt 3 ]; then echo "attempt ${CM_ATTEMPT} fails" >&2; exit 3; fi; exit 0"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mission_failing_twice_succeeds_on_its_third_attempt_and_is_not_paused() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let mission = files.write(
        "flaky.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "report"}"#,
    );
    let id = created_id(&ok(
        &db.url,
        &create_args(
            "flaky",
            "0 0 1 1 *",
            &[
                "--mission",
                &mission,
                "--retries",
                "2",
                "--retry-backoff",
                "1s",
            ],
        ),
    ));
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let mut flags: Vec<&str> = vec![
        "--mission-backend",
        "process",
        "--mission-workdir",
        &workdir,
        "--mission-command",
        "/bin/sh",
        "-c",
        FLAKY_SCRIPT,
        // Two failures in a row would pause it, were they counted before the retries were spent.
        "--pause-after-failures",
        "2",
    ];
    flags.extend(SLOW_REAPER);
    let first = Running::start_with(&db.url, &flags, &[]);
    let second = Running::start_with(&db.url, &flags, &[]);
    ok(&db.url, &["routine", "trigger", "flaky"]);
    let ended = eventually_within(Duration::from_secs(40), async || {
        let rows = rows(&db, id).await;
        (rows.len() == 1 && rows[0].5.as_deref() == Some("succeeded")).then_some(rows)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the mission did not succeed within 40 s:\n{}\n{}",
            first.log(),
            second.log()
        )
    });
    let (at, status, attempt, retry, _, _, tries) = &ended[0];
    assert_eq!((status.as_str(), *attempt, *retry), ("fired", 3, 2));
    let tries = tries.clone().unwrap();
    let tries = tries.as_array().unwrap();
    assert_eq!(tries.len(), 2, "{tries:?}");
    for (n, t) in tries.iter().enumerate() {
        assert_eq!(t["attempt"], n + 1, "{t}");
        assert_eq!(
            (t["outcome"].as_str(), t["exit_code"].as_i64()),
            (Some("failed"), Some(3))
        );
        let output = t["output"].as_str().unwrap_or_default();
        assert!(output.contains(&format!("attempt {} fails", n + 1)), "{t}");
    }
    // Three runs of three names: the key, then `-r1` and `-r2`.
    let key = cm_domain::Occurrence::new(id, *at)
        .idempotency_key()
        .to_string();
    for name in [key.clone(), format!("{key}-r1"), format!("{key}-r2")] {
        assert!(
            std::path::Path::new(&workdir)
                .join(format!("{name}.launched"))
                .exists(),
            "no run {name} in {workdir}"
        );
    }
    assert!(
        !std::path::Path::new(&workdir)
            .join(format!("{key}-r3.launched"))
            .exists()
    );
    let paused: bool = sqlx::query_scalar("SELECT paused FROM cm.routines WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!paused, "a routine whose retry succeeded is not paused");
    let shown = ok(&db.url, &["fires", "show", &key]);
    assert!(shown.contains("attempt 1"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_outlives_the_scheduler_that_decided_it() {
    let db = TestDb::new().await;
    let receiver = Flaky {
        succeed_from: Some(2),
        requests: Arc::default(),
    };
    let hook = Hook::serve(
        &db,
        "retry-kill",
        Router::new().fallback(flaky).with_state(receiver.clone()),
    )
    .await;
    let id = created_id(&ok(
        &db.url,
        &create_args(
            "survivor",
            "0 0 1 1 *",
            &[
                "--message",
                "hello",
                "--retries",
                "1",
                "--retry-backoff",
                "3s",
            ],
        ),
    ));
    let mut flags: Vec<&str> = hook.args().to_vec();
    flags.extend(["--lease", "4s", "--dispatch-timeout", "1s"]);
    let first = Running::start_with(&db.url, &flags, &[]);
    ok(&db.url, &["routine", "trigger", "survivor"]);
    // The first attempt fails and its retry is decided; the scheduler that decided it is
    // SIGKILLed before it is due.
    eventually_within(Duration::from_secs(20), async || {
        let rows = rows(&db, id).await;
        (rows.len() == 1 && rows[0].3 == 1).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("no retry decided within 20 s:\n{}", first.log()));
    drop(first);
    // Another scheduler's reaper takes it over once due.
    let second = Running::start_with(&db.url, &flags, &[]);
    let settled = eventually_within(Duration::from_secs(20), async || {
        let rows = rows(&db, id).await;
        (rows[0].1 != "claimed").then_some(rows)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the retry was not taken over within 20 s:\n{}",
            second.log()
        )
    });
    assert_eq!(
        (settled[0].1.as_str(), settled[0].2, settled[0].3),
        ("fired", 2, 1)
    );
    let requests = receiver.requests.lock().unwrap().clone();
    assert_eq!(
        requests.iter().filter(|r| r.answered == 204).count(),
        1,
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.id == requests[0].id));
}
