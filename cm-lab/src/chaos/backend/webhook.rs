//! The webhook backend (`--message-backend webhook`): the run's own receiver and the check of
//! what it got.
//!
//! The receiver is an HTTP server on 127.0.0.1 that the chaos run starts before the schedulers. It
//! verifies every request's Standard Webhooks signature with the tests' verifier,
//! `cm_dispatch::fakes::standard_webhooks` (HMAC-SHA256, not the `standardwebhooks` crate the
//! backend signs with), refuses a timestamp more than [`TOLERANCE_SECS`] from its own clock,
//! records every request in memory in the order it took them, and is slow on purpose. A seeded share of the occurrences is refused with 503 on their
//! first delivery (the backend resends within its deadline); a seeded share of the acceptances
//! is answered after a delay of up to [`MAX_DELAY`], so scheduler kills land while deliveries
//! are in flight and the occurrence is delivered again by a later attempt; the rest are
//! answered 200 at once. A `webhook-id` already accepted is answered 409, the receiver's
//! deduplication that the backend counts as a duplicate.
//!
//! `--receiver-outage SECONDS` adds a window in which the receiver answers every request 503
//! (see [`OutageSwitch`]): the backend resends within each deadline under the same
//! `webhook-id`, and what the deadline ends settles `failed`; no occurrence the receiver
//! accepted may be `failed`. An id refused during the outage is answered without delay
//! afterwards: its sender has spent part of its deadline on resends, and a delayed acceptance
//! arriving after that deadline would make a `failed` row of an occurrence the receiver has,
//! which the design accepts for a target that answers too late.
//!
//! No answer is delayed beyond the schedulers' dispatch timeout: the product settles a dispatch
//! that times out `failed` (the design retries only claims whose claimant vanished), so such a
//! delay would make failed rows, not redeliveries.
//!
//! [`check_deliveries`] compares the record with the ledger (see `docs/CHAOS.md`).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use cm_dispatch::fakes::standard_webhooks::signature_valid;
use cm_domain::occurrence::Occurrence;
use uuid::Uuid;

use super::Takeover;
use crate::chaos::fleet::write_private;
use crate::chaos::ledger::FireRow;
use crate::chaos::report::Findings;
use crate::chaos::rng::Rng;

/// How far a `webhook-timestamp` may be from the receiver's clock: the five minutes the
/// Standard Webhooks libraries allow.
pub(super) const TOLERANCE_SECS: i64 = 300;

/// The share of occurrences (percent) refused with 503 on their first delivery.
const REFUSE_PERCENT: u64 = 15;

/// The share of acceptances (percent) answered after a delay.
const DELAY_PERCENT: u64 = 40;

/// The shortest and longest delay. With a 503 and the backend's backoff before it (at most
/// 250 ms), the longest path stays well inside the schedulers' 2 s dispatch timeout.
const MIN_DELAY: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_millis(1200);

/// The event type every cm webhook carries.
const EVENT_TYPE: &str = "cm.routine.fired";

/// How the receiver answered one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// 200: accepted (perhaps after a delay).
    Accepted,
    /// 409: this `webhook-id` was accepted before.
    Duplicate,
    /// 503: refused for now; the sender should try again.
    Unavailable,
    /// 401: the signature or the timestamp did not verify.
    Unauthorized,
    /// 400: the body is not a cm webhook.
    BadRequest,
}

impl Answer {
    fn status(self) -> StatusCode {
        match self {
            Answer::Accepted => StatusCode::OK,
            Answer::Duplicate => StatusCode::CONFLICT,
            Answer::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Answer::Unauthorized => StatusCode::UNAUTHORIZED,
            Answer::BadRequest => StatusCode::BAD_REQUEST,
        }
    }

    /// Whether the answer tells the sender the message is in (2xx, or 409 for one it had).
    fn acknowledges(self) -> bool {
        matches!(self, Answer::Accepted | Answer::Duplicate)
    }
}

/// What a body says it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub routine_id: Uuid,
    pub scheduled_at: DateTime<Utc>,
}

impl Identity {
    /// The idempotency key the product derives from this occurrence.
    fn key(&self) -> String {
        Occurrence::new(self.routine_id, self.scheduled_at)
            .idempotency_key()
            .as_str()
            .to_string()
    }
}

/// One request the receiver took, in the order it took them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Delivery {
    /// Its place in the receiver's order (0 for the first).
    pub seq: u64,
    /// `webhook-id`.
    pub id: String,
    /// `Idempotency-Key`.
    pub idempotency_key: String,
    /// `webhook-timestamp`, unless missing or not a number.
    pub timestamp: Option<i64>,
    /// The receiver's clock minus the timestamp, in seconds, at arrival.
    pub skew_secs: Option<i64>,
    /// Whether `webhook-signature` holds a `v1` HMAC of `<id>.<timestamp>.<body>`.
    pub signature_valid: bool,
    /// The body's `data.routine_id` and `data.scheduled_at`, if it is a cm webhook.
    pub identity: Option<Identity>,
    /// The body's `data.attempt`.
    pub attempt: Option<u32>,
    /// How the receiver answered.
    pub answer: Answer,
    /// How long it held the answer back.
    pub delay: Duration,
    /// When it arrived.
    pub received_at: DateTime<Utc>,
}

impl Delivery {
    /// A valid signature over a timestamp within the tolerance.
    pub fn verified(&self) -> bool {
        self.signature_valid && self.skew_secs.is_some_and(|s| s.abs() <= TOLERANCE_SECS)
    }

