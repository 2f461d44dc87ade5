//! The reaper, which takes over claims whose lease ran out, and the pruning of settled fires.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use cm_domain::ClaimToken;
use sqlx::pool::PoolConnection;
use sqlx::{FromRow, Postgres, Transaction};

use super::claim::{bind_group, lease_seconds};
use super::claimed::ClaimedRow;
use super::sql::{CLOCK_SQL, PRUNE_GROUP_SQL, PRUNE_SQL, REAP_GROUP_SQL, REAP_SQL};
use super::{ClaimedFire, ReapParams, TickClaim};
use crate::groups::GroupId;
use crate::{PgStore, StoreError};

/// Begins a reaper pass's transaction on an acquired connection, and returns it with the local
/// instant it began at and the database's clock, read once for the whole transaction. The
/// connection is acquired by the caller first, so a wait for one (the database restarting, the
/// pool exhausted) is not counted against the leases the transaction takes.
async fn begin_claim<'c>(
    store: &PgStore,
    conn: &'c mut PoolConnection<Postgres>,
) -> Result<(Transaction<'c, Postgres>, Instant, DateTime<Utc>), StoreError> {
    let began = Instant::now();
    let mut tx = store.begin_on(conn).await?;
    let now: DateTime<Utc> = crate::schema::query_scalar(CLOCK_SQL)
        .fetch_one(&mut *tx)
        .await?;
    Ok((tx, began, now))
}

/// The reaper's statement for `params`, bound, with the claim token it takes the rows with.
pub(crate) fn reap_query(
    params: &ReapParams,
    token: ClaimToken,
) -> sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments> {
    let query = crate::schema::query(match params.group {
        None => REAP_SQL,
        Some(_) => REAP_GROUP_SQL,
    })
    .bind(i64::from(params.limit))
    .bind(&params.claimant)
    .bind(token.0)
    .bind(lease_seconds(params.lease));
    bind_group(query, params.group)
}

/// [`FireLedger::reap_expired`](super::FireLedger::reap_expired).
pub(super) async fn reap_expired(
    store: &PgStore,
    params: &ReapParams,
) -> Result<TickClaim, StoreError> {
    let token = ClaimToken::new_v4();
    let mut conn = store.pool.acquire().await?;
    let (mut tx, began, now) = begin_claim(store, &mut conn).await?;
    let rows: Vec<ClaimedRow> = reap_query(params, token)
        .try_map(|row| ClaimedRow::from_row(&row))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let mut fires = rows
        .into_iter()
        .map(ClaimedFire::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    fires.sort_by_key(|f| f.occurrence);
    Ok(TickClaim {
        now,
        began,
        token,
        fires,
        deferred: 0,
        held: 0,
        more_due: false,
        resume_after: None,
        skipped: 0,
        unusable: Vec::new(),
    })
}

/// Retention's statement, bound: at most `limit` fires settled and scheduled longer than
/// `retention` ago, among the fires of `group` or of every group.
pub(crate) fn prune_query(
    group: Option<GroupId>,
    retention: Duration,
    limit: u32,
) -> sqlx::query::Query<'static, Postgres, sqlx::postgres::PgArguments> {
    let statement = match group {
        None => PRUNE_SQL,
        Some(_) => PRUNE_GROUP_SQL,
    };
    bind_group(
        crate::schema::query(statement)
            .bind(retention.as_secs_f64())
            .bind(i64::from(limit)),
        group,
    )
}

/// [`FireLedger::prune_settled`](super::FireLedger::prune_settled), among the fires of `group`
/// or of every group.
pub(super) async fn prune_settled(
    store: &PgStore,
    group: Option<GroupId>,
    retention: Duration,
    limit: u32,
) -> Result<u64, StoreError> {
    // The ledger is the dedupe: a settled row is what stops an occurrence firing twice, so
    // only rows far older than any occurrence a scheduler could compute again go.
    let deleted =
        on_store!(store, |e| prune_query(group, retention, limit).execute(e))?.rows_affected();
    Ok(deleted)
}
