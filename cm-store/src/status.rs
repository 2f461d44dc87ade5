//! What an operator's status page reads: routines a page at a time (filtered, sorted) with their
//! newest fires, recent failures across routines, the claims still open, fires per minute over
//! the last hour and the outbox backlog. Every query is bounded.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::{FireOutcome, FireStatus, Occurrence};
use sqlx::FromRow;
use uuid::Uuid;

use crate::model::{RoutineRow, routines_of};
use crate::{
    Fire, FireFilter, FireLedger, OutboxBacklog, OutboxConsumer, PgStore, Routine, RoutineStore,
    StoreError,
};

/// The most rows any status query returns.
pub const MAX_PAGE: u32 = 500;

/// Which routines a page lists: an optional part of the name, an optional state, an order,
/// and the routine the page starts after (keyset paging in that order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutineQuery {
    /// Only routines whose name contains this text, compared without case.
    pub name_contains: Option<String>,
    /// Only paused (`Some(true)`) or only active (`Some(false)`) routines.
    pub paused: Option<bool>,
    /// The order of the listing.
    pub order: RoutineOrder,
    /// Start after this routine, in `order`.
    pub after: Option<Uuid>,
    /// At most this many routines (at most [`MAX_PAGE`]).
    pub limit: u32,
    /// Each routine's newest fires to return (at most [`MAX_STRIP`]).
    pub recent_fires: u32,
}

/// The order of a routine listing; every order ends on the id, so a page boundary is exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RoutineOrder {
    /// Creation order, as `routine list` prints them.
    #[default]
    Created,
    /// By name.
    Name,
    /// Soonest next run first; routines with none (paused, or a schedule that ended) last.
    NextRun,
}

/// The most fires of one routine a summary carries.
pub const MAX_STRIP: u32 = 60;

/// A routine and its newest fires.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutineSummary {
    /// The routine.
    pub routine: Routine,
    /// Its newest occurrences in the ledger, newest first.
    pub recent_fires: Vec<RecentFire>,
}

impl RoutineSummary {
    /// Its newest occurrence in the ledger, if any.
    pub fn last_fire(&self) -> Option<&RecentFire> {
        self.recent_fires.first()
    }
}

/// One of a routine's newest fires.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct RecentFire {
    /// The occurrence's instant.
    pub scheduled_at: DateTime<Utc>,
    /// `claimed`, `fired`, `failed` or `skipped`: whether it was dispatched.
    pub status: String,
    /// When it was settled.
    pub completed_at: Option<DateTime<Utc>>,
    /// Why it failed (its dispatch's error, or its run's reason) or was skipped, cut to its
    /// first 300 characters.
    pub error: Option<String>,
    /// A mission's run: `running`, `succeeded`, `failed` or `lost`.
    pub run_state: Option<String>,
    /// The run's exit code, when its runtime reported one.
    pub run_exit_code: Option<i32>,
}

impl RecentFire {
    /// What the fire's effect did ([`FireOutcome::of`]): its run's state for a mission.
    pub fn outcome(&self) -> FireOutcome {
        let status = self.status.parse().unwrap_or(FireStatus::Claimed);
        FireOutcome::of(
            status,
            self.run_state.as_deref().and_then(|r| r.parse().ok()),
        )
    }
}

/// Fires settled per minute over the last hour, by occurrence time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireRate {
    /// The start of the current minute, by the database's clock: the last bucket.
    pub until: DateTime<Utc>,
    /// One bucket a minute, oldest first, [`RATE_MINUTES`] of them ending at `until`.
    pub minutes: Vec<MinuteCount>,
}

/// Minutes in a [`FireRate`].
pub const RATE_MINUTES: usize = 60;

/// The fires of one minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MinuteCount {
    /// Dispatched and not failed: messages fired, missions whose run has not failed.
    pub fired: u64,
    /// Failed: a failed dispatch, or a mission whose run failed or was lost.
    pub failed: u64,
}

/// A fire whose outcome is a failure (a failed dispatch, or a mission whose run failed or was
/// lost), with its routine's name.
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
    /// Why it failed: the dispatch's error, or the run's reason (`exit code 3`).
    pub error: Option<String>,
    /// `failed` or `lost`.
    pub outcome: String,
    /// The run's exit code, when it has one.
    pub run_exit_code: Option<i32>,
}

/// One fire with what its run left: `fires show` and the fire's part of a routine's page.
#[derive(Debug, Clone, PartialEq)]
pub struct FireDetail {
    /// The fire, as listed.
    pub fire: Fire,
    /// The last of its run's output (at most [`crate::MAX_RUN_OUTPUT`] bytes, secrets
    /// scrubbed), when its runtime kept any.
    pub run_output: Option<String>,
}

#[derive(FromRow)]
struct DetailRow {
    #[sqlx(flatten)]
    fire: crate::ledger::FireRow,
    run_output: Option<String>,
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
    /// The routines `query` asks for, each with its newest fires.
    async fn routine_summaries(
        &self,
        query: &RoutineQuery,
    ) -> Result<Vec<RoutineSummary>, StoreError>;

