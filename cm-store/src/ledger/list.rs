//! Listing fires, a page at a time, newest occurrence first.

use chrono::{DateTime, Utc};
use sqlx::{FromRow, Postgres};
use uuid::Uuid;

use super::sql::list_fires_statement;
use super::{Fire, FireFilter};
use crate::{PgStore, StoreError};

/// The listing statement for `filter`, bound.
pub(crate) fn list_query(
    filter: &FireFilter,
) -> sqlx::query::Query<'static, Postgres, sqlx::postgres::PgArguments> {
    crate::schema::query(list_fires_statement(filter.outcome))
        .bind(filter.routine_id)
        .bind(filter.after.map(|c| c.scheduled_at))
        .bind(filter.after.map(|c| c.routine_id))
        .bind(i64::from(filter.limit))
}

/// [`FireLedger::list_fires`](super::FireLedger::list_fires).
pub(super) async fn list_fires(
    store: &PgStore,
    filter: &FireFilter,
) -> Result<Vec<Fire>, StoreError> {
    let rows: Vec<FireRow> = on_store!(store, |e| list_query(filter)
        .try_map(|row| FireRow::from_row(&row))
        .fetch_all(e))?;
    Ok(rows.into_iter().map(Fire::from).collect())
}

/// A row of the listing statement.
#[derive(FromRow)]
pub(crate) struct FireRow {
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    status: String,
    origin: String,
    claimant: String,
    attempt: i32,
    claimed_at: DateTime<Utc>,
    lease_expires_at: DateTime<Utc>,
    completed_at: Option<DateTime<Utc>>,
    error: Option<String>,
    receipt: Option<String>,
    run_state: Option<String>,
    run_exit_code: Option<i32>,
    run_reason: Option<String>,
    run_started_at: Option<DateTime<Utc>>,
    run_finished_at: Option<DateTime<Utc>>,
    retry: i16,
    tries: Option<serde_json::Value>,
}

impl From<FireRow> for Fire {
    fn from(r: FireRow) -> Self {
        Fire {
            routine_id: r.routine_id,
            scheduled_at: r.scheduled_at,
            status: r.status,
            origin: r.origin,
            claimant: r.claimant,
            attempt: u32::try_from(r.attempt).unwrap_or(0),
            claimed_at: r.claimed_at,
            lease_expires_at: r.lease_expires_at,
            completed_at: r.completed_at,
            error: r.error,
            receipt: r.receipt,
            run_state: r.run_state,
            run_exit_code: r.run_exit_code,
            run_reason: r.run_reason,
            run_started_at: r.run_started_at,
            run_finished_at: r.run_finished_at,
            retry: u32::try_from(r.retry).unwrap_or(0),
            // A record this version does not read is left out rather than failing the listing.
            tries: r
                .tries
                .and_then(|t| serde_json::from_value(t).ok())
                .unwrap_or_default(),
        }
    }
}
