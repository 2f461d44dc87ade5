//! The store's error type.

use uuid::Uuid;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database refused or failed a statement, or could not be reached. The sqlx error is
    /// kept whole; [`StoreError::database_kind`] tells a constraint violation by its meaning.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// No routine has this id.
    #[error("no routine has id {0}")]
    RoutineNotFound(Uuid),
    /// A stored row holds a value the domain refuses (written by hand, or by an older version).
    #[error("stored routine {routine_id} is unusable: {reason}")]
    CorruptRoutine {
        /// The routine whose row is unusable.
        routine_id: Uuid,
        /// What is wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// The kind of database error (unique violation, foreign key violation, …), if this is one.
    pub fn database_kind(&self) -> Option<sqlx::error::ErrorKind> {
        match self {
            StoreError::Database(e) => e.as_database_error().map(|d| d.kind()),
            _ => None,
        }
    }

    /// Whether the error is the database being unreachable or the pool exhausted, rather than a
    /// statement being refused: worth retrying on the next tick.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Database(
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
            )
        )
    }
}
