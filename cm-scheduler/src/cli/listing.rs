//! Tables for people: `routine list`, `fires` and the sections of `routine show`, with a header
//! and aligned columns. Every value is printed with its control characters escaped, so a stored
//! text cannot break a listing or drive the terminal.

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use cm_store::{Fire, RecentFire, Routine};
use uuid::Uuid;

/// How many routines `routine list` reads and prints at a time.
pub(super) const ROUTINE_PAGE: u32 = 1000;

/// `text` with control characters (newlines, escapes, …) and invisible or bidirectional
/// formatting characters (a right-to-left override, a zero-width space) written as escapes
/// (`\n`, `\u{202e}`).
pub(super) fn printable(text: &str) -> String {
    cm_domain::name::escape_unseen(text).into_owned()
}

/// Prints each item as one line of JSON (the `--json` form of the listings).
pub(super) fn print_json_lines<T: serde::Serialize>(items: &[T]) -> Result<(), super::Failure> {
    for item in items {
        say!(
            "{}",
            serde_json::to_string(item).map_err(|e| super::Failure::Other(e.to_string()))?
        );
    }
    Ok(())
}

/// What a routine was owed and did not fire, by why, each with its latest: `90 by misfire
/// policy (last 2026-12-05T12:15:30Z), 2 by overlap (last …)`, or `none`.
pub(super) fn skips(skips: &cm_store::Skips) -> String {
    let parts: Vec<String> = [
        (skips.misfired, skips.last_misfired, "misfire policy"),
        (skips.overlap, skips.last_overlap, "overlap"),
        (skips.buffered, skips.last_buffered, "buffering"),
    ]
    .into_iter()
    .filter(|(n, _, _)| *n > 0)
    .map(|(n, last, why)| match last {
        Some(at) => format!("{n} by {why} (last {})", instant(at)),
        None => format!("{n} by {why}"),
    })
    .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// An instant as the listings print it: UTC, to the second.
pub(super) fn instant(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Rows printed under a header, each column as wide as its widest value so far. The last
/// column is not padded, so a long value there (a name, an error) does not widen the others.
pub(super) struct Table {
    headers: &'static [&'static str],
    widths: Vec<usize>,
    printed_header: bool,
}

impl Table {
    pub(super) fn new(headers: &'static [&'static str]) -> Table {
        Table {
            headers,
            widths: headers.iter().map(|h| h.chars().count()).collect(),
            printed_header: false,
        }
    }

    /// Prints a page of rows (possibly none), the header first if it has not been printed yet,
    /// so an empty listing still shows its columns. Columns widen
    /// to this page's values; earlier pages are not reprinted.
    pub(super) fn print_page(&mut self, rows: &[Vec<String>]) {
        for row in rows {
            for (width, cell) in self.widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        if !self.printed_header {
            let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
            self.print_row(&header);
            self.printed_header = true;
        }
        for row in rows {
            self.print_row(row);
        }
    }

    fn print_row(&self, row: &[String]) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = self.widths[i].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        say!("{}", line.trim_end());
    }
}

/// The columns of `routine list`; the state is last, as a cm-paused routine's reason is long.
pub(super) const ROUTINE_COLUMNS: &[&str] = &[
    "ID",
    "KIND",
    "NEXT RUN (UTC)",
    "MISFIRE",
    "TIMEZONE",
    "SCHEDULE",
    "READS",
    "LAST",
    "NAME",
    "STATE",
];

/// Whether a routine runs: `active`, `finished` (its window closed or its one instant fired),
/// `paused`, or why cm paused it by itself (its reason starts `paused by cm:`).
pub(super) fn state(r: &Routine) -> String {
    match (&r.paused_reason, r.paused) {
        (_, false) => r.state(chrono::Utc::now()).as_str().into(),
        (Some(reason), true) => printable(reason),
        (None, true) => "paused".into(),
    }
}

/// A routine's last fire as `routine list` shows it: its outcome (`failed (exit 3)`), or
/// `never` when it has none.
pub(super) fn last_outcome(last: Option<&RecentFire>) -> String {
    match last {
        Some(f) => cm_scheduler::runs::outcome_text(f.outcome(), &f.status, f.run_exit_code),
        None => "never".into(),
    }
}

