//! The [`Dispatcher`] trait, and the backends that carry out an occurrence.
//!
//! A dispatch is one attempt at one occurrence: the routine's payload, its
//! [`IdempotencyKey`] (the same for every attempt at the occurrence)
//! and a deadline. A backend turns it into an effect (a message posted, a container launched)
//! and uses the key so that a retry after a crash cannot produce a second effect where the
//! target can prevent it.
//!
//! This crate knows nothing of ticks, leases or the ledger: the scheduler claims an occurrence,
//! calls [`Dispatcher::dispatch`] under a timeout shorter than the lease, and settles the result.
//!
//! # Backends
//!
//! | backend | kind | how the key is used |
//! |---|---|---|
//! | [`OutboxDispatcher`] | message | a row in `outbox_messages` keyed by the occurrence; a second insert is a no-op. The default. |
//! | [`MemoryDispatcher`] | any | an in-memory fake for tests: records every effect, deduplicated by key |
//! | [`RoutedDispatcher`] | both | sends message routines to one backend and mission routines to another |
//! | [`ProcessDispatcher`] | mission | a local child process per occurrence, guarded by a marker file created with `O_EXCL`; development only |
//! | `DockerDispatcher` (feature `docker`) | mission | a container named by the key: Docker answers a second create with 409 |
//! | `KubernetesDispatcher` (feature `kubernetes`) | mission | a Job named by the key: the API server answers a second create with 409 `AlreadyExists` |
//! | `WebhookDispatcher` (feature `webhook`) | message | an HTTP POST signed per Standard Webhooks 1.0; `webhook-id` is the key; a 409 answer is a duplicate |
//! | `NatsDispatcher` (feature `nats`) | message | a JetStream publish with `Nats-Msg-Id` set to the key, so the stream drops a duplicate |
//!
//! Mission backends share [`mission::Launch`] (the `CM_*` environment and `cm.*` labels every
//! mission gets) and [`mission::MissionConfig`] (the operator's image, command and resources).
//!
//! [`conformance::check_backend`] is the suite every backend passes;
//! [`mission_conformance::check_mission_backend`] adds the cases of mission backends.
//! Fakes of the runtimes' HTTP APIs are in `fakes` (feature `fakes`).

/// The crate's README, whose example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(any(feature = "docker", feature = "kubernetes"))]
mod bounded;
pub mod conformance;
#[cfg(feature = "docker")]
mod docker;
#[cfg(feature = "fakes")]
pub mod fakes;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
mod memory;
pub mod mission;
pub mod mission_conformance;
#[cfg(feature = "nats")]
pub mod nats;
mod outbox;
mod output;
mod process;
#[cfg(any(feature = "docker", feature = "kubernetes"))]
mod retry;
mod routed;
pub mod runtime;
#[cfg(feature = "webhook")]
pub mod webhook;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use cm_domain::RoutineKind;
use cm_domain::{IdempotencyKey, Occurrence};
use cm_store::InClaimEffect;
use serde_json::Value;

#[cfg(feature = "docker")]
pub use docker::{DockerDispatcher, DockerSetupError};
#[cfg(feature = "kubernetes")]
pub use kubernetes::{KubernetesDispatcher, KubernetesSetupError};
pub use memory::MemoryDispatcher;
#[cfg(feature = "nats")]
pub use nats::NatsDispatcher;
pub use outbox::OutboxDispatcher;
pub use process::ProcessDispatcher;
pub use routed::RoutedDispatcher;
pub use runtime::{
    MAX_REPLY_BYTES, MAX_RUN_OUTPUT, MissionRuntime, RunRef, RunReport, scrub_output,
};
#[cfg(feature = "webhook")]
pub use webhook::WebhookDispatcher;

/// One attempt at one occurrence.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// The routine's name, for logs and message bodies.
    pub routine_name: String,
    /// What the routine does.
    pub kind: RoutineKind,
    /// What the backend receives: the message, or the mission's description.
    pub payload: Value,
    /// The same for every attempt at this occurrence; different for any other.
    pub idempotency_key: IdempotencyKey,
    /// 1 for the first attempt at this occurrence.
    pub attempt: u32,
    /// How many retries of the occurrence after failed outcomes (its routine's retry policy)
    /// have begun: 0 for its first attempt and every takeover of it. A mission's run is named
    /// [`Occurrence::run_name`] of it, so a retry launches a new run and a takeover finds its
    /// own; a message keeps its idempotency key on every retry.
    pub retry: u32,
    /// When the dispatch must have finished. The caller enforces it with a timeout as well; a
    /// backend uses it to bound retries of its own.
    pub deadline: Instant,
    /// How long ago the occurrence's first attempt began (zero for the first attempt): a backend
    /// whose dedupe lasts a window (JetStream's duplicate window) must not rely on it past it.
    pub first_attempt_age: Duration,
}

