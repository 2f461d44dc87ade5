//! A slow target never delays other routines: the real loop against the real database, with the
//! webhook backend posting to a receiver in the test that answers one routine only after 20 s
//! and every other routine at once. Every occurrence of the other routines must be delivered
//! on time while the slow one is still waiting for its answer.

use crate::support::new_routine;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use cm_dispatch::WebhookDispatcher;
use cm_dispatch::fakes::standard_webhooks::signature_valid;
use cm_dispatch::webhook::WebhookSecret;
use cm_domain::{FireCap, Lease, Schedule, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::{PgStore, RoutineKind, RoutineStore};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

/// How long the slow routine's answer takes.
const SLOW_ANSWER: Duration = Duration::from_secs(20);
/// How long the loop runs: well inside the slow answer.
const RUN_FOR: Duration = Duration::from_secs(8);
/// How late after its scheduled instant an occurrence of a fast routine may arrive: a few tick
/// intervals, far less than the slow answer.
const ON_TIME: Duration = Duration::from_secs(2);

/// Arrivals per routine: (scheduled_at, arrived at).
type Arrivals = Arc<Mutex<HashMap<Uuid, Vec<(DateTime<Utc>, DateTime<Utc>)>>>>;

#[derive(Clone)]
struct Receiver {
    slow: Uuid,
    arrivals: Arrivals,
}

/// The signing secret the test's backend is given.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Records a signed delivery's arrival (a request whose Standard Webhooks signature does not
/// verify is refused, so its routine misses the arrivals the test expects).
async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let arrived = Utc::now();
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
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let data = &body["data"];
    let routine: Uuid = data["routine_id"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .unwrap_or_default();
    let scheduled: DateTime<Utc> = data["scheduled_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    r.arrivals
        .lock()
        .unwrap()
        .entry(routine)
        .or_default()
        .push((scheduled, arrived));
    if routine == r.slow {
        // The slow target, on purpose.
        tokio::time::sleep(SLOW_ANSWER).await;
    }
    StatusCode::NO_CONTENT
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_slow_target_never_delays_other_routines(pool: PgPool) {
    let store = PgStore::new(pool);
    let every_second = Schedule::parse("* * * * * *", "UTC").unwrap();
    let mut routines = Vec::new();
    for i in 0..4 {
        let routine = store
            .create_routine(new_routine(
                format!("routine-{i}"),
                "* * * * * *",
                "UTC",
                RoutineKind::Message,
                json!({ "text": format!("routine {i}") }),
            ))
            .await
            .unwrap();
        routines.push(routine.id);
    }
    let receiver = Receiver {
        slow: routines[0],
        arrivals: Arrivals::default(),
    };
    let app = Router::new()
        .fallback(axum::routing::post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let webhook = WebhookDispatcher::new(&url, WebhookSecret::parse(SECRET).unwrap()).unwrap();
    let config = SchedulerConfig {
        tick_interval: Duration::from_millis(200),
        max_fires_per_tick: FireCap::DEFAULT,
        lease: Lease::new(Duration::from_secs(60)).unwrap(),
        dispatch_timeout: Duration::from_secs(30),
        ..SchedulerConfig::default()
    };
    let scheduler = Arc::new(
        Scheduler::new(
            Arc::new(store.clone()),
            Arc::new(webhook),
            config,
            "slow-test",
        )
        .unwrap(),
    );
    let started = Utc::now();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = scheduler.spawn(async move {
        let _ = stopped.await;
    });
    // Time passes on purpose: the fast routines must stay on time for the whole run while the
    // slow one's answers are held.
    tokio::time::sleep(RUN_FOR).await;
    let stopped_at = Utc::now();
    let arrivals = receiver.arrivals.lock().unwrap().clone();
    let _ = stop.send(());
    handle.await.unwrap();

    // Every occurrence of a fast routine due in the run (with a tick's margin at the end) came,
    // and on time.
    let on_time = chrono::TimeDelta::from_std(ON_TIME).unwrap();
    for routine in &routines[1..] {
        let got = arrivals.get(routine).cloned().unwrap_or_default();
        let due: Vec<DateTime<Utc>> =
            std::iter::successors(every_second.next_after(started), |t| {
                every_second.next_after(*t)
            })
            .take_while(|t| *t <= stopped_at - on_time)
            .collect();
        let expected = due.len();
        for t in &due {
            assert!(
                got.iter().any(|(scheduled, _)| scheduled == t),
                "routine {routine}: the occurrence at {t} never arrived (arrivals {got:?})"
            );
        }
        let late: Vec<_> = got
            .iter()
            .filter(|(scheduled, arrived)| *arrived - *scheduled > on_time)
            .collect();
        assert!(
            got.len() >= expected && expected >= 4,
            "routine {routine}: {} arrivals, {expected} occurrences due",
            got.len()
        );
        assert!(late.is_empty(), "routine {routine}: late arrivals {late:?}");
    }
    assert!(
        arrivals.get(&routines[0]).is_some_and(|a| !a.is_empty()),
        "the slow routine was dispatched"
    );
}
