//! Tables for people: `routine list`, `fires` and the sections of `routine show`, with a header
//! and aligned columns. Every value is printed with its control characters escaped, so a stored
//! text cannot break a listing or drive the terminal.

use chrono::{DateTime, SecondsFormat, Utc};
use cm_store::{Fire, Routine};

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
            serde_json::to_string(item).map_err(anyhow::Error::from)?
        );
    }
    Ok(())
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
    "NAME",
    "STATE",
];

/// Whether a routine runs: `active`, `paused`, or why cm paused it by itself (its reason
/// starts `paused by cm:`).
pub(super) fn state(r: &Routine) -> String {
    match (&r.paused_reason, r.paused) {
        (_, false) => "active".into(),
        (Some(reason), true) => printable(reason),
        (None, true) => "paused".into(),
    }
}

/// A routine as a row of `routine list`.
pub(super) fn routine_row(r: &Routine) -> Vec<String> {
    let next = match r.next_run_at {
        Some(t) => instant(t),
        None if r.paused => "paused".into(),
        None => "never".into(),
    };
    vec![
        r.id.to_string(),
        r.kind.to_string(),
        next,
        r.misfire_policy.clone(),
        r.timezone.clone(),
        printable(&r.schedule),
        printable(&r.name),
        state(r),
    ]
}

/// The columns of `fires`. A receipt column (what the backend answered) goes before ERROR once
/// the ledger keeps one.
pub(super) const FIRE_COLUMNS: &[&str] = &[
    "SCHEDULED AT (UTC)",
    "ROUTINE",
    "STATUS",
    "ORIGIN",
    "RUN",
    "ATTEMPT",
    "CLAIMANT",
    "RECEIPT",
    "ERROR",
];

/// A fire as a row of `fires`.
pub(super) fn fire_row(f: &Fire) -> Vec<String> {
    vec![
        instant(f.scheduled_at),
        f.routine_id.to_string(),
        f.status.clone(),
        f.origin.clone(),
        printable(&cm_scheduler::runs::run_text(f)),
        f.attempt.to_string(),
        printable(&f.claimant),
        f.receipt.as_deref().map(printable).unwrap_or_default(),
        f.error.as_deref().map(printable).unwrap_or_default(),
    ]
}

/// The columns of the fires `routine show` lists (the routine is the one shown).
pub(super) const ROUTINE_FIRE_COLUMNS: &[&str] = &[
    "SCHEDULED AT (UTC)",
    "STATUS",
    "ORIGIN",
    "RUN",
    "ATTEMPT",
    "CLAIMANT",
    "RECEIPT",
    "ERROR",
];

/// A fire as a row of `routine show`.
pub(super) fn routine_fire_row(f: &Fire) -> Vec<String> {
    let mut row = fire_row(f);
    row.remove(1);
    row
}
