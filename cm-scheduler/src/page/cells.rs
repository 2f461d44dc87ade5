//! How one value reads on the page, in every view: an instant (relative, in the routine's
//! zone, in UTC), a fire's outcome and its colour, a routine's state and next run, its address,
//! and stored text with what could hide or reorder it escaped.

use chrono::{DateTime, SecondsFormat, Utc};
use cm_domain::FireOutcome;
use cm_store::{FailedFire, Routine};
use maud::{Markup, html};

/// A fire's outcome in words (`failed (exit 3)`, `succeeded`; a claim is `running`), coloured
/// as its cell in the strips.
pub(super) fn outcome_word(outcome: FireOutcome, status: &str, exit_code: Option<i32>) -> Markup {
    html! { span class=(outcome_class(outcome)) { (page_outcome_text(outcome, status, exit_code)) } }
}

/// An outcome's words on the page: [`crate::runs::outcome_text`], with a claim `running`.
pub(super) fn page_outcome_text(
    outcome: FireOutcome,
    status: &str,
    exit_code: Option<i32>,
) -> String {
    match outcome {
        FireOutcome::Claimed => "running".to_owned(),
        _ => crate::runs::outcome_text(outcome, status, exit_code),
    }
}

/// The outcome of a failure listed in "Recent failures".
pub(super) fn failure_word(f: &FailedFire) -> Markup {
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
pub(super) fn outcome_class(outcome: FireOutcome) -> &'static str {
    match outcome {
        FireOutcome::Fired | FireOutcome::Succeeded => "fired",
        FireOutcome::Failed | FireOutcome::Lost => "failed",
        FireOutcome::Claimed | FireOutcome::Running => "claimed",
        FireOutcome::Skipped => "skipped",
    }
}

/// A routine's state as the command line words it, with the reason cm paused it, cut short
/// (the whole reason is its title, and on the routine's page).
pub(super) fn state_cell(r: &Routine) -> Markup {
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
pub(super) fn next_run_cell(r: &Routine, now: DateTime<Utc>) -> Markup {
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
pub(super) fn instant_cell(at: DateTime<Utc>, zone: Option<chrono_tz::Tz>) -> Markup {
    html! {
        (in_zone(at, zone)) " " span.muted.small.nowrap { (utc(at)) }
    }
}

/// An instant as "3 min ago" / "in 2 h", with the exact instant (UTC) beside it.
pub(super) fn moment(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
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
pub(super) fn routine_href(r: &Routine) -> String {
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

pub(super) fn in_zone(at: DateTime<Utc>, zone: Option<chrono_tz::Tz>) -> String {
    match zone {
        Some(tz) => at
            .with_timezone(&tz)
            .format("%Y-%m-%d %H:%M:%S %Z")
            .to_string(),
        None => utc(at),
    }
}

pub(super) fn utc(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Stored text as the page shows it: control, invisible and bidirectional characters written
/// as escapes (`\u{202e}`), so a name or an error cannot reorder or hide what is around it.
pub(super) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    cm_domain::name::escape_unseen(text)
}
