//! The outbox's consumer contract: taking batches of pending messages under a lease, in `seq`
//! order, acknowledging them, looking at the backlog, and pruning acknowledged rows.
//!
//! # How a consumer reads the outbox
//!
//! ```text
//! loop {
//!     batch = outbox_take(consumer, limit, lease)   // pending rows, oldest seq first, leased to it
//!     deliver each message (dropping any whose idempotency key the target already has)
//!     outbox_ack(consumer, the batch's acks)        // never taken again
//! }
//! ```
//!
//! Several consumers share the table: a take picks rows with `FOR UPDATE SKIP LOCKED` and leases
//! them in the same statement, so two consumers never hold one pending row at once. A consumer
//! that crashes holds its batch only until the lease runs out; the next take after that takes it
//! again (`deliveries` counts how often). Delivery is therefore at least once, never lost: a
//! consumer slower than its lease may see its batch also delivered by another, and the
//! occurrence's idempotency key is how the target drops the second. Acknowledging is idempotent,
//! and fenced on the take: each take writes a fresh lease token on its rows, an acknowledgement
//! names it ([`OutboxDelivery::ack`]), and a consumer whose rows were taken again by another
//! after its lease ran out acknowledges nothing of them.
//! Acknowledged rows are deleted after the scheduler's retention (the same as the ledger's, so a
//! retried dispatch inside that window still finds its row and writes nothing).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::outbox::OutboxRow;
use crate::{GroupId, PgStore, StoreError};

/// What a consumer asks of one take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxTake {
    /// Who takes the batch (written on the rows, for operators and acknowledgement).
    pub consumer: String,
    /// The most rows in the batch.
    pub limit: u32,
    /// How long the batch is the consumer's; after it, the batch is presumed crashed.
    pub lease: Duration,
    /// Take from this group only, in `seq` order within it (on Citus, one shard); `None` takes
    /// across every group in `seq` order (plain PostgreSQL only). Either way each routine's
    /// messages come in order: a routine's messages are all in its group.
    pub group: Option<GroupId>,
}

/// A message taken by a consumer.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct OutboxDelivery {
    /// The message.
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub message: OutboxRow,
    /// How many times it has been taken, this time included (above 1: an earlier consumer
    /// did not acknowledge it within its lease).
    pub deliveries: i32,
    /// The token of the take that leased it, which its acknowledgement names.
    pub lease_token: Uuid,
}

impl OutboxDelivery {
    /// The acknowledgement of this delivery.
    pub fn ack(&self) -> OutboxAck {
        OutboxAck {
            seq: self.message.seq,
            lease_token: self.lease_token,
        }
    }
}

/// The acknowledgement of one delivered message: its `seq` and the lease token of the take that
/// delivered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxAck {
    /// The message.
    pub seq: i64,
    /// The token its take wrote ([`OutboxDelivery::lease_token`]).
    pub lease_token: Uuid,
}

/// A pending (unacknowledged) message, as `cm-scheduler outbox` shows it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct OutboxPending {
    /// The message.
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub message: OutboxRow,
    /// How many times it has been taken.
    pub deliveries: i32,
    /// The consumer holding it, if its lease is live.
    pub leased_by: Option<String>,
    /// Until when, if its lease is live.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// What the outbox holds that consumers have not acknowledged.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OutboxBacklog {
    /// Unacknowledged messages.
    pub pending: i64,
    /// Of those, how many a consumer holds under a live lease.
    pub leased: i64,
    /// When the oldest unacknowledged message was written.
    pub oldest: Option<DateTime<Utc>>,
    /// The oldest unacknowledged messages, in `seq` order, at most the limit asked.
    pub messages: Vec<OutboxPending>,
}

