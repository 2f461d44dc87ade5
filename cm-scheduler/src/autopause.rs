//! Failing routines stop themselves: in the loop's periodic maintenance, every routine whose
//! last N fires all failed is paused with the reason kept, and logged as an error, so a broken
//! routine does not hammer its target occurrence after occurrence.

use std::sync::Arc;
use std::time::Duration;

use cm_store::{FailingRoutines, GroupId};
use tracing::error;

use crate::stats::Stats;

/// How far back a pass looks for routines with a fresh failure. A pass runs every few
/// seconds to a minute, so each failure is seen by many passes.
const WINDOW: Duration = Duration::from_secs(3600);

/// The automatic pause: the store it acts through and how many failures in a row trigger it.
pub(crate) struct AutoPause {
    pub(crate) store: Arc<dyn FailingRoutines>,
    pub(crate) after_failures: u32,
}

impl AutoPause {
    /// One pass. Returns whether it succeeded; a failure is logged and kept for health like a
    /// failed tick, and the next pass tries again.
    pub(crate) async fn pass(&self, stats: &Stats, group: Option<GroupId>) -> bool {
        let paused = match group {
            None => {
                self.store
                    .pause_failing_routines(self.after_failures, WINDOW)
                    .await
            }
            Some(group) => {
                self.store
                    .pause_failing_routines_in(group, self.after_failures, WINDOW)
                    .await
            }
        };
        match paused {
            Ok(paused) => {
                for routine in paused {
                    error!(routine = %routine.name, routine_id = %routine.id, reason = %routine.reason,
                        "routine paused: its last {} fires failed; resume it once it is fixed",
                        self.after_failures);
                }
                true
            }
            Err(e) => {
                error!(error = %e, "pausing failing routines failed");
                stats.tick_failed(format!("pausing failing routines failed: {e}"));
                false
            }
        }
    }
}
