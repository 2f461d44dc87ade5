//! The webhook backend against a real HTTP receiver that verifies signatures independently.

use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use cm_dispatch::conformance::check_backend;
use cm_dispatch::webhook::{RetryPolicy, WebhookSecret};
use cm_dispatch::{Dispatch, DispatchError, Dispatcher, WebhookDispatcher};
use cm_domain::Occurrence;
use cm_domain::RoutineKind;
use serde_json::json;

use crate::receiver::{Answer, Receiver, SECRET};

/// Quick retries, so a test with several retries stays short.
const QUICK: RetryPolicy = RetryPolicy {
    initial_backoff: Duration::from_millis(20),
    max_backoff: Duration::from_millis(100),
};

fn backend(url: &str) -> WebhookDispatcher {
    WebhookDispatcher::new(url, WebhookSecret::parse(SECRET).unwrap())
        .unwrap()
        .with_retry(QUICK)
}

fn dispatch(within: Duration) -> Dispatch {
    Dispatch::new(
        Occurrence::new(
            uuid::Uuid::new_v4(),
            Utc.with_ymd_and_hms(2026, 3, 29, 1, 30, 0).unwrap(),
        ),
        "standup",
        RoutineKind::Message,
        json!({ "text": "standup in 5" }),
        2,
        Instant::now() + within,
    )
}

#[tokio::test]
async fn webhook_backend_conforms() {
    let receiver = Receiver::start().await;
    check_backend(
        &backend(&receiver.url("/hook")),
        &receiver,
        RoutineKind::Message,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_delivery_carries_the_standard_webhooks_contract() {
    let receiver = Receiver::start().await;
    let d = dispatch(Duration::from_secs(10));
    let receipt = backend(&receiver.url("/hook")).dispatch(&d).await.unwrap();
    assert_eq!(
        (receipt.duplicate, receipt.detail.as_str()),
        (false, "HTTP 204")
    );

    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 1);
    let got = &deliveries[0];
    assert!(got.signature_valid, "{got:?}");
    assert_eq!(got.id, d.idempotency_key.as_str());
    assert_eq!(got.idempotency_key, d.idempotency_key.as_str());
    assert_eq!(got.traceparent, d.traceparent().to_string());
    assert!(got.traceparent.starts_with("00-") && got.traceparent.ends_with("-01"));
    assert!((Utc::now().timestamp() - got.timestamp).abs() <= 5);
    assert_eq!(got.body["type"], "cm.routine.fired");
    assert!(
        chrono::DateTime::parse_from_rfc3339(got.body["timestamp"].as_str().unwrap()).is_ok(),
        "{}",
        got.body
    );
    assert_eq!(
        got.body["data"],
        json!({
            "routine_id": d.occurrence.routine_id,
            "routine_name": "standup",
            "scheduled_at": "2026-03-29T01:30:00Z",
            "attempt": 2,
            "payload": { "text": "standup in 5" },
        })
    );
}

/// What one dispatch against a scripted receiver must come to.
struct Case {
    name: &'static str,
    script: Vec<Answer>,
    /// `Ok(detail)` or `Err(a fragment of the error)`.
    expected: Result<&'static str, &'static str>,
    /// How many requests the receiver gets.
    sends: usize,
}

async fn check(case: Case) {
    let receiver = Receiver::start().await;
    receiver.script(case.script);
    let d = dispatch(Duration::from_secs(5));
    let outcome = backend(&receiver.url("/hook")).dispatch(&d).await;
    let deliveries = receiver.deliveries();
    match (&outcome, case.expected) {
        (Ok(receipt), Ok(detail)) => assert_eq!(receipt.detail, detail, "{}", case.name),
        (Err(e), Err(fragment)) => {
            assert!(e.to_string().contains(fragment), "{}: {e}", case.name);
        }
        _ => panic!("{}: got {outcome:?}", case.name),
    }
    assert_eq!(
        deliveries.len(),
        case.sends,
        "{}: {deliveries:?}",
        case.name
    );
    for delivery in &deliveries {
        // Every send, retries included, is the same occurrence, validly signed.
        assert_eq!(delivery.path, "/hook", "{}", case.name);
        assert_eq!(delivery.id, d.idempotency_key.as_str(), "{}", case.name);
        assert!(delivery.signature_valid, "{}: {delivery:?}", case.name);
        assert_eq!(delivery.body["data"]["attempt"], 2, "{}", case.name);
    }
}

#[tokio::test]
async fn answers_decide_fired_retried_or_failed() {
    let cases = [
        Case {
            name: "2xx",
            script: vec![Answer::new(200, "ok")],
            expected: Ok("HTTP 200"),
            sends: 1,
        },
        Case {
            name: "409 is the receiver already having it",
            script: vec![Answer::new(409, "dup")],
            expected: Ok("HTTP 409 already received"),
            sends: 1,
        },
        Case {
            name: "other 4xx fails at once",
            script: vec![Answer::new(422, "payload has no channel")],
            expected: Err("rejected: HTTP 422 Unprocessable Entity: payload has no channel"),
            sends: 1,
        },
        Case {
            name: "5xx then 2xx is retried",
            script: vec![
                Answer::new(503, "busy"),
                Answer::new(500, "oops"),
                Answer::new(202, ""),
            ],
            expected: Ok("HTTP 202"),
            sends: 3,
        },
        Case {
            name: "408 is retried",
            script: vec![Answer::new(408, ""), Answer::new(204, "")],
            expected: Ok("HTTP 204"),
            sends: 2,
        },
        Case {
            name: "a redirect is not followed",
            script: vec![Answer::new(307, "").header("location", "/elsewhere")],
            expected: Err("HTTP 307 Temporary Redirect (redirects are not followed)"),
            sends: 1,
        },
    ];
    for case in cases {
        check(case).await;
    }
}

/// A backend whose own backoff (10 ms) is far below a `Retry-After` and whose ceiling (5 s) is
/// above it, so a wait of a second or more can only come from the header.
fn honouring_retry_after(receiver: &Receiver) -> WebhookDispatcher {
    WebhookDispatcher::new(
        &receiver.url("/hook"),
        WebhookSecret::parse(SECRET).unwrap(),
    )
    .unwrap()
    .with_retry(RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_secs(5),
    })
}

