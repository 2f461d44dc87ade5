//! The `routines` table: creating, reading, pausing, resuming and deleting routines (editing,
//! importing and paging through them are in [`crate::catalog`]).

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::{MisfirePolicy, Schedule};
use serde_json::Value;
use uuid::Uuid;

use crate::catalog::{self, ImportedRoutine, PendingRequests, RoutineCursor, RoutineUpdate};
use crate::{PgStore, StoreError};

/// What a routine does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutineKind {
    /// Posts a message (the payload) through the message backend.
    Message,
    /// Launches a container through the mission backend.
    Mission,
}

impl RoutineKind {
    /// The kind as stored: `message` or `mission`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutineKind::Message => "message",
            RoutineKind::Mission => "mission",
        }
    }
}

impl fmt::Display for RoutineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for RoutineKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl FromStr for RoutineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "message" => Ok(RoutineKind::Message),
            "mission" => Ok(RoutineKind::Mission),
            other => Err(format!(
                "unknown routine kind {other:?} (expected message or mission)"
            )),
        }
    }
}

/// A routine to create. The schedule is already parsed, so an invalid one cannot be stored.
#[derive(Debug, Clone)]
pub struct NewRoutine {
    /// A name for people, unique (check it with `cm_domain::RoutineName`).
    pub name: String,
    /// When it runs.
    pub schedule: Schedule,
    /// What it does.
    pub kind: RoutineKind,
    /// What the backend receives: the message, or the mission's description.
    pub payload: Value,
    /// What to do with occurrences found late.
    pub misfire: MisfirePolicy,
    /// Created paused: never due until resumed.
    pub paused: bool,
}

/// A stored routine.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct Routine {
    /// Its id.
    pub id: Uuid,
    /// Its name.
    pub name: String,
    /// The cron expression as written.
    pub schedule: String,
    /// The IANA zone the expression is read in.
    pub timezone: String,
    /// `message` or `mission`.
    #[sqlx(try_from = "String")]
    pub kind: RoutineKind,
    /// What the backend receives.
    pub payload: Value,
    /// `fire-once`, `catch-up` or `skip`.
    pub misfire_policy: String,
    /// What a mission's occurrence does while an earlier run is still running: `allow`,
    /// `forbid` (the default) or `replace`. Meaningless for messages.
    pub overlap: String,
    /// Whether it is paused.
    pub paused: bool,
    /// Why cm paused it by itself (its last fires all failed); `None` when it runs or a person
    /// paused it.
    pub paused_reason: Option<String>,
    /// Its next occurrence; `None` while paused or when the schedule has no more.
    pub next_run_at: Option<DateTime<Utc>>,
    /// When a tick last claimed occurrences of it.
    pub last_run_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last changed.
    pub updated_at: DateTime<Utc>,
}

impl Routine {
    /// The parsed schedule.
    pub fn parsed_schedule(&self) -> Result<Schedule, StoreError> {
        Schedule::parse(&self.schedule, &self.timezone).map_err(|e| StoreError::CorruptRoutine {
            routine_id: self.id,
            reason: e.to_string(),
        })
    }

    /// The parsed misfire policy.
    pub fn misfire(&self) -> Result<MisfirePolicy, StoreError> {
        self.misfire_policy
            .parse()
            .map_err(
                |e: cm_domain::ParseMisfirePolicyError| StoreError::CorruptRoutine {
                    routine_id: self.id,
                    reason: e.to_string(),
                },
            )
    }
}

/// Creating and managing routines.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait RoutineStore: Send + Sync {
    /// Stores a new routine; unless paused, its first run is the schedule's first occurrence
    /// after the database's clock.
    async fn create_routine(&self, routine: NewRoutine) -> Result<Routine, StoreError>;

    /// The routine with this id.
    async fn get_routine(&self, id: Uuid) -> Result<Routine, StoreError>;

    /// Every routine, oldest first.
    async fn list_routines(&self) -> Result<Vec<Routine>, StoreError>;

    /// The routine with this name (names are unique).
    async fn get_routine_by_name(&self, name: &str) -> Result<Routine, StoreError>;

    /// At most `limit` routines in creation order, after `after` (from the first when `None`):
    /// a listing reads the table a page at a time instead of holding it all.
    async fn list_routines_page(
        &self,
        after: Option<RoutineCursor>,
        limit: u32,
    ) -> Result<Vec<Routine>, StoreError>;

    /// Changes a routine in one transaction with its row locked (see [`RoutineUpdate`]). A
    /// name another routine has is refused with [`StoreError::NameTaken`].
    async fn update_routine(&self, id: Uuid, update: &RoutineUpdate)
    -> Result<Routine, StoreError>;

    /// Stores every routine of `routines` in one transaction, or none: a name that exists is
    /// refused with [`StoreError::NameTaken`], unless `upsert`, where that routine takes the
    /// new schedule, policy, kind and payload (as [`RoutineStore::update_routine`] would; its
    /// paused state is kept). Returns what was written, in order.
    async fn import_routines(
        &self,
        routines: &[NewRoutine],
        upsert: bool,
    ) -> Result<Vec<ImportedRoutine>, StoreError>;

    /// How many occurrences of a routine are asked for and not yet claimed, and the oldest
    /// `limit` of them.
    async fn pending_requests(&self, id: Uuid, limit: u32) -> Result<PendingRequests, StoreError>;

    /// Pauses a routine (it is never due while paused) or resumes it (its next run is computed
    /// from the database's clock, so a long pause does not produce misfires).
    async fn set_routine_paused(&self, id: Uuid, paused: bool) -> Result<Routine, StoreError>;

    /// Deletes a routine, its pending requests and its ledger rows. A dispatch of it already in
    /// flight finishes, and its settle finds the row gone ([`crate::SettleOutcome::Gone`]).
    async fn delete_routine(&self, id: Uuid) -> Result<(), StoreError>;

    /// Asks for occurrences of a routine to be fired by the next ticks, through the ledger:
    /// an occurrence already in the ledger (fired, failed or in flight) is not asked for again,
    /// and one already asked for is asked for once. Returns how many were newly asked for.
    async fn request_occurrences(
        &self,
        id: Uuid,
        instants: &[DateTime<Utc>],
    ) -> Result<u64, StoreError>;

    /// Asks for an occurrence of a routine at the database's current instant (a manual
    /// trigger), fired by the next tick, paused or not. Returns its instant.
    async fn trigger_routine(&self, id: Uuid) -> Result<DateTime<Utc>, StoreError>;
}

