//! A webhook receiver for tests: a real HTTP server on 127.0.0.1 that verifies Standard Webhooks
//! signatures with the tests' own verifier (`cm_dispatch::fakes::standard_webhooks`, not the
//! `standardwebhooks` crate the backend signs with), records every request, and answers as the
//! test scripts it: by default 204 for a new `webhook-id` and 409 for one it already accepted.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use cm_dispatch::conformance::EffectProbe;
use cm_dispatch::fakes::standard_webhooks::signature_valid;
use cm_domain::IdempotencyKey;
use serde_json::Value;

/// The secret every test receiver shares with its backend.
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The request's path.
    pub path: String,
    /// `webhook-id`.
    pub id: String,
    /// `Idempotency-Key`.
    pub idempotency_key: String,
    /// `traceparent`.
    pub traceparent: String,
    /// `webhook-timestamp`.
    pub timestamp: i64,
    /// Whether `webhook-signature` verified against the body, id and timestamp.
    pub signature_valid: bool,
    /// The body, parsed.
    pub body: Value,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: String,
}

impl Answer {
    /// An answer with `status` and `body`.
    pub fn new(status: u16, body: &str) -> Self {
        Answer {
            status,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    /// The same answer with a header.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }
}

#[derive(Debug, Default)]
struct State_ {
    deliveries: Vec<Delivery>,
    accepted: HashSet<String>,
    script: VecDeque<Answer>,
    stalled: bool,
    refusing: Option<String>,
}

/// The receiver: where it listens, and what it saw.
#[derive(Debug, Clone)]
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<State_>>,
}

impl Receiver {
    /// Starts a receiver on an ephemeral port of 127.0.0.1.
    pub async fn start() -> Receiver {
        let state = Arc::new(Mutex::new(State_::default()));
        let app = Router::new().fallback(receive).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { addr, state }
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answers the next requests with `answers`, in order, before going back to the default.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.lock().script.extend(answers);
    }

    /// Every request so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().deliveries.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State_> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn receive(
    State(state): State<Arc<Mutex<State_>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (id, timestamp) = (header("webhook-id"), header("webhook-timestamp"));
    let fresh = timestamp
        .parse::<i64>()
        .is_ok_and(|ts| (chrono::Utc::now().timestamp() - ts).abs() <= 300);
    let delivery = Delivery {
        path: uri.path().to_string(),
        id: id.clone(),
        idempotency_key: header("idempotency-key"),
        traceparent: header("traceparent"),
        timestamp: timestamp.parse().unwrap_or_default(),
        signature_valid: fresh
            && signature_valid(SECRET, &id, &timestamp, &body, &header("webhook-signature")),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: std::time::Instant::now(),
    };
    let valid = delivery.signature_valid;
    let (stalled, answer) = {
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        state.deliveries.push(delivery);
        let answer = if let Some(answer) = state.script.pop_front() {
            if (200..300).contains(&answer.status) && valid {
                state.accepted.insert(id.clone());
            }
            Some(answer)
        } else if let Some(reason) = &state.refusing {
            Some(Answer::new(400, reason))
        } else if state.stalled {
            None
        } else if !valid {
            Some(Answer::new(401, "bad signature"))
        } else if state.accepted.insert(id.clone()) {
            Some(Answer::new(204, ""))
        } else {
            Some(Answer::new(409, "already received"))
        };
        (state.stalled, answer)
    };
    match answer {
        Some(answer) => {
            let mut response =
                (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
            for (name, value) in answer.headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        None => {
            debug_assert!(stalled);
            // A stalled target holds the request on purpose, past any deadline.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
    }
}

#[async_trait]
impl EffectProbe for Receiver {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        Ok(usize::from(self.lock().accepted.contains(key.as_str())))
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        Ok(self
            .lock()
            .deliveries
            .iter()
            .find(|d| d.id == key.as_str() && d.signature_valid)
            .map(|d| d.body["data"]["payload"].clone()))
    }
    async fn stall(&self) -> Result<(), String> {
        self.lock().stalled = true;
        Ok(())
    }
    async fn fail(&self, reason: &str) -> Result<(), String> {
        self.lock().refusing = Some(reason.to_string());
        Ok(())
    }
    async fn heal(&self) -> Result<(), String> {
        let mut state = self.lock();
        state.stalled = false;
        state.refusing = None;
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        Some(SECRET.to_string())
    }
}
