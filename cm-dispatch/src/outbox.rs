//! The outbox backend: message routines write a row to `outbox_messages`.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use cm_domain::RoutineKind;
use cm_store::{InClaimEffect, OutboxMessage, OutboxStore};

use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// Writes each message to the database outbox, keyed by its occurrence, for a consumer to read.
///
/// The default message backend: it needs nothing but the database. It is database-local, so
/// the scheduler has the store write its rows inside the claim's own transaction
/// ([`Dispatcher::in_claim_effect`]): a fire and its message exist together or not at all.
/// [`Dispatcher::dispatch`] writes the row on its own, for an occurrence that reaches it
/// another way (a crashed claim taken over); a retry finds the row already there and writes
/// nothing ([`Receipt::duplicate`]).
///
/// A transient database error (a pool timeout, a dropped connection, a serialization failure)
/// is retried with backoff within the dispatch's deadline; if it persists, the error says so
/// ([`DispatchError::is_transient_store_error`]) and the occurrence is left for a retry rather
/// than settled `failed`: the database failing for a moment is not the message's failure.
#[derive(Debug, Clone)]
pub struct OutboxDispatcher<S> {
    store: S,
    in_claim: bool,
}

/// The first pause after a transient failure; each later one doubles, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between two tries: long enough for a restarting database to come back
/// within a few tries, short enough to use most of a dispatch's deadline.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

impl<S: OutboxStore> OutboxDispatcher<S> {
    /// An outbox writing through `store`, its rows written inside the claim's transaction.
    pub fn new(store: S) -> Self {
        OutboxDispatcher {
            store,
            in_claim: true,
        }
    }

    /// An outbox whose rows are written by a dispatch after the claim, in a transaction of
    /// their own, as an external backend's effect would be. Slower and only idempotent, not
    /// transactional; for comparison, and for exercising the dispatch path against the database.
    pub fn dispatched(store: S) -> Self {
        OutboxDispatcher {
            store,
            in_claim: false,
        }
    }
}

#[async_trait]
impl<S: OutboxStore> Dispatcher for OutboxDispatcher<S> {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let message = OutboxMessage {
            occurrence: dispatch.occurrence,
            idempotency_key: dispatch.idempotency_key.clone(),
            attempt: dispatch.attempt,
            payload: dispatch.payload.clone(),
        };
        // Each insert is abandoned at the deadline (a lock held on the table, a database that
        // stopped answering); a retry of the occurrence finds the row if it was written after all.
        let deadline = tokio::time::Instant::from_std(dispatch.deadline);
        let mut backoff = FIRST_BACKOFF;
        loop {
            let inserted = tokio::time::timeout_at(deadline, self.store.outbox_insert(&message))
                .await
                .map_err(|_| {
                    DispatchError::Unavailable(
                        "the outbox insert did not finish by the dispatch deadline".into(),
                    )
                })?;
            match inserted {
                Ok(inserted) => {
                    return Ok(Receipt {
                        duplicate: !inserted,
                        detail: if inserted {
                            "outbox: message written".into()
                        } else {
                            "outbox: the message was already written".into()
                        },
                    });
                }
                Err(e) if e.is_transient() && Instant::now() + backoff < dispatch.deadline => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => return Err(DispatchError::Store(e)),
            }
        }
    }

    fn in_claim_effect(&self, _kind: RoutineKind) -> Option<InClaimEffect> {
        self.in_claim.then_some(InClaimEffect::Outbox)
    }
}