    /// One line for the log file.
    fn line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\tattempt {}\t{:?}\tdelay {} ms\tsignature {}\tskew {}\t{}",
            self.seq,
            self.received_at.to_rfc3339(),
            self.id,
            self.identity.map_or("?".to_string(), |i| format!(
                "{} {}",
                i.routine_id,
                i.scheduled_at.to_rfc3339()
            )),
            self.attempt.map_or("?".to_string(), |a| a.to_string()),
            self.answer,
            self.delay.as_millis(),
            if self.signature_valid {
                "valid"
            } else {
                "INVALID"
            },
            self.skew_secs.map_or("?".to_string(), |s| format!("{s} s")),
            self.timestamp.map_or("?".to_string(), |t| t.to_string()),
        )
    }
}

/// A random signing secret, `whsec_<base64 of 32 bytes>`.
pub(super) fn random_secret() -> String {
    let mut key = Vec::with_capacity(32);
    key.extend_from_slice(Uuid::new_v4().as_bytes());
    key.extend_from_slice(Uuid::new_v4().as_bytes());
    format!("whsec_{}", STANDARD.encode(key))
}

/// The body's type, identity and attempt; `None` for a body that is not a cm webhook.
fn read_body(body: &[u8]) -> Option<(Identity, u32)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    if value.get("type")?.as_str()? != EVENT_TYPE {
        return None;
    }
    let data = value.get("data")?;
    let routine_id = data.get("routine_id")?.as_str()?.parse().ok()?;
    let scheduled_at = DateTime::parse_from_rfc3339(data.get("scheduled_at")?.as_str()?)
        .ok()?
        .with_timezone(&Utc);
    let attempt = u32::try_from(data.get("attempt")?.as_u64()?).ok()?;
    Some((
        Identity {
            routine_id,
            scheduled_at,
        },
        attempt,
    ))
}

/// FNV-1a, written out so a seed means the same answers on every platform and version.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// How the receiver answers the `nth` request (0 for the first) carrying `id`: a function of
/// the seed, the id and `nth` only, so a seed means the same behaviour whatever the arrival
/// order between different ids.
pub(super) fn decide(
    seed: u64,
    id: &str,
    nth: u32,
    verified: bool,
    readable: bool,
    already_accepted: bool,
) -> (Answer, Duration) {
    if !verified {
        return (Answer::Unauthorized, Duration::ZERO);
    }
    if !readable {
        return (Answer::BadRequest, Duration::ZERO);
    }
    if already_accepted {
        return (Answer::Duplicate, Duration::ZERO);
    }
    let mut per_id = Rng::new(seed ^ fnv1a(id));
    if nth == 0 && per_id.below(100) < REFUSE_PERCENT {
        return (Answer::Unavailable, Duration::ZERO);
    }
    let mut per_request = Rng::new(per_id.next_u64() ^ u64::from(nth + 1));
    if per_request.below(100) < DELAY_PERCENT {
        let delay = per_request.millis(MIN_DELAY.as_millis() as u64, MAX_DELAY.as_millis() as u64);
        return (Answer::Accepted, delay);
    }
    (Answer::Accepted, Duration::ZERO)
}

#[derive(Debug, Default)]
struct Log {
    deliveries: Vec<Delivery>,
    /// Requests seen per id.
    seen: HashMap<String, u32>,
    accepted: HashSet<String>,
    /// Ids refused during an outage: answered without delay afterwards, since their sender
    /// has already spent part of its deadline on resends.
    refused_in_outage: HashSet<String>,
}

struct Shared {
    secret: String,
    seed: u64,
    log: Mutex<Log>,
    /// While set, every request is answered 503.
    outage: AtomicBool,
    /// The answers being held back now: the sender's port on 127.0.0.1 and when the answer
    /// goes out.
    held: Mutex<Vec<(u16, Instant)>>,
}

/// Tells which sender the receiver is holding an answer back from, so a fault can kill the
/// scheduler whose delivery is in flight ([`crate::chaos::fault::held`]).
#[derive(Clone)]
pub(in crate::chaos) struct HeldAnswers(Arc<Shared>);

impl HeldAnswers {
    /// The local port (on 127.0.0.1) of a sender whose answer is held for at least `left`
    /// more, if any is.
    pub fn sender_port(&self, left: Duration) -> Option<u16> {
        let now = Instant::now();
        let held = self.0.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter()
            .find(|(_, until)| until.saturating_duration_since(now) >= left)
            .map(|(port, _)| *port)
    }
}

/// Turns the receiver's outage on and off.
#[derive(Clone)]
pub(in crate::chaos) struct OutageSwitch(Arc<Shared>);

impl OutageSwitch {
    pub fn set(&self, down: bool) {
        self.0.outage.store(down, Ordering::Relaxed);
    }
}

