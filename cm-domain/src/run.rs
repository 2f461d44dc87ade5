//! A mission's run, watched after its launch, and what a routine does when its occurrences'
//! runs would overlap.
//!
//! A mission is `fired` when its runtime accepts it (the container started, the Job created);
//! that stays the ledger's terminal status for the occurrence. Its **run** is watched to its end
//! beside the ticks:
//!
//! ```text
//!   fired ──▶ running ──▶ succeeded      (exit code 0, the Job succeeded)
//!                   ├──▶ failed         (a non-zero exit code, or the runtime's reason)
//!                   └──▶ lost           (the runtime no longer knows the run)
//! ```
//!
//! The [`OverlapPolicy`] of a mission routine (Kubernetes' concurrencyPolicy names) decides what
//! an occurrence does when an earlier run of the routine is still running: [`decide_overlap`].

use std::fmt;
use std::str::FromStr;

use crate::claim::ErrorText;

/// Where a mission's run is, as its runtime last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Launched and not finished (a container created, running or restarting; a Job active).
    Running,
    /// Ended well: exit code 0, or the Job's `Complete` condition.
    Succeeded,
    /// Ended badly.
    Failed {
        /// The process's exit code, when the runtime reports one.
        exit_code: Option<i32>,
        /// Why, in the runtime's words (`exit code 3`, `OOMKilled`, `DeadlineExceeded: …`).
        reason: ErrorText,
    },
    /// The runtime no longer knows the run (its container or Job is gone, a process that is no
    /// longer there and left no exit status).
    Lost {
        /// What was looked for and not found.
        reason: ErrorText,
    },
}

impl RunState {
    /// A failed run from its exit code, with the reason `exit code N`, and `detail` after it
    /// when the runtime adds one.
    pub fn exited(code: i32, detail: &str) -> RunState {
        if code == 0 {
            return RunState::Succeeded;
        }
        let reason = match detail.trim() {
            "" => format!("exit code {code}"),
            detail => format!("exit code {code}: {detail}"),
        };
        RunState::Failed {
            exit_code: Some(code),
            reason: ErrorText::new(reason),
        }
    }

    /// The state's name as stored and shown: `running`, `succeeded`, `failed` or `lost`.
    pub fn name(&self) -> RunStateName {
        match self {
            RunState::Running => RunStateName::Running,
            RunState::Succeeded => RunStateName::Succeeded,
            RunState::Failed { .. } => RunStateName::Failed,
            RunState::Lost { .. } => RunStateName::Lost,
        }
    }

    /// Whether the run has ended; an ended run is not watched again.
    pub fn is_finished(&self) -> bool {
        !matches!(self, RunState::Running)
    }

    /// The exit code: 0 for a succeeded run (every runtime's success is exit code 0: the
    /// container's, the process's, every container of the Job's pod), a failed run's when its
    /// runtime reports one.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            RunState::Succeeded => Some(0),
            RunState::Failed { exit_code, .. } => *exit_code,
            RunState::Running | RunState::Lost { .. } => None,
        }
    }

    /// Why a run failed or was lost.
    pub fn reason(&self) -> Option<&str> {
        match self {
            RunState::Failed { reason, .. } | RunState::Lost { reason } => Some(reason.as_str()),
            _ => None,
        }
    }
}

/// The name of a [`RunState`], without its details: the `run_state` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunStateName {
    /// See [`RunState::Running`].
    Running,
    /// See [`RunState::Succeeded`].
    Succeeded,
    /// See [`RunState::Failed`].
    Failed,
    /// See [`RunState::Lost`].
    Lost,
}

impl RunStateName {
    /// Every state, in the order of a run's life.
    pub const ALL: [RunStateName; 4] = [
        RunStateName::Running,
        RunStateName::Succeeded,
        RunStateName::Failed,
        RunStateName::Lost,
    ];

    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStateName::Running => "running",
            RunStateName::Succeeded => "succeeded",
            RunStateName::Failed => "failed",
            RunStateName::Lost => "lost",
        }
    }
}

impl fmt::Display for RunStateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run state text that is none of `running`, `succeeded`, `failed`, `lost`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown run state {0:?} (expected running, succeeded, failed or lost)")]
pub struct ParseRunStateError(pub String);

impl FromStr for RunStateName {
    type Err = ParseRunStateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStateName::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| ParseRunStateError(s.to_owned()))
    }
}