    /// The newest fire of each routine of `ids` that has one (at most [`MAX_PAGE`] routines), in
    /// no particular order: what `routine list` shows as the last outcome.
    async fn last_fires(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, RecentFire)>, StoreError>;

    /// The routine `handle` names: by id when it is a UUID, else by name (names are never
    /// UUIDs), as the command line takes them.
    async fn routine(&self, handle: &str) -> Result<Routine, StoreError>;

    /// A routine's newest `limit` fires (at most [`MAX_PAGE`]).
    async fn routine_fires(&self, id: Uuid, limit: u32) -> Result<Vec<Fire>, StoreError>;

    /// The fire of `occurrence` with its run's output, if the ledger holds it.
    async fn fire(&self, occurrence: Occurrence) -> Result<Option<FireDetail>, StoreError>;

    /// How many fires the ledger holds for a routine (what deleting it deletes with it).
    async fn fire_count(&self, id: Uuid) -> Result<u64, StoreError>;

    /// The `limit` newest failures across routines (at most [`MAX_PAGE`]): failed dispatches
    /// and missions whose run failed or was lost, by occurrence, newest first.
    async fn recent_failures(&self, limit: u32) -> Result<Vec<FailedFire>, StoreError>;

    /// How many claims are open, in all and held by `claimant`.
    async fn open_claims(&self, claimant: &str) -> Result<OpenClaims, StoreError>;

    /// Fires and failures per minute over the last hour.
    async fn fire_rate(&self) -> Result<FireRate, StoreError>;

    /// The outbox's messages not yet acknowledged: how many, and the oldest's age.
    async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError>;
}

