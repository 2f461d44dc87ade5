//! Routine writes over the caller's own connection, so a sibling service writes a routine in the
//! same transaction as its own rows: a user and that user's digest commit together or not at
//! all.
//!
//! Each function takes `&mut PgConnection`: give it `&mut *tx` of a [`sqlx::Transaction`] the
//! caller began (with `pool.begin()` or `conn.begin()`), or a plain connection. Each runs its
//! statements in a transaction of its own nested in the caller's: sqlx opens a `SAVEPOINT`
//! inside the caller's transaction (a plain `BEGIN` on a connection with none) and releases it
//! when the write is done, so
//!
//! - the write is the caller's until the caller commits: a rollback (or a connection that dies
//!   before the commit) leaves no routine, no name taken and nothing owed, and no scheduler
//!   sees the routine before the commit (a claim reads committed rows only);
//! - a refused write ([`StoreError::NameTaken`], [`StoreError::RoutineNotFound`],
//!   [`StoreError::InvalidRoutine`]) is rolled back to its savepoint and leaves the caller's
//!   transaction usable: the caller decides whether to go on or roll back;
//! - the locks are the command line's, taken in the same order (the routine's row first, then
//!   its requests and fires; names through `routine_names`), and held until the caller's
//!   transaction ends. Keep that transaction short: a routine locked by an open transaction is
//!   skipped by every claim until it ends (`FOR UPDATE SKIP LOCKED`), so it fires late, never
//!   twice.
//!
//! One rule for the caller: begin the transaction through sqlx (`begin()`), not with a `BEGIN`
//! statement of its own. sqlx tracks the depth of its transactions; behind a raw `BEGIN` it
//! would take the connection for one without a transaction and commit the caller's work with
//! its own.
//!
//! Everything is validated before it is written, by the checks every other path makes
//! (`cm_domain::definition`): a [`NewRoutine`] is checked whole when it is built (its name,
//! its payload for its kind, its overlap policy, its run limit; its schedule already parsed);
//! an update's name, payload and run limit are checked the same way, and its expression is
//! read again in the routine's zone under its lock. The [`RoutineStore`](crate::RoutineStore) methods of
//! [`PgStore`](crate::PgStore) are these functions on a connection of the store's pool.
//!
//! On Citus a routine's rows live on its group's shard (`group_id`), and every statement here
//! names the group. A transaction that writes routines of several groups is a distributed
//! transaction (Citus commits it with two-phase commit, so it still commits or rolls back as
//! one); one that writes a single routine stays on one worker.
//!
//! ```no_run
//! use cm_domain::{MisfirePolicy, Schedule};
//! use cm_store::NewRoutine;
//! use cm_store::sqlx::PgPool;
//!
//! async fn sign_up(pool: &PgPool, email: &str) -> Result<cm_store::uuid::Uuid, Box<dyn std::error::Error>> {
//!     let mut tx = pool.begin().await?;
//!     let user: cm_store::uuid::Uuid =
//!         cm_store::sqlx::query_scalar("INSERT INTO users (email) VALUES ($1) RETURNING id")
//!             .bind(email)
//!             .fetch_one(&mut *tx)
//!             .await?;
//!     let digest = NewRoutine::message(
//!         format!("digest for {user}"),
//!         Schedule::parse("0 9 * * *", "Europe/Berlin")?,
//!         &format!("good morning, {email}"),
//!     )
//!     .misfire(MisfirePolicy::FireOnce)
//!     .build()?;
//!     cm_store::tx::create_routine(&mut tx, &digest).await?;
//!     // Both rows, or neither.
//!     tx.commit().await?;
//!     Ok(user)
//! }
//! ```

use chrono::{DateTime, Utc};
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use crate::StoreError;
use crate::catalog::{self, ImportedRoutine, RoutineUpdate, SyncedRoutine, Write};
use crate::model::{NewRoutine, Routine, RoutineRow};

/// Stores a new routine; unless paused, its first run is the schedule's first occurrence after
/// the database's clock (the transaction's start: `now()`). A name another routine has, or
/// one an uncommitted transaction is writing (this waits for it to end), is
/// [`StoreError::NameTaken`].
pub async fn create_routine(
    conn: &mut PgConnection,
    routine: &NewRoutine,
) -> Result<Routine, StoreError> {
    let mut tx = conn.begin().await?;
    let now = catalog::db_now(&mut tx).await?;
    let row = catalog::insert_routine(&mut tx, routine, None, now).await?;
    tx.commit().await?;
    Ok(row)
}

/// Changes a routine with its row locked (see [`RoutineUpdate`]); a name another routine has
/// is [`StoreError::NameTaken`].
pub async fn update_routine(
    conn: &mut PgConnection,
    id: Uuid,
    update: &RoutineUpdate,
) -> Result<Routine, StoreError> {
    catalog::update_routine(conn, id, update).await
}

