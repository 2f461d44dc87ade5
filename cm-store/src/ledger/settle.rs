//! Settling claims: one, or a batch in one statement (on Citus, one per group), each row fenced
//! on its claim's token and attempt; and noting on a claim still held what its attempt met.
//!
//! A settle never waits on a row another transaction holds: it skips it and reports it
//! [`SettleOutcome::Locked`], so one caller's open transaction delays the settles of its own
//! routine's rows and no others. [`settle_waiting`] is the way back for such a row.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use cm_domain::{ErrorText, Settlement};
use uuid::Uuid;

use super::sql::{
    LOCAL_LOCK_TIMEOUT_SQL, NOTE_UNSETTLED_SQL, PRESENT_FIRES_SQL, PRESENT_GROUP_FIRES_SQL,
    SETTLE_FIRES_SQL, SETTLE_GROUP_FIRES_SQL, SETTLE_WAITING_SQL,
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

/// [`FireLedger::settle_fire`](super::FireLedger::settle_fire): a batch of one, so it skips a
/// locked row as a batch does (and on Citus names its group).
pub(super) async fn settle_fire(
    store: &PgStore,
    fire: &FireRef,
    settlement: &Settlement,
) -> Result<SettleOutcome, StoreError> {
    let settle = FireSettle {
        fire: *fire,
        settlement: settlement.clone(),
        receipt: None,
    };
    Ok(settle_fires(store, std::slice::from_ref(&settle))
        .await?
        .pop()
        .unwrap_or(SettleOutcome::Unwritten))
}

/// [`FireLedger::settle_waiting`](super::FireLedger::settle_waiting): one claim's settle, in a
/// transaction of its own whose `lock_timeout` is `wait`, queued on the row's lock if another
/// transaction holds it. Past `wait` it is [`SettleOutcome::Locked`] again, and nothing changed.
pub(super) async fn settle_waiting(
    store: &PgStore,
    settle: &FireSettle,
    wait: Duration,
) -> Result<SettleOutcome, StoreError> {
    let group = store
        .group_of_routine(settle.fire.occurrence.routine_id)
        .await?;
    let columns = Columns::of(std::slice::from_ref(settle));
    let mut conn = store.pool.acquire().await?;
    let mut tx = store.begin_on(&mut conn).await?;
    crate::schema::query(LOCAL_LOCK_TIMEOUT_SQL)
        .bind(format!("{}ms", wait.as_millis().max(1)))
        .execute(&mut *tx)
        .await?;
    let settled: Result<Vec<super::Written>, sqlx::Error> = columns
        .bind(crate::schema::query_as(SETTLE_WAITING_SQL))
        .bind(group)
        .fetch_all(&mut *tx)
        .await;
    let settled = match settled {
        Ok(settled) => settled,
        // lock_not_available: the row's holder kept it past `wait`. The transaction rolls back
        // as it is dropped.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            return Ok(SettleOutcome::Locked);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(after) = store.pause_after
        && !settled.is_empty()
        && settle.settlement.status() == cm_domain::FireStatus::Failed
    {
        let routine = [settle.fire.occurrence.routine_id];
        crate::autopause::pause_failed_in(&mut tx, Some(group), after, &routine).await?;
    }
    tx.commit().await?;
    if let Some((_, _, retry)) = settled.first() {
        return Ok(match retry {
            Some(at) => SettleOutcome::Retrying { at: *at },
            None => SettleOutcome::Settled,
        });
    }
    Ok(unsettled(store, Some(group), &columns, &HashMap::new())
        .await?
        .pop()
        .unwrap_or(SettleOutcome::Gone))
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

/// A batch of settles as the statements' arrays.
struct Columns<'a> {
    ids: Vec<Uuid>,
    instants: Vec<DateTime<Utc>>,
    tokens: Vec<Uuid>,
    attempts: Vec<i32>,
    statuses: Vec<&'a str>,
    errors: Vec<Option<&'a str>>,
    receipts: Vec<Option<String>>,
}

impl<'a> Columns<'a> {
    fn of(settles: &'a [FireSettle]) -> Self {
        let n = settles.len();
        let mut columns = Columns {
            ids: Vec::with_capacity(n),
            instants: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            statuses: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            receipts: Vec::with_capacity(n),
        };
        for s in settles {
            columns.ids.push(s.fire.occurrence.routine_id);
            columns.instants.push(s.fire.occurrence.scheduled_at);
            columns.tokens.push(s.fire.token.0);
            columns
                .attempts
                .push(i32::try_from(s.fire.attempt).unwrap_or(i32::MAX));
            columns.statuses.push(s.settlement.status().as_str());
            columns.errors.push(s.settlement.error());
            columns
                .receipts
                .push(s.receipt.as_deref().map(bounded_receipt));
        }
        columns
    }

    /// `query` with the seven arrays bound as `$1` to `$7`.
    fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.instants)
            .bind(&self.tokens)
            .bind(&self.attempts)
            .bind(&self.statuses)
            .bind(&self.errors)
            .bind(&self.receipts)
    }
}

