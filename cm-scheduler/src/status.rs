//! The status page: every routine (filtered by name and state, sorted) with its schedule, next
//! run, state and a strip of its last fires; fires and failures per minute over the last hour;
//! the outbox backlog; recent failures; this scheduler's figures; a page per routine (by name or
//! id) with its settings, how its mission runs, next runs and fires; and the operator's actions
//! on a routine (pause, resume, fire now, edit its settings, delete it), each confirmed on the
//! page.
//!
//! Server-rendered HTML (maud) and SVG: everything reads without JavaScript. A small script
//! (`/page.js`) updates the page in place every few seconds, keeping the scroll and any open
//! confirmation, and the operator can switch it off; without script a `<noscript>` refresh does
//! it (`?live=off` stops that). A message's text is never shown (it may be private), only its
//! size; a mission's repository, ref, task, env and labels are, each scrubbed of secrets
//! (`cm_dispatch::scrub_output`: a URL's password, `TOKEN=…` values, known token shapes).
//!
//! Every read waits on the database at most [`StatusPage::deadline`], and the cached health is
//! asked first: with the database down the page answers 503 with the reason at once.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use cm_domain::FireOutcome;
use cm_store::{
    FailedFire, FireRate, OpenClaims, OutboxBacklog, RecentFire, Routine, RoutineOrder,
    RoutineQuery, StoreError,
};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use uuid::Uuid;

use crate::state::{HttpState, StatusPage};
use crate::stats::Stats;

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

