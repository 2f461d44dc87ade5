//! A fire's outcome: what its effect did.
//!
//! The ledger's `status` says whether an occurrence was dispatched (`fired`), refused (`failed`),
//! not launched (`skipped`) or is still claimed. For a message that is the whole story: its
//! dispatch is its effect. A mission's effect is its run, which the ledger keeps beside the
//! status (`run_state`): a mission `fired` whose container exited 3 has failed. The outcome is
//! derived from the two, never stored as a second truth:
//!
//! ```text
//!   status    run_state            outcome
//!   failed    (any)                failed      the dispatch failed (or was abandoned)
//!   claimed   running|...          the run's   launched, not yet settled
//!   fired     running|succeeded|   the run's   a mission's run, as last seen
//!             failed|lost
//!   fired     (none)               fired       a message dispatched, or a mission handed on
//!   claimed   (none)               claimed     its dispatch not yet known to have finished
//!   skipped   (none)               skipped     not launched under the overlap policy
//! ```
//!
//! Everything that counts failures (auto-pause, the status page, `fires --status failed`, the
//! metrics, the exit summary) counts [`FireOutcome::is_failure`]: `failed` or `lost`.

use std::fmt;
use std::str::FromStr;

use crate::claim::FireStatus;
use crate::run::RunStateName;

/// What a fire's effect did (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FireOutcome {
    /// Claimed; its dispatch is not yet known to have finished.
    Claimed,
    /// Dispatched, with no run to watch: a message delivered, or a mission handed to the outbox.
    Fired,
    /// The dispatch failed, or the mission's run ended badly.
    Failed,
    /// Not launched under the routine's overlap policy.
    Skipped,
    /// A mission's run that has not ended.
    Running,
    /// A mission's run that ended well.
    Succeeded,
    /// A mission's run that its runtime no longer knows.
    Lost,
}

impl FireOutcome {
    /// Every outcome.
    pub const ALL: [FireOutcome; 7] = [
        FireOutcome::Claimed,
        FireOutcome::Fired,
        FireOutcome::Failed,
        FireOutcome::Skipped,
        FireOutcome::Running,
        FireOutcome::Succeeded,
        FireOutcome::Lost,
    ];

    /// The outcome of a fire with `status` whose run (if any) is in `run`.
    pub fn of(status: FireStatus, run: Option<RunStateName>) -> FireOutcome {
        match (status, run) {
            (FireStatus::Failed, _) => FireOutcome::Failed,
            (_, Some(run)) => FireOutcome::from(run),
            (FireStatus::Claimed, None) => FireOutcome::Claimed,
            (FireStatus::Fired, None) => FireOutcome::Fired,
            (FireStatus::Skipped, None) => FireOutcome::Skipped,
        }
    }

    /// Whether the outcome is a failure: a failed dispatch, a run that failed or was lost.
    pub fn is_failure(self) -> bool {
        matches!(self, FireOutcome::Failed | FireOutcome::Lost)
    }

    /// Whether the outcome may still change: claimed, or a run not yet ended.
    pub fn is_pending(self) -> bool {
        matches!(self, FireOutcome::Claimed | FireOutcome::Running)
    }

    /// The outcome's name, as shown and as `fires --status` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            FireOutcome::Claimed => "claimed",
            FireOutcome::Fired => "fired",
            FireOutcome::Failed => "failed",
            FireOutcome::Skipped => "skipped",
            FireOutcome::Running => "running",
            FireOutcome::Succeeded => "succeeded",
            FireOutcome::Lost => "lost",
        }
    }
}

impl From<RunStateName> for FireOutcome {
    fn from(run: RunStateName) -> Self {
        match run {
            RunStateName::Running => FireOutcome::Running,
            RunStateName::Succeeded => FireOutcome::Succeeded,
            RunStateName::Failed => FireOutcome::Failed,
            RunStateName::Lost => FireOutcome::Lost,
        }
    }
}

impl fmt::Display for FireOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An outcome text that is none of the outcomes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown outcome {0:?} (expected claimed, fired, failed, skipped, running, succeeded or lost)"
)]
pub struct ParseFireOutcomeError(pub String);

impl FromStr for FireOutcome {
    type Err = ParseFireOutcomeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FireOutcome::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| ParseFireOutcomeError(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUSES: [FireStatus; 4] = [
        FireStatus::Claimed,
        FireStatus::Fired,
        FireStatus::Failed,
        FireStatus::Skipped,
    ];

    fn runs() -> impl Iterator<Item = Option<RunStateName>> {
        std::iter::once(None).chain(RunStateName::ALL.into_iter().map(Some))
    }

    #[test]
    fn a_mission_fired_whose_run_failed_is_a_failure() {
        let outcome = FireOutcome::of(FireStatus::Fired, Some(RunStateName::Failed));
        assert_eq!(outcome, FireOutcome::Failed);
        assert!(outcome.is_failure());
        assert!(FireOutcome::of(FireStatus::Fired, Some(RunStateName::Lost)).is_failure());
        assert!(!FireOutcome::of(FireStatus::Fired, Some(RunStateName::Succeeded)).is_failure());
        assert!(!FireOutcome::of(FireStatus::Fired, None).is_failure());
    }

    #[test]
    fn a_failed_dispatch_is_failed_whatever_its_run() {
        for run in runs() {
            assert_eq!(
                FireOutcome::of(FireStatus::Failed, run),
                FireOutcome::Failed
            );
        }
    }

    #[test]
    fn a_failure_is_a_failed_status_or_a_failed_or_lost_run() {
        // The rule the store's SQL states (`status = 'failed' OR run_state IN ('failed', 'lost')`).
        for status in STATUSES {
            for run in runs() {
                let sql = status == FireStatus::Failed
                    || matches!(run, Some(RunStateName::Failed | RunStateName::Lost));
                assert_eq!(
                    FireOutcome::of(status, run).is_failure(),
                    sql,
                    "{status} {run:?}"
                );
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for outcome in FireOutcome::ALL {
            assert_eq!(outcome.as_str().parse::<FireOutcome>(), Ok(outcome));
        }
        assert!("fine".parse::<FireOutcome>().is_err());
    }
}
