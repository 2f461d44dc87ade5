//! What a mission runtime offers beside launching: whether it answers, where a launched run is,
//! and stopping one.
//!
//! The scheduler waits at start for a runtime that does not answer yet ([`MissionRuntime::ready`],
//! shown by `/readyz`), watches every launched run to its end ([`MissionRuntime::observe`], a
//! bounded pass beside the ticks) and stops a running one when a routine's overlap policy is
//! `replace` ([`MissionRuntime::stop`]). Once a run ended, the watch asks what it left
//! ([`MissionRuntime::report`]): the tail of its output ([`MAX_RUN_OUTPUT`] bytes at most, secrets
//! scrubbed by [`scrub_output`]) and when it started and ended. Docker, Kubernetes and the
//! process runner implement it.

use std::time::Instant;

use async_trait::async_trait;
use cm_domain::RunState;

use crate::DispatchError;
pub use crate::output::scrub_output;

/// The most bytes of a run's output kept: its last 16 KiB.
pub const MAX_RUN_OUTPUT: usize = 16 * 1024;

/// The most bytes of one reply the Docker and Kubernetes backends read from their runtime's API:
/// 16 MiB. A reply past it is not read further; the call fails with an error naming the bound,
/// and is treated as any other failed call (tried again within the deadline, never judged by
/// what was read of it). A list of a Job's pods, a container's inspection or an error's text is
/// a few KiB to a few hundred, and a log read asks for a few times [`MAX_RUN_OUTPUT`]. The
/// Docker backend bounds each connection, which carries one reply: an image pull's progress
/// lines count as one reply, cut and tried again past the bound.
pub const MAX_REPLY_BYTES: u64 = 16 * 1024 * 1024;

/// What an ended run left behind, as its runtime reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// The run's last output (stdout and stderr as the runtime keeps them), at most
    /// [`MAX_RUN_OUTPUT`] bytes, starting at a line start when it was cut, lossy UTF-8, with
    /// secrets scrubbed ([`scrub_output`], without the caller's own secrets: pass them to it
    /// again); `None` when the runtime kept none (the container or pod gone, no log file), and
    /// empty when the run printed nothing.
    pub output: Option<String>,
    /// When the run started, by the runtime's clock (`None` when it does not say).
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the run ended, by the runtime's clock (`None` when it does not say).
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A launched mission, as the ledger names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRef {
    /// The runtime name: the occurrence's idempotency key (the container's name, the key the
    /// Job name is derived from, the process runner's marker).
    pub name: String,
    /// Where the run's evidence is, as the runtime that launched it named its place
    /// ([`MissionRuntime::place`]) and the ledger recorded it; `None` when nothing was
    /// recorded (a runtime every scheduler sees alike, or a run begun before places were).
    pub place: Option<String>,
}

impl RunRef {
    /// The run named `name`, with no place recorded: looked for where this runtime keeps its
    /// own runs.
    pub fn named(name: impl Into<String>) -> RunRef {
        RunRef {
            name: name.into(),
            place: None,
        }
    }
}

/// A mission runtime, seen after its launches.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait MissionRuntime: Send + Sync {
    /// `Ok` when the runtime answers; otherwise what was tried and why it failed
    /// (`cannot reach the Docker engine at unix:///…: connection refused`).
    async fn ready(&self) -> Result<(), String>;

    /// Where the run is now. An error is the runtime failing to answer (tried again on the next
    /// pass), never a verdict on the run: a run the runtime does not know is
    /// [`RunState::Lost`].
    async fn observe(&self, run: &RunRef, deadline: Instant) -> Result<RunState, DispatchError>;

    /// Stops the run, and returns `Ok` only once the runtime confirms it is gone: the
    /// container stopped (Docker stop with the configured grace), the Job and its pods deleted
    /// (foreground deletion, read back until the Job is gone), the process group exited. A run
    /// already ended or gone is stopped already. A stop not confirmed by `deadline` is an
    /// error, and the run may still be running.
    async fn stop(&self, run: &RunRef, deadline: Instant) -> Result<(), DispatchError>;

    /// Where this runtime keeps the evidence of the runs it launches, when that differs from
    /// one scheduler to another (the process runner: its host and its absolute work
    /// directory); recorded on each run's fire as it begins, and handed back in
    /// [`RunRef::place`]. `None` (the default) for a runtime every scheduler asks alike.
    fn place(&self) -> Option<String> {
        None
    }

    /// Whether this runtime can see the evidence of `run`, recorded at [`RunRef::place`]: only
    /// then may it judge the run (and say it is [`RunState::Lost`]). A run it cannot see is
    /// left to a scheduler that can. `true` (the default) for a runtime every scheduler asks
    /// alike.
    fn sees(&self, run: &RunRef) -> bool {
        let _ = run;
        true
    }

    /// What the scheduler's identity may not do of what this backend needs, each as
    /// `verb resource` (`delete jobs`), asked of the runtime once it answers: the scheduler
    /// refuses to start while anything is missing, instead of failing at the first stop. `Ok`
    /// with nothing missing for a runtime without permissions of its own (Docker's socket
    /// grants everything or nothing).
    async fn missing_permissions(&self) -> Result<Vec<String>, DispatchError> {
        Ok(Vec::new())
    }

    /// What the ended run `run` left: its output's tail and its times. Asked once, after the
    /// watch records the run's end (before anything removes the container or Job). An error is the
    /// runtime failing to answer; a run whose output is gone is `Ok` with `output: None`.
    async fn report(&self, run: &RunRef, deadline: Instant) -> Result<RunReport, DispatchError> {
        let _ = (run, deadline);
        Ok(RunReport::default())
    }
}