#[async_trait]
impl RoutineStore for PgStore {
    async fn create_routine(&self, routine: NewRoutine) -> Result<Routine, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await?;
        let row = catalog::insert_routine(&mut tx, &routine, now).await?;
        tx.commit().await?;
        Ok(row)
    }

    async fn get_routine(&self, id: Uuid) -> Result<Routine, StoreError> {
        sqlx::query_as::<_, Routine>("SELECT * FROM routines WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::RoutineNotFound(id))
    }

    async fn list_routines(&self) -> Result<Vec<Routine>, StoreError> {
        Ok(
            sqlx::query_as::<_, Routine>("SELECT * FROM routines ORDER BY created_at, id")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn get_routine_by_name(&self, name: &str) -> Result<Routine, StoreError> {
        catalog::get_routine_by_name(&self.pool, name).await
    }

    async fn list_routines_page(
        &self,
        after: Option<RoutineCursor>,
        limit: u32,
    ) -> Result<Vec<Routine>, StoreError> {
        catalog::list_routines_page(&self.pool, after, limit).await
    }

    async fn update_routine(
        &self,
        id: Uuid,
        update: &RoutineUpdate,
    ) -> Result<Routine, StoreError> {
        catalog::update_routine(&self.pool, id, update).await
    }

    async fn import_routines(
        &self,
        routines: &[NewRoutine],
        upsert: bool,
    ) -> Result<Vec<ImportedRoutine>, StoreError> {
        catalog::import_routines(&self.pool, routines, upsert).await
    }

    async fn pending_requests(&self, id: Uuid, limit: u32) -> Result<PendingRequests, StoreError> {
        catalog::pending_requests(&self.pool, id, limit).await
    }

    async fn set_routine_paused(&self, id: Uuid, paused: bool) -> Result<Routine, StoreError> {
        let mut tx = self.pool.begin().await?;
        let routine =
            sqlx::query_as::<_, Routine>("SELECT * FROM routines WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or(StoreError::RoutineNotFound(id))?;
        if routine.paused == paused {
            return Ok(routine);
        }
        let next_run_at = if paused {
            None
        } else {
            let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
                .fetch_one(&mut *tx)
                .await?;
            routine.parsed_schedule()?.next_after(now)
        };
        let row = sqlx::query_as::<_, Routine>(
            "UPDATE routines
             SET paused = $2, next_run_at = $3, paused_reason = NULL, updated_at = now()
             WHERE id = $1 RETURNING *",
        )
        .bind(id)
        .bind(paused)
        .bind(next_run_at)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row)
    }

    async fn request_occurrences(
        &self,
        id: Uuid,
        instants: &[DateTime<Utc>],
    ) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await?;
        // Lock the routine so a concurrent delete cannot slip between the check and the insert.
        let exists: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM routines WHERE id = $1 FOR SHARE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_none() {
            return Err(StoreError::RoutineNotFound(id));
        }
        let requested = sqlx::query(
            "INSERT INTO routine_requests (routine_id, scheduled_at)
             SELECT $1, t.scheduled_at
             FROM UNNEST($2::timestamptz[]) AS t(scheduled_at)
             WHERE NOT EXISTS (
                 SELECT 1 FROM routine_fires f
                 WHERE f.routine_id = $1 AND f.scheduled_at = t.scheduled_at)
             ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(instants)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(requested)
    }

    async fn trigger_routine(&self, id: Uuid) -> Result<DateTime<Utc>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT now() FROM routines WHERE id = $1 FOR SHARE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let now = now.ok_or(StoreError::RoutineNotFound(id))?;
        // Two triggers in the same microsecond name the same occurrence, and fire once.
        sqlx::query(
            "INSERT INTO routine_requests (routine_id, scheduled_at) VALUES ($1, $2)
             ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(now)
    }

    async fn delete_routine(&self, id: Uuid) -> Result<(), StoreError> {
        // Locks are taken in one order, the routine first: a tick's claim skips a routine
        // locked here (its due query and its requests both use SKIP LOCKED on the routine), so
        // once the routine is ours no claim can be holding one of its requests while waiting
        // for it. Leaving the requests and fires to the foreign keys' cascade would lock the
        // routine and then wait for a request a claim holds while that claim waits for the
        // routine: a deadlock.
        let mut tx = self.pool.begin().await?;
        let locked: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM routines WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        if locked.is_none() {
            return Err(StoreError::RoutineNotFound(id));
        }
        sqlx::query("DELETE FROM routine_requests WHERE routine_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM routine_fires WHERE routine_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM routines WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}
