//! Events heard by a real receiver: `cm-scheduler run --events-webhook` posts each event signed
//! per Standard Webhooks to a server in the test, which refuses any request whose signature
//! does not verify. A mission failing every 2 s is paused at its third failure with one
//! `routine.paused`, and after its fix and a resume, one `routine.recovered`; a 6 s run under a
//! 2 s deadline raises one `routine.deadline_missed` per occurrence, within a second or two of
//! the deadline; a routine owed for 90 s under fire-once raises one `routine.misfired` with its
//! count. Two schedulers run side by side: still one event per change.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use cm_dispatch::fakes::standard_webhooks::signature_valid;
use serde_json::Value;

use crate::cli::{MissionFiles, ok};
use crate::missions_real::{fires, routine};
use crate::operate::Running;
use crate::support::{TestDb, eventually_within};

/// The events webhook's signing secret.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One delivery as the receiver took it: its `webhook-id`, its body, when it arrived.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    body: Value,
    arrived: DateTime<Utc>,
}

/// A receiver of events on a port of its own, keeping every signed delivery.
#[derive(Clone, Default)]
struct Receiver {
    deliveries: Arc<Mutex<Vec<Delivery>>>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let (id, timestamp) = (header("webhook-id"), header("webhook-timestamp"));
    if !signature_valid(SECRET, id, timestamp, &body, header("webhook-signature")) {
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    r.deliveries.lock().unwrap().push(Delivery {
        id: id.to_owned(),
        body,
        arrived: Utc::now(),
    });
    StatusCode::NO_CONTENT
}

impl Receiver {
    /// Serves on a free port; returns the receiver and its URL.
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let app = Router::new()
            .route("/events", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/events", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    /// The deliveries of `event_type` about the routine `name`, one per id (a redelivery of
    /// an id is the same event).
    fn of(&self, name: &str, event_type: &str) -> Vec<Delivery> {
        let mut seen = std::collections::HashSet::new();
        self.deliveries
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.body["type"] == event_type && d.body["data"]["routine_name"] == name)
            .filter(|d| seen.insert(d.id.clone()))
            .cloned()
            .collect()
    }

