//! Settling claims: one, or a batch in one statement (on Citus, one per group), each row fenced
//! on its claim's token and attempt; and noting on a claim still held what its attempt met.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use cm_domain::{ErrorText, Settlement};
use uuid::Uuid;

use super::sql::{
    NOTE_UNSETTLED_SQL, PRESENT_FIRES_SQL, PRESENT_GROUP_FIRES_SQL, SETTLE_FIRES_SQL,
    SETTLE_GROUP_FIRES_SQL, SETTLE_SQL,
};
use super::{FireRef, FireSettle, MAX_RECEIPT_BYTES, SettleOutcome};
use crate::groups::GroupId;
use crate::{PgStore, StoreError};

/// A receipt cut to [`MAX_RECEIPT_BYTES`] on a character boundary, without the NUL characters
/// PostgreSQL's text refuses.
fn bounded_receipt(receipt: &str) -> String {
    let mut text: String = receipt.chars().filter(|c| *c != '\0').collect();
    if text.len() > MAX_RECEIPT_BYTES {
        let mut end = MAX_RECEIPT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// [`FireLedger::settle_fires`](super::FireLedger::settle_fires).
pub(super) async fn settle_fires(
    store: &PgStore,
    settles: &[FireSettle],
) -> Result<Vec<SettleOutcome>, StoreError> {
    if settles.is_empty() {
        return Ok(Vec::new());
    }
    if !store.is_citus().await? {
        return settle_fires_of(store, None, settles).await;
    }
    // On Citus, one statement per group, each on one shard: a worker that is down fails the
    // settles of its own groups alone, and the others are written.
    let count = store.group_count().await?;
    let mut by_group: BTreeMap<GroupId, Vec<usize>> = BTreeMap::new();
    for (i, settle) in settles.iter().enumerate() {
        by_group
            .entry(crate::group_of(settle.fire.occurrence.routine_id, count))
            .or_default()
            .push(i);
    }
    let mut outcomes = vec![SettleOutcome::Unwritten; settles.len()];
    let (mut written, mut failed) = (false, None);
    for (group, rows) in by_group {
        let part: Vec<FireSettle> = rows.iter().map(|i| settles[*i].clone()).collect();
        match settle_fires_of(store, Some(group), &part).await {
            Ok(done) => {
                written = true;
                for (i, outcome) in rows.into_iter().zip(done) {
                    outcomes[i] = outcome;
                }
            }
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) if !written => Err(e),
        _ => Ok(outcomes),
    }
}

/// [`FireLedger::settle_fire`](super::FireLedger::settle_fire).
pub(super) async fn settle_fire(
    store: &PgStore,
    fire: &FireRef,
    settlement: &Settlement,
) -> Result<SettleOutcome, StoreError> {
    let (settled, present): (bool, bool) =
        on_store!(store, |e| crate::schema::query_as(SETTLE_SQL)
            .bind(fire.occurrence.routine_id)
            .bind(fire.occurrence.scheduled_at)
            .bind(fire.token.0)
            .bind(i32::try_from(fire.attempt).unwrap_or(i32::MAX))
            .bind(settlement.status().as_str())
            .bind(settlement.error())
            .fetch_one(e))?;
    Ok(match (settled, present) {
        (true, _) => SettleOutcome::Settled,
        (false, true) => SettleOutcome::TakenOver,
        (false, false) => SettleOutcome::Gone,
    })
}

/// [`FireLedger::note_unsettled`](super::FireLedger::note_unsettled).
pub(super) async fn note_unsettled(
    store: &PgStore,
    fire: &FireRef,
    error: &ErrorText,
) -> Result<bool, StoreError> {
    Ok(
        on_store!(store, |e| crate::schema::query(NOTE_UNSETTLED_SQL)
            .bind(fire.occurrence.routine_id)
            .bind(fire.occurrence.scheduled_at)
            .bind(fire.token.0)
            .bind(i32::try_from(fire.attempt).unwrap_or(i32::MAX))
            .bind(error.as_str())
            .execute(e))?
        .rows_affected()
            == 1,
    )
}

/// [`FireLedger::settle_fires`](super::FireLedger::settle_fires)'s statements, for the rows of `group` (on Citus, naming it
/// keeps them on its shard) or of any group.
async fn settle_fires_of(
    store: &PgStore,
    group: Option<GroupId>,
    settles: &[FireSettle],
) -> Result<Vec<SettleOutcome>, StoreError> {
    let n = settles.len();
    let mut ids = Vec::with_capacity(n);
    let mut instants = Vec::with_capacity(n);
    let mut tokens = Vec::with_capacity(n);
    let mut attempts = Vec::with_capacity(n);
    let mut statuses = Vec::with_capacity(n);
    let mut errors = Vec::with_capacity(n);
    let mut receipts = Vec::with_capacity(n);
    for s in settles {
        ids.push(s.fire.occurrence.routine_id);
        instants.push(s.fire.occurrence.scheduled_at);
        tokens.push(s.fire.token.0);
        attempts.push(i32::try_from(s.fire.attempt).unwrap_or(i32::MAX));
        statuses.push(s.settlement.status().as_str());
        errors.push(s.settlement.error());
        receipts.push(s.receipt.as_deref().map(bounded_receipt));
    }
    // One fenced UPDATE for the batch; the rows it did not settle are then told apart
    // (taken over, or gone with a deleted routine) by a read of the same keys.
    let query = crate::schema::query_as(match group {
        None => SETTLE_FIRES_SQL,
        Some(_) => SETTLE_GROUP_FIRES_SQL,
    })
    .bind(&ids)
    .bind(&instants)
    .bind(&tokens)
    .bind(&attempts)
    .bind(&statuses)
    .bind(&errors)
    .bind(&receipts);
    let query = match group {
        None => query,
        Some(group) => query.bind(group),
    };
    let settled: Vec<(Uuid, DateTime<Utc>)> = on_store!(store, |e| query.fetch_all(e))?;
    let settled: HashSet<(Uuid, DateTime<Utc>)> = settled.into_iter().collect();
    if settled.len() == n {
        return Ok(vec![SettleOutcome::Settled; n]);
    }
    let (missed_ids, missed_instants): (Vec<Uuid>, Vec<DateTime<Utc>>) = ids
        .iter()
        .zip(&instants)
        .filter(|key| !settled.contains(&(*key.0, *key.1)))
        .map(|(id, at)| (*id, *at))
        .unzip();
    let query = crate::schema::query_as(match group {
        None => PRESENT_FIRES_SQL,
        Some(_) => PRESENT_GROUP_FIRES_SQL,
    })
    .bind(&missed_ids)
    .bind(&missed_instants);
    let query = match group {
        None => query,
        Some(group) => query.bind(group),
    };
    let present: HashSet<(Uuid, DateTime<Utc>)> = on_store!(store, |e| query.fetch_all(e))?
        .into_iter()
        .collect();
    Ok(ids
        .iter()
        .zip(&instants)
        .map(|(id, at)| {
            if settled.contains(&(*id, *at)) {
                SettleOutcome::Settled
            } else if present.contains(&(*id, *at)) {
                SettleOutcome::TakenOver
            } else {
                SettleOutcome::Gone
            }
        })
        .collect())
}