/// What an occurrence of a mission routine does while an earlier run of the routine is still
/// running (Kubernetes CronJob's `concurrencyPolicy`). Meaningless for message routines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OverlapPolicy {
    /// Launch regardless: runs may overlap.
    Allow,
    /// Do not launch: the occurrence settles `skipped`, naming the running fire. The default:
    /// a mission costs money, and two of one routine at once is rarely what anyone meant.
    #[default]
    Forbid,
    /// Stop the running one, then launch.
    Replace,
    /// Wait: while a run lasts the routine's clock stays at its first occurrence due (nothing is
    /// claimed, so nothing is lost if every scheduler dies), and when the run ends the newest
    /// owed occurrence launches; the older ones are recorded `skipped`, naming it
    /// ([`buffer_plan`]). Temporal's `BUFFER_ONE`.
    BufferOne,
    /// Wait, then launch every owed occurrence, oldest first, each after the previous run ends
    /// ([`buffer_plan`]). Temporal's `BUFFER_ALL`.
    BufferAll,
}

impl OverlapPolicy {
    /// The text stored in the database and typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::Forbid => "forbid",
            OverlapPolicy::Replace => "replace",
            OverlapPolicy::BufferOne => "buffer-one",
            OverlapPolicy::BufferAll => "buffer-all",
        }
    }

    /// Whether occurrences wait for the run instead of being decided at launch
    /// (`buffer-one`, `buffer-all`).
    pub fn buffers(self) -> bool {
        matches!(self, OverlapPolicy::BufferOne | OverlapPolicy::BufferAll)
    }
}

/// What a buffering routine's claim does with the occurrences its plan owes, once the routine's
/// run is free (a claim does not plan it while a run lasts): the one to launch now, the ones
/// recorded `skipped` (they came due while it waited), and where its clock goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferPlan {
    /// The occurrence launched now, if any.
    pub launch: Option<chrono::DateTime<chrono::Utc>>,
    /// Occurrences recorded `skipped`, naming `launch` (`buffer-one` only).
    pub skipped: Vec<chrono::DateTime<chrono::Utc>>,
    /// The routine's new clock: under `buffer-all`, the next owed occurrence (claimed after this
    /// run ends); otherwise the plan's.
    pub next_run_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// [`BufferPlan`] for `owed` (a plan's occurrences, oldest first) and `next_run_at` (the plan's
/// clock) under `policy`. `buffer-one` launches the newest and skips the rest; `buffer-all`
/// launches the oldest and keeps its clock at the next, so one run at a time drains them all in
/// order. Any other policy launches nothing here (it is decided at launch).
pub fn buffer_plan(
    policy: OverlapPolicy,
    owed: &[chrono::DateTime<chrono::Utc>],
    next_run_at: Option<chrono::DateTime<chrono::Utc>>,
) -> BufferPlan {
    match (policy, owed) {
        (OverlapPolicy::BufferOne, [older @ .., newest]) => BufferPlan {
            launch: Some(*newest),
            skipped: older.to_vec(),
            next_run_at,
        },
        (OverlapPolicy::BufferAll, [oldest, rest @ ..]) => BufferPlan {
            launch: Some(*oldest),
            skipped: Vec::new(),
            next_run_at: rest.first().copied().or(next_run_at),
        },
        _ => BufferPlan {
            launch: None,
            skipped: Vec::new(),
            next_run_at,
        },
    }
}

impl fmt::Display for OverlapPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An overlap policy text that is none of `allow`, `forbid`, `replace`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown overlap policy {0:?} (expected allow, forbid, replace, buffer-one or buffer-all)")]
pub struct ParseOverlapPolicyError(pub String);

impl FromStr for OverlapPolicy {
    type Err = ParseOverlapPolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(OverlapPolicy::Allow),
            "forbid" => Ok(OverlapPolicy::Forbid),
            "replace" => Ok(OverlapPolicy::Replace),
            "buffer-one" => Ok(OverlapPolicy::BufferOne),
            "buffer-all" => Ok(OverlapPolicy::BufferAll),
            other => Err(ParseOverlapPolicyError(other.to_owned())),
        }
    }
}

/// The earlier fire of a routine that holds its run: the one launched last under `forbid` or
/// `replace`, as the ledger holds it when the next occurrence is about to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunHolder {
    /// No earlier fire holds the routine's run, or the one that did has ended (its run finished,
    /// its launch failed, it was skipped).
    Free,
    /// The earlier fire is still being launched (`claimed`): its runtime may be starting it now.
    Launching,
    /// The earlier fire's run is `running`.
    Running,
}

/// What an occurrence about to launch does, decided by [`decide_overlap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapDecision {
    /// Launch it; it now holds the routine's run.
    Launch,
    /// Settle it `skipped`: an earlier run holds the routine.
    Skip,
    /// Stop the earlier run, then launch this one.
    ReplaceRunning,
}