#[tokio::test]
async fn a_429_waits_as_long_as_retry_after_says() {
    let receiver = Receiver::start().await;
    receiver.script([
        Answer::new(429, "slow down").header("retry-after", "1"),
        Answer::new(204, ""),
    ]);
    let d = dispatch(Duration::from_secs(10));
    let webhook = honouring_retry_after(&receiver);
    let receipt = webhook.dispatch(&d).await.unwrap();
    assert_eq!(receipt.detail, "HTTP 204");
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 2);
    let waited = deliveries[1].at - deliveries[0].at;
    assert!(
        waited >= Duration::from_millis(950),
        "waited only {waited:?}"
    );
    assert!(deliveries.iter().all(|d| d.signature_valid));
}

#[tokio::test]
async fn a_503_with_an_http_date_retry_after_waits_until_that_date() {
    let receiver = Receiver::start().await;
    // Two seconds ahead at whole-second resolution: at least one second is left to wait.
    let at = chrono::Utc::now() + chrono::TimeDelta::seconds(2);
    let date = at.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    receiver.script([
        Answer::new(503, "maintenance").header("retry-after", &date),
        Answer::new(200, ""),
    ]);
    let d = dispatch(Duration::from_secs(10));
    let webhook = honouring_retry_after(&receiver);
    let receipt = webhook.dispatch(&d).await.unwrap();
    assert_eq!(receipt.detail, "HTTP 200");
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 2);
    let waited = deliveries[1].at - deliveries[0].at;
    assert!(
        waited >= Duration::from_millis(950),
        "waited only {waited:?} for {date}"
    );
}

