//! The `routines` table: creating, reading, pausing, resuming and deleting routines (editing,
//! importing and paging through them are in [`crate::catalog`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::catalog;
pub use crate::model::{
    ImportedRoutine, NewRoutine, PendingRequests, Routine, RoutineCursor, RoutineKind,
    RoutineUpdate, SyncedRoutine,
};
use crate::{PgStore, StoreError};

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

    /// Makes the routines of `source` (a file's name) what `routines` are, in one transaction or
    /// not at all, as `crontab FILE` replaces a table: creates the new, updates the changed
    /// (their history kept), leaves the rest, and deletes the source's routines `routines` no
    /// longer has, with their fires. A line is the stored routine of its name; a line whose
    /// name no routine has is the routine with its kind and payload (its command: an edited
    /// schedule keeps its routine, renamed) that is the source's, or has no source and a name
    /// the source gave it (`SOURCE: …`, as a crontab imported without a source names its
    /// entries), where exactly one routine and one line share that identity. A routine without a source paired so joins the source
    /// ([`crate::SyncAction::Adopted`]); one of the name from another source is refused
    /// ([`StoreError::InvalidRoutine`]). Returns what it did, the file's routines in order,
    /// then the deleted.
    async fn sync_routines(
        &self,
        source: &str,
        routines: &[NewRoutine],
    ) -> Result<Vec<SyncedRoutine>, StoreError>;

    /// How many occurrences of a routine are asked for and not yet claimed, and the oldest
    /// `limit` of them.
    async fn pending_requests(&self, id: Uuid, limit: u32) -> Result<PendingRequests, StoreError>;

    /// Pauses a routine (it is never due while paused) or resumes it (its next run is computed
    /// from the database's clock, so a long pause does not produce misfires).
    async fn set_routine_paused(&self, id: Uuid, paused: bool) -> Result<Routine, StoreError>;

    /// Deletes a routine, its pending requests and its ledger rows. A dispatch of it already in
    /// flight finishes, and its settle finds the row gone ([`crate::SettleOutcome::Gone`]).
    async fn delete_routine(&self, id: Uuid) -> Result<(), StoreError>;

    /// Asks for occurrences of a routine (a backfill) to be fired by the next ticks, through the
    /// ledger, their fires marked `backfill`:
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
        let row = catalog::insert_routine(&mut tx, &routine, None, now).await?;
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
        catalog::import_routines(&self.pool, routines, upsert, catalog::Write::Commit).await
    }

    async fn sync_routines(
        &self,
        source: &str,
        routines: &[NewRoutine],
    ) -> Result<Vec<SyncedRoutine>, StoreError> {
        catalog::sync_routines(&self.pool, source, routines, catalog::Write::Commit).await
    }

    async fn pending_requests(&self, id: Uuid, limit: u32) -> Result<PendingRequests, StoreError> {
        catalog::pending_requests(&self.pool, id, limit).await
    }

    async fn set_routine_paused(&self, id: Uuid, paused: bool) -> Result<Routine, StoreError> {
        let mut tx = self.pool.begin().await?;
        let routine = catalog::lock_routine(&mut tx, id).await?;
        let group = routine.group_id;
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
             WHERE id = $1 AND group_id = $4 RETURNING *",
        )
        .bind(id)
        .bind(paused)
        .bind(next_run_at)
        .bind(group)
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
        let group = catalog::routine_group(&mut tx, id).await?;
        // Lock the routine so a concurrent delete cannot slip between the check and the insert.
        let exists: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM routines WHERE id = $1 AND group_id = $2 FOR SHARE")
                .bind(id)
                .bind(group)
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_none() {
            return Err(StoreError::RoutineNotFound(id));
        }
        let requested = sqlx::query(
            "INSERT INTO routine_requests (routine_id, scheduled_at, origin, group_id)
             SELECT $1, t.scheduled_at, 'backfill', $3
             FROM UNNEST($2::timestamptz[]) AS t(scheduled_at)
             WHERE NOT EXISTS (
                 SELECT 1 FROM routine_fires f
                 WHERE f.routine_id = $1 AND f.scheduled_at = t.scheduled_at
                   AND f.group_id = $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(instants)
        .bind(group)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(requested)
    }

    async fn trigger_routine(&self, id: Uuid) -> Result<DateTime<Utc>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let group = catalog::routine_group(&mut tx, id).await?;
        let now: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT now() FROM routines WHERE id = $1 AND group_id = $2 FOR SHARE",
        )
        .bind(id)
        .bind(group)
        .fetch_optional(&mut *tx)
        .await?;
        let now = now.ok_or(StoreError::RoutineNotFound(id))?;
        // Two triggers in the same microsecond name the same occurrence, and fire once.
        sqlx::query(
            "INSERT INTO routine_requests (routine_id, scheduled_at, origin, group_id)
             VALUES ($1, $2, 'trigger', $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(id)
        .bind(now)
        .bind(group)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(now)
    }

    async fn delete_routine(&self, id: Uuid) -> Result<(), StoreError> {
        // Locks are taken in one order, the routine first: a tick's claim skips a routine
        // locked here (its due query and its requests both use SKIP LOCKED on the routine), so
        // once the routine is ours no claim can be holding one of its requests while waiting
        // for it. Leaving the requests to their foreign key's cascade would lock the routine
        // and then wait for a request a claim holds while that claim waits for the routine: a
        // deadlock. The fires have no foreign key: this lock is what keeps a claim from writing
        // one after the delete, and the delete, which waited for any claim holding the
        // routine, deletes the ones written before.
        let mut tx = self.pool.begin().await?;
        let group = catalog::routine_group(&mut tx, id).await?;
        let locked: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM routines WHERE id = $1 AND group_id = $2 FOR UPDATE",
        )
        .bind(id)
        .bind(group)
        .fetch_optional(&mut *tx)
        .await?;
        if locked.is_none() {
            return Err(StoreError::RoutineNotFound(id));
        }
        catalog::delete_locked(&mut tx, id).await?;
        tx.commit().await?;
        Ok(())
    }
}