/// A routine as a row of `routine list`, with its last fire's outcome.
pub(super) fn routine_row(r: &Routine, last: Option<&RecentFire>) -> Vec<String> {
    let next = match r.next_run_at {
        Some(t) => instant(t),
        None if r.paused => "paused".into(),
        None if r.is_finished(chrono::Utc::now()) => "finished".into(),
        None => "never".into(),
    };
    vec![
        r.id.to_string(),
        r.kind.to_string(),
        next,
        r.misfire_policy.to_string(),
        r.timezone.clone(),
        printable(&r.schedule),
        r.schedule_words().unwrap_or_default(),
        last_outcome(last),
        printable(&r.name),
        state(r),
    ]
}

/// A routine as a line of `routine list --json`: the routine, with its last fire's outcome.
#[derive(serde::Serialize)]
pub(super) struct RoutineLine<'a> {
    #[serde(flatten)]
    routine: &'a Routine,
    /// Its schedule as a person would say it ([`Routine::schedule_words`]).
    schedule_words: Option<String>,
    last_outcome: Option<&'static str>,
}

impl<'a> RoutineLine<'a> {
    /// `routine` and its newest fire, if any.
    pub(super) fn new(routine: &'a Routine, last: Option<&RecentFire>) -> Self {
        RoutineLine {
            routine,
            schedule_words: routine.schedule_words(),
            last_outcome: last.map(|f| f.outcome().as_str()),
        }
    }
}

/// The columns of `fires`: OUTCOME is what the fire's effect did (a mission's is its run's:
/// `failed (exit 3)`), STATUS the ledger's word on its dispatch, FIRE the key `fires show`
/// takes, ERROR why it failed (the dispatch's error or the run's reason) or was skipped.
pub(super) const FIRE_COLUMNS: &[&str] = &[
    "SCHEDULED AT (UTC)",
    "ROUTINE",
    "ROUTINE ID",
    "OUTCOME",
    "STATUS",
    "ORIGIN",
    "ATTEMPT",
    "CLAIMANT",
    "RECEIPT",
    "FIRE",
    "ERROR",
];

/// What `fires` prints for a routine no longer there (its fires outlive it only in a listing
/// taken while it was being deleted).
const DELETED: &str = "(deleted)";

/// A fire as a row of `fires`: its routine's name (from `names`) beside its id.
pub(super) fn fire_row(f: &Fire, names: &HashMap<Uuid, String>) -> Vec<String> {
    let mut row = fire_columns(f);
    // The key `fires show` takes, before the error (the widest column, kept last).
    row.insert(row.len() - 1, fire_key(f));
    let name = names
        .get(&f.routine_id)
        .map_or_else(|| DELETED.to_string(), |n| printable(n));
    row.insert(1, name);
    row
}

/// A fire's columns but its routine's name.
fn fire_columns(f: &Fire) -> Vec<String> {
    let why = f.failure().or(f.error.as_deref());
    vec![
        instant(f.scheduled_at),
        f.routine_id.to_string(),
        printable(&cm_scheduler::runs::fire_outcome_text(f)),
        f.status.clone(),
        f.origin.clone(),
        f.attempt.to_string(),
        printable(&f.claimant),
        f.receipt.as_deref().map(printable).unwrap_or_default(),
        why.map(printable).unwrap_or_default(),
    ]
}

/// The fire's key (`cm-<routine id>-<microseconds>`), as `fires show` takes it.
fn fire_key(f: &Fire) -> String {
    cm_domain::Occurrence::new(f.routine_id, f.scheduled_at)
        .idempotency_key()
        .to_string()
}

/// A fire as a line of `fires --json`: its row with its key, its outcome and its routine's
/// name (`null` once the routine is deleted).
#[derive(serde::Serialize)]
pub(super) struct FireLine<'a> {
    #[serde(flatten)]
    fire: &'a Fire,
    /// The key `fires show` takes.
    key: String,
    outcome: &'static str,
    routine_name: Option<&'a str>,
    /// The W3C `traceparent` its last attempt was sent with.
    traceparent: String,
}

impl<'a> FireLine<'a> {
    /// The line of `fire`, its routine named from `names`.
    pub(super) fn new(fire: &'a Fire, names: &'a HashMap<Uuid, String>) -> Self {
        FireLine {
            fire,
            key: fire_key(fire),
            outcome: fire.outcome().as_str(),
            routine_name: names.get(&fire.routine_id).map(String::as_str),
            traceparent: fire_traceparent(fire),
        }
    }
}

