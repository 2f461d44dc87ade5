//! OpenTelemetry traces of fires, exported over OTLP/HTTP (protobuf) when `--otlp-endpoint` is
//! given; nothing is recorded or sent without it.
//!
//! Each attempt at an occurrence is one span, `cm.fire`, with a child for each step it took:
//!
//! - `cm.claim`: the claim statement that took it (one statement claims many occurrences, so
//!   the fires of one claim share its times);
//! - `cm.dispatch`: the backend's call (a webhook, a NATS publish, a mission's launch), or, for
//!   a message written in the claim (the outbox), that write;
//! - `cm.settle`: writing the outcome to the ledger.
//!
//! The trace is the occurrence's and the dispatch span is the one the target hears of: the
//! trace id and the dispatch span's id are those of the attempt's
//! [`TraceParent`](cm_domain::trace::TraceParent), the `traceparent` sent with the webhook, the
//! NATS message or the mission, and named by the ledger's row (`cm-scheduler fires show`). So a
//! receiver's spans hang under cm's dispatch, and every attempt at one occurrence (a retry on
//! another scheduler) is in one trace. The SDK draws span ids itself; [`ChosenIds`] lets it
//! take the one the ledger names.
//!
//! Spans are batched and sent by the SDK's own thread; a collector that is down or slow costs
//! dropped spans (the queue is bounded: `QUEUED_SPANS`), never a fire. Of a collector's reply
//! only the status and the first `MAX_REPLY` bytes are read, whatever it sends.

use std::cell::Cell;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use cm_domain::trace::TraceParent;
use cm_store::RoutineKind;
use opentelemetry::trace::{
    Span as _, SpanId, SpanKind, Status, TraceContextExt as _, TraceId, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, SdkTracer,
    SdkTracerProvider,
};

/// The path OTLP/HTTP receivers take traces at.
const TRACES_PATH: &str = "/v1/traces";

/// The most spans waiting to be sent (about 8 MiB); more are dropped. Four spans a fire: a burst
/// of 4,000 fires is held whole, where the SDK's default (2,048) would drop most of it.
const QUEUED_SPANS: usize = 16_384;

/// The most bytes of a collector's reply read. The exporter needs only its status, and at most a
/// short protobuf saying how many spans were refused and why.
const MAX_REPLY: usize = 4 * 1024;

/// How long one export may take before its batch is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where fires are traced to: an OTLP/HTTP collector. Cheap to clone.
#[derive(Clone, Debug)]
pub struct FireTracer {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl FireTracer {
    /// A tracer sending to the OTLP/HTTP collector at `endpoint` (`http://collector:4318`, to
    /// which `/v1/traces` is added unless it ends so), naming this scheduler `instance_id`.
    /// Must be called inside a tokio runtime: exports are sent on it.
    pub fn otlp(endpoint: &str, instance_id: &str) -> Result<Self, String> {
        let url = traces_url(endpoint)?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "traces are exported from a tokio runtime".to_string())?;
        // reqwest is built without a crypto provider of its own; ring is the process default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(EXPORT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("cm-scheduler/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot make the OTLP client: {e}"))?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(OnRuntime { client, runtime })
            .build()
            .map_err(|e| format!("invalid --otlp-endpoint {endpoint}: {e}"))?;
        let resource = Resource::builder_empty()
            .with_service_name("cm-scheduler")
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", instance_id.to_string()),
            ])
            .build();
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(QUEUED_SPANS)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_id_generator(ChosenIds)
            .with_resource(resource)
            .with_span_processor(batches)
            .build();
        let tracer = provider.tracer("cm-scheduler");
        Ok(FireTracer { provider, tracer })
    }

    /// Sends what is batched and stops exporting; blocks until the last export is answered (or
    /// times out), so call it off the runtime's workers (`spawn_blocking`).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the last traces were not all exported");
        }
    }

    /// Starts the trace of an attempt claimed in `claim`.
    pub(crate) fn attempt(&self, fire: AttemptFacts, claim: ClaimWindow) -> AttemptTrace {
        AttemptTrace {
            tracer: self.clone(),
            fire,
            claim,
            dispatch: None,
            settle: None,
            outcome: "unsettled",
            error: None,
        }
    }
}

