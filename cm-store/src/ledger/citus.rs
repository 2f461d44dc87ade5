//! The claim on Citus, kept in one group: written per table, each a router statement on the
//! group's shard, so the claim's transaction stays on one worker and commits there in one phase
//! (see [`SHARD_CLAIM_SQL`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use cm_domain::Occurrence;
use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, Postgres, Transaction};
use uuid::Uuid;

use super::ClaimDueParams;
use super::ClaimedFire;
use super::advance::Advance;
use super::claim::{ClaimInput, lease_seconds, outbox_kinds};
use super::claimed::{ClaimedRow, mark_unwritten_messages};
use super::sql::{
    ADVANCE_GROUP_SQL, CITUS_DISTRIBUTED_SQL, CITUS_EXTENSION_SQL, DRAW_SEQS_SQL, SHARD_CLAIM_SQL,
    SHARD_OUTBOX_SQL, SHARD_ROUTINES_SQL,
};
use crate::groups::GroupId;
use crate::{PgStore, StoreError};

/// A row of [`SHARD_CLAIM_SQL`]: the fire as the upsert left it.
#[derive(FromRow)]
struct UpsertedRow {
    inserted: bool,
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    status: String,
    claimant: String,
    claim_token: Uuid,
    attempt: i32,
    lease_expires_at: DateTime<Utc>,
    receipt: Option<String>,
    origin: String,
    error: Option<String>,
    first_claimed_at: Option<DateTime<Utc>>,
    planned_at: Option<DateTime<Utc>>,
    retry: i16,
    retry_began: i32,
}

impl PgStore {
    /// Whether the schema is distributed on Citus (`routines` is a distributed table), read
    /// once.
    pub(crate) async fn is_citus(&self) -> Result<bool, StoreError> {
        if let Some(citus) = self.citus.get() {
            return Ok(*citus);
        }
        let citus = on_store_conn!(self, |conn| async {
            let extension: bool = crate::schema::query_scalar(CITUS_EXTENSION_SQL)
                .fetch_one(&mut *conn)
                .await?;
            Ok::<_, sqlx::Error>(
                extension
                    && crate::schema::query_scalar(CITUS_DISTRIBUTED_SQL)
                        .fetch_one(&mut *conn)
                        .await?,
            )
        })?;
        Ok(*self.citus.get_or_init(|| citus))
    }
}

