//! The status page: every routine with its schedule, next run and last fire; a page per
//! routine with its settings, next runs and recent fires; recent failures; and this
//! scheduler's own figures.
//!
//! Server-rendered HTML (maud), no JavaScript; it refreshes itself while open and reads only.
//! Payload contents are never shown (a mission's description or a message's text may be
//! private), only their size.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use cm_store::{Routine, StatusReader, StoreError};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use uuid::Uuid;

use crate::http::HttpState;
use crate::stats::Stats;

/// Routines shown on one page of the index.
pub const ROUTINES_PER_PAGE: u32 = 100;
/// Failures shown on the index.
pub const RECENT_FAILURES: u32 = 20;
/// Fires shown on a routine's page.
pub const FIRES_PER_ROUTINE: u32 = 50;
/// Next runs shown on a routine's page.
pub const NEXT_RUNS: usize = 5;

/// What the status page reads besides the counters.
pub struct StatusPage {
    /// The store's read-only queries.
    pub reader: Arc<dyn StatusReader>,
    /// This scheduler's instance id (its claims are "its own" in flight).
    pub instance_id: String,
    /// How often an open page reloads itself.
    pub refresh: Duration,
}

/// The index's query string: `?after=<routine id>` pages on.
#[derive(Debug, serde::Deserialize)]
pub struct IndexQuery {
    after: Option<Uuid>,
}

const CSS: &str = "
body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;padding:0 .8em 2em;max-width:80em;color:#1b1b1b}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.6em}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3em .5em;border-bottom:1px solid #ddd;vertical-align:top}
th{background:#f3f3f3}
.fired{color:#176f2c}.failed{color:#b00020;font-weight:600}.claimed{color:#8a5a00}
.paused{color:#8a5a00}.muted{color:#666}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em}dt{font-weight:600}
.figures{display:flex;flex-wrap:wrap;gap:.5em}
.figure{border:1px solid #ddd;border-radius:4px;padding:.4em .7em;min-width:8em}
.figure b{display:block;font-size:1.2em}
.error{white-space:pre-wrap;word-break:break-word}
";

fn page(title: &str, refresh: Duration, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    meta http-equiv="refresh" content=(refresh.as_secs().max(1));
                    title { (title) }
                    style { (PreEscaped(CSS)) }
                }
                body { (body) }
            }
        }
        .into_string(),
    )
}

fn unavailable(state: &HttpState, error: &StoreError) -> Response {
    let refresh = status_page(state).refresh;
    (
        StatusCode::SERVICE_UNAVAILABLE,
        page(
            "cm: database unavailable",
            refresh,
            html! {
                h1 { "cm scheduler" }
                p.failed { "The database does not answer: " (error) }
                (figures(state, None))
            },
        ),
    )
        .into_response()
}

fn status_page(state: &HttpState) -> &StatusPage {
    state
        .status
        .as_ref()
        .expect("the status routes exist only with a status page")
}

/// `GET /`: every routine (a page at a time), recent failures, this scheduler's figures.
pub async fn index(
    State(state): State<Arc<HttpState>>,
    Query(query): Query<IndexQuery>,
) -> Response {
    let status = status_page(&state);
    let reader = &status.reader;
    let loaded = async {
        let routines = reader
            .routine_summaries(query.after, ROUTINES_PER_PAGE)
            .await?;
        let failures = reader.recent_failures(RECENT_FAILURES).await?;
        let claims = reader.open_claims(&status.instance_id).await?;
        Ok::<_, StoreError>((routines, failures, claims))
    }
    .await;
    let (routines, failures, claims) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => return unavailable(&state, &e),
    };
    let next_page = (routines.len() == ROUTINES_PER_PAGE as usize)
        .then(|| routines.last().map(|r| r.routine.id))
        .flatten();
    let body = html! {
        h1 { "cm scheduler " span.muted { (status.instance_id) } }
        (figures(&state, Some(claims)))
        h2 { "Routines" }
        @if routines.is_empty() {
            p.muted { "No routines." }
        } @else {
            div.scroll { table id="routines" {
                thead { tr {
                    th { "Name" } th { "Schedule" } th { "Next run (its zone)" } th { "Next run (UTC)" }
                    th { "State" } th { "Last fire" }
                } }
                tbody { @for summary in &routines {
                    @let r = &summary.routine;
                    tr data-routine=(r.id) {
                        td { a href={ "/routines/" (r.id) } { (r.name) } }
                        td { code { (r.schedule) } " " span.muted { (r.timezone) } }
                        td { (next_in_zone(r)) }
                        td { (r.next_run_at.map(utc).unwrap_or_default()) }
                        td { (state_cell(r)) }
                        td { @match &summary.last_fire {
                            Some(fire) => {
                                span class=(fire.status) { (fire.status) } " "
                                span.muted { (utc(fire.completed_at.unwrap_or(fire.scheduled_at))) }
                            }
                            None => span.muted { "never fired" },
                        } }
                    }
                } }
            } }
            @if let Some(after) = next_page {
                p { a href={ "/?after=" (after) } { "Next routines →" } }
            }
        }
        h2 { "Recent failures" }
        @if failures.is_empty() {
            p.muted { "None." }
        } @else {
            div.scroll { table id="failures" {
                thead { tr { th { "Routine" } th { "Occurrence (UTC)" } th { "Settled" } th { "Attempt" } th { "Error" } } }
                tbody { @for f in &failures {
                    tr {
                        td { a href={ "/routines/" (f.routine_id) } { (f.routine_name) } }
                        td { (utc(f.scheduled_at)) }
                        td { (f.completed_at.map(utc).unwrap_or_default()) }
                        td { (f.attempt) }
                        td.error { (f.error.as_deref().unwrap_or("")) }
                    }
                } }
            } }
        }
    };
    page("cm: status", status.refresh, body).into_response()
}

