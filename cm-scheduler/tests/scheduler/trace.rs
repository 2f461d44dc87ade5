//! A fire followed across systems: the scheduler binary sends each webhook with the W3C
//! `traceparent` of its attempt, and `fires --json` and `fires show` name the same context from
//! the ledger's row. With `--otlp-endpoint`, each attempt's claim, dispatch and settle reach an
//! OTLP/HTTP receiver as spans of that trace, the dispatch span the one the webhook names.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use cm_dispatch::fakes::standard_webhooks::signature_valid;

use crate::cli::{create_args, ok};
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, cm_scheduler, eventually_within};

/// Each request's `webhook-id` and `traceparent`.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// The signing secret every [`Hook`] gives the scheduler.
pub(crate) const SECRET: &str = "whsec_dHJhY2VwYXJlbnQtdGVzdC1rZXk=";

/// Records a signed request's `webhook-id` and `traceparent`; refuses one whose Standard
/// Webhooks signature does not verify, as a receiver would (its fire then fails the test).
async fn receive(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) -> StatusCode {
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
    seen.lock().unwrap().push((id, header("traceparent")));
    StatusCode::NO_CONTENT
}

/// A webhook receiver serving `app`, and the scheduler flags that send to it (a signing secret
/// in a directory of its own, removed when this is dropped).
pub(crate) struct Hook {
    url: String,
    dir: std::path::PathBuf,
    secret: String,
}

impl Hook {
    pub(crate) async fn serve(db: &TestDb, name: &str, app: Router) -> Hook {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = std::env::temp_dir().join(format!("{}-{name}", db.name));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
        let secret = secret.to_str().unwrap().to_string();
        Hook { url, dir, secret }
    }

    /// `--message-backend webhook` to this receiver.
    pub(crate) fn args(&self) -> [&str; 6] {
        [
            "--message-backend",
            "webhook",
            "--webhook-url",
            &self.url,
            "--webhook-secret-file",
            &self.secret,
        ]
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

#[tokio::test]
async fn a_webhook_carries_the_traceparent_the_ledger_names() {
    let db = TestDb::new().await;
    let seen: Seen = Arc::default();
    let hook = Hook::serve(
        &db,
        "trace",
        Router::new().fallback(receive).with_state(seen.clone()),
    )
    .await;

    ok(
        &db.url,
        &create_args("traced", "* * * * * *", &["--message", "hello"]),
    );
    let mut scheduler = SchedulerProcess::start_with(&db, "trace", &hook.args(), &[]);
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
}

/// The spans an OTLP/HTTP receiver was sent, each with its resource's attributes.
type Exported = Arc<Mutex<Vec<(Vec<(String, String)>, Span)>>>;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

/// An OTLP/HTTP receiver: takes `/v1/traces` only, with the token the scheduler is given in
/// `OTEL_EXPORTER_OTLP_HEADERS`; decodes each request with the protocol's own messages, and
/// answers as a collector does.
async fn otlp_receiver() -> (String, Exported) {
    async fn traces(
        State(exported): State<Exported>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> (StatusCode, Vec<u8>) {
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/x-protobuf")
        );
        // A hosted collector's credential, from OTEL_EXPORTER_OTLP_HEADERS.
        if headers.get("x-otlp-token").and_then(|v| v.to_str().ok()) != Some("otlp-test") {
            return (StatusCode::UNAUTHORIZED, Vec::new());
        }
        let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
        let mut exported = exported.lock().unwrap();
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| r.attributes.iter().map(text).collect::<Vec<_>>())
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    exported.push((resource.clone(), span));
                }
            }
        }
        (
            StatusCode::OK,
            ExportTraceServiceResponse::default().encode_to_vec(),
        )
    }
    let exported: Exported = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/v1/traces", axum::routing::post(traces))
        .with_state(exported.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, exported)
}