/// The claim's writes on Citus, one router statement each (see [`SHARD_CLAIM_SQL`])..
pub(super) async fn claim_rows_on_one_shard(
    tx: &mut Transaction<'_, Postgres>,
    params: &ClaimDueParams,
    claim: &ClaimInput<'_>,
    advance: &Advance,
    group: GroupId,
) -> Result<Vec<ClaimedFire>, StoreError> {
    let claims = claim.claims;
    let (ids, instants, origins) = claim.columns();
    let (message, mission) = outbox_kinds(params);
    // Numbers drawn in the order of the occurrences (oldest first), as the one-statement
    // claim draws them.
    let seqs: Vec<i64> = if message || mission {
        crate::schema::query_scalar(DRAW_SEQS_SQL)
            .bind(i64::try_from(claims.len()).unwrap_or(i64::MAX))
            .fetch_all(&mut **tx)
            .await?
    } else {
        vec![0; claims.len()]
    };
    let upserted: Vec<UpsertedRow> = crate::schema::query_as(SHARD_CLAIM_SQL)
        .bind(&ids)
        .bind(&instants)
        .bind(&params.claimant)
        .bind(claim.token.0)
        .bind(lease_seconds(params.lease))
        .bind(&origins)
        .bind(claim.now)
        .bind(&seqs)
        .bind(message)
        .bind(mission)
        .bind(group)
        .bind(&claim.planned)
        .fetch_all(&mut **tx)
        .await?;
    let fresh: Vec<&UpsertedRow> = upserted
        .iter()
        .filter(|r| r.inserted && r.receipt.is_some())
        .collect();
    let written = if fresh.is_empty() {
        0
    } else {
        let keys: Vec<String> = fresh
            .iter()
            .map(|r| {
                Occurrence::new(r.routine_id, r.scheduled_at)
                    .idempotency_key()
                    .as_str()
                    .to_owned()
            })
            .collect();
        let seqs: Vec<i64> = fresh
            .iter()
            .filter_map(|r| {
                r.receipt
                    .as_deref()?
                    .strip_prefix("outbox seq ")?
                    .parse()
                    .ok()
            })
            .collect();
        let written: Vec<i64> = crate::schema::query_scalar(SHARD_OUTBOX_SQL)
            .bind(fresh.iter().map(|r| r.routine_id).collect::<Vec<_>>())
            .bind(fresh.iter().map(|r| r.scheduled_at).collect::<Vec<_>>())
            .bind(&seqs)
            .bind(&keys)
            .bind(group)
            .fetch_all(&mut **tx)
            .await?;
        written.len()
    };
    if !advance.ids.is_empty() {
        advance
            .bind_claimed(
                advance
                    .bind(crate::schema::query(ADVANCE_GROUP_SQL))
                    .bind(claim.now)
                    .bind(group),
            )
            .execute(&mut **tx)
            .await?;
    }
    let routines: HashMap<Uuid, (String, String, Value)> =
        crate::schema::query_as::<_, (Uuid, String, String, Value)>(SHARD_ROUTINES_SQL)
            .bind(&ids)
            .bind(group)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .map(|(id, name, kind, payload)| (id, (name, kind, payload)))
            .collect();
    let mut rows: Vec<ClaimedRow> = upserted
        .into_iter()
        .filter_map(|r| {
            let (name, kind, payload) = routines.get(&r.routine_id)?.clone();
            Some(ClaimedRow {
                inserted: r.inserted,
                routine_id: r.routine_id,
                scheduled_at: r.scheduled_at,
                status: r.status,
                claimant: r.claimant,
                claim_token: r.claim_token,
                attempt: r.attempt,
                lease_expires_at: r.lease_expires_at,
                name,
                kind,
                origin: r.origin,
                payload,
                receipt: r.receipt,
                error: r.error,
                first_claimed_at: r.first_claimed_at,
                planned_at: r.planned_at,
                retry: r.retry,
                retry_began: r.retry_began,
                written: Some(i64::try_from(written).unwrap_or(i64::MAX)),
            })
        })
        .collect();
    if message || mission {
        mark_unwritten_messages(tx, &mut rows).await?;
    }
    rows.into_iter().map(ClaimedFire::try_from).collect()
}

/// The statements of [`claim_rows_on_one_shard`] but the outbox numbers' draw, named, bound for
/// one occurrence of a made-up routine in `group`: what a check that each is a router statement
/// on one shard explains.
pub(crate) fn shard_claim_queries(
    group: GroupId,
) -> Vec<(&'static str, Query<'static, Postgres, PgArguments>)> {
    let ids = vec![Uuid::new_v4()];
    let now = Utc::now();
    let at = vec![now];
    vec![
        (
            "claim",
            crate::schema::query(SHARD_CLAIM_SQL)
                .bind(ids.clone())
                .bind(at.clone())
                .bind("a")
                .bind(Uuid::new_v4())
                .bind(30.0_f64)
                .bind(vec!["schedule"])
                .bind(now)
                .bind(vec![1_i64])
                .bind(true)
                .bind(false)
                .bind(group)
                .bind(vec![None::<DateTime<Utc>>]),
        ),
        (
            "outbox",
            crate::schema::query(SHARD_OUTBOX_SQL)
                .bind(ids.clone())
                .bind(at)
                .bind(vec![1_i64])
                .bind(vec!["key"])
                .bind(group),
        ),
        (
            "routines",
            crate::schema::query(SHARD_ROUTINES_SQL)
                .bind(ids.clone())
                .bind(group),
        ),
        (
            "advance",
            crate::schema::query(ADVANCE_GROUP_SQL)
                .bind(ids)
                .bind(vec![Some(now)])
                .bind(vec![true])
                .bind(vec![true])
                .bind(now)
                .bind(group)
                .bind(vec![1_i32]),
        ),
    ]
}
