//! A fire followed across systems: the scheduler binary sends each webhook with the W3C
//! `traceparent` of its attempt, and `fires --json` and `fires show` name the same context from
//! the ledger's row.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use crate::cli::ok;
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, eventually_within};

/// Each request's `webhook-id` and `traceparent`.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

async fn receive(State(seen): State<Seen>, headers: HeaderMap) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    seen.lock()
        .unwrap()
        .push((header("webhook-id"), header("traceparent")));
    StatusCode::NO_CONTENT
}

#[tokio::test]
async fn a_webhook_carries_the_traceparent_the_ledger_names() {
    let db = TestDb::new().await;
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = Router::new().fallback(receive).with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = std::env::temp_dir().join(format!("{}-trace", db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "whsec_dHJhY2VwYXJlbnQtdGVzdC1rZXk=\n").unwrap();

    ok(
        &db.url,
        &[
            "routine",
            "create",
            "--name",
            "traced",
            "--schedule",
            "* * * * * *",
            "--message",
            "hello",
        ],
    );
    let mut scheduler = SchedulerProcess::start_with(
        &db,
        "trace",
        &[
            "--message-backend",
            "webhook",
            "--webhook-url",
            &url,
            "--webhook-secret-file",
            secret.to_str().unwrap(),
        ],
        &[],
    );
    let fires: Vec<serde_json::Value> = eventually_within(Duration::from_secs(30), async || {
        let fired: Vec<serde_json::Value> = ok(&db.url, &["fires", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|f: &serde_json::Value| f["status"] == "fired")
            .collect();
        (fired.len() >= 2).then_some(fired)
    })
    .await
    .unwrap_or_else(|| panic!("no two fires within 30 s; log:\n{}", scheduler.log()));
    scheduler.shut_down_gracefully().await;

    let seen = seen.lock().unwrap().clone();
    let mut traces = std::collections::HashSet::new();
    for fire in &fires {
        let traceparent = fire["traceparent"].as_str().unwrap();
        let sent = seen
            .iter()
            .filter(|(_, t)| t == traceparent)
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>();
        assert!(
            !sent.is_empty(),
            "{fire} names {traceparent}, which no request carried: {seen:?}"
        );
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(
            (parts.len(), parts[0], parts[3]),
            (4, "00", "01"),
            "{traceparent}"
        );
        assert_eq!((parts[1].len(), parts[2].len()), (32, 16), "{traceparent}");
        traces.insert(parts[1].to_string());
    }
    assert_eq!(traces.len(), fires.len(), "one trace per occurrence");

    let first = &fires[0];
    let key = seen
        .iter()
        .find(|(_, t)| first["traceparent"] == t.as_str())
        .map(|(id, _)| id.clone())
        .unwrap();
    let shown = ok(&db.url, &["fires", "show", &key]);
    assert!(
        shown.contains(&format!(
            "traceparent {}",
            first["traceparent"].as_str().unwrap()
        )),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