impl Dispatch {
    /// This dispatch as the attempt of retry `retry` of its occurrence (0: its first
    /// attempt's), whose mission run is named [`Occurrence::run_name`] of it.
    pub fn with_retry(mut self, retry: u32) -> Self {
        self.retry = retry;
        self
    }

    /// A dispatch of `occurrence` with its derived key.
    pub fn new(
        occurrence: Occurrence,
        routine_name: impl Into<String>,
        kind: RoutineKind,
        payload: Value,
        attempt: u32,
        deadline: Instant,
    ) -> Self {
        Dispatch {
            occurrence,
            routine_name: routine_name.into(),
            kind,
            payload,
            idempotency_key: occurrence.idempotency_key(),
            attempt,
            retry: 0,
            deadline,
            first_attempt_age: Duration::ZERO,
        }
    }

    /// The W3C `traceparent` of this attempt: one trace per occurrence, one span per attempt
    /// ([`cm_domain::trace`]). Every backend sends it: a webhook's and a NATS message's
    /// `traceparent` header, a mission's `CM_TRACEPARENT` and its `cm.traceparent` label.
    pub fn traceparent(&self) -> cm_domain::trace::TraceParent {
        cm_domain::trace::TraceParent::for_attempt(&self.occurrence, self.attempt)
    }

    /// The same dispatch, its occurrence's first attempt having begun `age` ago.
    pub fn with_first_attempt_age(mut self, age: Duration) -> Self {
        self.first_attempt_age = age;
        self
    }

    /// What a message backend sends about this dispatch: the routine, the occurrence (RFC 3339
    /// UTC), the attempt and the payload. The webhook body's `data` and the NATS message body.
    pub fn message_data(&self) -> Value {
        serde_json::json!({
            "routine_id": self.occurrence.routine_id,
            "routine_name": self.routine_name,
            "scheduled_at": self
                .occurrence
                .scheduled_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            "attempt": self.attempt,
            "payload": self.payload,
        })
    }
}

/// What a backend reports of a successful dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The effect already existed (an earlier attempt produced it), so this attempt produced
    /// nothing new.
    pub duplicate: bool,
    /// What was done, for logs: a row's sequence number, a container's name, a message id.
    pub detail: String,
}

/// Why a dispatch failed. A failure settles the occurrence `failed` with this text, and is not
/// retried on a later tick, unless it leaves the outcome open: cm's own database failing
/// ([`DispatchError::is_transient_store_error`]) or the target perhaps having taken the
/// occurrence ([`DispatchError::Unconfirmed`]) leaves the claim for the next attempt instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// The target refused the dispatch (a bad payload, a 4xx answer).
    #[error("rejected: {0}")]
    Rejected(String),
    /// The target could not be reached or answered with an error, after any retries the
    /// backend makes within the deadline.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The target may have taken the occurrence, and nothing confirmed or refused it before the
    /// deadline: a container created whose start went unanswered, a Job create sent whose
    /// answer never came. Settling it `failed` could leave a mission running under a failed
    /// row, so the scheduler leaves the claim for the next attempt, which finds what this one
    /// did by the occurrence's name and finishes it (bounded by the attempt limit).
    #[error("unconfirmed: {0}")]
    Unconfirmed(String),
    /// No backend is configured for this routine's kind.
    #[error("no {0} backend is configured")]
    NoBackend(RoutineKind),
    /// The outbox's database failed.
    #[error("outbox: {0}")]
    Store(#[from] cm_store::StoreError),
}

impl DispatchError {
    /// Whether the failure is cm's own database failing for a moment (a pool timeout, a dropped
    /// connection, a serialization failure) rather than the target refusing or failing. Such a
    /// dispatch is not the target's failure: the scheduler leaves its claim for a retry instead
    /// of settling it `failed`.
    pub fn is_transient_store_error(&self) -> bool {
        matches!(self, DispatchError::Store(e) if e.is_transient())
    }
}

/// Carries out one attempt at one occurrence.
///
/// A backend whose effect is a write to cm's own database can also say so through
/// [`Dispatcher::in_claim_effect`]: the store then writes the effect inside the claim's own
/// transaction, settled with it, and `dispatch` is only called for the rare occurrence that
/// reaches it another way (a crashed claim taken over).
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait Dispatcher: Send + Sync {
    /// Produces the occurrence's effect, or finds it already produced (a duplicate receipt).
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError>;

    /// The effect the store can write for routines of `kind` inside the claim's transaction,
    /// if this backend's effect is such a write (the database outbox). `None`, the default, for
    /// every backend that talks to something else: its occurrences are dispatched.
    fn in_claim_effect(&self, _kind: RoutineKind) -> Option<InClaimEffect> {
        None
    }
}

#[async_trait]
impl<D: Dispatcher + ?Sized> Dispatcher for std::sync::Arc<D> {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        (**self).dispatch(dispatch).await
    }

    fn in_claim_effect(&self, kind: RoutineKind) -> Option<InClaimEffect> {
        (**self).in_claim_effect(kind)
    }
}
