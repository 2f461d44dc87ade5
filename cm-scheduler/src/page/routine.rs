//! A routine's page (`GET /routines/{name or id}`): its settings (never a message's text), how
//! its mission runs, its last run's outcome and output, its next runs, its fires, and the
//! operator's actions on it.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use cm_store::{RecentFire, Routine};
use maud::{Markup, html};

use super::actions::{actions, delete_form, edit_form, notice};
use super::cells::{
    in_zone, instant_cell, moment, next_run_cell, outcome_word, relative, routine_href, shown, utc,
};
use super::figures::strip;
use super::{
    FIRES_PER_ROUTINE, IndexQuery, NEXT_RUNS, StatusPage, missing, page, read, status_page,
    unreadable_address,
};
use crate::http_state::HttpState;

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
        let (events, skips) = match &status.events {
            Some(log) => {
                let events = log
                    .events(&cm_store::EventFilter {
                        routine: Some(routine.id),
                        limit: super::events::EVENTS_SHOWN,
                        ..cm_store::EventFilter::default()
                    })
                    .await?;
                (events, Some(log.skips(routine.id, routine.group_id).await?))
            }
            None => (Vec::new(), None),
        };
        // Its schedule on its calendar, so its next runs are the planned ones.
        let on_calendar = match (&status.calendars, &routine.calendar) {
            (Some(calendars), Some(_)) => calendars.routine_schedule(&routine).await.ok(),
            _ => None,
        };
        // Its key's limit, with the places held now (`None` inside: the key has no limit).
        let limit = match (&status.limits, &routine.concurrency_key) {
            (Some(limits), Some(key)) => Some(
                limits
                    .list_concurrency_limits()
                    .await?
                    .into_iter()
                    .find(|l| l.key == key.as_str()),
            ),
            _ => None,
        };
        Ok((
            routine,
            fires,
            last_run,
            fire_count,
            (events, skips, on_calendar, limit),
        ))
    };
    let (r, fires, last_run, fire_count, (events, skips, on_calendar, limit)) =
        match read(&state, reads).await {
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
                @if let Some(words) = r.schedule_words() { dt { "Reads" } dd.reads { (words) } }
                dt { "Time zone" } dd { (r.timezone) }
                @if let Some((Some(start), _)) = window { dt { "Starts" } dd { (instant_cell(start, zone)) } }
                @if let Some((_, Some(end))) = window { dt { "Ends" } dd { (instant_cell(end, zone)) } }
                @if let Some(left) = r.runs_left { dt { "Runs left" } dd { (left) } }
                @if let Some(deadline) = r.deadline { dt { "Deadline" } dd { (humantime::format_duration(deadline).to_string()) " after each occurrence" } }
                @if r.retry.retries > 0 { dt { "Retries" } dd { (r.retry.retries) ", backoff " (r.retry.backoff.to_string()) } }
                @if let Some(key) = &r.concurrency_key { dt { "Concurrency key" } dd { (key_cell(key, limit.as_ref())) } }
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
                @if let Some(skips) = &skips { dt { "Skipped" } dd { (super::events::skips_cell(skips, now)) } }
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
            @let next = next_runs(&r, on_calendar.as_ref());
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
            @if status.events.is_some() {
                h2 { "Events" }
                (super::events::events_table("events", &events, false, now))
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
                            td.nowrap { (f.attempt) @if f.retry > 0 { " " span.muted.small { "(retry " (f.retry) ")" } } }
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

/// A routine's concurrency key, with its limit and the places its routines' fires hold now
/// (`limit`: `None` when the limits are not read, `Some(None)` when the key has none).
fn key_cell(
    key: &cm_domain::ConcurrencyKey,
    limit: Option<&Option<cm_store::ConcurrencyLimit>>,
) -> Markup {
    html! {
        code { (shown(key.as_str())) }
        @match limit {
            Some(Some(l)) => {
                " — " (l.running) " of " (l.max_running) " running"
                @if l.running >= u64::from(l.max_running) { " " span.paused { "full" } " " span.muted.small { "(its next runs wait, owed)" } }
                br;
                span.muted.small {
                    "at most " (l.max_running) " at once across all schedulers, shared by "
                    @match l.routines { 1 => "this routine alone", n => { (n) " routines" } }
                }
            }
            Some(None) => { " — " span.muted { "no limit set (unlimited)" } }
            None => {}
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

/// The newest run that ended: the earlier attempts of its occurrence that were retried, each
/// with what it met; then its own outcome, start, end, duration and exit code, and the last of
/// its output.
fn last_run_section(run: &cm_store::FireDetail, now: DateTime<Utc>) -> Markup {
    let f = &run.fire;
    html! {
        h2 { "Last run" }
        @if !f.tries.is_empty() { (earlier_tries(&f.tries, f.attempt, now)) }
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

/// The earlier attempts of an occurrence that failed and were tried again, oldest first: each
/// one's outcome, exit code, error or reason, when it ended and its retry was due, and the
/// last of its output.
/// `last_attempt` is the number of the attempt whose details follow.
fn earlier_tries(tries: &[cm_store::EarlierTry], last_attempt: u32, now: DateTime<Utc>) -> Markup {
    html! {
        div id="earlier-tries" {
            p.muted.small {
                @match tries.len() { 1 => "Its occurrence was tried once before, and retried:", n => { "Its occurrence was tried " (n) " times before, each retried:" } }
            }
            @for t in tries {
                h3 { "Attempt " (t.attempt) }
                dl.try {
                    dt { "Outcome" } dd { span.error { (shown(&t.outcome)) } }
                    @if let Some(code) = t.exit_code { dt { "Exit code" } dd { (code) } }
                    @if let Some(why) = t.error.as_deref().or(t.reason.as_deref()) { dt { "Reason" } dd.error { (shown(why)) } }
                    dt { "Ended" } dd { (moment(t.ended_at, now)) }
                    dt { "Retried" } dd { (moment(t.retry_at, now)) }
                }
                @if let Some(output) = t.output.as_deref().filter(|o| !o.is_empty()) {
                    pre.try-output { @for line in output.lines() { (shown(line)) "\n" } }
                }
            }
            h3 { "Attempt " (last_attempt) ", the last" }
        }
    }
}

/// The routine's next runs, when each comes due (a jitter or its calendar applied): its stored
/// next run, then the schedule's following occurrences. `on_calendar` is its schedule on its
/// calendar, when it is on one.
fn next_runs(r: &Routine, on_calendar: Option<&cm_domain::Schedule>) -> Vec<DateTime<Utc>> {
    let parsed = r.parsed_schedule();
    let schedule = match (on_calendar, &parsed) {
        (Some(schedule), _) => schedule,
        (None, Ok(schedule)) => schedule,
        (None, Err(_)) => return Vec::new(),
    };
    let Some(first) = r.next_run_at else {
        return Vec::new();
    };
    schedule
        .runs_from_clock(r.id, first)
        .map(|(_, planned)| planned)
        .take(NEXT_RUNS)
        .collect()
}