/// An attribute as text.
fn text(kv: &KeyValue) -> (String, String) {
    let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    (kv.key.clone(), value)
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .map(text)
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs a scheduler with `--otlp-endpoint` (and `backend`) until two occurrences of an
/// every-second routine fired, stops it, and returns the fires' rows and the spans exported
/// (the last are sent as it stops).
async fn traced_run(
    db: &TestDb,
    backend: &[&str],
    status: &str,
) -> (Vec<serde_json::Value>, Vec<(Vec<(String, String)>, Span)>) {
    let (endpoint, exported) = otlp_receiver().await;
    ok(
        &db.url,
        &create_args("traced", "* * * * * *", &["--message", "hello"]),
    );
    let mut args = vec!["--otlp-endpoint", endpoint.as_str()];
    args.extend_from_slice(backend);
    let mut scheduler = SchedulerProcess::start_with_settings(
        db,
        "otlp",
        &["--tick-interval", "200ms"],
        &args,
        &[("OTEL_EXPORTER_OTLP_HEADERS", "x-otlp-token=otlp-test")],
    );
    eventually_within(Duration::from_secs(30), async || {
        let fired = ok(&db.url, &["fires", "--json"])
            .lines()
            .filter(|l| l.contains(&format!(r#""status":"{status}""#)))
            .count();
        (fired >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("no two fires within 30 s; log:\n{}", scheduler.log()));
    scheduler.shut_down_gracefully().await;
    // Every fire settled before the exit was sent before it: the ledger is read again.
    let fires = ok(&db.url, &["fires", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|f: &serde_json::Value| f["status"] == status)
        .collect();
    let exported = exported.lock().unwrap().clone();
    (fires, exported)
}

/// The spans of `fire`'s attempt: its `cm.fire` span and that span's children, by name.
fn attempt_spans<'a>(
    fire: &serde_json::Value,
    exported: &'a [(Vec<(String, String)>, Span)],
) -> (&'a Span, Vec<&'a Span>) {
    let traceparent = fire["traceparent"].as_str().unwrap();
    let trace_id = traceparent.split('-').nth(1).unwrap();
    let in_trace: Vec<&Span> = exported
        .iter()
        .map(|(_, s)| s)
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let roots: Vec<&&Span> = in_trace.iter().filter(|s| s.name == "cm.fire").collect();
    assert_eq!(
        roots.len(),
        1,
        "{fire} ({traceparent}): one attempt, one cm.fire span: {in_trace:#?}"
    );
    let root = *roots[0];
    assert!(root.parent_span_id.is_empty(), "{root:?}");
    let children = in_trace
        .iter()
        .copied()
        .filter(|s| s.parent_span_id == root.span_id)
        .collect();
    (root, children)
}

#[tokio::test]
async fn claim_dispatch_and_settle_reach_an_otlp_receiver_as_spans_of_the_fires_trace() {
    let db = TestDb::new().await;
    let seen: Seen = Arc::default();
    let hook = Hook::serve(
        &db,
        "otlp",
        Router::new().fallback(receive).with_state(seen.clone()),
    )
    .await;
    let (fires, exported) = traced_run(&db, &hook.args(), "fired").await;

    let (resource, _) = &exported[0];
    for (key, value) in [
        ("service.name", "cm-scheduler"),
        ("service.instance.id", "otlp"),
    ] {
        assert!(
            resource.contains(&(key.to_string(), value.to_string())),
            "{resource:?}"
        );
    }
    let seen = seen.lock().unwrap().clone();
    assert!(fires.len() >= 2, "{fires:?}");
    for fire in &fires {
        let traceparent = fire["traceparent"].as_str().unwrap();
        let (root, children) = attempt_spans(fire, &exported);
        assert_eq!(
            attribute(root, "cm.routine.id").as_deref(),
            fire["routine_id"].as_str()
        );
        assert_eq!(attribute(root, "cm.outcome").as_deref(), Some("fired"));
        assert_eq!(attribute(root, "cm.attempt").as_deref(), Some("1"));
        let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        for name in ["cm.claim", "cm.dispatch", "cm.settle"] {
            assert!(names.contains(&name), "{fire}: {names:?}");
        }
        let step = |name: &str| *children.iter().find(|s| s.name == name).unwrap();
        let (claim, dispatch, settle) = (step("cm.claim"), step("cm.dispatch"), step("cm.settle"));
        // The dispatch span is the one the webhook's traceparent names.
        let sent = format!("00-{}-{}-01", hex(&root.trace_id), hex(&dispatch.span_id));
        assert_eq!(sent, traceparent);
        assert!(
            seen.iter().any(|(_, t)| *t == sent),
            "no webhook carried {sent}: {seen:?}"
        );
        // In order: claimed, then dispatched, then settled, all within the attempt.
        assert!(
            claim.end_time_unix_nano <= dispatch.start_time_unix_nano,
            "{claim:?} {dispatch:?}"
        );
        assert!(
            dispatch.end_time_unix_nano <= settle.start_time_unix_nano,
            "{dispatch:?} {settle:?}"
        );
        assert!(root.start_time_unix_nano <= claim.start_time_unix_nano);
        assert!(settle.end_time_unix_nano <= root.end_time_unix_nano);
        assert_eq!(
            attribute(claim, "db.system.name").as_deref(),
            Some("postgresql")
        );
        for span in [root, claim, dispatch, settle] {
            let status = span.status.clone().unwrap_or_default();
            assert_ne!(status.code, 2, "an error status on {span:?}");
        }
    }
}

/// With the default backend (the outbox, written in the claim) the attempt's dispatch span is
/// the claim's write, named by the ledger as a webhook's would be; no settle follows.
#[tokio::test]
async fn a_message_written_in_the_claim_is_traced_as_its_dispatch() {
    let db = TestDb::new().await;
    let (fires, exported) = traced_run(&db, &[], "fired").await;
    for fire in &fires {
        assert_eq!(
            fire["claimed_at"], fire["completed_at"],
            "settled in the claim: {fire}"
        );
    }
    for fire in &fires {
        let traceparent = fire["traceparent"].as_str().unwrap();
        let (root, children) = attempt_spans(fire, &exported);
        assert_eq!(attribute(root, "cm.outcome").as_deref(), Some("fired"));
        let mut names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["cm.claim", "cm.dispatch"], "{fire}");
        let dispatch = children.iter().find(|s| s.name == "cm.dispatch").unwrap();
        assert_eq!(
            format!("00-{}-{}-01", hex(&root.trace_id), hex(&dispatch.span_id)),
            traceparent
        );
    }
}

/// A dispatch the target refuses: the attempt's span and its dispatch span carry the error the
/// ledger keeps.
#[tokio::test]
async fn a_refused_dispatch_is_an_error_span_with_the_ledgers_reason() {
    let db = TestDb::new().await;
    let app = Router::new().fallback(async || StatusCode::UNPROCESSABLE_ENTITY);
    let hook = Hook::serve(&db, "otlp-refused", app).await;
    let (fires, exported) = traced_run(&db, &hook.args(), "failed").await;
    for fire in &fires {
        let error = fire["error"].as_str().unwrap();
        let (root, children) = attempt_spans(fire, &exported);
        assert_eq!(attribute(root, "cm.outcome").as_deref(), Some("failed"));
        assert_eq!(attribute(root, "cm.error").as_deref(), Some(error));
        let dispatch = children.iter().find(|s| s.name == "cm.dispatch").unwrap();
        for span in [root, *dispatch] {
            let status = span.status.clone().unwrap_or_default();
            assert_eq!(
                (status.code, status.message.as_str()),
                (2, error),
                "{span:?}"
            );
        }
    }
}

/// A bad `--otlp-endpoint` is refused at start in one line, exit 2, before anything runs.
#[tokio::test]
async fn a_bad_otlp_endpoint_is_refused_in_one_line() {
    let db = TestDb::new().await;
    let out = cm_scheduler()
        .args([
            "--database-url",
            &db.url,
            "run",
            "--otlp-endpoint",
            "collector:4318",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("invalid --otlp-endpoint collector:4318"),
        "{stderr}"
    );
}