/// Pauses a routine (it is never due while paused) or resumes it (its next run is computed
/// from the database's clock, so a long pause does not produce misfires; a pause reason is
/// cleared).
pub async fn set_routine_paused(
    conn: &mut PgConnection,
    id: Uuid,
    paused: bool,
) -> Result<Routine, StoreError> {
    let mut tx = conn.begin().await?;
    let routine = catalog::lock_routine(&mut tx, id).await?;
    let group = routine.group_id;
    if routine.paused == paused {
        return Ok(routine);
    }
    let next_run_at = if paused || routine.runs_left == Some(0) {
        None
    } else {
        let now = catalog::db_now(&mut tx).await?;
        // Its calendar is read after its row is locked: an edit of the calendar waits for this
        // lock, or committed before and is read (`calendars.rs`).
        crate::calendars::schedule_in(
            &mut tx,
            routine.parsed_schedule()?,
            routine.calendar.as_deref(),
            routine.on_holiday,
            false,
        )
        .await?
        .next_planned_after(id, now)
        .map(|(_, planned)| planned)
    };
    let row: Routine = crate::schema::query_as::<_, RoutineRow>(
        "UPDATE cm.routines
         SET paused = $2, next_run_at = $3, paused_reason = NULL, updated_at = now()
         WHERE id = $1 AND group_id = $4 RETURNING *",
    )
    .bind(id)
    .bind(paused)
    .bind(next_run_at)
    .bind(group)
    .fetch_one(&mut *tx)
    .await?
    .try_into()?;
    let event = crate::events::NewEvent {
        group_id: group,
        routine_id: id,
        routine_name: row.name.clone(),
        event_type: if paused {
            cm_domain::EventType::Paused
        } else {
            cm_domain::EventType::Resumed
        },
        scheduled_at: None,
        data: if paused {
            serde_json::json!({"by": "person", "reason": "paused by a person"})
        } else {
            serde_json::json!({"by": "person"})
        },
    };
    crate::events::record(&mut tx, std::slice::from_ref(&event)).await?;
    tx.commit().await?;
    Ok(row)
}

/// Asks for occurrences of a routine (a backfill) to be fired by the next ticks after the
/// caller commits, through the ledger, their fires marked `backfill`: an occurrence already in
/// the ledger is not asked for again, and one already asked for is asked for once. Returns how
/// many were newly asked for.
pub async fn request_occurrences(
    conn: &mut PgConnection,
    id: Uuid,
    instants: &[DateTime<Utc>],
) -> Result<u64, StoreError> {
    let mut tx = conn.begin().await?;
    let group = catalog::routine_group(&mut tx, id).await?;
    // Lock the routine so a concurrent delete cannot slip between the check and the insert.
    let exists: Option<Uuid> = crate::schema::query_scalar(
        "SELECT id FROM cm.routines WHERE id = $1 AND group_id = $2 FOR SHARE",
    )
    .bind(id)
    .bind(group)
    .fetch_optional(&mut *tx)
    .await?;
    if exists.is_none() {
        return Err(StoreError::RoutineNotFound(id));
    }
    let requested = crate::schema::query(
        "INSERT INTO cm.routine_requests (routine_id, scheduled_at, origin, group_id)
         SELECT $1, t.scheduled_at, 'backfill', $3
         FROM UNNEST($2::timestamptz[]) AS t(scheduled_at)
         WHERE NOT EXISTS (
             SELECT 1 FROM cm.routine_fires f
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

/// Asks for an occurrence of a routine at the database's current instant (a manual trigger:
/// the transaction's start), fired by the next tick after the caller commits, paused or not.
/// Returns its instant.
pub async fn trigger_routine(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<DateTime<Utc>, StoreError> {
    let mut tx = conn.begin().await?;
    let group = catalog::routine_group(&mut tx, id).await?;
    let now: Option<DateTime<Utc>> = crate::schema::query_scalar(
        "SELECT now() FROM cm.routines WHERE id = $1 AND group_id = $2 FOR SHARE",
    )
    .bind(id)
    .bind(group)
    .fetch_optional(&mut *tx)
    .await?;
    let now = now.ok_or(StoreError::RoutineNotFound(id))?;
    // Two triggers in the same microsecond name the same occurrence, and fire once.
    crate::schema::query(
        "INSERT INTO cm.routine_requests (routine_id, scheduled_at, origin, group_id)
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

/// Deletes a routine, its pending requests and its ledger rows. A dispatch of it already in
/// flight finishes, and its settle finds the row gone ([`crate::SettleOutcome::Gone`]).
pub async fn delete_routine(conn: &mut PgConnection, id: Uuid) -> Result<(), StoreError> {
    // Locks are taken in one order, the routine first: a tick's claim skips a routine locked
    // here (its due query and its requests both use SKIP LOCKED on the routine), so once the
    // routine is ours no claim can be holding one of its requests while waiting for it.
    // Leaving the requests to their foreign key's cascade would lock the routine and then wait
    // for a request a claim holds while that claim waits for the routine: a deadlock. The fires
    // have no foreign key: this lock is what keeps a claim from writing one after the delete,
    // and the delete, which waited for any claim holding the routine, deletes the ones written
    // before.
    let mut tx = conn.begin().await?;
    let group = catalog::routine_group(&mut tx, id).await?;
    let locked: Option<Uuid> = crate::schema::query_scalar(
        "SELECT id FROM cm.routines WHERE id = $1 AND group_id = $2 FOR UPDATE",
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

/// Stores every routine of `routines`, or none: a name that exists is refused with
/// [`StoreError::NameTaken`], unless `upsert`, where that routine takes the new settings (its
/// paused state kept). With a `source`, every routine written records it, as
/// [`RoutineStore::import_routines`](crate::RoutineStore::import_routines) describes. Returns
/// what was written, in order.
pub async fn import_routines(
    conn: &mut PgConnection,
    routines: &[NewRoutine],
    upsert: bool,
    source: Option<&str>,
) -> Result<Vec<ImportedRoutine>, StoreError> {
    catalog::import_routines(conn, routines, upsert, source, Write::Commit).await
}

/// Makes the routines of `source` what `routines` are, or changes nothing, as
/// [`RoutineStore::sync_routines`](crate::RoutineStore::sync_routines) describes.
pub async fn sync_routines(
    conn: &mut PgConnection,
    source: &str,
    routines: &[NewRoutine],
) -> Result<Vec<SyncedRoutine>, StoreError> {
    catalog::sync_routines(conn, source, routines, Write::Commit).await
}