    /// Waits up to `patience` for at least `n` events of `event_type` about `name`.
    async fn wait_for(
        &self,
        name: &str,
        event_type: &str,
        n: usize,
        patience: Duration,
    ) -> Option<Vec<Delivery>> {
        eventually_within(patience, async || {
            let found = self.of(name, event_type);
            (found.len() >= n).then_some(found)
        })
        .await
    }
}

/// `run`'s flags posting events to `url`, the secret in `files`.
fn events_flags(files: &MissionFiles, url: &str) -> Vec<String> {
    let secret = files.write("events-secret", SECRET);
    vec![
        "--events-webhook".into(),
        url.into(),
        "--events-webhook-secret-file".into(),
        secret,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_mission_is_heard_paused_at_its_third_failure_then_recovered() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let (receiver, url) = Receiver::start().await;
    let three = routine(&db, &files, "three", "*/2 * * * * *", 0, 3, "forbid");
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let mut flags: Vec<String> = events_flags(&files, &url);
    flags.extend(["--pause-after-failures", "3", "--lease", "60s"].map(String::from));
    flags.extend(crate::missions_operate::process_backend(&workdir).map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    // Two schedulers, so each change must still be one event.
    let first = Running::start_with(&db.url, &flags, &[]);
    let second = Running::start_with(&db.url, &flags, &[]);
    let Some(paused) = receiver
        .wait_for("three", "routine.paused", 1, Duration::from_secs(40))
        .await
    else {
        panic!(
            "no routine.paused within 40 s:\n{}\n{}",
            first.log(),
            second.log()
        );
    };
    assert_eq!(paused[0].body["data"]["by"], "cm", "{paused:?}");
    let reason = paused[0].body["data"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("its last 3 fires failed"), "{reason}");
    let failed = receiver
        .wait_for("three", "routine.failed", 3, Duration::from_secs(20))
        .await
        .expect("three routine.failed");
    for event in &failed {
        assert_eq!(event.body["data"]["exit_code"], 3, "{event:?}");
        let tail = event.body["data"]["output_tail"]
            .as_str()
            .unwrap_or_default();
        assert!(tail.contains("the report will exit 3"), "{event:?}");
        assert!(
            !tail.contains("hunter2secret"),
            "the tail is scrubbed: {tail}"
        );
    }
    // Nothing claimed after the pause: two more occurrences' time, and still at most 4 runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let runs = fires(&db, three);
    assert!(runs.len() <= 4, "{} runs: {runs:?}", runs.len());
    assert_eq!(receiver.of("three", "routine.paused").len(), 1);
    // One event per failed occurrence, whichever scheduler recorded it.
    let failures: std::collections::HashSet<String> = receiver
        .of("three", "routine.failed")
        .iter()
        .map(|d| d.body["data"]["scheduled_at"].to_string())
        .collect();
    assert_eq!(failures.len(), receiver.of("three", "routine.failed").len());

    // Fixed, then resumed: one recovery, however many successes follow.
    let fixed = files.write(
        "fixed.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "report",
            "env": {"NAP": "0", "CODE": "0"}}"#,
    );
    ok(
        &db.url,
        &[
            "routine",
            "update",
            "three",
            "--mission",
            &fixed,
            "--mission-env-allow",
            "NAP,CODE",
        ],
    );
    ok(&db.url, &["routine", "resume", "three"]);
    receiver
        .wait_for("three", "routine.resumed", 1, Duration::from_secs(20))
        .await
        .expect("one routine.resumed");
    let recovered = receiver
        .wait_for("three", "routine.recovered", 1, Duration::from_secs(30))
        .await
        .expect("one routine.recovered");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let succeeded = fires(&db, three)
        .iter()
        .filter(|f| f["run_state"] == "succeeded")
        .count();
    assert!(succeeded >= 2, "{:?}", fires(&db, three));
    assert_eq!(
        receiver.of("three", "routine.recovered").len(),
        1,
        "{recovered:?}"
    );
    // `cm-scheduler events` lists the same, newest first.
    let listed = ok(&db.url, &["events", "--routine", "three", "--json"]);
    let types: Vec<String> = listed
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| e["type"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(types.first().map(String::as_str), Some("routine.recovered"));
    assert_eq!(types.iter().filter(|t| *t == "routine.paused").count(), 1);
    let _ = std::fs::remove_dir_all(&workdir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_deadline_and_a_misfire_are_each_heard_once() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let (receiver, url) = Receiver::start().await;
    // A 6 s run every 10 s, with 2 s to succeed.
    routine(&db, &files, "slow", "*/10 * * * * *", 6, 0, "forbid");
    ok(&db.url, &["routine", "update", "slow", "--deadline", "2s"]);
    // Owed for 90 s, every second, as if every scheduler had been down.
    ok(
        &db.url,
        &[
            "routine",
            "create",
            "--name",
            "behind",
            "--schedule",
            "* * * * * *",
            "--message",
            "hi",
        ],
    );
    sqlx::query(
        "UPDATE cm.routines SET next_run_at = date_trunc('second', now()) - interval '90 seconds'
         WHERE name = 'behind'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let mut flags: Vec<String> = events_flags(&files, &url);
    flags.extend(crate::missions_operate::process_backend(&workdir).map(String::from));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let scheduler = Running::start_with(&db.url, &flags, &[]);

    let Some(misfired) = receiver
        .wait_for("behind", "routine.misfired", 1, Duration::from_secs(30))
        .await
    else {
        panic!("no routine.misfired:\n{}", scheduler.log());
    };
    let skipped = misfired[0].body["data"]["skipped"].as_u64().unwrap_or(0);
    assert!((88..=92).contains(&skipped), "{misfired:?}");
    assert_eq!(misfired[0].body["data"]["policy"], "fire-once");

    let Some(missed) = receiver
        .wait_for(
            "slow",
            "routine.deadline_missed",
            2,
            Duration::from_secs(40),
        )
        .await
    else {
        panic!("no two routine.deadline_missed:\n{}", scheduler.log());
    };
    for event in &missed {
        let data = &event.body["data"];
        let planned: DateTime<Utc> = data["planned_at"].as_str().unwrap().parse().unwrap();
        let raised: DateTime<Utc> = data["occurred_at"].as_str().unwrap().parse().unwrap();
        let late = raised - (planned + chrono::TimeDelta::seconds(2));
        assert!(
            late >= chrono::TimeDelta::zero() && late <= chrono::TimeDelta::seconds(2),
            "raised {late} after the deadline: {event:?}"
        );
        assert!(
            event.arrived - raised <= chrono::TimeDelta::seconds(3),
            "{event:?}"
        );
        assert_eq!(data["deadline"], "2s");
    }
    // One per occurrence.
    let occurrences: std::collections::HashSet<String> = receiver
        .of("slow", "routine.deadline_missed")
        .iter()
        .map(|d| d.body["data"]["scheduled_at"].to_string())
        .collect();
    assert_eq!(
        occurrences.len(),
        receiver.of("slow", "routine.deadline_missed").len()
    );
    // The routine that keeps its deadline (none) and the routine that misfired once: no
    // second misfire.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(receiver.of("behind", "routine.misfired").len(), 1);
    assert!(receiver.of("behind", "routine.deadline_missed").is_empty());
    let _ = std::fs::remove_dir_all(&workdir);
}
