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

    /// Stops the run (Docker stop with the configured grace, the Job deleted with its pods). A run
    /// already ended or gone is stopped already.
    async fn stop(&self, run: &RunRef, deadline: Instant) -> Result<(), DispatchError>;

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