/// The `traceparent` the fire's last attempt was sent with: a function of its occurrence and
/// attempt ([`cm_domain::trace`]), so the ledger's row names it.
fn fire_traceparent(fire: &Fire) -> String {
    let occurrence = cm_domain::Occurrence::new(fire.routine_id, fire.scheduled_at);
    let attempt = fire.attempt.max(1);
    cm_domain::trace::TraceParent::for_attempt(&occurrence, attempt).to_string()
}

/// The columns of the fires `routine show` lists (the routine is the one shown).
pub(super) const ROUTINE_FIRE_COLUMNS: &[&str] = &[
    "SCHEDULED AT (UTC)",
    "OUTCOME",
    "STATUS",
    "ORIGIN",
    "ATTEMPT",
    "CLAIMANT",
    "RECEIPT",
    "ERROR",
];

/// A fire as a row of `routine show`.
pub(super) fn routine_fire_row(f: &Fire) -> Vec<String> {
    let mut row = fire_columns(f);
    row.remove(1);
    row
}

/// `fires show`: the fire's fields, one a line, then the last of its run's output; then each
/// earlier attempt of its occurrence that failed and was retried, with the last of its output.
pub(super) fn print_fire(
    detail: &cm_store::FireDetail,
    occurrence: cm_domain::Occurrence,
    name: Option<&str>,
) {
    let f = &detail.fire;
    let time = |t: Option<DateTime<Utc>>| t.map(instant).unwrap_or_else(|| "-".into());
    say!("fire        {}", occurrence.idempotency_key());
    say!(
        "routine     {} ({})",
        name.map_or_else(|| DELETED.to_string(), printable),
        f.routine_id
    );
    say!("scheduled   {}", instant(f.scheduled_at));
    say!(
        "outcome     {}",
        printable(&cm_scheduler::runs::fire_outcome_text(f))
    );
    say!("status      {}", f.status);
    say!("origin      {}", f.origin);
    match f.retry {
        0 => say!("attempt     {} by {}", f.attempt, printable(&f.claimant)),
        retry => say!(
            "attempt     {} by {} (retry {retry})",
            f.attempt,
            printable(&f.claimant)
        ),
    }
    say!("traceparent {}", fire_traceparent(f));
    say!("settled     {}", time(f.completed_at));
    if let Some(why) = f.failure().or(f.error.as_deref()) {
        say!("error       {}", printable(why));
    }
    if let Some(receipt) = &f.receipt {
        say!("receipt     {}", printable(receipt));
    }
    if f.run_state.is_some() {
        say!("run         {}", f.run_state.as_deref().unwrap_or_default());
        say!("started     {}", time(f.run_started_at));
        say!("ended       {}", time(f.run_finished_at));
        say!(
            "duration    {}",
            f.run_duration()
                .map(cm_scheduler::runs::duration_text)
                .unwrap_or_else(|| "-".into())
        );
        say!(
            "exit code   {}",
            f.run_exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into())
        );
        say!("");
        match &detail.run_output {
            Some(output) if !output.is_empty() => {
                say!(
                    "output (the last {} bytes at most):",
                    cm_store::MAX_RUN_OUTPUT
                );
                for line in output.lines() {
                    say!("  {}", printable(line));
                }
            }
            _ => say!("output: none kept"),
        }
    }
    if !f.tries.is_empty() {
        say!("");
        say!("earlier attempts, each retried:");
        for t in &f.tries {
            say!("{}", earlier_try(t));
            if let Some(output) = t.output.as_deref() {
                for line in output.lines() {
                    say!("    {}", printable(line));
                }
            }
        }
    }
}

/// An earlier attempt of an occurrence, in one line: `attempt 1   failed  exit 3  <error or
/// reason>  retried at <instant>`.
fn earlier_try(t: &cm_store::EarlierTry) -> String {
    let mut parts = vec![format!(
        "attempt {:<3} {}",
        t.attempt,
        printable(&t.outcome)
    )];
    if let Some(code) = t.exit_code {
        parts.push(format!("exit {code}"));
    }
    if let Some(why) = t.error.as_deref().or(t.reason.as_deref()) {
        parts.push(printable(why));
    }
    parts.push(format!("retried at {}", instant(t.retry_at)));
    parts.join("  ")
}
