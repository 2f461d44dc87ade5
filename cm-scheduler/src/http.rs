//! The scheduler's HTTP endpoints, served by axum: `/livez`, `/readyz` and `/metrics` for
//! probes and Prometheus, and the status page (`/`, `/routines/{name or id}`, and its actions)
//! when one is configured.
//!
//! [`router`] builds every route in one place from the handlers of [`crate::page`] and the
//! state of [`crate::http_state`]; [`serve`] runs it on a listener. The dependency goes one way:
//! this module imports the page (its handlers, its headers, its refusals), and the page never
//! imports this module. The status page and its actions can require a bearer token; the probes
//! and `/metrics` never do, as orchestrators and scrapers expect. Every action is a `POST`
//! that passes the CSRF guard ([`same_origin`] and the page's form token). The page, its
//! actions and any other path it answers (its 404s) answer only requests sent to one of its own
//! names ([`crate::hosts`], against DNS rebinding), before the token is asked for; the probes
//! and `/metrics` answer whatever `Host` names them, as orchestrators probe by address and
//! scrapers by address or service name.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::http_state::HttpState;
use crate::page;

/// The longest a request may take before it is answered 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request body accepted: an edit's form with the longest message a routine may
/// have, percent-encoded (three bytes a byte at most), and room for the other fields; every
/// other action's form is a few hundred bytes.
pub const BODY_LIMIT: usize = 3 * cm_domain::MAX_MESSAGE_BYTES + 16 * 1024;

/// Every route, with a request timeout and a body limit.
pub fn router(state: Arc<HttpState>) -> Router {
    let mut router = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    if state.status.is_some() {
        let actions = Router::new()
            .route(
                "/routines/{handle}/{action}",
                post(page::action).get(page::action_by_get),
            )
            .route_layer(middleware::from_fn(refuse_cross_site));
        let page_routes = Router::new()
            .route("/", get(page::index))
            .route("/routines/{handle}", get(page::routine))
            .route("/page.js", get(page::script))
            .merge(actions)
            .fallback(page::not_found)
            .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
            // Before the token and every handler, and for the fallback too.
            .layer(middleware::from_fn_with_state(
                state.clone(),
                refuse_other_hosts,
            ))
            .layer(middleware::from_fn(page::page_headers));
        router = router.merge(page_routes);
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

/// `/readyz` reads the cached health: it answers at once even when the network to the
/// database hangs, and adds no query however often it is asked.
async fn readyz(State(state): State<Arc<HttpState>>) -> (StatusCode, String) {
    match readiness(
        state.health.current(),
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

/// The guard against DNS rebinding: a request to the page or its actions must name one of the
/// page's own hosts ([`crate::hosts::AllowedHosts`]), else it is answered 421 whatever it
/// carries. The name is the `Host` header's and, when the request line or HTTP/2 gives one,
/// the URI's authority's: both must be admitted. `X-Forwarded-Host` and `Forwarded` are never
/// read (a rebinding page's script can set them).
async fn refuse_other_hosts(
    State(state): State<Arc<HttpState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(status) = &state.status else {
        return next.run(request).await;
    };
    let header = request.headers().get(header::HOST).map(|h| h.to_str());
    let authority = request.uri().authority().map(|a| a.as_str());
    let named = match (header, authority) {
        (Some(Ok(host)), authority) => {
            status.hosts.admits(host) && authority.is_none_or(|a| status.hosts.admits(a))
        }
        (Some(Err(_)), _) => false,
        (None, Some(authority)) => status.hosts.admits(authority),
        (None, None) => false,
    };
    if named {
        return next.run(request).await;
    }
    page::refused(
        StatusCode::MISDIRECTED_REQUEST,
        "This page answers only at its own names: the host this request was sent to is not \
         one of them (a page of another site may have had its name point here). If you serve \
         the page at this name, start cm-scheduler run with --allowed-host NAME.",
    )
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

/// The first half of the CSRF guard, before the form is read: an action's request must come
/// from this page, as the browser tells (`Sec-Fetch-Site`, else `Origin`). A request with
/// neither comes from no browser (curl, a script) and still needs the form token.
async fn refuse_cross_site(request: Request, next: Next) -> Response {
    // Only a POST acts (the router answers 405 to anything else).
    if request.method() == Method::POST && !same_origin(request.headers()) {
        return page::refused(
            StatusCode::FORBIDDEN,
            "This action was refused: it did not come from this page (a cross-site request).",
        );
    }
    next.run(request).await
}

/// Whether a request's headers show it came from a page of this server, or from no browser.
/// `Sec-Fetch-Site` decides when sent (`same-origin`, or `none` for what the user typed);
/// else `Origin`, when sent, must name the `Host` asked.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}
