//! A caller's transaction holding one routine's rows holds back that routine only: the
//! scheduler binary sends webhooks for six routines while a caller deletes one of them from SQL
//! (`cm.delete_routine`) and keeps its transaction open past the lease. The settle of the other
//! five is written at once, nothing is taken over by the reaper and delivered twice, and the
//! held routine's own occurrence is settled when the caller lets go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use cm_dispatch::fakes::standard_webhooks::signature_valid;
use tokio::sync::watch;

use crate::cli::{create_args, ok};
use crate::crash::SchedulerProcess;
use crate::support::{PATIENCE, TestDb, wait_until};
use crate::trace::{Hook, SECRET};

/// The scheduler's lease (`RUN_SETTINGS`), and how long the caller holds its transaction open:
/// past the lease and the reaper's next pass (every half lease), with room to spare.
const LEASE: Duration = Duration::from_secs(4);
const HOLD: Duration = Duration::from_secs(8);

/// What the receiver saw: each delivery's `webhook-id`, with the routine it was for.
#[derive(Clone)]
struct Receiver {
    deliveries: Arc<Mutex<Vec<(String, String)>>>,
    /// Requests wait until this is true, so the test can choose when their settles are written.
    gate: watch::Receiver<bool>,
}

/// Records a signed delivery, then answers once the gate is open.
async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (id, timestamp) = (header("webhook-id"), header("webhook-timestamp"));
    if !signature_valid(SECRET, &id, &timestamp, &body, &header("webhook-signature")) {
        return StatusCode::UNAUTHORIZED;
    }
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let routine = body["data"]["routine_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    r.deliveries.lock().unwrap().push((id, routine));
    let _ = r.gate.clone().wait_for(|open| *open).await;
    StatusCode::NO_CONTENT
}

/// The id of the routine named `name`.
async fn routine_id(db: &TestDb, name: &str) -> uuid::Uuid {
    sqlx::query_scalar("SELECT id FROM cm.routines WHERE name = $1")
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_callers_open_transaction_holds_back_only_its_own_routine() {
    let db = TestDb::new().await;
    let names = ["held", "free-1", "free-2", "free-3", "free-4", "free-5"];
    for name in names {
        ok(
            &db.url,
            &create_args(name, "* * * * * *", &["--message", name]),
        );
    }
    let held = routine_id(&db, "held").await.to_string();
    let (open_gate, gate) = watch::channel(false);
    let receiver = Receiver {
        deliveries: Arc::default(),
        gate,
    };
    let hook = Hook::serve(
        &db,
        "held-locks",
        Router::new().fallback(receive).with_state(receiver.clone()),
    )
    .await;
    let mut scheduler = SchedulerProcess::start_with(&db, "held-locks", &hook.args(), &[]);

    // Every routine's first occurrence is dispatched and waits at the gate, still claimed.
    let routines: Vec<String> = {
        let mut ids = Vec::new();
        for name in names {
            ids.push(routine_id(&db, name).await.to_string());
        }
        ids
    };
    let deliveries = receiver.deliveries.clone();
    wait_until(
        "a delivery of every routine waiting at the gate",
        PATIENCE,
        async || deliveries.lock().unwrap().clone(),
        |seen: &Vec<(String, String)>| {
            routines
                .iter()
                .all(|r| seen.iter().any(|(_, routine)| routine == r))
        },
    )
    .await;

    // A caller deletes the held routine from SQL and keeps its transaction open: its fire rows,
    // the one waiting at the gate among them, are locked.
    let mut caller = db.pool.begin().await.unwrap();
    let deleted: bool = sqlx::query_scalar("SELECT cm.delete_routine($1::uuid)")
        .bind(&held)
        .fetch_one(&mut *caller)
        .await
        .unwrap();
    assert!(deleted);

    // The targets answer, together: the six settles share a batch.
    open_gate.send(true).unwrap();
    // The caller holds its lock past the lease and the reaper's next pass: the fault itself,
    // not a wait for a state.
    tokio::time::sleep(HOLD).await;
    assert!(HOLD > LEASE + LEASE / 2);
    // The caller changes its mind: the routine and its rows are back, unlocked.
    caller.rollback().await.unwrap();

    // Every occurrence claimed so far is settled, the held routine's too.
    let unsettled = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM cm.routine_fires WHERE status = 'claimed'
             AND claimed_at < now() - interval '1 second'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    wait_until(
        "every occurrence claimed before the release settled",
        PATIENCE,
        unsettled,
        |n| *n == 0,
    )
    .await;
    scheduler.shut_down_gracefully().await;

    // Nothing was taken over, and nothing was delivered twice.
    let taken_over: Vec<(uuid::Uuid, i32)> =
        sqlx::query_as("SELECT routine_id, attempt FROM cm.routine_fires WHERE attempt > 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let mut times: HashMap<String, usize> = HashMap::new();
    for (id, _) in receiver.deliveries.lock().unwrap().iter() {
        *times.entry(id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        taken_over.is_empty() && twice.is_empty(),
        "taken over: {taken_over:?}; delivered more than once: {twice:?}; log:\n{}",
        scheduler.log()
    );
    let held_fired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1::uuid AND status = 'fired'",
    )
    .bind(&held)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(held_fired >= 1, "the held routine's occurrence was settled");
}
