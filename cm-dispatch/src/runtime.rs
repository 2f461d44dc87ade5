//! What a mission runtime offers beside launching: whether it answers, where a launched run is,
//! and stopping one.
//!
//! The scheduler waits at start for a runtime that does not answer yet ([`MissionRuntime::ready`],
//! shown by `/readyz`), watches every launched run to its end ([`MissionRuntime::observe`], a
//! bounded pass beside the ticks) and stops a running one when a routine's overlap policy is
//! `replace` ([`MissionRuntime::stop`]). Docker, Kubernetes and the process runner implement it.

use std::time::Instant;

use async_trait::async_trait;
use cm_domain::RunState;

use crate::DispatchError;

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
}
