//! Failing routines stop themselves. The store pauses a routine in the transaction that
//! records its Nth failure in a row (`PgStore::pausing_after_failures`); this is the safety net
//! in the loop's periodic maintenance, for a pause that could not be taken then: every routine
//! whose last N fires all failed is paused with the reason kept, and logged as an error, so a
//! broken routine does not hammer its target occurrence after occurrence.

use std::sync::Arc;
use std::time::Duration;

use cm_store::{FailingRoutines, GroupId, StoreError};
use tracing::error;

/// How far back a pass looks for routines with a fresh failure. A pass runs every few
/// seconds to a minute, so each failure is seen by many passes.
const WINDOW: Duration = Duration::from_secs(3600);

/// The automatic pause: the store it acts through and how many failures in a row trigger it.
pub(crate) struct AutoPause {
    pub(crate) store: Arc<dyn FailingRoutines>,
    pub(crate) after_failures: u32,
}

impl AutoPause {
    /// One pass in `group` (every group: `None`): pauses the routines whose last fires all
    /// failed, and logs each. Returns how many it paused; the caller logs a failure.
    pub(crate) async fn pass(&self, group: Option<GroupId>) -> Result<usize, StoreError> {
        let paused = match group {
            None => {
                self.store
                    .pause_failing_routines(self.after_failures, WINDOW)
                    .await?
            }
            Some(group) => {
                self.store
                    .pause_failing_routines_in(group, self.after_failures, WINDOW)
                    .await?
            }
        };
        for routine in &paused {
            error!(routine = %routine.name, routine_id = %routine.id, reason = %routine.reason,
                "routine paused: its last {} fires failed; resume it once it is fixed",
                self.after_failures);
        }
        Ok(paused.len())
    }
}