/// The receiver, serving on a runtime of its own until dropped.
pub(super) struct Receiver {
    url: String,
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Receiver {
    /// Starts a receiver on an ephemeral port of 127.0.0.1, verifying with `secret` and
    /// answering as `seed` decides.
    pub fn start(secret: &str, seed: u64) -> anyhow::Result<Receiver> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("chaos-receiver")
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            secret: secret.to_string(),
            seed,
            log: Mutex::new(Log::default()),
            outage: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        });
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the webhook receiver")?;
        listener.set_nonblocking(true)?;
        let addr: SocketAddr = listener.local_addr()?;
        let app = Router::new().fallback(receive).with_state(shared.clone());
        runtime.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    let app = app.into_make_service_with_connect_info::<SocketAddr>();
                    if let Err(e) = axum::serve(listener, app).await {
                        eprintln!("chaos: the webhook receiver stopped: {e}");
                    }
                }
                Err(e) => eprintln!("chaos: the webhook receiver cannot listen: {e}"),
            }
        });
        Ok(Receiver {
            url: format!("http://{addr}/chaos"),
            addr,
            shared,
            runtime: Some(runtime),
        })
    }

    /// Where it listens.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The switch of its outage.
    pub fn outage_switch(&self) -> OutageSwitch {
        OutageSwitch(self.shared.clone())
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Who it is holding answers back from.
    pub fn held_answers(&self) -> HeldAnswers {
        HeldAnswers(self.shared.clone())
    }

    /// Every request so far, in the order the receiver took them.
    pub fn deliveries(&self) -> Vec<Delivery> {
        lock(&self.shared.log).deliveries.clone()
    }

    /// Writes every request so far to `path`, one a line.
    pub fn write_log(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let text: String = self.deliveries().iter().map(|d| d.line() + "\n").collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn lock(log: &Mutex<Log>) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(sender): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received_at = Utc::now();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let id = header("webhook-id");
    let timestamp_text = header("webhook-timestamp");
    let timestamp = timestamp_text.parse::<i64>().ok();
    let signature_ok = signature_valid(
        &shared.secret,
        &id,
        &timestamp_text,
        &body,
        &header("webhook-signature"),
    );
    let content = read_body(&body);
    let mut delivery = Delivery {
        seq: 0,
        id: id.clone(),
        idempotency_key: header("idempotency-key"),
        timestamp,
        skew_secs: timestamp.map(|t| received_at.timestamp() - t),
        signature_valid: signature_ok,
        identity: content.map(|c| c.0),
        attempt: content.map(|c| c.1),
        answer: Answer::Unauthorized,
        delay: Duration::ZERO,
        received_at,
    };
    let (answer, delay) = {
        let mut log = lock(&shared.log);
        let seen = log.seen.entry(id.clone()).or_default();
        let nth = *seen;
        *seen += 1;
        let decided = if shared.outage.load(Ordering::Relaxed) {
            log.refused_in_outage.insert(id.clone());
            (Answer::Unavailable, Duration::ZERO)
        } else {
            let (answer, delay) = decide(
                shared.seed,
                &id,
                nth,
                delivery.verified(),
                content.is_some(),
                log.accepted.contains(&id),
            );
            if log.refused_in_outage.contains(&id) {
                (answer, Duration::ZERO)
            } else {
                (answer, delay)
            }
        };
        if decided.0 == Answer::Accepted {
            log.accepted.insert(id);
        }
        delivery.seq = log.deliveries.len() as u64;
        (delivery.answer, delivery.delay) = decided;
        log.deliveries.push(delivery);
        decided
    };
    if !delay.is_zero() {
        let until = Instant::now() + delay;
        {
            let mut held = shared.held.lock().unwrap_or_else(|e| e.into_inner());
            held.retain(|(_, u)| *u > Instant::now());
            held.push((sender.port(), until));
        }
        tokio::time::sleep(delay).await;
    }
    (answer.status(), format!("{answer:?}")).into_response()
}

/// What the receiver got, compared with the ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct WebhookCheck {
    pub deliveries: usize,
    pub distinct_ids: usize,
    /// Deliveries after the first of their id: `resends` plus `redeliveries`.
    pub second_deliveries: usize,
    /// A delivery at the same attempt as the one before it, which the receiver had refused
    /// (503): the backend's own retry within one dispatch.
    pub resends: usize,
    /// A delivery at a higher attempt than the one before it: a later claim after a crash.
    pub redeliveries: usize,
    /// Ids delivered by more than one attempt.
    pub ids_redelivered: usize,
    pub max_attempt: u32,
    pub max_skew_secs: i64,
    pub accepted: usize,
    pub delayed: usize,
    pub refused_503: usize,
    pub duplicates_409: usize,
    /// Answered 401 or 400.
    pub refused_bad: usize,
    /// Deliveries whose signature did not verify or whose timestamp was out of tolerance.
    pub invalid_signatures: usize,
    /// Fired rows with no verified delivery the receiver accepted.
    pub fired_undelivered: usize,
    /// Fired rows whose own (last) attempt has no delivery the receiver acknowledged (2xx or
    /// 409): the ledger says fired without the receiver having said so to that attempt.
    pub fired_unacknowledged: usize,
    /// Deliveries whose id names no ledger row.
    pub deliveries_without_fire: usize,
    /// Deliveries whose `webhook-id` is not the key of the body's occurrence, whose
    /// `Idempotency-Key` differs from it, whose body is not a cm webhook, or whose occurrence
    /// differs from that of the id's first delivery.
    pub identity_mismatches: usize,
    /// Deliveries at a lower attempt than the one before them, or at the same attempt after a
    /// delivery the receiver did not refuse.
    pub order_violations: usize,
    /// Deliveries at a higher attempt than their ledger row ever reached.
    pub ahead_of_ledger: usize,
    /// Deliveries of an occurrence sent again after a failover at an attempt no higher than one
    /// the receiver had acknowledged before it: the standby never received the claim.
    pub refired: usize,
    /// Of those, the ones a failover with synchronous replication should never have sent.
    pub refired_unexpected: usize,
    /// Failed rows the receiver had accepted a delivery of.
    pub failed_but_accepted: usize,
    /// Failed rows, with their errors.
    pub failed: Vec<String>,
    /// Failed rows without an error text.
    pub failed_unexplained: usize,
    /// The first findings, in words.
    pub examples: Vec<String>,
}