/// What became of each settle of `columns` not in `settled`, read after the update: still held
/// by its claim (so its row was locked: [`SettleOutcome::Locked`]), taken over, or gone; one
/// outcome per settle, in order, `Settled` (or `Retrying`, with its retry's instant) for those
/// in `settled`.
async fn unsettled(
    store: &PgStore,
    group: Option<GroupId>,
    columns: &Columns<'_>,
    settled: &HashMap<(Uuid, DateTime<Utc>), Option<DateTime<Utc>>>,
) -> Result<Vec<SettleOutcome>, StoreError> {
    let mut missed = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..columns.ids.len() {
        if !settled.contains_key(&(columns.ids[i], columns.instants[i])) {
            missed.0.push(columns.ids[i]);
            missed.1.push(columns.instants[i]);
            missed.2.push(columns.tokens[i]);
            missed.3.push(columns.attempts[i]);
        }
    }
    let query = crate::schema::query_as(match group {
        None => PRESENT_FIRES_SQL,
        Some(_) => PRESENT_GROUP_FIRES_SQL,
    })
    .bind(&missed.0)
    .bind(&missed.1)
    .bind(&missed.2)
    .bind(&missed.3);
    let query = match group {
        None => query,
        Some(group) => query.bind(group),
    };
    let present: Vec<(Uuid, DateTime<Utc>, bool)> = on_store!(store, |e| query.fetch_all(e))?;
    let present: HashMap<(Uuid, DateTime<Utc>), bool> = present
        .into_iter()
        .map(|(id, at, held)| ((id, at), held))
        .collect();
    Ok(columns
        .ids
        .iter()
        .zip(&columns.instants)
        .map(|(id, at)| {
            if let Some(retry) = settled.get(&(*id, *at)) {
                match retry {
                    Some(at) => SettleOutcome::Retrying { at: *at },
                    None => SettleOutcome::Settled,
                }
            } else {
                match present.get(&(*id, *at)) {
                    Some(true) => SettleOutcome::Locked,
                    Some(false) => SettleOutcome::TakenOver,
                    None => SettleOutcome::Gone,
                }
            }
        })
        .collect())
}

/// [`FireLedger::settle_fires`](super::FireLedger::settle_fires)'s statements, for the rows of
/// `group` (on Citus, naming it keeps them on its shard) or of any group.
async fn settle_fires_of(
    store: &PgStore,
    group: Option<GroupId>,
    settles: &[FireSettle],
) -> Result<Vec<SettleOutcome>, StoreError> {
    let n = settles.len();
    let columns = Columns::of(settles);
    // One fenced UPDATE for the batch, of the rows it could lock; the rows it did not settle
    // are then told apart (locked by another transaction, taken over, or gone with a deleted
    // routine) by a read of the same keys.
    let query = columns.bind(crate::schema::query_as(match group {
        None => SETTLE_FIRES_SQL,
        Some(_) => SETTLE_GROUP_FIRES_SQL,
    }));
    let query = match group {
        None => query,
        Some(group) => query.bind(group),
    };
    // A failed outcome may be a routine's Nth in a row: its pause is written in the same
    // transaction, so no occurrence of it is claimed after this commits.
    let failing: Vec<(Uuid, DateTime<Utc>)> = settles
        .iter()
        .filter(|s| s.settlement.status() == cm_domain::FireStatus::Failed)
        .map(|s| (s.fire.occurrence.routine_id, s.fire.occurrence.scheduled_at))
        .collect();
    let settled = store
        .record_then_pause(group, false, &failing, query)
        .await?;
    let settled: HashMap<(Uuid, DateTime<Utc>), Option<DateTime<Utc>>> = settled
        .into_iter()
        .map(|(id, at, retry)| ((id, at), retry))
        .collect();
    if settled.len() == n && settled.values().all(Option::is_none) {
        return Ok(vec![SettleOutcome::Settled; n]);
    }
    unsettled(store, group, &columns, &settled).await
}
