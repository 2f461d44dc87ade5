//! The index (`GET /`): every routine, a page at a time, filtered by name and state and sorted,
//! each with its schedule, next run, state and a strip of its last fires; the last hour's fires,
//! the outbox backlog, the concurrency limits (when any is set), recent failures and this
//! scheduler's figures.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use cm_store::{FireRate, OpenClaims, OutboxBacklog, RoutineOrder, RoutineQuery};
use maud::{Markup, html};
use uuid::Uuid;

use super::actions::{actions, notice};
use super::cells::{
    failure_word, moment, next_run_cell, outcome_word, routine_href, shown, state_cell,
};
use super::figures::{figures, rate_chart, strip};
use super::{
    IndexQuery, RECENT_FAILURES, ROUTINES_PER_PAGE, STRIP_FIRES, page, read, refused, status_page,
    unavailable,
};
use crate::http_state::HttpState;

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
    events: Vec<cm_store::RoutineEvent>,
    limits: Vec<cm_store::ConcurrencyLimit>,
}

/// `GET /`: the routines (a page at a time, filtered and sorted), the last hour's fires, the
/// outbox backlog, the concurrency limits, recent failures, this scheduler's figures.
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
            events: match &status.events {
                Some(log) => {
                    log.events(&cm_store::EventFilter {
                        limit: super::events::EVENTS_SHOWN,
                        ..cm_store::EventFilter::default()
                    })
                    .await?
                }
                None => Vec::new(),
            },
            limits: match &status.limits {
                Some(limits) => limits.list_concurrency_limits().await?,
                None => Vec::new(),
            },
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
                            td.schedule { code { (r.schedule) } br; span.muted.small.reads { (r.schedule_words().unwrap_or_else(|| r.timezone.clone())) } }
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
            @if !data.limits.is_empty() { (limits_table(&data.limits, now)) }
            @if status.events.is_some() {
                h2 { "Latest events" }
                (super::events::events_table("latest-events", &data.events, true, now))
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

/// The concurrency limits, as `limit list` prints them: each key's limit, the places its
/// routines' fires hold now, how many routines have the key, and when the limit was set.
fn limits_table(limits: &[cm_store::ConcurrencyLimit], now: chrono::DateTime<Utc>) -> Markup {
    html! {
        h2 { "Concurrency limits" }
        div.scroll { table id="limits" {
            thead { tr {
                th { "Key" } th { "At most" } th { "Running now" } th { "Routines" } th { "Set" }
            } }
            tbody { @for l in limits {
                tr {
                    td { code { (shown(&l.key)) } }
                    td { (l.max_running) }
                    td {
                        (l.running)
                        @if l.running >= u64::from(l.max_running) { " " span.paused.small { "full" } }
                    }
                    td { (l.routines) }
                    td { (moment(l.updated_at, now)) }
                }
            } }
        } }
        p.muted.small { "A key's routines run at most this many at once across all schedulers; the others wait, owed. Set with " code { "limit set KEY N" } "." }
    }
}
