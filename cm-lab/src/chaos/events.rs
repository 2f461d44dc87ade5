//! `--events-webhook`: the schedulers post their events to the run's own receiver while the
//! faults happen, and the check compares what it got with `cm.routine_events`.
//!
//! The receiver verifies each request's Standard Webhooks signature, refuses a seeded share of
//! first deliveries with 503 (the event is posted again after its backoff) and answers a
//! seeded share only after up to 1.5 s, so a SIGKILL lands while a post is in flight and the
//! event is posted again under the same `webhook-id`. Beside the schedulers' own events (every
//! routine gets a one-second deadline, which faults make it miss), a toggler pauses and resumes
//! a routine of its own (yearly, so it owes nothing in the run) through `cm.set_routine_paused`
//! every few hundred milliseconds, committing half the toggles and rolling back the others.
//!
//! The check, after every event is delivered: every event row reached the receiver (0 lost),
//! every id the receiver got is a row (0 sent for a change that rolled back), every signature
//! verified, each routine's events first arrived in the order they were written, and the
//! toggled routine has exactly one `routine.paused` or `routine.resumed` per committed toggle.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use cm_dispatch::fakes::standard_webhooks::signature_valid;
use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::fault::{Chaos, Fault};
use super::fleet::write_private;
use super::report::Findings;
use super::rng::Rng;

/// The share (percent) of first deliveries refused with 503.
const REFUSE_PERCENT: u64 = 10;
/// The share (percent) of acceptances answered late.
const DELAY_PERCENT: u64 = 20;
/// The longest late answer: inside the sink's 10 s timeout.
const MAX_DELAY: Duration = Duration::from_millis(1500);
/// How long the events may take to be delivered once the chaos ends.
pub(super) const EVENTS_DRAIN: Duration = Duration::from_secs(60);

/// One request the receiver took.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    event_type: String,
    routine_id: String,
    valid: bool,
}

#[derive(Default)]
struct Shared {
    secret: String,
    seed: u64,
    deliveries: Mutex<Vec<Delivery>>,
    seen: Mutex<HashSet<String>>,
}

/// The events receiver, on its own runtime.
pub(super) struct EventsReceiver {
    url: String,
    secret_file: std::path::PathBuf,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl EventsReceiver {
    /// Starts it on an ephemeral port of 127.0.0.1; its secret file goes in `dir`.
    pub fn start(seed: u64, dir: &std::path::Path) -> anyhow::Result<Self> {
        let mut rng = Rng::new(seed ^ 0x0e7e_0175);
        let key: Vec<u8> = (0..24).map(|_| rng.below(256) as u8).collect();
        let secret = format!(
            "whsec_{}",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key)
        );
        let secret_file = dir.join("events-secret");
        write_private(&secret_file, &secret)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("chaos-events")
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            secret,
            seed,
            ..Shared::default()
        });
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the events receiver")?;
        listener.set_nonblocking(true)?;
        let addr: SocketAddr = listener.local_addr()?;
        let app = Router::new().fallback(receive).with_state(shared.clone());
        runtime.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    if let Err(e) = axum::serve(listener, app).await {
                        eprintln!("chaos: the events receiver stopped: {e}");
                    }
                }
                Err(e) => eprintln!("chaos: the events receiver cannot listen: {e}"),
            }
        });
        Ok(EventsReceiver {
            url: format!("http://{addr}/events"),
            secret_file,
            shared,
            runtime: Some(runtime),
        })
    }

    /// The flags every scheduler gets.
    pub fn scheduler_args(&self) -> Vec<String> {
        vec![
            "--events-webhook".into(),
            self.url.clone(),
            "--events-webhook-secret-file".into(),
            self.secret_file.display().to_string(),
        ]
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.shared
            .deliveries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Compares what it got with the event rows (see the module).
    pub async fn check(
        &self,
        pool: &PgPool,
        routine: Uuid,
        toggles: &ToggleCount,
    ) -> anyhow::Result<Findings> {
        let rows: Vec<(Uuid, String, Uuid, i64)> = sqlx::query_as(
            "SELECT id, type, routine_id, seq FROM cm.routine_events ORDER BY routine_id, seq",
        )
        .fetch_all(pool)
        .await?;
        let deliveries = self.deliveries();
        let mut findings = Findings::default();
        let received: HashSet<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
        let written: HashMap<String, &(Uuid, String, Uuid, i64)> =
            rows.iter().map(|r| (r.0.to_string(), r)).collect();
        let lost = rows
            .iter()
            .filter(|r| !received.contains(r.0.to_string().as_str()))
            .count();
        let phantom = received
            .iter()
            .filter(|id| !written.contains_key(**id))
            .count();
        let invalid = deliveries.iter().filter(|d| !d.valid).count();
        let mistyped = deliveries
            .iter()
            .filter(|d| {
                written
                    .get(&d.id)
                    .is_some_and(|r| r.1 != d.event_type || r.2.to_string() != d.routine_id)
            })
            .count();
        // Each routine's events in the order they first arrived must be in `seq` order.
        let mut first_arrivals: HashMap<Uuid, Vec<i64>> = HashMap::new();
        let mut counted = HashSet::new();
        for d in &deliveries {
            if let Some(row) = written.get(&d.id)
                && counted.insert(d.id.clone())
            {
                first_arrivals.entry(row.2).or_default().push(row.3);
            }
        }
        let out_of_order = first_arrivals
            .values()
            .filter(|seqs| seqs.windows(2).any(|w| w[0] > w[1]))
            .count();
        let mut by_type: HashMap<&str, usize> = HashMap::new();
        for row in &rows {
            *by_type.entry(row.1.as_str()).or_default() += 1;
        }
        let mut types: Vec<String> = by_type.iter().map(|(t, n)| format!("{t} {n}")).collect();
        types.sort();
        findings.line(
            "events",
            format!(
                "{} written ({}), {} posts received, {} posted more than once",
                rows.len(),
                types.join(", "),
                deliveries.len(),
                deliveries.len() - counted.len().min(deliveries.len())
            ),
        );
        findings.require(lost > 0, || {
            format!("lost: {lost} events never reached the receiver")
        });
        findings.require(phantom > 0, || {
            format!("{phantom} event ids received that no row has (sent for a rolled-back change)")
        });
        findings.require(invalid > 0, || {
            format!("{invalid} event posts did not verify")
        });
        findings.require(mistyped > 0, || {
            format!("{mistyped} event posts whose type or routine differ from their row")
        });
        findings.require(out_of_order > 0, || {
            format!("{out_of_order} routines' events first arrived out of their order")
        });
        let toggled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM cm.routine_events
             WHERE routine_id = $1 AND type IN ('routine.paused', 'routine.resumed')",
        )
        .bind(routine)
        .fetch_one(pool)
        .await?;
        let committed = toggles.committed.load(Ordering::Relaxed);
        let rolled_back = toggles.rolled_back.load(Ordering::Relaxed);
        findings.line(
            "toggles",
            format!(
                "{committed} committed, {rolled_back} rolled back; {toggled} pause and resume \
                 events"
            ),
        );
        findings.require(toggled != committed, || {
            format!("{committed} toggles committed but {toggled} pause and resume events written")
        });
        Ok(findings)
    }
}

