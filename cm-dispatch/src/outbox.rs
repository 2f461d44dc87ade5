//! The outbox backend: message routines write a row to `outbox_messages`.

use async_trait::async_trait;
use cm_store::{OutboxMessage, OutboxStore};

use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// Writes each message to the database outbox, keyed by its occurrence, for a consumer to read.
///
/// The default message backend: it needs nothing but the database. A retry after a crash finds
/// the row already there and writes nothing ([`Receipt::duplicate`]).
#[derive(Debug, Clone)]
pub struct OutboxDispatcher<S> {
    store: S,
}

impl<S: OutboxStore> OutboxDispatcher<S> {
    /// An outbox writing through `store`.
    pub fn new(store: S) -> Self {
        OutboxDispatcher { store }
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
        // The insert is abandoned at the deadline (a lock held on the table, a database that
        // stopped answering); a retry of the occurrence finds the row if it was written after all.
        let deadline = tokio::time::Instant::from_std(dispatch.deadline);
        let inserted = tokio::time::timeout_at(deadline, self.store.outbox_insert(&message))
            .await
            .map_err(|_| {
                DispatchError::Unavailable(
                    "the outbox insert did not finish by the dispatch deadline".into(),
                )
            })??;
        Ok(Receipt {
            duplicate: !inserted,
            detail: format!("outbox message {}", dispatch.idempotency_key),
        })
    }
}