/// The outbox's consumer side.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait OutboxConsumer: Send + Sync {
    /// Takes up to `take.limit` pending messages, oldest `seq` first: those never taken, and
    /// those whose consumer's lease ran out. They are leased to `take.consumer` until the lease
    /// is over. An empty batch means nothing is pending or every pending row is leased.
    async fn outbox_take(&self, take: &OutboxTake) -> Result<Vec<OutboxDelivery>, StoreError>;

    /// Acknowledges delivered messages: they are never taken again. Each is acknowledged only
    /// while it still carries `consumer` and the lease token of the take that delivered it, so
    /// a consumer whose lease ran out cannot acknowledge rows another consumer has taken since.
    /// Returns how many were acknowledged now; a message already acknowledged, or leased by
    /// another take, counts 0 and is left as it was.
    async fn outbox_ack(&self, consumer: &str, acks: &[OutboxAck]) -> Result<u64, StoreError>;

    /// The unacknowledged backlog, listing at most `limit` messages.
    async fn outbox_backlog(&self, limit: u32) -> Result<OutboxBacklog, StoreError>;

    /// Deletes at most `limit` messages acknowledged longer than `retention` ago. Returns how
    /// many. A pass that finds the table locked for more than a second deletes nothing.
    async fn outbox_prune_acked(&self, retention: Duration, limit: u32) -> Result<u64, StoreError>;

    /// [`OutboxConsumer::outbox_prune_acked`] among the messages of `group` only (on Citus,
    /// one shard). By default, every group's.
    async fn outbox_prune_acked_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let _ = group;
        self.outbox_prune_acked(retention, limit).await
    }
}

/// The take: leases up to `$2` pending messages to `$1` for `$3` seconds under the token `$4`,
/// oldest `seq` first; the argument keeps it in one group (`$5`).
macro_rules! take_sql {
    ($group:literal, $outer:literal) => {
        concat!(
            "
UPDATE cm.outbox_messages o
SET leased_by = $1, lease_expires_at = now() + make_interval(secs => $3),
    deliveries = o.deliveries + 1, lease_token = $4
FROM (SELECT seq, group_id FROM cm.outbox_messages
      WHERE acked_at IS NULL
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())",
            $group,
            "
      ORDER BY seq
      LIMIT $2
      FOR UPDATE SKIP LOCKED) taken
WHERE o.seq = taken.seq AND o.group_id = taken.group_id",
            $outer,
            "
RETURNING o.seq, o.routine_id, o.scheduled_at, o.idempotency_key, o.attempt,
          o.payload, o.created_at, o.deliveries, o.lease_token"
        )
    };
}

/// Takes across every group.
const TAKE_SQL: &str = take_sql!("", "");

/// Takes within the group `$5`.
const TAKE_GROUP_SQL: &str = take_sql!(" AND group_id = $5", " AND o.group_id = $5");

/// How long a prune pass waits for a lock on the outbox before it gives up for this pass.
const PRUNE_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '1s'";

#[async_trait]
impl OutboxConsumer for PgStore {
    async fn outbox_take(&self, take: &OutboxTake) -> Result<Vec<OutboxDelivery>, StoreError> {
        let query = crate::schema::query_as(match take.group {
            None => TAKE_SQL,
            Some(_) => TAKE_GROUP_SQL,
        })
        .bind(&take.consumer)
        .bind(i64::from(take.limit))
        .bind(take.lease.as_secs_f64())
        .bind(Uuid::new_v4());
        let query = match take.group {
            Some(group) => query.bind(group),
            None => query,
        };
        let mut rows: Vec<OutboxDelivery> = on_store!(self, |e| query.fetch_all(e))?;
        // RETURNING follows no order; the contract is seq order.
        rows.sort_by_key(|r| r.message.seq);
        Ok(rows)
    }

