//! The scheduler's HTTP endpoints, served by axum: `/livez`, `/readyz` and `/metrics` for
//! probes and Prometheus, and the read-only status page (`/`, `/routines/{id}`) when one is
//! configured.
//!
//! [`router`] builds every route in one place; [`serve`] runs it on a listener. The status
//! page can require a bearer token; the probes and `/metrics` never do, as orchestrators and
//! scrapers expect.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::stats::Stats;
use crate::status::{self, StatusPage};

/// The longest a request may take before it is answered 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request body accepted (every endpoint is a GET; bodies are refused beyond this).
pub const BODY_LIMIT: usize = 16 * 1024;

/// Tells whether the scheduler's database is usable.
#[async_trait::async_trait]
pub trait Readiness: Send + Sync + 'static {
    /// `Ok` when the database answers; otherwise why the scheduler cannot work, for `/readyz`.
    async fn check(&self) -> Result<(), String>;
}

/// A bearer token the status page requires. Its value never reaches a log or a response.
#[derive(Clone)]
pub struct BearerToken(String);

impl BearerToken {
    /// A token; `None` when it is empty (after trimming surrounding whitespace).
    pub fn new(token: &str) -> Option<Self> {
        let token = token.trim();
        (!token.is_empty()).then(|| BearerToken(token.to_string()))
    }

    /// Whether an `Authorization` header carries this token, compared in constant time.
    fn admits(&self, header: Option<&HeaderValue>) -> bool {
        let Some(given) = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
        else {
            return false;
        };
        let (given, expected) = (given.trim().as_bytes(), self.0.as_bytes());
        given.len() == expected.len()
            && given
                .iter()
                .zip(expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(***)")
    }
}

/// What the endpoints read.
pub struct HttpState {
    /// This scheduler's counters.
    pub stats: Arc<Stats>,
    /// How the database is checked.
    pub readiness: Arc<dyn Readiness>,
    /// How recent the last successful tick must be for `/readyz` to answer 200.
    pub fresh_within: Duration,
    /// Renders the process's metrics recorder for `/metrics`.
    pub metrics: PrometheusHandle,
    /// The status page, if served.
    pub status: Option<StatusPage>,
    /// The token the status page requires, if any.
    pub token: Option<BearerToken>,
}

/// Every route, with a request timeout and a body limit.
pub fn router(state: Arc<HttpState>) -> Router {
    let mut router = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    if state.status.is_some() {
        let page = Router::new()
            .route("/", get(status::index))
            .route("/routines/{id}", get(status::routine))
            .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
        router = router.merge(page);
    }
    router
        .with_state(state)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
}

/// Serves `router` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    axum::serve(listener, router).await
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<Arc<HttpState>>) -> (StatusCode, String) {
    let database = state.readiness.check().await;
    match readiness(
        database,
        state.stats.last_success(),
        state.fresh_within,
        state.stats.last_error(),
    ) {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// Decides `/readyz`: ready when the database answers and a whole tick succeeded within
/// `fresh_within`. A tick's dispatches run under the dispatch timeout, which `fresh_within`
/// must cover, so one slow dispatch never makes a healthy scheduler look unready.
pub fn readiness(
    database: Result<(), String>,
    last_success: Option<Instant>,
    fresh_within: Duration,
    last_error: Option<String>,
) -> Result<(), String> {
    database?;
    match last_success {
        Some(at) if at.elapsed() <= fresh_within => Ok(()),
        Some(at) => Err(format!(
            "no successful tick for {}s: {}",
            at.elapsed().as_secs(),
            last_error.unwrap_or_else(|| "ticks are not finishing".into())
        )),
        None => Err(format!(
            "no tick has succeeded yet{}",
            last_error.map(|e| format!(": {e}")).unwrap_or_default()
        )),
    }
}

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn require_token(
    State(state): State<Arc<HttpState>>,
    request: Request,
    next: Next,
) -> Response {
    match &state.token {
        Some(token) if !token.admits(request.headers().get(header::AUTHORIZATION)) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "this page needs Authorization: Bearer <token>\n",
        )
            .into_response(),
        _ => next.run(request).await,
    }
}