/// What an occurrence of a routine under `policy` does when the routine's run is `holder`.
///
/// Under `replace`, an earlier fire still being launched cannot be stopped yet (nothing runs to
/// stop, and its launch may complete after this one's), so the occurrence is skipped as under
/// `forbid`: two runs at once are what `replace` promises never to allow. A buffering policy's
/// occurrence is claimed only once the run is free; one that finds it held all the same (a
/// trigger launched beside it) is skipped as under `forbid`, never run beside it.
pub fn decide_overlap(policy: OverlapPolicy, holder: &RunHolder) -> OverlapDecision {
    match (policy, holder) {
        (OverlapPolicy::Allow, _) | (_, RunHolder::Free) => OverlapDecision::Launch,
        (OverlapPolicy::Forbid | OverlapPolicy::BufferOne | OverlapPolicy::BufferAll, _)
        | (OverlapPolicy::Replace, RunHolder::Launching) => OverlapDecision::Skip,
        (OverlapPolicy::Replace, RunHolder::Running) => OverlapDecision::ReplaceRunning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_become_states() {
        assert_eq!(RunState::exited(0, "ignored"), RunState::Succeeded);
        assert_eq!(RunState::Succeeded.exit_code(), Some(0));
        assert_eq!(RunState::Running.exit_code(), None);
        let failed = RunState::exited(3, "");
        assert_eq!(failed.exit_code(), Some(3));
        assert_eq!(failed.reason(), Some("exit code 3"));
        assert_eq!(
            RunState::exited(137, "OOMKilled").reason(),
            Some("exit code 137: OOMKilled")
        );
        assert!(failed.is_finished());
        assert!(!RunState::Running.is_finished());
    }

    #[test]
    fn names_round_trip() {
        for name in RunStateName::ALL {
            assert_eq!(name.as_str().parse::<RunStateName>(), Ok(name));
        }
        assert!("done".parse::<RunStateName>().is_err());
        for policy in [
            OverlapPolicy::Allow,
            OverlapPolicy::Forbid,
            OverlapPolicy::Replace,
            OverlapPolicy::BufferOne,
            OverlapPolicy::BufferAll,
        ] {
            assert_eq!(policy.as_str().parse::<OverlapPolicy>(), Ok(policy));
        }
        assert_eq!(OverlapPolicy::default(), OverlapPolicy::Forbid);
        assert!("sometimes".parse::<OverlapPolicy>().is_err());
    }

    #[test]
    fn overlap_decisions() {
        use OverlapDecision::*;
        use OverlapPolicy::*;
        let check = |policy, holder: RunHolder, expected| {
            assert_eq!(
                decide_overlap(policy, &holder),
                expected,
                "{policy} {holder:?}"
            );
        };
        check(Allow, RunHolder::Running, Launch);
        check(Allow, RunHolder::Launching, Launch);
        check(Forbid, RunHolder::Free, Launch);
        check(Forbid, RunHolder::Running, Skip);
        check(Forbid, RunHolder::Launching, Skip);
        check(Replace, RunHolder::Free, Launch);
        check(Replace, RunHolder::Running, ReplaceRunning);
        check(Replace, RunHolder::Launching, Skip);
        check(BufferOne, RunHolder::Free, Launch);
        check(BufferOne, RunHolder::Running, Skip);
        check(BufferAll, RunHolder::Launching, Skip);
    }

    #[test]
    fn buffering_launches_the_newest_or_the_oldest() {
        let t =
            |m: i64| chrono::DateTime::<chrono::Utc>::UNIX_EPOCH + chrono::TimeDelta::minutes(m);
        let owed = [t(1), t(2), t(3)];
        assert_eq!(
            buffer_plan(OverlapPolicy::BufferOne, &owed, Some(t(4))),
            BufferPlan {
                launch: Some(t(3)),
                skipped: vec![t(1), t(2)],
                next_run_at: Some(t(4))
            }
        );
        assert_eq!(
            buffer_plan(OverlapPolicy::BufferAll, &owed, Some(t(4))),
            BufferPlan {
                launch: Some(t(1)),
                skipped: vec![],
                next_run_at: Some(t(2))
            }
        );
        assert_eq!(
            buffer_plan(OverlapPolicy::BufferAll, &owed[2..], Some(t(4))),
            BufferPlan {
                launch: Some(t(3)),
                skipped: vec![],
                next_run_at: Some(t(4))
            }
        );
        assert_eq!(
            buffer_plan(OverlapPolicy::BufferOne, &[], Some(t(4))),
            BufferPlan {
                launch: None,
                skipped: vec![],
                next_run_at: Some(t(4))
            }
        );
    }
}
