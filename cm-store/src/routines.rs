//! The `routines` table: creating, reading, pausing, resuming and deleting routines (editing,
//! importing and paging through them are in [`crate::catalog`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use crate::model::{
    ImportedRoutine, NewRoutine, PendingRequests, Routine, RoutineCursor, RoutineUpdate,
    SyncedRoutine,
};
// The kind is the domain's; named here too, so callers that take it from the store still do.
use crate::model::{RoutineRow, routines_of};
use crate::{PgStore, StoreError};
use crate::{catalog, tx};
pub use cm_domain::RoutineKind;

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
    /// paused state is kept). With a `source` (the file's name), every routine written records
    /// it, so a later [`RoutineStore::sync_routines`] of that source deletes the ones the file
    /// no longer has. Returns what was written, in order.
    async fn import_routines<'a>(
        &self,
        routines: &[NewRoutine],
        upsert: bool,
        source: Option<&'a str>,
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
        on_store_conn!(self, |c| tx::create_routine(c, &routine))
    }

    async fn get_routine(&self, id: Uuid) -> Result<Routine, StoreError> {
        on_store!(self, |e| crate::schema::query_as::<_, RoutineRow>(
            "SELECT * FROM cm.routines WHERE id = $1"
        )
        .bind(id)
        .fetch_optional(e))?
        .ok_or(StoreError::RoutineNotFound(id))?
        .try_into()
    }

    async fn list_routines(&self) -> Result<Vec<Routine>, StoreError> {
        routines_of(on_store!(self, |e| {
            crate::schema::query_as::<_, RoutineRow>(
                "SELECT * FROM cm.routines ORDER BY created_at, id",
            )
            .fetch_all(e)
        })?)
    }

    async fn get_routine_by_name(&self, name: &str) -> Result<Routine, StoreError> {
        on_store_conn!(self, |c| catalog::get_routine_by_name(c, name))
    }

    async fn list_routines_page(
        &self,
        after: Option<RoutineCursor>,
        limit: u32,
    ) -> Result<Vec<Routine>, StoreError> {
        on_store_conn!(self, |c| catalog::list_routines_page(c, after, limit))
    }

    async fn update_routine(
        &self,
        id: Uuid,
        update: &RoutineUpdate,
    ) -> Result<Routine, StoreError> {
        on_store_conn!(self, |c| tx::update_routine(c, id, update))
    }

    async fn import_routines<'a>(
        &self,
        routines: &[NewRoutine],
        upsert: bool,
        source: Option<&'a str>,
    ) -> Result<Vec<ImportedRoutine>, StoreError> {
        on_store_conn!(self, |c| tx::import_routines(c, routines, upsert, source))
    }

    async fn sync_routines(
        &self,
        source: &str,
        routines: &[NewRoutine],
    ) -> Result<Vec<SyncedRoutine>, StoreError> {
        on_store_conn!(self, |c| tx::sync_routines(c, source, routines))
    }

    async fn pending_requests(&self, id: Uuid, limit: u32) -> Result<PendingRequests, StoreError> {
        on_store_conn!(self, |c| catalog::pending_requests(c, id, limit))
    }

    async fn set_routine_paused(&self, id: Uuid, paused: bool) -> Result<Routine, StoreError> {
        on_store_conn!(self, |c| tx::set_routine_paused(c, id, paused))
    }

    async fn request_occurrences(
        &self,
        id: Uuid,
        instants: &[DateTime<Utc>],
    ) -> Result<u64, StoreError> {
        on_store_conn!(self, |c| tx::request_occurrences(c, id, instants))
    }

    async fn trigger_routine(&self, id: Uuid) -> Result<DateTime<Utc>, StoreError> {
        on_store_conn!(self, |c| tx::trigger_routine(c, id))
    }

    async fn delete_routine(&self, id: Uuid) -> Result<(), StoreError> {
        on_store_conn!(self, |c| tx::delete_routine(c, id))
    }
}