impl WebhookCheck {
    fn note(&mut self, what: String) {
        if self.examples.len() < 10 {
            self.examples.push(what);
        }
    }

    /// What makes the run fail.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut add = |n: usize, what: &str| {
            if n > 0 {
                problems.push(format!("webhook: {n} {what}"));
            }
        };
        add(
            self.invalid_signatures,
            "deliveries with an invalid signature or timestamp",
        );
        add(
            self.fired_undelivered,
            "fired occurrences were never delivered and accepted (missing)",
        );
        add(
            self.fired_unacknowledged,
            "fired occurrences whose last attempt the receiver never acknowledged",
        );
        add(
            self.deliveries_without_fire,
            "deliveries for an occurrence with no ledger row (doubled)",
        );
        add(
            self.identity_mismatches,
            "deliveries whose id, key or body do not name one occurrence",
        );
        add(
            self.order_violations,
            "repeated deliveries not at a higher attempt (nor a resend after a 503)",
        );
        add(
            self.ahead_of_ledger,
            "deliveries at an attempt the ledger never reached",
        );
        add(self.failed_unexplained, "failed rows without a reason");
        add(
            self.failed_but_accepted,
            "failed occurrences the receiver had accepted",
        );
        add(
            self.refired_unexpected,
            "occurrences sent again after a failover with synchronous replication",
        );
        if self.deliveries > 0 && self.redeliveries == 0 {
            problems.push(
                "webhook: no occurrence was delivered again by a later attempt, so the run did \
                 not test redelivery"
                    .to_string(),
            );
        }
        if !problems.is_empty() && !self.examples.is_empty() {
            problems.push(format!(
                "webhook findings (first {}):\n    {}",
                self.examples.len(),
                self.examples.join("\n    ")
            ));
        }
        problems
    }
}

/// Checks the receiver's record against the ledger's rows:
///
/// - every delivery is verified (signature and timestamp), names by its body the occurrence its
///   `webhook-id` is the key of (and `Idempotency-Key` repeats it), and names a ledger row;
/// - every `fired` row was delivered and accepted at least once, and its last attempt was
///   acknowledged (2xx or 409) by the receiver;
/// - per id, in the receiver's order, each delivery after the first carries the same
///   occurrence and either a higher attempt than the one before it (a later claim) or the same
///   attempt right after a 503 (the backend's resend within its deadline); no delivery's attempt
///   is higher than its row's;
/// - a `failed` row is reported with its error, and needs one.
///
/// After a failover (`takeover`), a delivery at an attempt no higher than the one before it is
/// a refire when the one before came before the takeover: the claim that sent it was lost with
/// the primary. Under asynchronous replication it is counted and allowed (it carries the same
/// `webhook-id`, which the identity check holds it to); under synchronous replication it fails
/// the run. Deliveries from before the takeover may then also be ahead of the new ledger.
pub(super) fn check_deliveries(
    rows: &[FireRow],
    deliveries: &[Delivery],
    takeover: Option<Takeover>,
) -> WebhookCheck {
    let before_takeover = |d: &Delivery| takeover.is_some_and(|t| d.received_at < t.at);
    let mut check = WebhookCheck {
        deliveries: deliveries.len(),
        ..WebhookCheck::default()
    };
    let by_key: HashMap<String, &FireRow> = rows
        .iter()
        .map(|r| {
            let identity = Identity {
                routine_id: r.routine_id,
                scheduled_at: r.scheduled_at,
            };
            (identity.key(), r)
        })
        .collect();
    let mut ordered: Vec<&Delivery> = deliveries.iter().collect();
    ordered.sort_by_key(|d| d.seq);
    let mut by_id: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &ordered {
        by_id.entry(d.id.as_str()).or_default().push(d);
    }
    check.distinct_ids = by_id.len();
    check.second_deliveries = check.deliveries - check.distinct_ids;

    for d in &ordered {
        match d.answer {
            Answer::Accepted => check.accepted += 1,
            Answer::Duplicate => check.duplicates_409 += 1,
            Answer::Unavailable => check.refused_503 += 1,
            Answer::Unauthorized | Answer::BadRequest => check.refused_bad += 1,
        }
        if !d.delay.is_zero() {
            check.delayed += 1;
        }
        check.max_attempt = check.max_attempt.max(d.attempt.unwrap_or(0));
        if let Some(skew) = d.skew_secs {
            check.max_skew_secs = check.max_skew_secs.max(skew.abs());
        }
        if !d.verified() {
            check.invalid_signatures += 1;
            check.note(format!(
                "delivery {} of {} does not verify (signature {}, skew {:?} s)",
                d.seq,
                d.id,
                if d.signature_valid {
                    "valid"
                } else {
                    "invalid"
                },
                d.skew_secs
            ));
        }
        match d.identity {
            Some(identity) if identity.key() == d.id && d.idempotency_key == d.id => {}
            _ => {
                check.identity_mismatches += 1;
                check.note(format!(
                    "delivery {} has id {:?}, Idempotency-Key {:?} and body occurrence {:?}",
                    d.seq, d.id, d.idempotency_key, d.identity
                ));
            }
        }
        match by_key.get(d.id.as_str()) {
            None => {
                check.deliveries_without_fire += 1;
                check.note(format!(
                    "delivery {} of {} names no ledger row",
                    d.seq, d.id
                ));
            }
            Some(row) => {
                let refired_row = takeover.is_some_and(|t| t.refires_allowed) && before_takeover(d);
                if !refired_row
                    && d.attempt
                        .is_some_and(|a| i64::from(a) > i64::from(row.attempt))
                {
                    check.ahead_of_ledger += 1;
                    check.note(format!(
                        "delivery {} of {} is attempt {:?}; the ledger's row reached {}",
                        d.seq, d.id, d.attempt, row.attempt
                    ));
                }
            }
        }
    }

    for (id, list) in &by_id {
        let mut attempts = HashSet::new();
        for pair in list.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            attempts.insert(before.attempt);
            attempts.insert(after.attempt);
            if after.identity != before.identity {
                check.identity_mismatches += 1;
                check.note(format!(
                    "{id}: delivery {} names {:?}, the one before it {:?}",
                    after.seq, after.identity, before.identity
                ));
            }
            match (before.attempt, after.attempt) {
                (Some(b), Some(a)) if a > b => check.redeliveries += 1,
                (Some(b), Some(a)) if a == b && before.answer == Answer::Unavailable => {
                    check.resends += 1;
                }
                (Some(_), Some(_)) if before_takeover(before) && !before_takeover(after) => {
                    check.refired += 1;
                    if !takeover.is_some_and(|t| t.refires_allowed) {
                        check.refired_unexpected += 1;
                        check.note(format!(
                            "{id}: delivery {} at attempt {:?} was sent again after the failover",
                            after.seq, after.attempt
                        ));
                    }
                }
                _ => {
                    check.order_violations += 1;
                    check.note(format!(
                        "{id}: delivery {} is attempt {:?} after delivery {} at attempt {:?} \
                         answered {:?}",
                        after.seq, after.attempt, before.seq, before.attempt, before.answer
                    ));
                }
            }
        }
        if attempts.len() > 1 {
            check.ids_redelivered += 1;
        }
    }

    for row in rows {
        let key = Identity {
            routine_id: row.routine_id,
            scheduled_at: row.scheduled_at,
        }
        .key();
        let list = by_id.get(key.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        match row.status.as_str() {
            "fired" => {
                if !list
                    .iter()
                    .any(|d| d.verified() && d.answer == Answer::Accepted)
                {
                    check.fired_undelivered += 1;
                    check.note(format!(
                        "{key} is fired (attempt {}) but was never accepted ({} deliveries)",
                        row.attempt,
                        list.len()
                    ));
                }
                if !list.iter().any(|d| {
                    d.verified()
                        && d.answer.acknowledges()
                        && d.attempt
                            .is_some_and(|a| i64::from(a) == i64::from(row.attempt))
                }) {
                    check.fired_unacknowledged += 1;
                    check.note(format!(
                        "{key} is fired by attempt {}, which the receiver never acknowledged",
                        row.attempt
                    ));
                }
            }
            "failed" => {
                if row.error.trim().is_empty() {
                    check.failed_unexplained += 1;
                }
                if list.iter().any(|d| d.answer == Answer::Accepted) {
                    check.failed_but_accepted += 1;
                    check.note(format!(
                        "{key} is failed (attempt {}) but the receiver had accepted it",
                        row.attempt
                    ));
                }
                check.failed.push(format!(
                    "{key} failed at attempt {} ({} deliveries): {}",
                    row.attempt,
                    list.len(),
                    row.error
                ));
            }
            _ => {}
        }
    }
    check
}