/// The OTLP/HTTP URL traces are posted to: `endpoint`, with `/v1/traces` added unless it ends
/// so (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
fn traces_url(endpoint: &str) -> Result<url::Url, String> {
    let bad = |why: String| format!("invalid --otlp-endpoint {endpoint}: {why}");
    let mut url = url::Url::parse(endpoint).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(bad(
            "give an http:// or https:// URL of an OTLP/HTTP receiver".into(),
        ));
    }
    if !url.path().ends_with(TRACES_PATH) {
        let path = format!("{}{TRACES_PATH}", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    Ok(url)
}

/// When a claim statement ran, on the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimWindow {
    pub began: SystemTime,
    pub ended: SystemTime,
    /// How many occurrences it took.
    pub fires: usize,
}

/// What a trace says of the occurrence it follows.
#[derive(Debug, Clone)]
pub(crate) struct AttemptFacts {
    pub traceparent: TraceParent,
    pub routine_id: uuid::Uuid,
    pub routine_name: String,
    pub kind: RoutineKind,
    pub scheduled_at: chrono::DateTime<chrono::Utc>,
    pub attempt: u32,
}

/// One attempt's steps as they happen; its spans are recorded when it is dropped, whichever
/// way the attempt ended.
#[derive(Debug)]
pub(crate) struct AttemptTrace {
    tracer: FireTracer,
    fire: AttemptFacts,
    claim: ClaimWindow,
    dispatch: Option<Step>,
    settle: Option<Step>,
    outcome: &'static str,
    error: Option<String>,
}

/// One step's times and error.
#[derive(Debug)]
struct Step {
    began: SystemTime,
    ended: SystemTime,
    error: Option<String>,
}

impl AttemptTrace {
    /// The dispatch ran from `began` until now; `error` if it failed.
    pub(crate) fn dispatched(&mut self, began: SystemTime, error: Option<String>) {
        self.dispatch = Some(Step {
            began,
            ended: SystemTime::now(),
            error,
        });
    }

    /// The dispatch was the claim's own write (a message written in the claim).
    pub(crate) fn dispatched_in_claim(&mut self) {
        self.dispatch = Some(Step {
            began: self.claim.began,
            ended: self.claim.ended,
            error: None,
        });
    }

    /// The settle ran from `began` until now; `error` if it was not written.
    pub(crate) fn settled(&mut self, began: SystemTime, error: Option<String>) {
        self.settle = Some(Step {
            began,
            ended: SystemTime::now(),
            error,
        });
    }

    /// How the attempt ended (`fired`, `failed`, `skipped`, `abandoned`, `unsettled`), and
    /// why, for a failure.
    pub(crate) fn ended(&mut self, outcome: &'static str, error: Option<String>) {
        self.outcome = outcome;
        self.error = error;
    }

    fn record(&mut self) {
        let tracer = &self.tracer.tracer;
        let fire = &self.fire;
        let Ok(trace_id) = TraceId::from_hex(&fire.traceparent.trace_id()) else {
            return;
        };
        let Ok(dispatch_id) = SpanId::from_hex(&fire.traceparent.parent_id()) else {
            return;
        };
        let end = [&self.dispatch, &self.settle]
            .into_iter()
            .flatten()
            .map(|s| s.ended)
            .fold(self.claim.ended, SystemTime::max);
        let kind = match fire.kind {
            RoutineKind::Message => "message",
            RoutineKind::Mission => "mission",
        };
        let mut attributes = vec![
            KeyValue::new("cm.routine.id", fire.routine_id.to_string()),
            KeyValue::new("cm.routine.name", fire.routine_name.clone()),
            KeyValue::new("cm.routine.kind", kind),
            KeyValue::new("cm.occurrence", fire.scheduled_at.to_rfc3339()),
            KeyValue::new("cm.attempt", i64::from(fire.attempt)),
            KeyValue::new("cm.outcome", self.outcome),
        ];
        if let Some(error) = &self.error {
            attributes.push(KeyValue::new("cm.error", error.clone()));
        }
        let root = chosen(Some(trace_id), None, || {
            tracer
                .span_builder("cm.fire")
                .with_kind(SpanKind::Internal)
                .with_start_time(self.claim.began)
                .with_attributes(attributes)
                .start_with_context(tracer, &Context::new())
        });
        let mut root = root;
        if let Some(error) = &self.error {
            root.set_status(Status::error(error.clone()));
        }
        let parent = Context::new().with_span(root);
        let child = |name: &'static str,
                     kind: SpanKind,
                     step: &Step,
                     id: Option<SpanId>,
                     more: Vec<KeyValue>| {
            let mut span = chosen(None, id, || {
                tracer
                    .span_builder(name)
                    .with_kind(kind)
                    .with_start_time(step.began)
                    .with_attributes(more)
                    .start_with_context(tracer, &parent)
            });
            if let Some(error) = &step.error {
                span.set_status(Status::error(error.clone()));
            }
            span.end_with_timestamp(step.ended);
        };
        let db = |operation: &'static str| {
            vec![
                KeyValue::new("db.system.name", "postgresql"),
                KeyValue::new("db.operation.name", operation),
            ]
        };
        let mut claim_attributes = db("claim");
        claim_attributes.push(KeyValue::new("cm.claim.fires", self.claim.fires as i64));
        let claim = Step {
            began: self.claim.began,
            ended: self.claim.ended,
            error: None,
        };
        child("cm.claim", SpanKind::Client, &claim, None, claim_attributes);
        if let Some(step) = &self.dispatch {
            child(
                "cm.dispatch",
                SpanKind::Producer,
                step,
                Some(dispatch_id),
                Vec::new(),
            );
        }
        if let Some(step) = &self.settle {
            child("cm.settle", SpanKind::Client, step, None, db("settle"));
        }
        parent.span().end_with_timestamp(end);
    }
}

