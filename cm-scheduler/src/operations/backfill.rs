//! Backfilling: a routine's occurrences in a past window that the ledger does not hold yet,
//! requested for the next ticks to fire.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cm_store::{PgStore, Routine, RoutineStore};

use super::{OperationError, refused};

/// What a backfill asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backfilled {
    /// The occurrences newly requested.
    pub requested: u64,
    /// The window's occurrences, those already in the ledger or requested included.
    pub occurrences: u64,
}

/// Refuses a retention shorter than the schedulers may have (`run --retention`), before
/// anything is read.
pub fn check_retention(retention: Duration) -> Result<(), OperationError> {
    if retention < cm_domain::config::MIN_RETENTION {
        return Err(refused("--retention must be at least a day, as for run"));
    }
    Ok(())
}

/// Requests `routine`'s occurrences from `from` to `to` (both included) that the ledger does
/// not hold yet. The window is judged against the database's clock, the one the ticks use,
/// and refused when it starts earlier than `retention` (less an hour) allows: a pruned slot
/// would fire again.
pub async fn backfill(
    store: &PgStore,
    routine: &Routine,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    retention: Duration,
) -> Result<Backfilled, OperationError> {
    let schedule = routine.parsed_schedule()?;
    let now = store.ping().await?;
    let occurrences = cm_domain::backfill_occurrences(&schedule, from, to, now, retention)
        .map_err(|e| refused(e.to_string()))?;
    let requested = store.request_occurrences(routine.id, &occurrences).await?;
    Ok(Backfilled {
        requested,
        occurrences: occurrences.len() as u64,
    })
}