/// The webhook backend of a run: its receiver and the secret file the schedulers sign with.
pub(in crate::chaos) struct WebhookBackend {
    receiver: Receiver,
    secret_file: std::path::PathBuf,
}

impl WebhookBackend {
    /// Starts the receiver before the schedulers, so none of their first sends fails to
    /// connect. Its answers follow the run's seed; its secret is new each run, written under
    /// `dir/webhook` with mode 0600.
    pub fn start(seed: u64, dir: &std::path::Path) -> anyhow::Result<Self> {
        let dir = dir.join("webhook");
        std::fs::create_dir_all(&dir)?;
        let secret = random_secret();
        let secret_file = dir.join("secret");
        write_private(&secret_file, &secret)?;
        let receiver = Receiver::start(&secret, seed)?;
        eprintln!(
            "chaos: webhook receiver at {}, secret in {}",
            receiver.url(),
            secret_file.display()
        );
        Ok(WebhookBackend {
            receiver,
            secret_file,
        })
    }

    pub fn scheduler_args(&self) -> Vec<String> {
        vec![
            "--message-backend".to_string(),
            "webhook".to_string(),
            "--webhook-url".to_string(),
            self.receiver.url().to_string(),
            "--webhook-secret-file".to_string(),
            self.secret_file.display().to_string(),
        ]
    }

    pub fn outage_switch(&self) -> OutageSwitch {
        self.receiver.outage_switch()
    }

    pub fn held_answers(&self) -> HeldAnswers {
        self.receiver.held_answers()
    }