#[tokio::test]
async fn retries_stop_at_the_deadline_with_the_last_answer() {
    let receiver = Receiver::start().await;
    receiver.script((0..1000).map(|_| Answer::new(503, "still down")));
    let d = dispatch(Duration::from_millis(800));
    let started = Instant::now();
    let err = backend(&receiver.url("/hook"))
        .dispatch(&d)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, DispatchError::Unavailable(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("HTTP 503 Service Unavailable: still down"),
        "{err}"
    );
    assert!(
        took <= Duration::from_millis(800 + 500),
        "returned after {took:?}"
    );
    assert!(receiver.deliveries().len() >= 2, "it did not retry");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retried_until_the_deadline() {
    // A port nothing listens on: bind one, then free it.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let d = dispatch(Duration::from_millis(600));
    let started = Instant::now();
    let err = backend(&format!("http://127.0.0.1:{port}/hook"))
        .dispatch(&d)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot connect"), "{err}");
    assert!(started.elapsed() <= Duration::from_millis(600 + 500));
}

#[tokio::test]
async fn errors_hold_no_secret_and_a_bounded_excerpt() {
    let receiver = Receiver::start().await;
    let key = SECRET.trim_start_matches("whsec_");
    // A receiver that echoes everything it knows, at length.
    let echo = format!(
        "denied: secret {SECRET} key {key} token tok3n-value pass p4ss-value {}",
        "x".repeat(10_000)
    );
    receiver.script([Answer::new(403, &echo)]);
    let url = receiver
        .url("/hook?token=tok3n-value")
        .replace("http://", "http://user:p4ss-value@");
    let err = backend(&url)
        .dispatch(&dispatch(Duration::from_secs(5)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("rejected: HTTP 403 Forbidden: denied: secret ***"),
        "{err}"
    );
    for secret in [SECRET, key, "tok3n-value", "p4ss-value", "127.0.0.1"] {
        assert!(!err.contains(secret), "{secret} in {err}");
    }
    assert!(
        err.chars().count() < 300,
        "{} characters",
        err.chars().count()
    );
    let shown = backend(&url).shown_url();
    assert!(
        !shown.contains("p4ss-value") && !shown.contains("tok3n-value"),
        "{shown}"
    );
}

/// How an [`Endless`] receiver frames the body it never finishes.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// `Transfer-Encoding: chunked`, chunk after chunk, never the last.
    Chunked,
    /// A `Content-Length` of a terabyte, sent as fast as it is read.
    HugeLength,
}

/// A receiver that answers every request with a status and a body that does not end (or would
/// take a terabyte to), counting the bytes it manages to send. A raw TCP server: an HTTP
/// framework would buffer or pace the body itself.
struct Endless {
    addr: std::net::SocketAddr,
    /// Requests answered so far.
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Connections still being written to.
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The most body bytes the receiver got into one connection before it was closed.
    most_sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Endless {
    async fn start(status: &'static str, framing: Framing) -> Endless {
        use std::sync::atomic::Ordering::SeqCst;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endless = Endless {
            addr: listener.local_addr().unwrap(),
            requests: Default::default(),
            open: Default::default(),
            most_sent: Default::default(),
        };
        let (requests, open, most_sent) = (
            endless.requests.clone(),
            endless.open.clone(),
            endless.most_sent.clone(),
        );
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (requests, open, most_sent) =
                    (requests.clone(), open.clone(), most_sent.clone());
                open.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    // The request: its head, then as many body bytes as it declares.
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    let complete = |request: &[u8]| {
                        let text = String::from_utf8_lossy(request).to_ascii_lowercase();
                        let Some(end) = text.find("\r\n\r\n") else {
                            return false;
                        };
                        let length = text[..end]
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        request.len() >= end + 4 + length
                    };
                    while !complete(&request) {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => {
                                open.fetch_sub(1, SeqCst);
                                return;
                            }
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    requests.fetch_add(1, SeqCst);
                    let framing_header = match framing {
                        Framing::Chunked => "transfer-encoding: chunked".to_string(),
                        Framing::HugeLength => format!("content-length: {}", 1u64 << 40),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\n{framing_header}\r\n\r\n"
                    );
                    let piece = "endless answer ".repeat(4096);
                    let piece = match framing {
                        Framing::Chunked => format!("{:x}\r\n{piece}\r\n", piece.len()),
                        Framing::HugeLength => piece,
                    };
                    let mut sent = 0u64;
                    if socket.write_all(head.as_bytes()).await.is_ok() {
                        while socket.write_all(piece.as_bytes()).await.is_ok() {
                            sent += piece.len() as u64;
                            most_sent.fetch_max(sent, SeqCst);
                        }
                    }
                    open.fetch_sub(1, SeqCst);
                });
            }
        });
        endless
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Waits until the client has closed every connection, and returns the most body bytes one
    /// of them carried.
    async fn closed(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        cm_dispatch::fakes::wait::wait_until(
            "the client to close every connection",
            cm_dispatch::fakes::wait::PATIENCE,
            async || self.open.load(SeqCst),
            |open| *open == 0,
        )
        .await;
        self.most_sent.load(SeqCst)
    }
}

/// What the kernel's buffers and the client's may hold of an answer the client stopped
/// reading: the sender gets that far before its writes fail. A client reading the body whole
/// would take it all, gigabytes within the test's deadline.
const BUFFERED_AT_MOST: u64 = 64 << 20;

/// A receiver's answer is judged by its status; of its body only an excerpt is read, and one
/// that never ends (or declares a terabyte) does not hold the dispatch or its memory.
#[tokio::test]
async fn an_endless_answer_is_judged_by_its_status_and_read_no_further_than_an_excerpt() {
    use std::sync::atomic::Ordering::SeqCst;
    for framing in [Framing::Chunked, Framing::HugeLength] {
        // A success: fired at once, well before the deadline it would otherwise wait for.
        let ok = Endless::start("200 OK", framing).await;
        let receipt = backend(&ok.url())
            .dispatch(&dispatch(Duration::from_secs(30)))
            .await
            .unwrap_or_else(|e| panic!("{framing:?}: {e}"));
        assert_eq!(receipt.detail, "HTTP 200", "{framing:?}");
        assert_eq!(ok.requests.load(SeqCst), 1, "{framing:?}");
        let sent = ok.closed().await;
        assert!(sent < BUFFERED_AT_MOST, "{framing:?}: {sent} bytes sent");

        // A server error: retried until the deadline, and the error keeps a bounded excerpt.
        let failing = Endless::start("500 Internal Server Error", framing).await;
        let err = backend(&failing.url())
            .dispatch(&dispatch(Duration::from_secs(2)))
            .await
            .unwrap_err();
        assert!(matches!(err, DispatchError::Unavailable(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("HTTP 500 Internal Server Error: endless answer endless answer"),
            "{framing:?}: {text}"
        );
        // The excerpt (EXCERPT_CHARS) and the words around it.
        assert!(
            text.chars().count() < cm_dispatch::webhook::EXCERPT_CHARS + 200,
            "{framing:?}: {} characters",
            text.chars().count()
        );
        // Each send's answer was left after its excerpt, so the backend had time to try again.
        assert!(failing.requests.load(SeqCst) >= 2, "{framing:?}: no retry");
        let sent = failing.closed().await;
        assert!(sent < BUFFERED_AT_MOST, "{framing:?}: {sent} bytes sent");
    }
}