impl Drop for AttemptTrace {
    fn drop(&mut self) {
        self.record();
    }
}

thread_local! {
    /// The ids [`ChosenIds`] hands out next on this thread, where chosen.
    static CHOSEN: Cell<(Option<TraceId>, Option<SpanId>)> = const { Cell::new((None, None)) };
}

/// Builds a span with `make` taking `trace_id` (a root span's) and `span_id` where given: the
/// SDK asks [`ChosenIds`] for both, on this thread, while `make` runs.
fn chosen<T>(trace_id: Option<TraceId>, span_id: Option<SpanId>, make: impl FnOnce() -> T) -> T {
    CHOSEN.with(|c| c.set((trace_id, span_id)));
    let made = make();
    CHOSEN.with(|c| c.set((None, None)));
    made
}

/// Random ids, except those chosen for the span being built on this thread ([`chosen`]): the
/// trace of an occurrence and the span its target hears of are the ledger's, not random.
#[derive(Debug)]
struct ChosenIds;

impl IdGenerator for ChosenIds {
    fn new_trace_id(&self) -> TraceId {
        CHOSEN
            .with(|c| c.get().0)
            .unwrap_or_else(|| RandomIdGenerator::default().new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        CHOSEN
            .with(|c| c.get().1)
            .unwrap_or_else(|| RandomIdGenerator::default().new_span_id())
    }
}

/// reqwest on the scheduler's tokio runtime: the SDK exports from a thread of its own, outside
/// any runtime, and reqwest needs one.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let answer = client.execute(request).await?;
            let status = answer.status();
            let headers = answer.headers().clone();
            let body = reply_start(answer).await;
            let mut response = Response::new(body);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            Ok::<_, HttpError>(response)
        });
        sent.await?
    }
}

/// The start of a collector's reply: at most [`MAX_REPLY`] bytes, read a chunk at a time. The
/// rest is never read: the connection is dropped with it, so a collector answering without end
/// costs a few KiB, and a reply that stops coming is ended by the client's timeout. A body cut
/// short (or broken off) still leaves the status to judge the export by.
async fn reply_start(mut answer: reqwest::Response) -> Bytes {
    let mut start = Vec::new();
    while start.len() < MAX_REPLY {
        match answer.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_REPLY - start.len();
                start.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    Bytes::from(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_unless_given() {
        for (given, url) in [
            ("http://collector:4318", "http://collector:4318/v1/traces"),
            ("http://collector:4318/", "http://collector:4318/v1/traces"),
            ("https://c.example/otlp", "https://c.example/otlp/v1/traces"),
            ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
        ] {
            assert_eq!(traces_url(given).unwrap().as_str(), url, "{given}");
        }
        for bad in ["collector:4318", "ftp://c/", "not a url"] {
            let e = traces_url(bad).unwrap_err();
            assert!(e.starts_with("invalid --otlp-endpoint"), "{e}");
        }
    }

    #[test]
    fn chosen_ids_are_taken_only_while_chosen() {
        let ids = ChosenIds;
        let trace = TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap();
        let span = SpanId::from_hex("b7ad6b7169203331").unwrap();
        let (t, s) = chosen(Some(trace), Some(span), || {
            (ids.new_trace_id(), ids.new_span_id())
        });
        assert_eq!((t, s), (trace, span));
        assert_ne!(ids.new_trace_id(), trace);
        assert_ne!(ids.new_span_id(), span);
    }
}