const CSS: &str = "
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;padding:0 1em 2em;max-width:90em;color:#1f2328;background:#fff}
h1{font-size:1.35em;margin:.7em 0 .4em}h2{font-size:1.08em;margin:1.5em 0 .5em}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:.3em 1em}
header .live{margin-left:auto}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.35em .55em;border-bottom:1px solid #d8dee4;vertical-align:top}
th{background:#f6f8fa;font-weight:600;white-space:nowrap}
th a{color:inherit}th a.on::after{content:' ▾'}
time,.nowrap,td code{white-space:nowrap}
td.name{min-width:10em;max-width:18em;overflow-wrap:anywhere}h1{overflow-wrap:anywhere}
.fired{color:#1a7f37}.failed{color:#cf222e;font-weight:600}.claimed{color:#9a6700}.skipped{color:#57606a}
.paused{color:#9a6700;font-weight:600}.active{color:#1a7f37}.finished{color:#59636e;font-weight:600}.muted{color:#59636e}.small{font-size:.85em}
.reason{display:block;max-width:14em;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1.2em}dt{font-weight:600}dd{margin:0}
.figures{display:flex;flex-wrap:wrap;gap:.5em}
.figure{border:1px solid #d8dee4;border-radius:6px;padding:.4em .75em;min-width:8em;background:#f6f8fa}
.figure b{display:block;font-size:1.15em}
.error{white-space:pre-wrap;word-break:break-word}
td.error{min-width:22em}
pre#run-output{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.6em .8em;overflow:auto;max-height:28em;font-size:.85em;white-space:pre-wrap;word-break:break-word}
.strip{display:flex;gap:2px;align-items:center;min-height:1.1em}
.cell{display:inline-block;width:.45em;height:1.05em;border-radius:2px;background:#d0d7de}
.cell.fired{background:#2da44e}.cell.failed{background:#cf222e}.cell.claimed{background:#d4a72c}
.cell.skipped{background:#afb8c1}
.legend{display:inline-flex;gap:.9em;align-items:center}.legend span{display:inline-flex;gap:.3em;align-items:center}
form.filter{display:flex;flex-wrap:wrap;gap:.5em;align-items:center;margin:.4em 0 .8em}
input,select,button{font:inherit;padding:.2em .45em}
button{border:1px solid #d0d7de;border-radius:6px;background:#f6f8fa;cursor:pointer}
button.danger{border-color:#cf222e;color:#cf222e}button.go{border-color:#1a7f37;color:#1a7f37}
.actions{display:flex;gap:.4em;flex-wrap:wrap}
details.act summary{cursor:pointer;list-style:none;color:#0969da;white-space:nowrap}
details.act summary::-webkit-details-marker{display:none}
details.act[open] summary{color:#59636e}
details.act form{margin:.3em 0}
.actions details#edit[open]{order:1;flex-basis:100%}
form.edit{display:grid;grid-template-columns:max-content minmax(12em,28em);gap:.4em .8em;align-items:center;margin:.5em 0 1em}
form.edit textarea{font:inherit;min-height:4em}form.edit .hint{grid-column:2}
.notice{background:#dafbe1;border:1px solid #2da44e;border-radius:6px;padding:.5em .8em}
.problem{background:#ffebe9;border:1px solid #cf222e;border-radius:6px;padding:.5em .8em}
svg.chart{width:100%;max-width:60em;height:auto;display:block}
svg.chart text{font:11px system-ui,sans-serif;fill:#59636e}
";

/// The script that updates the page in place (see the module's documentation).
const SCRIPT: &str = r#"(function () {
  var url = new URL(location.href);
  if (url.searchParams.has('done')) {
    url.searchParams.delete('done');
    url.searchParams.delete('of');
    history.replaceState(null, '', url);
  }
  var toggle = document.getElementById('live-toggle');
  var every = Number(document.body.dataset.refresh || 5) * 1000;
  var on = function () {
    return url.searchParams.get('live') !== 'off' && localStorage.getItem('cm-live') !== 'off';
  };
  var show = function () {
    toggle.textContent = on() ? 'Live updates: on' : 'Live updates: off';
    toggle.setAttribute('aria-pressed', String(on()));
  };
  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener('click', function () {
      localStorage.setItem('cm-live', on() ? 'off' : 'on');
      show();
    });
    show();
  }
  var busy = function () {
    var focused = document.activeElement;
    return document.querySelector('#live details[open]') ||
      (focused && focused.closest && focused.closest('#live form'));
  };
  setInterval(function () {
    if (!on() || document.hidden || busy()) return;
    fetch(location.href, { credentials: 'same-origin', headers: { 'Accept': 'text/html' } })
      .then(function (r) { return r.ok || r.status === 503 ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        var fresh = new DOMParser().parseFromString(text, 'text/html').getElementById('live');
        var now = document.getElementById('live');
        if (fresh && now && !busy()) now.replaceWith(fresh);
      })
      .catch(function () {});
  }, every);
})();
"#;

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

/// The listing asked for, checked.
struct Listing {
    q: String,
    paused: Option<bool>,
    order: RoutineOrder,
    after: Option<Uuid>,
}

impl Listing {
    fn parse(query: &IndexQuery) -> Result<Listing, String> {
        let paused = match query.state.as_deref().unwrap_or("") {
            "" | "all" => None,
            "active" => Some(false),
            "paused" => Some(true),
            other => {
                return Err(format!(
                    "state must be all, active or paused, not {other:?}"
                ));
            }
        };
        let order = match query.sort.as_deref().unwrap_or("") {
            "" | "created" => RoutineOrder::Created,
            "name" => RoutineOrder::Name,
            "next" => RoutineOrder::NextRun,
            other => return Err(format!("sort must be created, name or next, not {other:?}")),
        };
        let after = match query.after.as_deref().filter(|a| !a.is_empty()) {
            None => None,
            Some(text) => Some(
                Uuid::try_parse(text)
                    .map_err(|_| format!("after must be a routine id, not {text:?}"))?,
            ),
        };
        let q = query.q.as_deref().unwrap_or("").trim();
        if q.chars().count() > 200 {
            return Err("the name filter must be at most 200 characters".into());
        }
        Ok(Listing {
            q: q.to_string(),
            paused,
            order,
            after,
        })
    }

    fn sort_word(order: RoutineOrder) -> &'static str {
        match order {
            RoutineOrder::Created => "created",
            RoutineOrder::Name => "name",
            RoutineOrder::NextRun => "next",
        }
    }

    /// The index's address for this listing in `order`, starting after `after`.
    fn href(&self, order: RoutineOrder, after: Option<Uuid>) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if !self.q.is_empty() {
            query.append_pair("q", &self.q);
        }
        match self.paused {
            Some(true) => drop(query.append_pair("state", "paused")),
            Some(false) => drop(query.append_pair("state", "active")),
            None => {}
        }
        if order != RoutineOrder::Created {
            query.append_pair("sort", Self::sort_word(order));
        }
        if let Some(after) = after {
            query.append_pair("after", &after.to_string());
        }
        let query = query.finish();
        if query.is_empty() {
            "/".into()
        } else {
            format!("/?{query}")
        }
    }
}

/// Everything the index shows from the database.
struct IndexData {
    routines: Vec<cm_store::RoutineSummary>,
    failures: Vec<cm_store::FailedFire>,
    claims: OpenClaims,
    rate: FireRate,
    outbox: OutboxBacklog,
}

/// `GET /`: the routines (a page at a time, filtered and sorted), the last hour's fires, the
/// outbox backlog, recent failures, this scheduler's figures.
pub async fn index(
    State(state): State<Arc<HttpState>>,
    query: Result<Query<IndexQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return refused(
            StatusCode::BAD_REQUEST,
            "This address's query is not readable.",
        );
    };
    let listing = match Listing::parse(&query) {
        Ok(listing) => listing,
        Err(problem) => return refused(StatusCode::BAD_REQUEST, &problem),
    };
    let status = status_page(&state);
    let reader = &status.reader;
    let reads = async {
        let routines = reader
            .routine_summaries(&RoutineQuery {
                name_contains: Some(listing.q.clone()).filter(|q| !q.is_empty()),
                paused: listing.paused,
                order: listing.order,
                after: listing.after,
                limit: ROUTINES_PER_PAGE,
                recent_fires: STRIP_FIRES,
            })
            .await?;
        Ok(IndexData {
            routines,
            failures: reader.recent_failures(RECENT_FAILURES).await?,
            claims: reader.open_claims(&status.instance_id).await?,
            rate: reader.fire_rate().await?,
            outbox: reader.outbox_backlog().await?,
        })
    };
    let data = match read(&state, reads).await {
        Ok(Ok(data)) => data,
        Ok(Err(e)) => return unavailable(&state, &e.to_string()),
        Err(response) => return response,
    };
    let now = Utc::now();
    let next_page = (data.routines.len() == ROUTINES_PER_PAGE as usize)
        .then(|| data.routines.last().map(|r| r.routine.id))
        .flatten();
    let back = listing.href(listing.order, listing.after);
    let sort_link = |order: RoutineOrder, label: &str| {
        html! {
            a href=(listing.href(order, None)) class=[(listing.order == order).then_some("on")] { (label) }
        }
    };
    let filtered = !listing.q.is_empty() || listing.paused.is_some();
    let body = html! {
        header {
            h1 { "cm scheduler " span.muted { (status.instance_id) } }
            span.live { button id="live-toggle" type="button" hidden { "Live updates" } }
        }
        (notice(&query))
        form.filter method="get" action="/" role="search" {
            label { "Name " input type="search" name="q" value=(listing.q) placeholder="part of a name"; }
            label { "State "
                select name="state" {
                    option value="all" selected[listing.paused.is_none()] { "all" }
                    option value="active" selected[listing.paused == Some(false)] { "active" }
                    option value="paused" selected[listing.paused == Some(true)] { "paused" }
                }
            }
            label { "Sort "
                select name="sort" {
                    option value="created" selected[listing.order == RoutineOrder::Created] { "created" }
                    option value="name" selected[listing.order == RoutineOrder::Name] { "name" }
                    option value="next" selected[listing.order == RoutineOrder::NextRun] { "next run" }
                }
            }
            button type="submit" { "Show" }
            @if filtered { a href="/" { "clear" } }
            noscript { a href={ (back) (if back.contains('?') { "&" } else { "?" }) "live=off" } { "stop refreshing" } }
        }
        div id="live" data-rendered=(now.timestamp_millis()) {
            (figures(&state, Some(data.claims), Some(&data.outbox), now))
            h2 { "Fires per minute, last hour" }
            (rate_chart(&data.rate))
            h2 { "Routines" }
            @if data.routines.is_empty() {
                p.muted { @if filtered { "No routine matches." } @else { "No routines." } }
            } @else {
                div.scroll { table id="routines" {
                    thead { tr {
                        th { (sort_link(RoutineOrder::Name, "Name")) }
                        th { "Schedule" }
                        th { (sort_link(RoutineOrder::NextRun, "Next run")) }
                        th { "State" }
                        th { "Last fires " span.muted.small { "(oldest → newest)" } }
                        th { "Last fire" }
                        th { "Actions" }
                    } }
                    tbody { @for summary in &data.routines {
                        @let r = &summary.routine;
                        tr data-routine=(r.id) {
                            td.name { a href=(routine_href(r)) { (shown(&r.name)) } br; span.muted.small { (r.kind) } }
                            td { code { (r.schedule) } br; span.muted.small { (r.timezone) } }
                            td { (next_run_cell(r, now)) }
                            td { (state_cell(r)) }
                            td { (strip(&summary.recent_fires)) }
                            td { @match summary.last_fire() {
                                Some(fire) => {
                                    (outcome_word(fire.outcome(), &fire.status, fire.run_exit_code)) br;
                                    (moment(fire.completed_at.unwrap_or(fire.scheduled_at), now))
                                }
                                None => span.muted { "never fired" },
                            } }
                            td { (actions(status, r, &back)) }
                        }
                    } }
                } }
                p.legend.small.muted {
                    span { span.cell.fired {} "fired, succeeded" }
                    span { span.cell.failed {} "failed, lost" }
                    span { span.cell.claimed {} "running" }
                    span { span.cell.skipped {} "skipped" }
                }
                @if let Some(after) = next_page {
                    p { a href=(listing.href(listing.order, Some(after))) { "Next " (ROUTINES_PER_PAGE) " routines →" } }
                }
            }
            h2 { "Recent failures" }
            @if data.failures.is_empty() {
                p.muted { "None." }
            } @else {
                div.scroll { table id="failures" {
                    thead { tr { th { "Routine" } th { "Occurrence" } th { "Outcome" } th { "Settled" } th { "Attempt" } th { "Error" } } }
                    tbody { @for f in &data.failures {
                        tr {
                            td { a href={ "/routines/" (f.routine_id) } { (shown(&f.routine_name)) } }
                            td { (moment(f.scheduled_at, now)) }
                            td { (failure_word(f)) }
                            td { @if let Some(at) = f.completed_at { (moment(at, now)) } }
                            td { (f.attempt) }
                            td.error { (shown(f.error.as_deref().unwrap_or(""))) }
                        }
                    } }
                } }
            }
        }
    };
    page(
        "cm: status",
        Some(status),
        query.live.as_deref() != Some("off"),
        body,
    )
    .into_response()
}

/// `GET /routines/{name or id}`: one routine's settings (not its payload), next runs, fires
/// and actions; 404 with a page when no routine has that name or id.
pub async fn routine(
    State(state): State<Arc<HttpState>>,
    handle: Result<Path<String>, PathRejection>,
    query: Result<Query<IndexQuery>, QueryRejection>,
) -> Response {
    let Ok(Path(handle)) = handle else {
        return unreadable_address();
    };
    let query = query.map(|Query(q)| q).unwrap_or_default();
    let status = status_page(&state);
    let reads = async {
        let routine = status.reader.routine(&handle).await?;
        let fires = status
            .reader
            .routine_fires(routine.id, FIRES_PER_ROUTINE)
            .await?;
        // The newest run that ended, with what it said.
        let last_run = match fires
            .iter()
            .find(|f| f.run_state.as_deref().is_some_and(|s| s != "running"))
        {
            Some(f) => {
                let occurrence = cm_domain::Occurrence::new(f.routine_id, f.scheduled_at);
                status.reader.fire(occurrence).await?
            }
            None => None,
        };
        let fire_count = status.reader.fire_count(routine.id).await?;
        Ok((routine, fires, last_run, fire_count))
    };
    let (r, fires, last_run, fire_count) = match read(&state, reads).await {
        Ok(Ok(read)) => read,
        Ok(Err(_)) => return missing(&handle),
        Err(response) => return response,
    };
    let now = Utc::now();
    let payload_bytes = serde_json::to_vec(&r.payload).map_or(0, |v| v.len());
    let parsed = r.parsed_schedule().ok();
    let zone = parsed.as_ref().map(|s| s.zone().tz());
    let window = parsed.as_ref().map(|s| (s.start(), s.end()));
    let jitter = parsed
        .as_ref()
        .and_then(|s| s.jitter())
        .and_then(|j| chrono::TimeDelta::from_std(j).ok());
    let recent: Vec<RecentFire> = fires
        .iter()
        .map(|f| RecentFire {
            scheduled_at: f.scheduled_at,
            status: f.status.clone(),
            completed_at: f.completed_at,
            error: f.failure().or(f.error.as_deref()).map(str::to_owned),
            run_state: f.run_state.clone(),
            run_exit_code: f.run_exit_code,
        })
        .collect();
    let back = routine_href(&r);
    let body = html! {
        header {
            p { a href="/" { "← All routines" } }
            span.live { button id="live-toggle" type="button" hidden { "Live updates" } }
        }
        h1 { (shown(&r.name)) }
        (notice(&query))
        div id="live" {
            div.actions {
                (actions(status, &r, &back))
                (edit_form(status, &r, &back))
                (delete_form(status, &r, fire_count))
            }
            dl id="settings" {
                dt { "Id" } dd { code { (r.id) } }
                dt { "Kind" } dd { (r.kind) }
                dt { "Schedule" } dd { code { (r.schedule) } }
                dt { "Time zone" } dd { (r.timezone) }
                @if let Some((Some(start), _)) = window { dt { "Starts" } dd { (instant_cell(start, zone)) } }
                @if let Some((_, Some(end))) = window { dt { "Ends" } dd { (instant_cell(end, zone)) } }
                @if let Some(left) = r.runs_left { dt { "Runs left" } dd { (left) } }
                @if let Some(jitter) = jitter { dt { "Jitter" } dd { "up to " (cm_domain::duration_text(jitter)) " after each occurrence" } }
                dt { "Misfire policy" } dd { (r.misfire_policy) }
                @if r.kind == cm_store::RoutineKind::Mission { dt { "Overlap" } dd { (r.overlap) } }
                dt { "State" } dd {
                    @if r.paused { span.paused { "paused" } }
                    @else if r.is_finished(now) { span.finished { "finished" } }
                    @else { span.active { "active" } }
                    @if let Some(reason) = &r.paused_reason { " " span.error { (shown(reason)) } }
                }
                dt { "Next run" } dd { (next_run_cell(&r, now)) }
                @if r.kind == cm_store::RoutineKind::Message {
                    dt { "Message" } dd.muted { (payload_bytes) " bytes (contents not shown)" }
                }
                dt { "Last claimed" } dd { @match r.last_run_at { Some(at) => (moment(at, now)), None => "never" } }
                dt { "Created" } dd { (moment(r.created_at, now)) }
                dt { "Changed" } dd { (moment(r.updated_at, now)) }
            }
            @if r.kind == cm_store::RoutineKind::Mission { (mission_section(status, &r, payload_bytes)) }
            @if let Some(run) = &last_run { (last_run_section(run, now)) }
            h2 { "Next runs" }
            @let next = next_runs(&r);
            @if next.is_empty() {
                p.muted { @if r.paused { "None while paused." } @else { "The schedule has no more runs." } }
            } @else {
                @let in_utc = zone.is_some_and(|z| z == chrono_tz::UTC);
                div.scroll { table id="next-runs" {
                    thead { tr {
                        @if !in_utc { th { "In " (r.timezone) } }
                        th { "UTC" } th { "When" }
                    } }
                    tbody { @for at in &next { tr {
                        @if !in_utc { td.nowrap { (in_zone(*at, zone)) } }
                        td.nowrap { (utc(*at)) }
                        td.nowrap { (relative(*at, now)) }
                    } } }
                } }
            }
            h2 {
                @if fires.len() < FIRES_PER_ROUTINE as usize {
                    @match fires.len() { 0 => "Fires", 1 => "Its one fire", n => { "All " (n) " fires" } }
                } @else {
                    "The newest " (fires.len()) " fires"
                }
            }
            @if fires.is_empty() {
                p.muted { "None yet." }
            } @else {
                (strip(&recent))
                div.scroll { table id="fires" {
                    thead { tr {
                        th { "Occurrence" } th { "Outcome" } th { "Dispatch" } th { "Origin" }
                        th { "Run" } th { "Attempt" } th { "Claimant" }
                        th { "Settled" } th { "Receipt" } th { "Error" }
                    } }
                    tbody { @for f in &fires {
                        tr {
                            td { (moment(f.scheduled_at, now)) }
                            td { (outcome_word(f.outcome(), &f.status, f.run_exit_code)) }
                            td.muted { (f.status) }
                            td.muted { (f.origin) }
                            td.nowrap { (run_cell(f, now)) }
                            td { (f.attempt) }
                            td.muted { (f.claimant) }
                            td { @if let Some(at) = f.completed_at { (moment(at, now)) } }
                            td.muted { (shown(f.receipt.as_deref().unwrap_or(""))) }
                            td.error { (shown(f.failure().or(f.error.as_deref()).unwrap_or(""))) }
                        }
                    } }
                } }
            }
        }
    };
    page(
        &format!("cm: {}", shown(&r.name)),
        Some(status),
        query.live.as_deref() != Some("off"),
        body,
    )
    .into_response()
}

fn unreadable_address() -> Response {
    refused(
        StatusCode::BAD_REQUEST,
        "This address does not name a routine (a routine's name or id, in UTF-8).",
    )
}

fn missing(handle: &str) -> Response {
    let what = match Uuid::try_parse(handle.trim()) {
        Ok(id) => format!("No routine has the id {id}."),
        Err(_) => format!("No routine is named “{}”.", handle.trim()),
    };
    refused(StatusCode::NOT_FOUND, &what)
}

/// What the page's actions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Pause,
    Resume,
    Trigger,
    Edit,
    Delete,
}

impl Action {
    const ALL: [Action; 5] = [
        Action::Pause,
        Action::Resume,
        Action::Trigger,
        Action::Edit,
        Action::Delete,
    ];

    fn path(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Trigger => "trigger",
            Action::Edit => "edit",
            Action::Delete => "delete",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Action::Pause => "paused",
            Action::Resume => "resumed",
            Action::Trigger => "triggered",
            Action::Edit => "edited",
            Action::Delete => "deleted",
        }
    }
}

/// `POST /routines/{name or id}/{pause|resume|trigger|edit|delete}`: pauses the routine,
/// resumes it from its next occurrence, asks for one occurrence now (fired by the next tick),
/// changes its settings (checked as `routine update` checks them), or deletes it with its
/// fires.
pub async fn action(
    State(state): State<Arc<HttpState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Bytes,
) -> Response {
    let Ok(Path((handle, action))) = path else {
        return unreadable_address();
    };
    match Action::ALL.into_iter().find(|a| a.path() == action) {
        Some(action) => act(&state, &handle, &body, action).await,
        None => not_found().await,
    }
}

/// `GET` of an action's address: 405, and nothing done (a link or an image cannot act).
pub async fn action_by_get() -> Response {
    let mut response = refused(
        StatusCode::METHOD_NOT_ALLOWED,
        "Nothing was done: an action is a button on the routine's page, never a link.",
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// The second half of the CSRF guard (the first, in `http`, checked the request's origin): the
/// form must carry this process's token. Then the action, and a redirect (303) back to the
/// page it came from, which says what was done (to the index after a delete). An edit that
/// the checks refuse changes nothing and answers 400 with the reason.
async fn act(state: &HttpState, handle: &str, body: &[u8], action: Action) -> Response {
    let status = status_page(state);
    let form: Vec<(String, String)> = url::form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if !field("csrf").is_some_and(|given| status.csrf.matches(given)) {
        return refused(
            StatusCode::FORBIDDEN,
            "This action was refused: its form did not come from this page (reload the page and \
             try again).",
        );
    }
    let routines = &status.routines;
    let acted = async {
        let routine = status.reader.routine(handle).await?;
        let outcome = match action {
            Action::Pause => routines.set_routine_paused(routine.id, true).await?,
            Action::Resume => routines.set_routine_paused(routine.id, false).await?,
            Action::Trigger => {
                routines.trigger_routine(routine.id).await?;
                routine
            }
            Action::Edit => match edit_of(&routine, &field) {
                Ok(Some(update)) => routines.update_routine(routine.id, &update).await?,
                Ok(None) => return Ok(Err((routine, "unchanged"))),
                Err(reason) => return Err(StoreError::InvalidRoutine(reason)),
            },
            Action::Delete => {
                routines.delete_routine(routine.id).await?;
                routine
            }
        };
        Ok(Ok(outcome))
    };
    let (routine, done) = match write(state, handle, acted).await {
        Ok(Ok(routine)) => (routine, action.done()),
        Ok(Err((routine, done))) => (routine, done),
        Err(response) => return response,
    };
    tracing::info!(routine = %routine.name, id = %routine.id, action = done,
        "an operator acted on the status page");
    let back = match action {
        Action::Delete => "/".to_owned(),
        _ => field("back")
            .filter(|b| safe_back(b))
            .map(str::to_owned)
            .unwrap_or_else(|| routine_href(&routine)),
    };
    let location = with_notice(&back, done, &routine.name);
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, location)],
        "done\n",
    )
        .into_response()
}

/// An action's write: [`read`]'s deadline and health, and a refusal (a check, a name taken, a
/// routine gone) answered 400 or 404 with its reason, nothing changed.
async fn write<T>(
    state: &HttpState,
    handle: &str,
    writes: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, Response> {
    match read(state, async {
        match writes.await {
            Err(StoreError::InvalidRoutine(reason)) => Ok(Err(reason)),
            Err(StoreError::NameTaken(name)) => Ok(Err(format!("the name {name} is taken"))),
            other => other.map(Ok),
        }
    })
    .await
    {
        Ok(Ok(Ok(done))) => Ok(done),
        Ok(Ok(Err(reason))) => Err(refused(
            StatusCode::BAD_REQUEST,
            &format!("Nothing was changed: {reason}."),
        )),
        Ok(Err(_)) => Err(missing(handle)),
        Err(response) => Err(response),
    }
}

/// The change an edit form asks of `routine`: each field that differs from the routine's
/// setting (an empty message keeps the message), checked by [`crate::edit::Edit::checked`] as
/// `routine update` checks its flags. `None` when nothing differs.
fn edit_of<'a>(
    routine: &Routine,
    field: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<cm_store::RoutineUpdate>, String> {
    let changed =
        |name: &str, current: &str| field(name).map(str::trim).filter(|given| *given != current);
    let edit = crate::edit::Edit {
        name: None,
        schedule: changed("schedule", &routine.schedule),
        timezone: changed("timezone", &routine.timezone),
        misfire: changed("misfire", routine.misfire_policy.as_str()),
        overlap: changed("overlap", routine.overlap.as_str())
            .filter(|_| routine.kind == cm_store::RoutineKind::Mission),
        message: field("message").filter(|m| !m.is_empty()),
    };
    let zone = cm_domain::Zone::parse(&routine.timezone).ok();
    match edit.checked(routine.kind, zone, "overlap") {
        Ok(update) => Ok(Some(update)),
        Err(e) if e == crate::edit::NOTHING_TO_CHANGE => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `back` is a path of this server (never another host: no open redirect).
fn safe_back(back: &str) -> bool {
    back.starts_with('/')
        && !back.starts_with("//")
        && !back.contains('\\')
        && back.len() <= 2048
        && !back.chars().any(char::is_control)
}

/// `back` with `done` and `of` set to what was done, replacing earlier ones.
fn with_notice(back: &str, done: &str, name: &str) -> String {
    let (path, query) = back.split_once('?').unwrap_or((back, ""));
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if key != "done" && key != "of" {
            out.append_pair(&key, &value);
        }
    }
    out.append_pair("done", done).append_pair("of", name);
    format!("{path}?{}", out.finish())
}

/// What the last action did, from the query it redirected to.
fn notice(query: &IndexQuery) -> Markup {
    let of = shown(query.of.as_deref().unwrap_or(""));
    let said = match query.done.as_deref() {
        Some("paused") => Some(format!("Paused “{of}”: it fires no more until resumed.")),
        Some("resumed") => Some(format!(
            "Resumed “{of}”: it fires from its next occurrence."
        )),
        Some("triggered") => Some(format!(
            "Triggered “{of}”: the next tick fires it (an occurrence at this instant)."
        )),
        Some("edited") => Some(format!(
            "Saved “{of}”: its next run is worked out from the new settings."
        )),
        Some("unchanged") => Some(format!("Nothing to save: “{of}” has these settings.")),
        Some("deleted") => Some(format!("Deleted “{of}” and its fires.")),
        _ => None,
    };
    html! { @if let Some(said) = said { p.notice role="status" { (said) } } }
}

/// A routine's actions, each behind a confirmation (a `<details>` the operator opens, then the
/// form's button), each form carrying the CSRF token and the page to come back to.
fn actions(status: &StatusPage, r: &Routine, back: &str) -> Markup {
    let form = |action: Action, summary: &str, confirm: String, class: &str| {
        html! {
            details.act {
                summary { (summary) }
                form method="post" action={ (routine_href(r)) "/" (action.path()) } {
                    input type="hidden" name="csrf" value=(status.csrf.value());
                    input type="hidden" name="back" value=(back);
                    button type="submit" class=(class) { (confirm) }
                }
            }
        }
    };
    html! {
        div.actions {
            @if r.paused {
                (form(Action::Resume, "Resume…", format!("Resume {}", shown(&r.name)), "go"))
            } @else {
                (form(Action::Pause, "Pause…", format!("Pause {}", shown(&r.name)), "danger"))
            }
            @if r.kind == cm_store::RoutineKind::Mission {
                (form(Action::Trigger, "Run again…", format!("Run {} again now", shown(&r.name)), "go"))
            } @else {
                (form(Action::Trigger, "Fire now…", format!("Fire {} now", shown(&r.name)), "go"))
            }
        }
    }
}

/// A routine's settings as a form (behind a `<details>`, as every action): schedule, zone,
/// misfire policy, and a mission's overlap policy or a message's new text (empty keeps the
/// text, which the page never shows).
fn edit_form(status: &StatusPage, r: &Routine, back: &str) -> Markup {
    let mission = r.kind == cm_store::RoutineKind::Mission;
    html! {
        details.act id="edit" {
            summary { "Edit settings…" }
            form.edit method="post" action={ (routine_href(r)) "/edit" } {
                input type="hidden" name="csrf" value=(status.csrf.value());
                input type="hidden" name="back" value=(back);
                label for="edit-schedule" { "Schedule" }
                input id="edit-schedule" name="schedule" value=(r.schedule) required spellcheck="false";
                label for="edit-timezone" { "Time zone" }
                input id="edit-timezone" name="timezone" value=(r.timezone) required spellcheck="false";
                label for="edit-misfire" { "Misfire policy" }
                select id="edit-misfire" name="misfire" {
                    @for policy in ["fire-once", "catch-up", "skip"] {
                        option value=(policy) selected[r.misfire_policy.as_str() == policy] { (policy) }
                    }
                }
                @if mission {
                    label for="edit-overlap" { "Overlap" }
                    select id="edit-overlap" name="overlap" {
                        @for policy in ["forbid", "allow", "replace", "buffer-one", "buffer-all"] {
                            option value=(policy) selected[r.overlap.as_str() == policy] { (policy) }
                        }
                    }
                } @else {
                    label for="edit-message" { "New message" }
                    textarea id="edit-message" name="message" maxlength=(cm_domain::MAX_MESSAGE_BYTES)
                        placeholder="empty keeps the current message (not shown)" {}
                }
                span {}
                button type="submit" class="go" { "Save changes" }
                span.hint.muted.small { "Checked as routine update checks it; a new schedule or zone moves the next run." }
            }
        }
    }
}

/// Delete, behind a confirmation that says how many fires go with the routine.
fn delete_form(status: &StatusPage, r: &Routine, fire_count: u64) -> Markup {
    let fires = match fire_count {
        0 => "no fires".to_owned(),
        1 => "its one fire".to_owned(),
        n => format!("its {n} fires"),
    };
    html! {
        details.act id="delete" {
            summary { "Delete…" }
            form method="post" action={ (routine_href(r)) "/delete" } {
                input type="hidden" name="csrf" value=(status.csrf.value());
                p.small { "Deletes the routine and " (fires) " from the ledger; a run already going is not stopped by this page." }
                button type="submit" class="danger" { "Delete " (shown(&r.name)) " and " (fires) }
            }
        }
    }
}

/// A mission routine's description, scrubbed of secrets, and how this scheduler runs it.
fn mission_section(status: &StatusPage, r: &Routine, payload_bytes: usize) -> Markup {
    let scrub = |text: &str| cm_dispatch::scrub_output(text, &[]);
    let mission = cm_domain::Mission::from_value(&r.payload);
    html! {
        h2 { "Mission" }
        @match &mission {
            Ok(m) => {
                dl id="mission" {
                    dt { "Repository" } dd { code { (shown(&scrub(m.repository()))) } }
                    dt { "Ref" } dd { @match m.git_ref() { Some(git_ref) => code { (shown(git_ref)) }, None => span.muted { "the default branch" } } }
                    dt { "Task" } dd.error { (shown(&scrub(m.task()))) }
                    dt { "Env" } dd {
                        @if m.env().is_empty() { span.muted { "none" } }
                        @for (name, value) in m.env() { code { (shown(&scrub(&format!("{name}={value}")))) } br; }
                    }
                    dt { "Labels" } dd {
                        @if m.labels().is_empty() { span.muted { "none" } }
                        @for (key, value) in m.labels() { code { (shown(key)) "=" (shown(value)) } br; }
                    }
                }
            }
            Err(e) => p.problem { (payload_bytes) " bytes that are not a mission this version reads: " (shown(&e.to_string())) }
        }
        h2 { "How missions run here" }
        @if status.runner.is_empty() {
            p.muted { "This scheduler has no mission backend (its occurrences settle failed)." }
        } @else {
            dl id="runner" {
                @for (label, value) in &status.runner { dt { (label) } dd { code { (shown(&scrub(value))) } } }
            }
        }
    }
}

/// This scheduler's own figures, with everyone's open claims and the outbox backlog when read.
fn figures(
    state: &HttpState,
    claims: Option<OpenClaims>,
    outbox: Option<&OutboxBacklog>,
    now: DateTime<Utc>,
) -> Markup {
    let stats = &state.stats;
    let last_tick = match stats.last_success() {
        Some(at) => format!("{}s ago", at.elapsed().as_secs()),
        None => "none yet".into(),
    };
    let lateness = match stats.lateness.mean() {
        Some(mean) => format!(
            "{} mean, {} max",
            seconds(mean),
            seconds(stats.lateness.max())
        ),
        None => "no dispatch yet".into(),
    };
    html! {
        div.figures id="figures" {
            div.figure { "In flight (this / all)" b {
                @match claims { Some(c) => { (c.mine) " / " (c.all) } None => "?" }
            } }
            div.figure title="outbox messages no consumer has acknowledged" { "Outbox backlog" b {
                @match outbox {
                    Some(o) => {
                        (o.pending)
                        @if let Some(oldest) = o.oldest { " " span.muted.small { "oldest " (relative(oldest, now)) } }
                    }
                    None => "?",
                }
            } }
            div.figure { "Last good tick" b { (last_tick) } }
            div.figure { "Ticks" b { (Stats::get(&stats.ticks)) } }
            div.figure { "Tick errors" b { (Stats::get(&stats.tick_errors)) } }
            div.figure { "Fired" b { (Stats::get(&stats.fired)) } }
            div.figure title="launched missions whose run succeeded" { "Succeeded" b { (Stats::get(&stats.succeeded)) } }
            div.figure title="failed dispatches, and missions whose run failed or was lost" { "Failed" b { (Stats::get(&stats.failed) + Stats::get(&stats.lost)) } }
            div.figure { "Deferred" b { (Stats::get(&stats.deferred)) } }
            div.figure { "Lateness" b { (lateness) } }
        }
        @if let Some(error) = stats.last_error() {
            p { "Latest loop error: " span.error.failed { (shown(&error)) } }
        }
    }
}

/// A fire's outcome in words (`failed (exit 3)`, `succeeded`; a claim is `running`), coloured
/// as its cell in the strips.
fn outcome_word(outcome: FireOutcome, status: &str, exit_code: Option<i32>) -> Markup {
    html! { span class=(outcome_class(outcome)) { (page_outcome_text(outcome, status, exit_code)) } }
}

/// An outcome's words on the page: [`crate::runs::outcome_text`], with a claim `running`.
fn page_outcome_text(outcome: FireOutcome, status: &str, exit_code: Option<i32>) -> String {
    match outcome {
        FireOutcome::Claimed => "running".to_owned(),
        _ => crate::runs::outcome_text(outcome, status, exit_code),
    }
}

/// A fire's run in a cell: its duration and start, or nothing for a fire with no run.
fn run_cell(f: &cm_store::Fire, now: DateTime<Utc>) -> Markup {
    html! {
        @if let Some(started) = f.run_started_at {
            @if let Some(d) = f.run_duration() { (crate::runs::duration_text(d)) " " }
            span.muted.small { "from " (moment(started, now)) }
        } @else if f.run_state.as_deref() == Some("running") {
            span.muted.small { "running" }
        }
    }
}

/// The newest run that ended: its outcome, start, end, duration and exit code, and the last of
/// its output.
fn last_run_section(run: &cm_store::FireDetail, now: DateTime<Utc>) -> Markup {
    let f = &run.fire;
    html! {
        h2 { "Last run" }
        dl id="last-run" {
            dt { "Occurrence" } dd { (moment(f.scheduled_at, now)) " " code.small { (cm_domain::Occurrence::new(f.routine_id, f.scheduled_at).idempotency_key()) } }
            dt { "Outcome" } dd { (outcome_word(f.outcome(), &f.status, f.run_exit_code)) }
            @if let Some(why) = f.failure() { dt { "Reason" } dd.error { (shown(why)) } }
            dt { "Started" } dd { @match f.run_started_at { Some(at) => (moment(at, now)), None => "not reported" } }
            dt { "Ended" } dd { @match f.run_finished_at { Some(at) => (moment(at, now)), None => "not reported" } }
            dt { "Duration" } dd { @match f.run_duration() { Some(d) => (crate::runs::duration_text(d)), None => "not reported" } }
            dt { "Exit code" } dd { @match f.run_exit_code { Some(code) => (code), None => "none" } }
        }
        @match run.run_output.as_deref() {
            Some(output) if !output.is_empty() => {
                p.muted.small { "Its output's last lines (" (cm_store::MAX_RUN_OUTPUT / 1024) " KiB at most, secrets scrubbed):" }
                pre id="run-output" { @for line in output.lines() { (shown(line)) "\n" } }
            }
            _ => p.muted { "Its runtime kept no output." },
        }
    }
}

/// The outcome of a failure listed in "Recent failures".
fn failure_word(f: &FailedFire) -> Markup {
    let outcome = f.outcome.parse().unwrap_or(FireOutcome::Failed);
    let status = if f.run_exit_code.is_some() {
        "fired"
    } else {
        "failed"
    };
    outcome_word(outcome, status, f.run_exit_code)
}

/// The class (colour) of an outcome: green for one that went well, red for a failure, amber
/// for one not known yet, grey for a skip.
fn outcome_class(outcome: FireOutcome) -> &'static str {
    match outcome {
        FireOutcome::Fired | FireOutcome::Succeeded => "fired",
        FireOutcome::Failed | FireOutcome::Lost => "failed",
        FireOutcome::Claimed | FireOutcome::Running => "claimed",
        FireOutcome::Skipped => "skipped",
    }
}

/// A routine's state as the command line words it, with the reason cm paused it, cut short
/// (the whole reason is its title, and on the routine's page).
fn state_cell(r: &Routine) -> Markup {
    html! {
        @if r.paused {
            span.paused { "paused" }
            @if let Some(reason) = &r.paused_reason {
                @let reason = reason.strip_prefix("paused ").unwrap_or(reason);
                span.reason.small.muted title=(shown(reason)) { (shown(reason)) }
            }
        } @else if r.is_finished(Utc::now()) {
            span.finished { "finished" }
        } @else {
            span.active { "active" }
        }
    }
}

/// The next run: how far away, then the instant in the routine's zone and in UTC.
fn next_run_cell(r: &Routine, now: DateTime<Utc>) -> Markup {
    let zone = r.parsed_schedule().ok().map(|s| s.zone().tz());
    html! {
        @match r.next_run_at {
            Some(at) => {
                time datetime=(utc(at)) title=(utc(at)) { (relative(at, now)) } br;
                @if r.timezone != "UTC" { span.muted.small.nowrap { (in_zone(at, zone)) } br; }
                span.muted.small.nowrap { (utc(at)) }
            }
            None => span.muted {
                @if r.paused { "none while paused" }
                @else if r.is_finished(now) { "none: finished" }
                @else { "none" }
            },
        }
    }
}

/// An instant in the routine's zone, with UTC beside it.
fn instant_cell(at: DateTime<Utc>, zone: Option<chrono_tz::Tz>) -> Markup {
    html! {
        (in_zone(at, zone)) " " span.muted.small.nowrap { (utc(at)) }
    }
}

/// A strip of fires, oldest left, one coloured cell each (by its outcome: a mission's is its
/// run's), its time, outcome and error its title.
fn strip(fires: &[RecentFire]) -> Markup {
    html! {
        span.strip role="img" aria-label=(strip_label(fires)) {
            @for f in fires.iter().rev() {
                @let outcome = f.outcome();
                @let word = page_outcome_text(outcome, &f.status, f.run_exit_code);
                @let title = match &f.error {
                    Some(error) => format!("{} {word}: {error}", utc(f.scheduled_at)),
                    None => format!("{} {word}", utc(f.scheduled_at)),
                };
                span class={ "cell " (outcome_class(outcome)) } title=(title) {}
            }
        }
    }
}

fn strip_label(fires: &[RecentFire]) -> String {
    let count = |class: &str| {
        fires
            .iter()
            .filter(|f| outcome_class(f.outcome()) == class)
            .count()
    };
    format!(
        "last {} fires: {} fired or succeeded, {} failed, {} skipped, {} running",
        fires.len(),
        count("fired"),
        count("failed"),
        count("skipped"),
        count("claimed")
    )
}

/// Fires and failures per minute over the last hour, as stacked bars drawn on the server.
fn rate_chart(rate: &FireRate) -> Markup {
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 130.0;
    const LEFT: f64 = 34.0;
    const BOTTOM: f64 = 18.0;
    const TOP: f64 = 6.0;
    let peak = rate
        .minutes
        .iter()
        .map(|m| m.fired + m.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let (fired, failed): (u64, u64) = rate
        .minutes
        .iter()
        .fold((0, 0), |(a, b), m| (a + m.fired, b + m.failed));
    let plot = HEIGHT - BOTTOM - TOP;
    let slot = (WIDTH - LEFT) / rate.minutes.len().max(1) as f64;
    let scale = |n: u64| n as f64 / peak as f64 * plot;
    let mut bars = String::new();
    let minutes = rate.minutes.len() as i64;
    for (i, m) in rate.minutes.iter().enumerate() {
        let x = LEFT + i as f64 * slot + 0.5;
        let start = rate.until - chrono::Duration::minutes(minutes - 1 - i as i64);
        let label = format!(
            "{}: {} fired, {} failed",
            start.format("%H:%M UTC"),
            m.fired,
            m.failed
        );
        let (h_fired, h_failed) = (scale(m.fired), scale(m.failed));
        let base = HEIGHT - BOTTOM;
        let _ = write!(
            bars,
            r##"<g><title>{label}</title><rect x="{x:.1}" y="{top:.1}" width="{w:.1}" height="{plot:.1}" fill="transparent"/>"##,
            top = TOP,
            w = slot - 1.0,
        );
        if m.fired > 0 {
            let _ = write!(
                bars,
                r##"<rect class="fired" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h_fired:.1}" fill="#2da44e"/>"##,
                y = base - h_fired,
                w = slot - 1.0,
            );
        }
        if m.failed > 0 {
            let _ = write!(
                bars,
                r##"<rect class="failed" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h_failed:.1}" fill="#cf222e"/>"##,
                y = base - h_fired - h_failed,
                w = slot - 1.0,
            );
        }
        bars.push_str("</g>");
    }
    let axis = HEIGHT - BOTTOM;
    html! {
        p.legend.small {
            span { span.cell.fired {} (fired) " fired" }
            span { span.cell.failed {} (failed) " failed" }
            span.muted { "in the last hour, by occurrence time; busiest minute " (peak) }
        }
        svg.chart id="fire-rate" xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            role="img" aria-label={ "fires per minute over the last hour: " (fired) " fired, " (failed) " failed" } {
            line x1=(LEFT) y1=(axis) x2=(WIDTH) y2=(axis) stroke="#d0d7de" {}
            line x1=(LEFT) y1=(TOP) x2=(WIDTH) y2=(TOP) stroke="#eaeef2" stroke-dasharray="3 3" {}
            text x=(LEFT - 4.0) y=(TOP + 9.0) text-anchor="end" { (peak) }
            text x=(LEFT - 4.0) y=(axis) text-anchor="end" { "0" }
            (PreEscaped(bars))
            text x=(LEFT) y=(HEIGHT - 4.0) { "60 min ago" }
            text x=(LEFT + (WIDTH - LEFT) / 2.0) y=(HEIGHT - 4.0) text-anchor="middle" { "30 min ago" }
            text x=(WIDTH) y=(HEIGHT - 4.0) text-anchor="end" { "now" }
        }
    }
}

/// An instant as "3 min ago" / "in 2 h", with the exact instant (UTC) beside it.
fn moment(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    html! {
        time datetime=(utc(at)) title=(utc(at)) { (relative(at, now)) }
        " " span.muted.small.nowrap { (utc(at)) }
    }
}

/// How far `at` is from `now`, in the largest unit that fits: "in 40 s", "3 min ago", "2 h ago",
/// "in 5 d".
pub fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let seconds = (at - now).num_seconds();
    let n = seconds.unsigned_abs();
    let amount = match n {
        0 => return "now".into(),
        1..=59 => format!("{n} s"),
        60..=3599 => format!("{} min", n / 60),
        3600..=172_799 => format!("{} h", n / 3600),
        _ => format!("{} d", n / 86_400),
    };
    if seconds > 0 {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// A routine's page: by name when the name is safe to write in a path as it is, else by id.
fn routine_href(r: &Routine) -> String {
    let plain = !r.name.is_empty()
        && r.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | ':' | '@'))
        && r.name != "."
        && r.name != "..";
    if plain {
        format!("/routines/{}", r.name)
    } else {
        format!("/routines/{}", r.id)
    }
}

/// The routine's next runs, when each comes due (a jitter applied): its stored next run, then
/// the schedule's following occurrences.
fn next_runs(r: &Routine) -> Vec<DateTime<Utc>> {
    let (Some(first), Ok(schedule)) = (r.next_run_at, r.parsed_schedule()) else {
        return Vec::new();
    };
    schedule
        .runs_from_clock(r.id, first)
        .map(|(_, planned)| planned)
        .take(NEXT_RUNS)
        .collect()
}

fn in_zone(at: DateTime<Utc>, zone: Option<chrono_tz::Tz>) -> String {
    match zone {
        Some(tz) => at
            .with_timezone(&tz)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        None => utc(at),
    }
}

fn utc(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// Stored text as the page shows it: control, invisible and bidirectional characters written
/// as escapes (`\u{202e}`), so a name or an error cannot reorder or hide what is around it.
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    cm_domain::name::escape_unseen(text)
}
