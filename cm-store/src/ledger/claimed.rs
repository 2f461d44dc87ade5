//! The rows the claim and reaper statements return, and the [`ClaimedFire`]s they become.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use cm_domain::{ClaimRow, ClaimToken, Occurrence};
use serde_json::Value;
use sqlx::{FromRow, Postgres, Transaction};
use uuid::Uuid;

use super::ClaimedFire;
use super::sql::WRITTEN_SEQS_SQL;
use crate::StoreError;

/// A row returned by the claim and reaper statements.
#[derive(FromRow)]
pub(super) struct ClaimedRow {
    pub(super) inserted: bool,
    pub(super) routine_id: Uuid,
    pub(super) scheduled_at: DateTime<Utc>,
    pub(super) status: String,
    pub(super) claimant: String,
    pub(super) claim_token: Uuid,
    pub(super) attempt: i32,
    pub(super) lease_expires_at: DateTime<Utc>,
    pub(super) name: String,
    pub(super) kind: String,
    pub(super) origin: String,
    pub(super) payload: Value,
    pub(super) receipt: Option<String>,
    pub(super) error: Option<String>,
    pub(super) first_claimed_at: Option<DateTime<Utc>>,
    /// When the occurrence came due, where its jitter delayed it.
    pub(super) planned_at: Option<DateTime<Utc>>,
    /// How many retries of the occurrence have begun (0 for its first attempt's claims).
    pub(super) retry: i16,
    /// The attempt the latest retry began with (1 without a retry).
    pub(super) retry_began: i32,
    /// How many outbox messages the claim statement wrote (the outbox claim only).
    pub(super) written: Option<i64>,
}

impl TryFrom<ClaimedRow> for ClaimedFire {
    type Error = StoreError;

    fn try_from(r: ClaimedRow) -> Result<Self, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptRoutine {
            routine_id: r.routine_id,
            reason,
        };
        let status = r
            .status
            .parse()
            .map_err(|e: cm_domain::ParseFireStatusError| corrupt(e.to_string()))?;
        let kind = r.kind.parse().map_err(corrupt)?;
        let origin = r
            .origin
            .parse()
            .map_err(|e: cm_domain::ParseFireOriginError| corrupt(e.to_string()))?;
        Ok(ClaimedFire {
            occurrence: Occurrence::new(r.routine_id, r.scheduled_at),
            routine_name: r.name,
            kind,
            origin,
            payload: r.payload,
            receipt: r.receipt,
            // Only a row written before the column existed has none: its first claim is
            // unknown, and is taken as long ago.
            first_claimed_at: r.first_claimed_at.unwrap_or(DateTime::<Utc>::MIN_UTC),
            planned_at: r.planned_at.unwrap_or(r.scheduled_at),
            retry: u32::try_from(r.retry).unwrap_or(0),
            retry_began: u32::try_from(r.retry_began).unwrap_or(1),
            row: ClaimRow {
                inserted: r.inserted,
                status,
                claimant: r.claimant,
                token: ClaimToken(r.claim_token),
                attempt: u32::try_from(r.attempt).unwrap_or(1),
                lease_expires_at: r.lease_expires_at,
                last_error: r.error.filter(|_| r.status == "claimed"),
            },
        })
    }
}

/// The outbox sequence number a fire settled in the claim names in its receipt.
pub(super) fn outbox_seq(row: &ClaimedRow) -> Option<i64> {
    row.receipt
        .as_deref()?
        .strip_prefix("outbox seq ")?
        .parse()
        .ok()
}

/// After the outbox claim: when it wrote fewer messages than its fresh fires drew numbers for
/// (a message of the occurrence was already there), finds which numbers were not written and
/// says so in those fires' receipts. The usual claim writes them all and reads nothing more.
pub(super) async fn mark_unwritten_messages(
    tx: &mut Transaction<'_, Postgres>,
    rows: &mut [ClaimedRow],
) -> Result<(), StoreError> {
    let drawn: Vec<i64> = rows
        .iter()
        .filter(|r| r.inserted)
        .filter_map(outbox_seq)
        .collect();
    let written = rows.first().and_then(|r| r.written).unwrap_or(0);
    if drawn.len() as i64 == written {
        return Ok(());
    }
    let present: HashSet<i64> = crate::schema::query_scalar(WRITTEN_SEQS_SQL)
        .bind(&drawn)
        .fetch_all(&mut **tx)
        .await?
        .into_iter()
        .collect();
    for row in rows.iter_mut().filter(|r| r.inserted) {
        if outbox_seq(row).is_some_and(|seq| !present.contains(&seq)) {
            row.receipt = Some("outbox: the message was already written".into());
        }
    }
    Ok(())
}
