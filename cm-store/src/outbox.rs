//! The message outbox, `outbox_messages`: the default message backend's table.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::{IdempotencyKey, Occurrence};
use serde_json::Value;

use crate::{PgStore, StoreError};

/// One message for the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// The occurrence that posts it.
    pub occurrence: Occurrence,
    /// The occurrence's key; unique in the table.
    pub idempotency_key: IdempotencyKey,
    /// The attempt that posts it.
    pub attempt: u32,
    /// The message.
    pub payload: Value,
}

/// A stored outbox row.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct OutboxRow {
    /// Its position in the outbox, for consumers reading in order.
    pub seq: i64,
    /// The routine that posted it.
    pub routine_id: uuid::Uuid,
    /// The occurrence that posted it.
    pub scheduled_at: DateTime<Utc>,
    /// The occurrence's key.
    pub idempotency_key: String,
    /// The attempt that wrote it.
    pub attempt: i32,
    /// The message.
    pub payload: Value,
    /// When it was written.
    pub created_at: DateTime<Utc>,
}

/// The message outbox.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Writes a message. Returns `false`, writing nothing, when the occurrence's message is
    /// already there (a retry after a crash): a second insert is a no-op. Any other conflict
    /// (a sequence number already taken by a row written by hand) is an error, never taken for
    /// the occurrence's message.
    async fn outbox_insert(&self, message: &OutboxMessage) -> Result<bool, StoreError>;

    /// Messages after `after_seq`, in order, at most `limit`.
    async fn outbox_read(&self, after_seq: i64, limit: u32) -> Result<Vec<OutboxRow>, StoreError>;

    /// The message of the occurrence whose key is `key`, if it was written.
    async fn outbox_get(&self, key: &IdempotencyKey) -> Result<Option<OutboxRow>, StoreError>;
}

#[async_trait]
impl OutboxStore for PgStore {
    async fn outbox_insert(&self, message: &OutboxMessage) -> Result<bool, StoreError> {
        let inserted = on_store!(self, |e| crate::schema::query(
            "INSERT INTO cm.outbox_messages
                 (routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
             SELECT $1, $2, $3, $4, $5, cm.cm_group_of($1, group_count) FROM cm.cm_settings
             ON CONFLICT (routine_id, scheduled_at, group_id) DO NOTHING",
        )
        .bind(message.occurrence.routine_id)
        .bind(message.occurrence.scheduled_at)
        .bind(message.idempotency_key.as_str())
        .bind(i32::try_from(message.attempt).unwrap_or(i32::MAX))
        .bind(&message.payload)
        .execute(e))?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn outbox_read(&self, after_seq: i64, limit: u32) -> Result<Vec<OutboxRow>, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_as(
            "SELECT seq, routine_id, scheduled_at, idempotency_key, attempt, payload, created_at
             FROM cm.outbox_messages WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(e))?)
    }

    async fn outbox_get(&self, key: &IdempotencyKey) -> Result<Option<OutboxRow>, StoreError> {
        // The key names its occurrence, and the occurrence is the primary key.
        let Some(occurrence) = IdempotencyKey::parse_occurrence(key.as_str()) else {
            return Ok(None);
        };
        Ok(on_store!(self, |e| crate::schema::query_as(
            "SELECT seq, routine_id, scheduled_at, idempotency_key, attempt, payload, created_at
             FROM cm.outbox_messages WHERE routine_id = $1 AND scheduled_at = $2",
        )
        .bind(occurrence.routine_id)
        .bind(occurrence.scheduled_at)
        .fetch_optional(e))?)
    }
}
