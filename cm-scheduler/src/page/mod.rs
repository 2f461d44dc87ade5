//! The status page: every routine (filtered by name and state, sorted) with its schedule, next
//! run, state and a strip of its last fires; fires and failures per minute over the last hour;
//! the outbox backlog; the concurrency limits; recent failures; this scheduler's figures; a page
//! per routine (by name or id) with its settings (its concurrency key with the key's limit and
//! places held), how its mission runs, next runs and fires; and the operator's actions on a
//! routine (pause, resume, fire now, edit its settings, delete it), each confirmed on the page.
//!
//! Server-rendered HTML (maud) and SVG: everything reads without JavaScript. A small script
//! (`/page.js`) updates the page in place every few seconds, keeping the scroll and any open
//! confirmation, and the operator can switch it off; without script a `<noscript>` refresh does
//! it (`?live=off` stops that). A message's text is never shown (it may be private), only its
//! size; a mission's repository, ref, task, env and labels are, each scrubbed of secrets
//! (`cm_dispatch::scrub_output`: a URL's password, `TOKEN=…` values, known token shapes, the
//! places tools print secrets).
//!
//! Every read waits on the database at most [`StatusPage::deadline`], and the cached health is
//! asked first: with the database down the page answers 503 with the reason at once.
//!
//! Each view has a file: `index.rs` (the routines, filtered and sorted), `routine.rs` (one
//! routine), `actions.rs` (the operator's actions and their forms), `figures.rs` (this
//! scheduler's figures and the charts), `cells.rs` (how an instant, an outcome or a state
//! reads); the style and the script are `page.css` and `page.js`.

mod actions;
mod cells;
mod events;
mod figures;
mod index;
mod routine;

use std::future::Future;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;
use cm_store::StoreError;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use uuid::Uuid;

use crate::http_state::{HttpState, StatusPage};
use figures::figures;

pub use actions::{action, action_by_get};
pub use cells::relative;
pub use index::index;
pub use routine::routine;

/// Routines shown on one page of the index.
pub const ROUTINES_PER_PAGE: u32 = 100;
/// Failures shown on the index.
pub const RECENT_FAILURES: u32 = 20;
/// Fires shown on a routine's page.
pub const FIRES_PER_ROUTINE: u32 = 50;
/// Fires in each routine's strip on the index.
pub const STRIP_FIRES: u32 = 30;
/// Next runs shown on a routine's page.
pub const NEXT_RUNS: usize = 5;

/// The page's style, inlined in every page.
const CSS: &str = include_str!("page.css");

/// The script that updates the page in place (see the module's documentation).
const SCRIPT: &str = include_str!("page.js");

/// The headers of every page response: no caching, no framing, and a content policy that
/// runs only this server's script and submits forms only to it.
pub async fn page_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
             img-src 'self' data:; connect-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `GET /page.js`: the in-place update.
pub async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

/// The frame of every page. `live` pages update themselves.
fn page(title: &str, status: Option<&StatusPage>, live: bool, body: Markup) -> Html<String> {
    let refresh = status.map_or(5, |s| s.refresh.as_secs().max(1));
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    @if live { noscript { meta http-equiv="refresh" content=(refresh); } }
                    title { (title) }
                    style { (PreEscaped(CSS)) }
                    @if live { script src="/page.js" defer {} }
                }
                body data-refresh=(refresh) { (body) }
            }
        }
        .into_string(),
    )
}

/// The page's own state (its routes exist only when there is one).
fn status_page(state: &HttpState) -> &StatusPage {
    state
        .status
        .as_ref()
        .expect("the status routes exist only with a status page")
}

/// A page saying why something was refused or not found, with `code`.
pub fn refused(code: StatusCode, message: &str) -> Response {
    (
        code,
        page(
            &format!("cm: {}", code.canonical_reason().unwrap_or("refused")),
            None,
            false,
            html! {
                h1 { "cm scheduler" }
                p.problem { (message) }
                p { a href="/" { "← All routines" } }
            },
        ),
    )
        .into_response()
}

/// The answer for any path the page does not have.
pub async fn not_found() -> Response {
    refused(StatusCode::NOT_FOUND, "There is no page at this address.")
}

/// Why the database cannot be read, answered 503 with this scheduler's own figures.
fn unavailable(state: &HttpState, reason: &str) -> Response {
    let status = status_page(state);
    (
        StatusCode::SERVICE_UNAVAILABLE,
        page(
            "cm: database unavailable",
            Some(status),
            true,
            html! {
                div id="live" {
                    h1 { "cm scheduler " span.muted { (status.instance_id) } }
                    p.problem { "The database cannot be read: " (reason) }
                    (figures(state, None, None, Utc::now()))
                }
            },
        ),
    )
        .into_response()
}

/// Runs the page's reads: at once 503 when the cached health says the database is down, and
/// 503 when the reads take longer than the page's deadline (a network that stops forwarding).
async fn read<T>(
    state: &HttpState,
    reads: impl Future<Output = Result<T, StoreError>>,
) -> Result<Result<T, StoreError>, Response> {
    if let Err(reason) = state.health.current() {
        return Err(unavailable(state, &reason));
    }
    let deadline = status_page(state).deadline;
    match tokio::time::timeout(deadline, reads).await {
        Ok(Err(e @ (StoreError::RoutineNotFound(_) | StoreError::RoutineNameNotFound(_)))) => {
            Ok(Err(e))
        }
        Ok(Err(e)) => Err(unavailable(state, &e.to_string())),
        Ok(Ok(read)) => Ok(Ok(read)),
        Err(_) => Err(unavailable(
            state,
            &format!(
                "the database did not answer within {}",
                humantime::format_duration(deadline)
            ),
        )),
    }
}

/// The index's query string, every field optional: `q` (part of a name), `state` (`active` or
/// `paused`), `sort` (`created`, `name` or `next`), `after` (a routine id, to page on), `live`
/// (`off` stops the updates), and `done`/`of` (the action just taken, and on which routine).
#[derive(Debug, Default, serde::Deserialize)]
pub struct IndexQuery {
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    sort: Option<String>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    live: Option<String>,
    #[serde(default)]
    done: Option<String>,
    #[serde(default)]
    of: Option<String>,
}

/// 400: the address's routine part is not readable.
fn unreadable_address() -> Response {
    refused(
        StatusCode::BAD_REQUEST,
        "This address does not name a routine (a routine's name or id, in UTF-8).",
    )
}

/// 404: no routine has the name or id `handle`.
fn missing(handle: &str) -> Response {
    let what = match Uuid::try_parse(handle.trim()) {
        Ok(id) => format!("No routine has the id {id}."),
        Err(_) => format!("No routine is named “{}”.", handle.trim()),
    };
    refused(StatusCode::NOT_FOUND, &what)
}