    /// The receiver's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.receiver.port()
    }

    /// Writes the receiver's record to `dir/webhook/deliveries.tsv` and checks it.
    pub fn check(
        &self,
        rows: &[FireRow],
        takeover: Option<Takeover>,
        dir: &std::path::Path,
    ) -> anyhow::Result<Findings> {
        self.receiver
            .write_log(&dir.join("webhook").join("deliveries.tsv"))?;
        let w = check_deliveries(rows, &self.receiver.deliveries(), takeover);
        let mut f = Findings::default();
        f.line(
            "missing",
            format!(
                "{} fired rows never delivered and accepted",
                w.fired_undelivered
            ),
        );
        f.line(
            "doubled",
            format!(
                "{} deliveries for occurrences without a row",
                w.deliveries_without_fire
            ),
        );
        for failed in &w.failed {
            f.line("  failed", failed.clone());
        }
        f.line("webhook", self.receiver.url().to_string());
        f.line(
            "deliveries",
            format!(
                "{} of {} distinct webhook-ids; {} second deliveries: {} by a later attempt ({} ids), {} resends of one attempt after a 503, {} refired after a failover",
                w.deliveries,
                w.distinct_ids,
                w.second_deliveries,
                w.redeliveries,
                w.ids_redelivered,
                w.resends,
                w.refired
            ),
        );
        f.line(
            "answers",
            format!(
                "{} accepted ({} of them after a delay), {} 503, {} 409 (id already accepted), {} 401/400",
                w.accepted, w.delayed, w.refused_503, w.duplicates_409, w.refused_bad
            ),
        );
        f.line(
            "max attempt",
            format!(
                "{} delivered; largest clock skew {} s",
                w.max_attempt, w.max_skew_secs
            ),
        );
        f.line("invalid sigs", w.invalid_signatures.to_string());
        f.line(
            "order",
            format!(
                "{} repeated deliveries neither at a higher attempt nor a resend after a 503; {} ahead of the ledger",
                w.order_violations, w.ahead_of_ledger
            ),
        );
        f.line(
            "identity",
            format!(
                "{} deliveries whose id, key and body disagree; {} fired rows whose last attempt was not acknowledged; {} failed rows the receiver had accepted",
                w.identity_mismatches, w.fired_unacknowledged, w.failed_but_accepted
            ),
        );
        f.problems = w.problems();
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signature, as a sender would make it.
    fn sign(secret: &str, id: &str, timestamp: &str, body: &str) -> String {
        cm_dispatch::fakes::standard_webhooks::sign(secret, id, timestamp, body.as_bytes())
            .expect("a whsec_ secret")
    }

    #[test]
    fn random_secrets_are_fresh_whsec_keys_that_sign_and_verify() {
        let (a, b) = (random_secret(), random_secret());
        assert_ne!(a, b);
        let key = STANDARD.decode(a.strip_prefix("whsec_").unwrap()).unwrap();
        assert_eq!(key.len(), 32);
        let header = sign(&a, "cm-x-1", "1700000000", "{}");
        assert!(signature_valid(&a, "cm-x-1", "1700000000", b"{}", &header));
        assert!(!signature_valid(&b, "cm-x-1", "1700000000", b"{}", &header));
    }

    #[test]
    fn the_receivers_answers_follow_the_seed_in_the_documented_shares() {
        let ids: Vec<String> = (0..2000).map(|i| format!("cm-id-{i}")).collect();
        let first: Vec<(Answer, Duration)> = ids
            .iter()
            .map(|id| decide(7, id, 0, true, true, false))
            .collect();
        let again: Vec<(Answer, Duration)> = ids
            .iter()
            .map(|id| decide(7, id, 0, true, true, false))
            .collect();
        assert_eq!(first, again, "one seed, one behaviour");
        let other: Vec<(Answer, Duration)> = ids
            .iter()
            .map(|id| decide(8, id, 0, true, true, false))
            .collect();
        assert_ne!(first, other);

        let refused = first.iter().filter(|a| a.0 == Answer::Unavailable).count();
        let delayed = first.iter().filter(|a| !a.1.is_zero()).count();
        assert!((200..400).contains(&refused), "{refused} of 2000 refused");
        assert!((550..850).contains(&delayed), "{delayed} of 2000 delayed");
        assert!(
            first
                .iter()
                .all(|(_, d)| d.is_zero() || (MIN_DELAY..=MAX_DELAY).contains(d))
        );
        // A 503 comes once: the resend is accepted.
        for (id, (answer, _)) in ids.iter().zip(&first) {
            if *answer == Answer::Unavailable {
                assert_eq!(decide(7, id, 1, true, true, false).0, Answer::Accepted);
            }
        }
        // Whatever the seed: a bad signature is refused, a known id is a duplicate.
        assert_eq!(
            decide(7, "cm-a", 0, false, true, false).0,
            Answer::Unauthorized
        );
        assert_eq!(
            decide(7, "cm-a", 0, true, false, false).0,
            Answer::BadRequest
        );
        assert_eq!(decide(7, "cm-a", 3, true, true, true).0, Answer::Duplicate);
    }

    /// A real request, signed as the backend signs it, through the running receiver.
    #[test]
    fn the_receiver_records_and_verifies_what_it_is_sent() {
        let secret = random_secret();
        let receiver = Receiver::start(&secret, 1).unwrap();
        let identity = Identity {
            routine_id: Uuid::new_v4(),
            scheduled_at: "2026-01-01T00:00:00Z".parse().unwrap(),
        };
        let id = identity.key();
        let body = serde_json::json!({
            "type": EVENT_TYPE,
            "timestamp": Utc::now().to_rfc3339(),
            "data": {"routine_id": identity.routine_id, "routine_name": "r",
                     "scheduled_at": "2026-01-01T00:00:00Z", "attempt": 2, "payload": {}},
        })
        .to_string();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let post = |signature: String, timestamp: i64| {
            let url = receiver.url().to_string();
            let (id, body) = (id.clone(), body.clone());
            rt.block_on(async move {
                let addr = url
                    .trim_start_matches("http://")
                    .trim_end_matches("/chaos")
                    .to_string();
                let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let request = format!(
                    "POST /chaos HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                     webhook-id: {id}\r\nidempotency-key: {id}\r\nwebhook-timestamp: {timestamp}\r\n\
                     webhook-signature: {signature}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                stream.write_all(request.as_bytes()).await.unwrap();
                let mut answer = String::new();
                stream.read_to_string(&mut answer).await.unwrap();
                answer
            })
        };
        let now = Utc::now().timestamp();
        let good = sign(&secret, &id, &now.to_string(), &body);
        let stale = now - 2 * TOLERANCE_SECS;
        let answers = [
            post(sign(&random_secret(), &id, &now.to_string(), &body), now),
            post(sign(&secret, &id, &stale.to_string(), &body), stale),
            post(good.clone(), now),
        ];
        assert!(answers[0].starts_with("HTTP/1.1 401"), "{}", answers[0]);
        assert!(answers[1].starts_with("HTTP/1.1 401"), "{}", answers[1]);
        let deliveries = receiver.deliveries();
        assert_eq!(deliveries.len(), 3);
        assert_eq!(
            deliveries
                .iter()
                .map(Delivery::verified)
                .collect::<Vec<_>>(),
            [false, false, true]
        );
        assert!(
            deliveries[1].signature_valid,
            "the stale one is signed right"
        );
        let last = &deliveries[2];
        assert_eq!(
            (last.seq, last.id.as_str(), last.attempt, last.identity),
            (2, id.as_str(), Some(2), Some(identity))
        );
        // The id's third request: past the one 503 a seed may give, so it is accepted.
        assert_eq!(last.answer, Answer::Accepted);
        assert!(answers[2].starts_with("HTTP/1.1 200"), "{}", answers[2]);
    }

    // The check, on hand-made records.

    fn at(s: i64) -> DateTime<Utc> {
        "2026-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap() + chrono::TimeDelta::seconds(s)
    }

    fn row(routine: Uuid, s: i64, status: &str, attempt: i32) -> FireRow {
        FireRow {
            routine_id: routine,
            scheduled_at: at(s),
            status: status.into(),
            attempt,
            error: if status == "failed" {
                "abandoned: 10 earlier attempts ended without settling".into()
            } else {
                String::new()
            },
        }
    }

    struct Log(Vec<Delivery>);

    impl Log {
        fn add(&mut self, routine: Uuid, s: i64, attempt: u32, answer: Answer) -> &mut Delivery {
            let identity = Identity {
                routine_id: routine,
                scheduled_at: at(s),
            };
            self.0.push(Delivery {
                seq: self.0.len() as u64,
                id: identity.key(),
                idempotency_key: identity.key(),
                timestamp: Some(1),
                skew_secs: Some(0),
                signature_valid: true,
                identity: Some(identity),
                attempt: Some(attempt),
                answer,
                delay: Duration::ZERO,
                received_at: Utc::now(),
            });
            self.0.last_mut().unwrap()
        }
    }

    /// Three occurrences: one delivered once, one refused once and resent, one accepted by
    /// attempt 1 (whose claimant was then killed) and delivered again by attempt 2.
    fn clean() -> (Vec<FireRow>, Log, Uuid) {
        let r = Uuid::new_v4();
        let rows = vec![
            row(r, 0, "fired", 1),
            row(r, 1, "fired", 1),
            row(r, 2, "fired", 2),
        ];
        let mut log = Log(Vec::new());
        log.add(r, 0, 1, Answer::Accepted);
        log.add(r, 1, 1, Answer::Unavailable);
        log.add(r, 2, 1, Answer::Accepted).delay = Duration::from_millis(800);
        log.add(r, 1, 1, Answer::Accepted);
        log.add(r, 2, 2, Answer::Duplicate);
        (rows, log, r)
    }

    #[test]
    fn a_clean_record_passes_and_counts_its_second_deliveries() {
        let (rows, log, _) = clean();
        let check = check_deliveries(&rows, &log.0, None);
        assert!(check.problems().is_empty(), "{:?}", check.problems());
        assert_eq!(
            (
                check.deliveries,
                check.distinct_ids,
                check.second_deliveries,
                check.resends,
                check.redeliveries,
                check.ids_redelivered,
                check.max_attempt
            ),
            (5, 3, 2, 1, 1, 1, 2)
        );
        assert_eq!(
            (
                check.accepted,
                check.delayed,
                check.refused_503,
                check.duplicates_409
            ),
            (3, 1, 1, 1)
        );
    }

    fn problems_of(rows: &[FireRow], log: &Log) -> (WebhookCheck, String) {
        let check = check_deliveries(rows, &log.0, None);
        let text = check.problems().join("\n");
        (check, text)
    }

    #[test]
    fn a_doubled_id_at_a_lower_attempt_is_found() {
        let (rows, mut log, r) = clean();
        log.add(r, 2, 1, Answer::Duplicate);
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(check.order_violations, 1, "{text}");
        assert!(text.contains("not at a higher attempt"), "{text}");
    }

    #[test]
    fn the_same_attempt_again_after_an_acceptance_is_found() {
        let (rows, mut log, r) = clean();
        log.add(r, 0, 1, Answer::Duplicate);
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(check.order_violations, 1, "{text}");
    }

    #[test]
    fn a_bad_signature_or_a_stale_timestamp_is_found() {
        let (rows, mut log, r) = clean();
        log.add(r, 2, 3, Answer::Unauthorized).signature_valid = false;
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(check.invalid_signatures, 1, "{text}");
        assert!(text.contains("invalid signature"), "{text}");
        // The attempt after the row's is also a delivery the ledger never reached.
        assert_eq!(check.ahead_of_ledger, 1, "{text}");

        let (rows, mut log, r) = clean();
        log.0[0].skew_secs = Some(TOLERANCE_SECS + 1);
        log.add(r, 5, 1, Answer::Accepted).skew_secs = None;
        let rows = [rows, vec![row(r, 5, "fired", 1)]].concat();
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(check.invalid_signatures, 2, "{text}");
        // Neither counts as the acceptance their occurrences needed.
        assert_eq!(check.fired_undelivered, 2, "{text}");
    }

    #[test]
    fn a_fired_row_never_delivered_is_found() {
        let (mut rows, log, r) = clean();
        rows.push(row(r, 3, "fired", 1));
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(
            (check.fired_undelivered, check.fired_unacknowledged),
            (1, 1),
            "{text}"
        );
        assert!(text.contains("never delivered"), "{text}");
    }

    #[test]
    fn a_fired_attempt_the_receiver_never_acknowledged_is_found() {
        // Attempt 1 was accepted, but the ledger says attempt 2 fired, and attempt 2's only
        // delivery was refused.
        let (rows, mut log, r) = clean();
        log.0.pop();
        log.add(r, 2, 2, Answer::Unavailable);
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(
            (check.fired_undelivered, check.fired_unacknowledged),
            (0, 1),
            "{text}"
        );
    }

    #[test]
    fn a_delivery_without_a_fire_is_found() {
        let (rows, mut log, _) = clean();
        log.add(Uuid::new_v4(), 0, 1, Answer::Accepted);
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(check.deliveries_without_fire, 1, "{text}");
        assert!(text.contains("doubled"), "{text}");
    }

    #[test]
    fn an_id_that_does_not_name_its_body_is_found() {
        let (rows, mut log, r) = clean();
        // The id of second 0 on a body of second 1.
        let first_id = log.0[0].id.clone();
        let d = log.add(r, 1, 2, Answer::Duplicate);
        d.id = first_id.clone();
        d.idempotency_key = first_id;
        let (check, text) = problems_of(&rows, &log);
        // The body disagrees with its id, and with the id's first delivery.
        assert_eq!(check.identity_mismatches, 2, "{text}");

        let (rows, mut log, r) = clean();
        log.add(r, 0, 2, Answer::Duplicate).idempotency_key = "other".into();
        let (check, _) = problems_of(&rows, &log);
        assert_eq!(check.identity_mismatches, 1);
    }

    #[test]
    fn failed_rows_are_reported_and_need_a_reason() {
        let (mut rows, log, r) = clean();
        rows.push(row(r, 3, "failed", 11));
        let (check, text) = problems_of(&rows, &log);
        assert!(text.is_empty(), "{text}");
        assert_eq!(check.failed.len(), 1);
        assert!(check.failed[0].contains("abandoned"), "{:?}", check.failed);
        rows.last_mut().unwrap().error = String::new();
        let (check, _) = problems_of(&rows, &log);
        assert_eq!(check.failed_unexplained, 1);
    }

    #[test]
    fn a_run_without_any_redelivery_is_not_a_pass() {
        let r = Uuid::new_v4();
        let mut log = Log(Vec::new());
        log.add(r, 0, 1, Answer::Accepted);
        let (_, text) = problems_of(&[row(r, 0, "fired", 1)], &log);
        assert!(text.contains("did not test redelivery"), "{text}");
    }

    #[test]
    fn a_failed_row_the_receiver_accepted_is_found() {
        let (mut rows, mut log, r) = clean();
        rows.push(row(r, 3, "failed", 1));
        log.add(r, 3, 1, Answer::Accepted);
        let (check, text) = problems_of(&rows, &log);
        assert_eq!(check.failed_but_accepted, 1, "{text}");
        assert!(
            text.contains("failed occurrences the receiver had accepted"),
            "{text}"
        );
    }

    /// After an asynchronous failover the new primary lost attempt 2 of second 2 and claimed
    /// it afresh: its attempt 1 after the takeover is a refire, allowed, and the delivery at
    /// attempt 2 before it is not "ahead" of the new ledger. After a synchronous one the same
    /// record fails the run.
    #[test]
    fn a_refire_after_a_failover_is_allowed_only_when_replication_was_asynchronous() {
        let (mut rows, mut log, r) = clean();
        let takeover_at = Utc::now() + chrono::TimeDelta::seconds(1);
        rows[2].attempt = 1;
        log.add(r, 2, 1, Answer::Duplicate).received_at =
            takeover_at + chrono::TimeDelta::seconds(1);
        let takeover = |refires_allowed| Takeover {
            at: takeover_at,
            refires_allowed,
        };
        let check = check_deliveries(&rows, &log.0, Some(takeover(true)));
        assert!(check.problems().is_empty(), "{:?}", check.problems());
        assert_eq!((check.refired, check.ahead_of_ledger), (1, 0));
        let check = check_deliveries(&rows, &log.0, Some(takeover(false)));
        assert_eq!(check.refired_unexpected, 1);
        assert!(!check.problems().is_empty());
        // Without a failover the same record is a delivery at a lower attempt.
        let check = check_deliveries(&rows, &log.0, None);
        assert_eq!(check.order_violations, 1);
    }
}
