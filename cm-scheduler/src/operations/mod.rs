//! One operation per use case, each one write to the store (in one transaction) returning a typed
//! result: the command line prints it, the status page renders it. Both call these, so a routine
//! is found, checked and changed the same way wherever an operator acts.
//!
//! - [`find`]: a routine by its id or its name.
//! - [`create`], [`update`], [`import`] (and its sync and dry run): writing routines, every
//!   field checked before the store is touched.
//! - [`pause`], [`resume`], [`trigger`], [`backfill`], [`delete`]: acting on one routine.

use chrono::{DateTime, Utc};
use cm_store::{Routine, RoutineStore, StatusReader, StoreError};
use uuid::Uuid;

mod backfill;
mod create;
pub mod import;
mod update;

pub use backfill::{Backfilled, backfill, check_retention};
use create::new_routine;
pub use create::{create, mission_payload, prepare};
pub use update::{Change, Updated, update};

/// Why an operation did nothing.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    /// The input is refused, with the reason in words; nothing was written.
    #[error("{0}")]
    Refused(String),
    /// The store refused the change (a routine gone, a name taken) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A refusal, in words.
pub(crate) fn refused(message: impl Into<String>) -> OperationError {
    OperationError::Refused(message.into())
}

/// The routine `handle` names: by id when it is a UUID, else by name (names are never UUIDs).
/// One that does not exist is [`StoreError::RoutineNotFound`] or
/// [`StoreError::RoutineNameNotFound`].
pub async fn find(reader: &dyn StatusReader, handle: &str) -> Result<Routine, OperationError> {
    Ok(reader.routine(handle).await?)
}

/// Pauses `routine`: it is never due until resumed.
pub async fn pause(
    routines: &dyn RoutineStore,
    routine: &Routine,
) -> Result<Routine, OperationError> {
    Ok(routines.set_routine_paused(routine.id, true).await?)
}

/// Resumes `routine`; its next run is computed from now.
pub async fn resume(
    routines: &dyn RoutineStore,
    routine: &Routine,
) -> Result<Routine, OperationError> {
    Ok(routines.set_routine_paused(routine.id, false).await?)
}

/// Asks for one occurrence of `routine` now, through the ledger (the next tick claims it,
/// paused or not); returns the occurrence's instant.
pub async fn trigger(
    routines: &dyn RoutineStore,
    routine: &Routine,
) -> Result<DateTime<Utc>, OperationError> {
    Ok(routines.trigger_routine(routine.id).await?)
}

/// Deletes `routine` and its fires; returns its id.
pub async fn delete(
    routines: &dyn RoutineStore,
    routine: &Routine,
) -> Result<Uuid, OperationError> {
    routines.delete_routine(routine.id).await?;
    Ok(routine.id)
}
