//! The instants of the retries this process decided (a failed attempt tried again under its
//! routine's retry policy), so its reaper takes each over when it is due instead of at its next
//! beat, every half lease. A retry another process decided, or one whose process stopped, is
//! taken over at the reaper's next beat by any process: the ledger holds it, this only hastens
//! it.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

/// How long after a retry's instant (by this host's clock) the reaper looks for it: the
/// database's clock decides, and may be a little behind.
const MARGIN: Duration = Duration::from_millis(250);

/// The most retry instants kept: past it, the latest are left to the reaper's beat.
const MAX_NOTED: usize = 10_000;

/// The retries due that this process decided, and a wake-up for the reaper.
#[derive(Debug, Default)]
pub struct RetryWake {
    due: Mutex<BTreeSet<DateTime<Utc>>>,
    changed: Notify,
}

impl RetryWake {
    /// Notes a retry due at `at`.
    pub fn due_at(&self, at: DateTime<Utc>) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = due.first().is_none_or(|first| at < *first);
        due.insert(at);
        if due.len() > MAX_NOTED {
            due.pop_last();
        }
        if earliest {
            self.changed.notify_one();
        }
    }

    /// Returns once the earliest retry noted is due, forgetting every one due by then; waits
    /// for one to be noted when none is. Cancel-safe: a retry noted stays until a call returns
    /// for it.
    pub async fn wait(&self) {
        loop {
            let next = self
                .due
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .first()
                .copied();
            let Some(at) = next else {
                self.changed.notified().await;
                continue;
            };
            let wait = (at - Utc::now()).to_std().unwrap_or_default() + MARGIN;
            tokio::select! {
                () = tokio::time::sleep(wait) => {
                    let now = Utc::now();
                    let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
                    while due.first().is_some_and(|first| *first <= now) {
                        due.pop_first();
                    }
                    return;
                }
                () = self.changed.notified() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_earliest_retry_wakes_first() {
        let wake = RetryWake::default();
        let now = Utc::now();
        wake.due_at(now + chrono::TimeDelta::seconds(3600));
        wake.due_at(now + chrono::TimeDelta::milliseconds(100));
        tokio::time::timeout(Duration::from_secs(5), wake.wait())
            .await
            .expect("the retry in 100 ms wakes the reaper");
        assert!(Utc::now() >= now + chrono::TimeDelta::milliseconds(100));
        // The later one is still noted, and not due yet.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), wake.wait())
                .await
                .is_err()
        );
        wake.due_at(Utc::now() + chrono::TimeDelta::milliseconds(50));
        tokio::time::timeout(Duration::from_secs(5), wake.wait())
            .await
            .expect("a retry noted while waiting wakes the reaper");
    }
}
