//! The `limit` commands' flags: the concurrency limits routines sharing a key share (set, list,
//! delete). A routine is given its key with `routine create|update --concurrency-key`.

use clap::Subcommand;
use cm_domain::ConcurrencyKey;
use cm_domain::limit::MAX_LIMIT;

use crate::edit::concurrency_key;

/// `limit`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum LimitCommand {
    /// Sets a key's limit: at most N runs of its routines at once, across all schedulers.
    ///
    /// Missions count their runs running, messages their dispatches in flight. The occurrences
    /// over the limit wait, owed, oldest first, taking turns between the key's routines; none
    /// is skipped for the limit. It takes effect at the next claim; what holds a place already
    /// keeps it.
    Set {
        /// The concurrency key (as `routine create --concurrency-key` gives it).
        #[arg(value_parser = concurrency_key)]
        key: ConcurrencyKey,
        /// At most this many at once: 0 (none runs until it is raised) to 1000000.
        #[arg(value_name = "N", value_parser = max_running, allow_negative_numbers = true)]
        max_running: u32,
    },
    /// Lists the limits by key, with the places held now and how many routines have each key.
    ///
    /// RUNNING counts the places its routines' fires hold: claimed (being dispatched, waiting
    /// for a retry, or left by a crashed scheduler until the reaper takes it over) or their
    /// mission's run running.
    List {
        /// As one JSON array of {"key", "max_running", "running", "routines", "updated_at"}.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a key's limit: its routines are unlimited (they keep their key).
    Delete {
        /// The concurrency key.
        #[arg(value_parser = concurrency_key)]
        key: ConcurrencyKey,
    },
}

/// `limit set`'s N: 0 to [`MAX_LIMIT`] ([`cm_domain::limit::check_limit`]); one out of range
/// said as it was written.
fn max_running(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i128>() {
        Ok(n) => u64::try_from(n)
            .ok()
            .and_then(|n| cm_domain::limit::check_limit(n).ok())
            .ok_or_else(|| format!("a concurrency limit must be 0 to {MAX_LIMIT} (it was {n})")),
        Err(_) => Err(format!(
            "{text:?} is not a concurrency limit (a number, 0 to {MAX_LIMIT})"
        )),
    }
}