/// The listing's statement for one order: the filters, the keyset condition and the order
/// differ only in the sort key.
macro_rules! summaries_sql {
    ($key:literal) => {
        concat!(
            "SELECT r.* FROM cm.routines r
             WHERE ($1::text IS NULL OR strpos(lower(r.name), lower($1)) > 0)
               AND ($2::bool IS NULL OR r.paused = $2)
               AND ($3::uuid IS NULL
                    OR (",
            $key,
            ", r.id) > (SELECT ",
            $key,
            ", r.id FROM cm.routines r WHERE r.id = $3))
             ORDER BY ",
            $key,
            ", r.id
             LIMIT $4"
        )
    };
}

impl PgStore {
    /// The newest `strip` fires of each routine of `ids`, newest first: one bounded probe of
    /// the ledger's primary key a routine, joined on the group (on Citus, each routine's probe
    /// runs on its shard).
    async fn strips(&self, ids: &[Uuid], strip: u32) -> Result<Vec<StripRow>, StoreError> {
        Ok(if ids.is_empty() || strip == 0 {
            Vec::new()
        } else {
            on_store!(self, |e| crate::schema::query_as(concat!(
                "SELECT r.id AS routine_id, f.scheduled_at, f.status, f.completed_at, f.error,
                            f.run_state, f.run_exit_code
                     FROM cm.routines r
                     CROSS JOIN LATERAL (
                         SELECT scheduled_at, status, completed_at, run_state, run_exit_code,
                                left(COALESCE(",
                failure_reason_sql!(""),
                ", error), 300) AS error
                     FROM cm.routine_fires
                     WHERE routine_id = r.id AND group_id = r.group_id
                     ORDER BY scheduled_at DESC
                     LIMIT $2) f
                     WHERE r.id = ANY($1)"
            ))
            .bind(ids)
            .bind(i64::from(strip))
            .fetch_all(e))?
        })
    }
}

#[derive(FromRow)]
struct StripRow {
    routine_id: Uuid,
    #[sqlx(flatten)]
    fire: RecentFire,
}

#[async_trait]
impl StatusReader for PgStore {
    async fn routine_summaries(
        &self,
        query: &RoutineQuery,
    ) -> Result<Vec<RoutineSummary>, StoreError> {
        // Keyset paging in the chosen order; each routine's newest fires come from the
        // ledger's primary key, one bounded index probe a routine.
        let sql = match query.order {
            RoutineOrder::Created => summaries_sql!("r.created_at"),
            RoutineOrder::Name => summaries_sql!("r.name"),
            RoutineOrder::NextRun => summaries_sql!("COALESCE(r.next_run_at, 'infinity')"),
        };
        let routines: Vec<RoutineRow> = on_store!(self, |e| crate::schema::query_as(sql)
            .bind(query.name_contains.as_deref().filter(|n| !n.is_empty()))
            .bind(query.paused)
            .bind(query.after)
            .bind(i64::from(query.limit.min(MAX_PAGE)))
            .fetch_all(e))?;
        let routines = routines_of(routines)?;
        let ids: Vec<Uuid> = routines.iter().map(|r| r.id).collect();
        let mut fires = self.strips(&ids, query.recent_fires.min(MAX_STRIP)).await?;
        Ok(routines
            .into_iter()
            .map(|routine| {
                let recent_fires = fires
                    .extract_if(.., |row| row.routine_id == routine.id)
                    .map(|row| row.fire)
                    .collect();
                RoutineSummary {
                    routine,
                    recent_fires,
                }
            })
            .collect())
    }

    async fn last_fires(&self, ids: &[Uuid]) -> Result<Vec<(Uuid, RecentFire)>, StoreError> {
        let ids = &ids[..ids.len().min(MAX_PAGE as usize)];
        Ok(self
            .strips(ids, 1)
            .await?
            .into_iter()
            .map(|row| (row.routine_id, row.fire))
            .collect())
    }

    async fn routine(&self, handle: &str) -> Result<Routine, StoreError> {
        let handle = handle.trim();
        match Uuid::try_parse(handle) {
            Ok(id) => self.get_routine(id).await,
            Err(_) => self.get_routine_by_name(handle).await,
        }
    }

    async fn routine_fires(&self, id: Uuid, limit: u32) -> Result<Vec<Fire>, StoreError> {
        self.list_fires(&FireFilter {
            routine_id: Some(id),
            outcome: None,
            limit: limit.min(MAX_PAGE),
            after: None,
        })
        .await
    }

    async fn fire(&self, occurrence: Occurrence) -> Result<Option<FireDetail>, StoreError> {
        let row: Option<DetailRow> = on_store!(self, |e| crate::schema::query_as(
            "SELECT routine_id, scheduled_at, status, origin, claimant, attempt, claimed_at,
                    lease_expires_at, completed_at, error, receipt, run_state, run_exit_code,
                    run_reason, run_started_at, run_finished_at, run_output, retry, tries
             FROM cm.routine_fires WHERE routine_id = $1 AND scheduled_at = $2",
        )
        .bind(occurrence.routine_id)
        .bind(occurrence.scheduled_at)
        .fetch_optional(e))?;
        Ok(row.map(|row| FireDetail {
            fire: Fire::from(row.fire),
            run_output: row.run_output,
        }))
    }

    async fn fire_count(&self, id: Uuid) -> Result<u64, StoreError> {
        let count: i64 = on_store!(self, |e| crate::schema::query_scalar(
            "SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1"
        )
        .bind(id)
        .fetch_one(e))?;
        Ok(count.max(0) as u64)
    }

    async fn recent_failures(&self, limit: u32) -> Result<Vec<FailedFire>, StoreError> {
        // Newest first through `routine_fires_failures_idx`, which holds the failures only.
        Ok(on_store!(self, |e| crate::schema::query_as(concat!(
            "SELECT f.routine_id, r.name AS routine_name, f.scheduled_at, f.completed_at,
                    f.attempt, f.run_exit_code, ",
            failure_reason_sql!("f."),
            " AS error, ",
            outcome_sql!("f."),
            " AS outcome
             FROM cm.routine_fires f
             JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
             WHERE ",
            failure_sql!("f."),
            "
             ORDER BY f.scheduled_at DESC, f.routine_id DESC
             LIMIT $1"
        ))
        .bind(i64::from(limit.min(MAX_PAGE)))
        .fetch_all(e))?)
    }

    async fn open_claims(&self, claimant: &str) -> Result<OpenClaims, StoreError> {
        let (mine, all): (i64, i64) = on_store!(self, |e| crate::schema::query_as(
            "SELECT count(*) FILTER (WHERE claimant = $1), count(*)
             FROM cm.routine_fires WHERE status = 'claimed'",
        )
        .bind(claimant)
        .fetch_one(e))?;
        Ok(OpenClaims {
            mine: u64::try_from(mine).unwrap_or(0),
            all: u64::try_from(all).unwrap_or(0),
        })
    }

    async fn fire_rate(&self) -> Result<FireRate, StoreError> {
        // Read through the (scheduled_at, routine_id) index: an hour of fires, no more.
        let mut tx = self.begin().await?;
        let until: DateTime<Utc> =
            crate::schema::query_scalar("SELECT date_trunc('minute', now())")
                .fetch_one(&mut *tx)
                .await?;
        let since = until - chrono::Duration::minutes(RATE_MINUTES as i64 - 1);
        let rows: Vec<(DateTime<Utc>, i64, i64)> = crate::schema::query_as(concat!(
            "SELECT date_trunc('minute', scheduled_at) AS minute,
                    count(*) FILTER (WHERE NOT ",
            failure_sql!(""),
            "),
                    count(*) FILTER (WHERE ",
            failure_sql!(""),
            ")
             FROM cm.routine_fires
             WHERE status IN ('fired', 'failed') AND scheduled_at >= $1
               AND scheduled_at < $2 + interval '1 minute'
             GROUP BY 1"
        ))
        .bind(since)
        .bind(until)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut minutes = vec![MinuteCount::default(); RATE_MINUTES];
        for (minute, fired, failed) in rows {
            let index = (minute - since).num_minutes();
            if let Some(bucket) = usize::try_from(index).ok().and_then(|i| minutes.get_mut(i)) {
                bucket.fired = u64::try_from(fired).unwrap_or(0);
                bucket.failed = u64::try_from(failed).unwrap_or(0);
            }
        }
        Ok(FireRate { until, minutes })
    }

    async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        OutboxConsumer::outbox_backlog(self, 0).await
    }
}
