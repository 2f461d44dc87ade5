//! What an operator's status page reads: routines a page at a time with their latest fire,
//! recent failures across routines, and the claims still open. Every query is bounded.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::FromRow;
use uuid::Uuid;

use crate::{Fire, FireFilter, FireLedger, PgStore, Routine, RoutineStore, StoreError};

/// The most rows any status query returns.
pub const MAX_PAGE: u32 = 500;

/// A routine and its latest fire.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutineSummary {
    /// The routine.
    pub routine: Routine,
    /// Its newest occurrence in the ledger, if any.
    pub last_fire: Option<LastFire>,
}

/// The newest fire of a routine.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct LastFire {
    /// The occurrence's instant.
    pub scheduled_at: DateTime<Utc>,
    /// `claimed`, `fired` or `failed`.
    pub status: String,
    /// When it was settled.
    pub completed_at: Option<DateTime<Utc>>,
}

/// A fire that settled `failed`, with its routine's name.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct FailedFire {
    /// The routine.
    pub routine_id: Uuid,
    /// The routine's name.
    pub routine_name: String,
    /// The occurrence's instant.
    pub scheduled_at: DateTime<Utc>,
    /// When it was settled.
    pub completed_at: Option<DateTime<Utc>>,
    /// The attempt that settled it.
    pub attempt: i32,
    /// Why it failed.
    pub error: Option<String>,
}

/// Claims not yet settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenClaims {
    /// Held by the claimant asked about.
    pub mine: u64,
    /// Held by any claimant.
    pub all: u64,
}

/// The read-only queries of the status page.
#[async_trait]
pub trait StatusReader: Send + Sync {
    /// Up to `limit` routines (at most [`MAX_PAGE`]) in creation order, starting after the
    /// routine `after`, each with its newest fire.
    async fn routine_summaries(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<RoutineSummary>, StoreError>;

    /// One routine.
    async fn routine(&self, id: Uuid) -> Result<Routine, StoreError>;

    /// A routine's newest `limit` fires (at most [`MAX_PAGE`]).
    async fn routine_fires(&self, id: Uuid, limit: u32) -> Result<Vec<Fire>, StoreError>;

    /// The `limit` most recently settled failures across routines (at most [`MAX_PAGE`]).
    async fn recent_failures(&self, limit: u32) -> Result<Vec<FailedFire>, StoreError>;

    /// How many claims are open, in all and held by `claimant`.
    async fn open_claims(&self, claimant: &str) -> Result<OpenClaims, StoreError>;
}

#[derive(FromRow)]
struct SummaryRow {
    #[sqlx(flatten)]
    routine: Routine,
    last_scheduled_at: Option<DateTime<Utc>>,
    last_status: Option<String>,
    last_completed_at: Option<DateTime<Utc>>,
}

#[async_trait]
impl StatusReader for PgStore {
    async fn routine_summaries(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<RoutineSummary>, StoreError> {
        // Keyset paging on (created_at, id), the order `routine list` uses; the newest fire
        // comes from the ledger's primary key, one index probe a routine.
        let rows: Vec<SummaryRow> = sqlx::query_as(
            "SELECT r.*, f.scheduled_at AS last_scheduled_at, f.status AS last_status,
                    f.completed_at AS last_completed_at
             FROM routines r
             LEFT JOIN LATERAL (
                 SELECT scheduled_at, status, completed_at FROM routine_fires
                 WHERE routine_id = r.id
                 ORDER BY scheduled_at DESC
                 LIMIT 1) f ON true
             WHERE $1::uuid IS NULL
                OR (r.created_at, r.id) > (SELECT created_at, id FROM routines WHERE id = $1)
             ORDER BY r.created_at, r.id
             LIMIT $2",
        )
        .bind(after)
        .bind(i64::from(limit.min(MAX_PAGE)))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| RoutineSummary {
                last_fire: match (row.last_scheduled_at, row.last_status) {
                    (Some(scheduled_at), Some(status)) => Some(LastFire {
                        scheduled_at,
                        status,
                        completed_at: row.last_completed_at,
                    }),
                    _ => None,
                },
                routine: row.routine,
            })
            .collect())
    }

    async fn routine(&self, id: Uuid) -> Result<Routine, StoreError> {
        self.get_routine(id).await
    }

    async fn routine_fires(&self, id: Uuid, limit: u32) -> Result<Vec<Fire>, StoreError> {
        self.list_fires(&FireFilter {
            routine_id: Some(id),
            status: None,
            limit: limit.min(MAX_PAGE),
            after: None,
        })
        .await
    }

    async fn recent_failures(&self, limit: u32) -> Result<Vec<FailedFire>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT f.routine_id, r.name AS routine_name, f.scheduled_at, f.completed_at,
                    f.attempt, f.error
             FROM routine_fires f
             JOIN routines r ON r.id = f.routine_id
             WHERE f.status = 'failed'
             ORDER BY f.scheduled_at DESC, f.routine_id DESC
             LIMIT $1",
        )
        .bind(i64::from(limit.min(MAX_PAGE)))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn open_claims(&self, claimant: &str) -> Result<OpenClaims, StoreError> {
        let (mine, all): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE claimant = $1), count(*)
             FROM routine_fires WHERE status = 'claimed'",
        )
        .bind(claimant)
        .fetch_one(&self.pool)
        .await?;
        Ok(OpenClaims {
            mine: u64::try_from(mine).unwrap_or(0),
            all: u64::try_from(all).unwrap_or(0),
        })
    }
}