    async fn outbox_ack(&self, consumer: &str, acks: &[OutboxAck]) -> Result<u64, StoreError> {
        let seqs: Vec<i64> = acks.iter().map(|a| a.seq).collect();
        let tokens: Vec<Uuid> = acks.iter().map(|a| a.lease_token).collect();
        Ok(on_store!(self, |e| crate::schema::query(
            "UPDATE cm.outbox_messages o
             SET acked_at = now(), acked_by = $1, leased_by = NULL, lease_expires_at = NULL
             FROM UNNEST($2::bigint[], $3::uuid[]) AS a(seq, lease_token)
             WHERE o.seq = a.seq AND o.acked_at IS NULL
               AND o.leased_by = $1 AND o.lease_token = a.lease_token",
        )
        .bind(consumer)
        .bind(&seqs)
        .bind(&tokens)
        .execute(e))?
        .rows_affected())
    }

    async fn outbox_backlog(&self, limit: u32) -> Result<OutboxBacklog, StoreError> {
        let mut tx = self.begin().await?;
        let (pending, leased, oldest): (i64, i64, Option<DateTime<Utc>>) = crate::schema::query_as(
            "SELECT count(*),
                    count(*) FILTER (WHERE lease_expires_at > now()),
                    min(created_at)
             FROM cm.outbox_messages WHERE acked_at IS NULL",
        )
        .fetch_one(&mut *tx)
        .await?;
        let messages = crate::schema::query_as(
            "SELECT seq, routine_id, scheduled_at, idempotency_key, attempt, payload, created_at,
                    deliveries,
                    CASE WHEN lease_expires_at > now() THEN leased_by END AS leased_by,
                    CASE WHEN lease_expires_at > now() THEN lease_expires_at END AS lease_expires_at
             FROM cm.outbox_messages WHERE acked_at IS NULL ORDER BY seq LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(OutboxBacklog {
            pending,
            leased,
            oldest,
            messages,
        })
    }

    async fn outbox_prune_acked(&self, retention: Duration, limit: u32) -> Result<u64, StoreError> {
        self.prune_acked(None, retention, limit).await
    }

    async fn outbox_prune_acked_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.prune_acked(Some(group), retention, limit).await
    }
}

/// Deletes acknowledged messages past the retention (`$1` seconds), at most `$2`, oldest
/// acknowledgement first; the argument keeps it in one group (`$3`).
macro_rules! prune_acked_sql {
    ($group:literal) => {
        concat!(
            "
DELETE FROM cm.outbox_messages
WHERE (seq, group_id) IN (SELECT seq, group_id FROM cm.outbox_messages
                          WHERE acked_at IS NOT NULL
                            AND acked_at < now() - make_interval(secs => $1)
                            AND scheduled_at < now() - make_interval(secs => $1)",
            $group,
            "
                          ORDER BY acked_at
                          LIMIT $2
                          FOR UPDATE SKIP LOCKED)",
            $group
        )
    };
}

impl PgStore {
    async fn prune_acked(
        &self,
        group: Option<GroupId>,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        // Like the ledger's pruning: a row is also what makes a retried dispatch write nothing,
        // so only rows of occurrences older than the retention go. Pruning is housekeeping run
        // inside the scheduler's loop: if something holds the table locked, this pass waits at
        // most PRUNE_LOCK_TIMEOUT and prunes nothing, leaving the rows to the next pass.
        let mut tx = self.begin().await?;
        crate::schema::query(PRUNE_LOCK_TIMEOUT)
            .execute(&mut *tx)
            .await?;
        let query = match group {
            None => crate::schema::query(prune_acked_sql!("")),
            Some(_) => crate::schema::query(prune_acked_sql!(" AND group_id = $3")),
        }
        .bind(retention.as_secs_f64())
        .bind(i64::from(limit));
        let query = match group {
            Some(group) => query.bind(group),
            None => query,
        };
        let deleted = query.execute(&mut *tx).await;
        match deleted {
            Ok(done) => {
                tx.commit().await?;
                Ok(done.rows_affected())
            }
            // lock_not_available: the table is locked; nothing pruned this pass.
            Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03") => {
                Ok(0)
            }
            Err(e) => Err(e.into()),
        }
    }
}