/// `GET /routines/{id}`: one routine's settings (not its payload), next runs and fires.
pub async fn routine(State(state): State<Arc<HttpState>>, Path(id): Path<Uuid>) -> Response {
    let status = status_page(&state);
    let loaded = async {
        let routine = status.reader.routine(id).await?;
        let fires = status.reader.routine_fires(id, FIRES_PER_ROUTINE).await?;
        Ok::<_, StoreError>((routine, fires))
    }
    .await;
    let (r, fires) = match loaded {
        Ok(loaded) => loaded,
        Err(StoreError::RoutineNotFound(_)) => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "cm: no such routine",
                    status.refresh,
                    html! { h1 { "No routine has id " (id) } p { a href="/" { "All routines" } } },
                ),
            )
                .into_response();
        }
        Err(e) => return unavailable(&state, &e),
    };
    let payload_bytes = serde_json::to_vec(&r.payload).map_or(0, |v| v.len());
    let zone = r.parsed_schedule().ok().map(|s| s.zone().tz());
    let body = html! {
        p { a href="/" { "← All routines" } }
        h1 { (r.name) }
        dl id="settings" {
            dt { "Id" } dd { code { (r.id) } }
            dt { "Kind" } dd { (r.kind) }
            dt { "Schedule" } dd { code { (r.schedule) } }
            dt { "Time zone" } dd { (r.timezone) }
            dt { "Misfire policy" } dd { (r.misfire_policy) }
            dt { "State" } dd { (state_cell(&r)) }
            dt { "Payload" } dd.muted { (payload_bytes) " bytes (contents not shown)" }
            dt { "Last claimed" } dd { (r.last_run_at.map(utc).unwrap_or_else(|| "never".into())) }
            dt { "Created" } dd { (utc(r.created_at)) }
            dt { "Changed" } dd { (utc(r.updated_at)) }
        }
        h2 { "Next runs" }
        @let next = next_runs(&r);
        @if next.is_empty() {
            p.muted { @if r.paused { "None while paused." } @else { "The schedule has no more runs." } }
        } @else {
            div.scroll { table id="next-runs" {
                thead { tr { th { "In " (r.timezone) } th { "UTC" } } }
                tbody { @for at in &next { tr { td { (in_zone(*at, zone)) } td { (utc(*at)) } } } }
            } }
        }
        h2 { "Last " (FIRES_PER_ROUTINE) " fires" }
        @if fires.is_empty() {
            p.muted { "None yet." }
        } @else {
            div.scroll { table id="fires" {
                thead { tr {
                    th { "Occurrence (UTC)" } th { "Status" } th { "Run" } th { "Attempt" }
                    th { "Claimant" }
                    th { "Settled" } th { "Receipt" } th { "Error" }
                } }
                tbody { @for f in &fires {
                    tr {
                        td { (utc(f.scheduled_at)) }
                        td { span class=(f.status) { (f.status) } }
                        td { (crate::runs::run_text(f)) }
                        td { (f.attempt) }
                        td.muted { (f.claimant) }
                        td { (f.completed_at.map(utc).unwrap_or_default()) }
                        td.muted { (f.receipt.as_deref().unwrap_or("")) }
                        td.error { (f.error.as_deref().unwrap_or("")) }
                    }
                } }
            } }
        }
    };
    page(&format!("cm: {}", r.name), status.refresh, body).into_response()
}

/// This scheduler's own figures.
fn figures(state: &HttpState, claims: Option<cm_store::OpenClaims>) -> Markup {
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
            div.figure { "Last good tick" b { (last_tick) } }
            div.figure { "Ticks" b { (Stats::get(&stats.ticks)) } }
            div.figure { "Tick errors" b { (Stats::get(&stats.tick_errors)) } }
            div.figure { "Fired" b { (Stats::get(&stats.fired)) } }
            div.figure { "Failed" b { (Stats::get(&stats.failed)) } }
            div.figure { "Deferred" b { (Stats::get(&stats.deferred)) } }
            div.figure { "Lateness" b { (lateness) } }
        }
        @if let Some(error) = stats.last_error() {
            p { "Latest loop error: " span.error.failed { (error) } }
        }
    }
}

fn state_cell(r: &Routine) -> Markup {
    html! {
        @if r.paused {
            span.paused { "paused" }
            @if let Some(reason) = &r.paused_reason { ": " span.error { (reason) } }
        } @else {
            "running"
        }
    }
}

/// The routine's next runs: its stored next run, then the schedule's following instants.
fn next_runs(r: &Routine) -> Vec<DateTime<Utc>> {
    let (Some(first), Ok(schedule)) = (r.next_run_at, r.parsed_schedule()) else {
        return Vec::new();
    };
    std::iter::successors(Some(first), |at| schedule.next_after(*at))
        .take(NEXT_RUNS)
        .collect()
}

fn next_in_zone(r: &Routine) -> String {
    let zone = r.parsed_schedule().ok().map(|s| s.zone().tz());
    r.next_run_at
        .map(|at| in_zone(at, zone))
        .unwrap_or_else(|| "—".into())
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