impl Drop for EventsReceiver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let id = header("webhook-id");
    let valid = signature_valid(
        &shared.secret,
        &id,
        &header("webhook-timestamp"),
        &body,
        &header("webhook-signature"),
    );
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    // Seeded by the id, so each event's fate is fixed whichever scheduler posts it.
    let mut rng = Rng::new(shared.seed ^ fnv(&id));
    let first = shared
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.clone());
    if first && rng.below(100) < REFUSE_PERCENT {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    if rng.below(100) < DELAY_PERCENT {
        tokio::time::sleep(rng.millis(0, MAX_DELAY.as_millis() as u64)).await;
    }
    shared
        .deliveries
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Delivery {
            id,
            event_type: parsed["type"].as_str().unwrap_or_default().to_owned(),
            routine_id: parsed["data"]["routine_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            valid,
        });
    if valid {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::UNAUTHORIZED
    }
}

/// FNV-1a of `text`: a seed per event id.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What the toggler did, read by the check after the run.
#[derive(Debug, Default)]
pub(super) struct ToggleCount {
    committed: AtomicI64,
    rolled_back: AtomicI64,
}

/// Pauses and resumes one routine through `cm.set_routine_paused` every 300 to 900 ms,
/// committing or rolling back each toggle as a coin says.
pub(super) struct Toggles {
    routine: Uuid,
    count: Arc<ToggleCount>,
    paused: bool,
    next: Instant,
}

impl Toggles {
    pub fn new(routine: Uuid, start: Instant) -> Self {
        Toggles {
            routine,
            count: Arc::default(),
            paused: false,
            next: start,
        }
    }

    /// Its count, shared.
    pub fn count(&self) -> Arc<ToggleCount> {
        self.count.clone()
    }

    /// One toggle in its own transaction, committed or rolled back.
    async fn toggle(pool: &PgPool, routine: Uuid, pause: bool, commit: bool) -> anyhow::Result<()> {
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT cm.set_routine_paused($1, $2)")
            .bind(routine)
            .bind(pause)
            .execute(&mut *tx)
            .await?;
        if commit {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(())
    }
}

impl Fault for Toggles {
    fn next_at(&self) -> Option<Instant> {
        Some(self.next)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let commit = chaos.rng.coin();
        let outcome = chaos.rt.block_on(Self::toggle(
            &chaos.pool,
            self.routine,
            !self.paused,
            commit,
        ));
        // An error (the database restarting) may have lost a commit's answer: the routine's
        // paused state says whether it happened, and the count follows it.
        let paused: Option<bool> = chaos
            .rt
            .block_on(
                sqlx::query_scalar("SELECT paused FROM cm.routines WHERE id = $1")
                    .bind(self.routine)
                    .fetch_optional(&chaos.pool),
            )
            .ok()
            .flatten();
        match (outcome, paused) {
            (_, Some(now)) if now != self.paused => {
                self.count.committed.fetch_add(1, Ordering::Relaxed);
                self.paused = now;
            }
            (Ok(()), Some(_)) if !commit => {
                self.count.rolled_back.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        self.next = Instant::now() + chaos.rng.millis(300, 900);
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::default()
    }
}
