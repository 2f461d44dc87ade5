//! Events on the page: the latest across routines on the index, a routine's own on its page
//! (see `cm_store::events`). A missed deadline is marked as a failure is.

use chrono::{DateTime, Utc};
use cm_store::RoutineEvent;
use maud::{Markup, html};

use super::cells::{moment, shown};

/// How many events the index's feed and a routine's page show.
pub(super) const EVENTS_SHOWN: u32 = 10;

/// A table of `events`, newest first; with `routines`, a column naming each event's routine.
pub(super) fn events_table(
    id: &str,
    events: &[RoutineEvent],
    routines: bool,
    now: DateTime<Utc>,
) -> Markup {
    html! {
        @if events.is_empty() {
            p.muted { "None." }
        } @else {
            div.scroll { table id=(id) {
                thead { tr {
                    th { "When" }
                    @if routines { th { "Routine" } }
                    th { "Event" } th { "Delivered" } th { "Detail" }
                } }
                tbody { @for e in events {
                    tr {
                        td.nowrap { (moment(e.occurred_at, now)) }
                        @if routines {
                            td { a href={ "/routines/" (e.routine_id) } { (shown(&e.routine_name)) } }
                        }
                        td.nowrap.error[loud(&e.event_type)] {
                            (e.event_type.trim_start_matches("routine."))
                        }
                        td.nowrap {
                            @match e.delivered_at {
                                Some(at) => (moment(at, now)),
                                None if e.delivery_attempts > 0 => span.error { "not yet (" (e.delivery_attempts) " tries)" },
                                None => span.muted { "-" },
                            }
                        }
                        td.muted { (shown(&detail(&e.data))) }
                    }
                } }
            } }
        }
    }
}

/// What a routine was owed and did not fire, by why, each with its latest decision.
pub(super) fn skips_cell(skips: &cm_store::Skips, now: DateTime<Utc>) -> Markup {
    let parts = [
        (skips.misfired, skips.last_misfired, "by its misfire policy"),
        (skips.overlap, skips.last_overlap, "by its overlap policy"),
        (skips.buffered, skips.last_buffered, "by buffering"),
    ];
    html! {
        @if parts.iter().all(|(n, _, _)| *n == 0) { span.muted { "none" } }
        @for (n, last, why) in parts.iter().filter(|(n, _, _)| *n > 0) {
            (n) " " (why)
            @if let Some(at) = last { ", the latest " (moment(*at, now)) }
            br;
        }
    }
}

/// Whether an event of this type is a failure a person must act on.
fn loud(event_type: &str) -> bool {
    matches!(
        event_type,
        "routine.failed" | "routine.deadline_missed" | "routine.planning_refused"
    )
}

/// An event's data in one line, its output tail left out (the routine's runs show it).
fn detail(data: &serde_json::Value) -> String {
    let Some(object) = data.as_object() else {
        return String::new();
    };
    object
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "output_tail" | "scheduled_at" | "planned_at"))
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => format!("{key}: {text}"),
            other => format!("{key}: {other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
