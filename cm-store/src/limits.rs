//! Concurrency limits: at most N runs at once of the routines sharing a key, across every
//! scheduler ([`cm_domain::limit`]).
//!
//! A key's places are counted from the ledger: a fire of one of its routines holds a place
//! while it is `claimed` (being dispatched, waiting for a retry, or left by a crashed scheduler
//! for the reaper) or its mission's run is `running`. The claim counts them under a
//! transaction-scoped advisory lock of the key (`lock_keys`, `rooms`), taken after its
//! due walk and before it writes a fire (a key another claim holds gets no place in this one),
//! so two schedulers never both take the last place; and
//! since the places are the ledger's own rows, a crashed scheduler's come back when the
//! occurrences it held settle, and none is counted twice.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::ConcurrencyKey;
use std::collections::HashMap;

use sqlx::{PgConnection, Postgres, Transaction};

use crate::{PgStore, StoreError};

/// A key's limit as stored, with what holds its places now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConcurrencyLimit {
    /// The key.
    pub key: String,
    /// At most this many of its routines' runs at once.
    pub max_running: u32,
    /// How many places its routines' fires hold now.
    pub running: u64,
    /// How many routines have the key.
    pub routines: u64,
    /// When the limit was last set.
    pub updated_at: DateTime<Utc>,
}

/// Setting, reading and deleting concurrency limits.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait LimitStore: Send + Sync {
    /// Sets `key`'s limit to `max_running` (0 to [`cm_domain::limit::MAX_LIMIT`]); whether the
    /// key had none before. It takes effect at the next claim.
    async fn set_concurrency_limit(
        &self,
        key: &ConcurrencyKey,
        max_running: u32,
    ) -> Result<bool, StoreError>;

    /// Every limit, by key, with the places held now.
    async fn list_concurrency_limits(&self) -> Result<Vec<ConcurrencyLimit>, StoreError>;

    /// Deletes `key`'s limit (its routines become unlimited); whether it had one.
    async fn delete_concurrency_limit(&self, key: &ConcurrencyKey) -> Result<bool, StoreError>;
}

#[async_trait]
impl LimitStore for PgStore {
    async fn set_concurrency_limit(
        &self,
        key: &ConcurrencyKey,
        max_running: u32,
    ) -> Result<bool, StoreError> {
        let max_running = cm_domain::limit::check_limit(u64::from(max_running))
            .map_err(|e| StoreError::InvalidRoutine(e.to_string()))?;
        let created: bool = on_store!(self, |e| crate::schema::query_scalar(
            "INSERT INTO cm.concurrency_limits AS l (key, max_running) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET max_running = excluded.max_running,
                                             updated_at = now()
             RETURNING (l.xmax = 0)"
        )
        .bind(key.as_str())
        .bind(i32::try_from(max_running).unwrap_or(i32::MAX))
        .fetch_one(e))?;
        self.full_keys.forget();
        Ok(created)
    }

    async fn list_concurrency_limits(&self) -> Result<Vec<ConcurrencyLimit>, StoreError> {
        let rows: Vec<(String, i32, DateTime<Utc>)> =
            on_store!(self, |e| crate::schema::query_as(
                "SELECT key, max_running, updated_at FROM cm.concurrency_limits ORDER BY key"
            )
            .fetch_all(e))?;
        let keys: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
        let counts: Vec<(String, i64, i64)> = on_store!(self, |e| {
            crate::schema::query_as(
            "SELECT r.concurrency_key, count(DISTINCT r.id),
                    count(f.routine_id) FILTER (WHERE f.status = 'claimed' OR f.run_state = 'running')
             FROM cm.routines r
             LEFT JOIN cm.routine_fires f
               ON f.routine_id = r.id AND f.group_id = r.group_id
              AND (f.status = 'claimed' OR f.run_state = 'running')
             WHERE r.concurrency_key = ANY($1)
             GROUP BY r.concurrency_key"
        )
        .bind(&keys)
        .fetch_all(e)
        })?;
        let counts: HashMap<String, (i64, i64)> = counts
            .into_iter()
            .map(|(key, routines, running)| (key, (routines, running)))
            .collect();
        Ok(rows
            .into_iter()
            .map(|(key, max_running, updated_at)| {
                let (routines, running) = counts.get(&key).copied().unwrap_or_default();
                ConcurrencyLimit {
                    key,
                    max_running: u32::try_from(max_running).unwrap_or(0),
                    running: u64::try_from(running).unwrap_or(0),
                    routines: u64::try_from(routines).unwrap_or(0),
                    updated_at,
                }
            })
            .collect())
    }

    async fn delete_concurrency_limit(&self, key: &ConcurrencyKey) -> Result<bool, StoreError> {
        let deleted = on_store!(self, |e| crate::schema::query(
            "DELETE FROM cm.concurrency_limits WHERE key = $1"
        )
        .bind(key.as_str())
        .execute(e))?;
        self.full_keys.forget();
        Ok(deleted.rows_affected() > 0)
    }
}

/// The limits of `keys` (every limit for `None`), by key.
async fn limits_of(
    conn: &mut PgConnection,
    keys: Option<&[String]>,
) -> Result<HashMap<String, u64>, StoreError> {
    let rows: Vec<(String, i32)> = crate::schema::query_as(
        "SELECT key, max_running FROM cm.concurrency_limits
         WHERE $1::text[] IS NULL OR key = ANY($1)",
    )
    .bind(keys)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(key, max)| (key, u64::try_from(max).unwrap_or(0)))
        .collect())
}

/// The places the fires of `keys`' routines hold, by key: each key's routines
/// (`routines_key_due_idx`), then each one's fires that are claimed or whose run is
/// running (`routine_fires_busy_idx`). One statement over the two distributed tables joined on
/// their group, so Citus runs it on every shard without the coordinator's tables.
async fn places_of(
    conn: &mut PgConnection,
    keys: &[String],
) -> Result<HashMap<String, u64>, StoreError> {
    let rows: Vec<(String, i64)> = crate::schema::query_as(
        "SELECT r.concurrency_key, count(*) FROM cm.routines r
         JOIN cm.routine_fires f ON f.routine_id = r.id AND f.group_id = r.group_id
         WHERE r.concurrency_key = ANY($1) AND (f.status = 'claimed' OR f.run_state = 'running')
         GROUP BY r.concurrency_key",
    )
    .bind(keys)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(key, n)| (key, u64::try_from(n).unwrap_or(0)))
        .collect())
}

/// How long the keys one claim read serve the claims after it: on Citus the count reads every
/// shard, too dear for each group's claim of a tick. A key that fills meanwhile is still walked
/// (and its occurrences held by the gate); one that frees is walked again at most this late;
/// a key first given to a routine takes its turns at most this late.
const FULL_KEYS_FOR: std::time::Duration = std::time::Duration::from_millis(500);

/// What a claim reads of the concurrency keys before its walk.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyState {
    /// The keys whose places are all held: the walk leaves their waiting routines be.
    pub(crate) full: Vec<String>,
    /// Every key some routine has: the walk takes turns between them. Empty, the walk is the
    /// instants' order alone.
    pub(crate) keys: Vec<String>,
}

/// The keys lately read, shared by a store's claims.
#[derive(Debug, Default)]
pub(crate) struct FullKeys {
    read: std::sync::Mutex<Option<(std::time::Instant, KeyState)>>,
    /// Whether the last read failed: a failure is logged once, until a read succeeds again.
    failing: std::sync::atomic::AtomicBool,
}

impl FullKeys {
    /// The keys read at most [`FULL_KEYS_FOR`] ago, or read now on `conn` (`citus`: the schema
    /// is distributed). Unread (on Citus, a worker down), none: no key is left out of the walk,
    /// the walk goes by instants alone, and the gate decides as always. The first failure of a
    /// run of them is logged, and the read that ends it.
    pub(crate) async fn get(&self, conn: &mut PgConnection, citus: bool) -> KeyState {
        use std::sync::atomic::Ordering;
        if let Some((at, keys)) = &*self.read.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < FULL_KEYS_FOR
        {
            return keys.clone();
        }
        let read = async {
            Ok::<_, StoreError>(KeyState {
                keys: keys_in_use(&mut *conn, citus).await?,
                full: full_keys(conn).await?,
            })
        };
        match read.await {
            Ok(keys) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("the concurrency keys are read again");
                }
                *self.read.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((std::time::Instant::now(), keys.clone()));
                keys
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "cannot read the concurrency keys; claims walk them all in the order of instants until they can"
                    );
                }
                // Kept as long as a read: the claims of the moment do not each wait on the
                // same failure (on Citus, a worker that is down).
                let none = KeyState::default();
                *self.read.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((std::time::Instant::now(), none.clone()));
                none
            }
        }
    }

    /// Forgets what was read: a limit this store changed counts from its next claim.
    fn forget(&self) {
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// The concurrency keys that take turns, in order. On PostgreSQL every key some routine has,
/// by a skip scan of `routines_key_due_idx`, one descent a key. On Citus the keys with a limit,
/// from `concurrency_limits` on the coordinator: reading the routines' keys would ask every
/// shard, and a claim of a group on a healthy worker must not wait on a worker that is down.
async fn keys_in_use(conn: &mut PgConnection, citus: bool) -> Result<Vec<String>, StoreError> {
    let statement = if citus {
        "SELECT key FROM cm.concurrency_limits ORDER BY key"
    } else {
        "WITH RECURSIVE k(key) AS (
             (SELECT concurrency_key FROM cm.routines WHERE concurrency_key IS NOT NULL
              ORDER BY concurrency_key LIMIT 1)
             UNION ALL
             SELECT (SELECT r.concurrency_key FROM cm.routines r
                     WHERE r.concurrency_key > k.key ORDER BY r.concurrency_key LIMIT 1)
             FROM k WHERE k.key IS NOT NULL
         )
         SELECT key FROM k WHERE key IS NOT NULL"
    };
    Ok(crate::schema::query_scalar(statement)
        .fetch_all(conn)
        .await?)
}

/// The keys whose places are all held now, whose routines a claim's due walk leaves be. Read
/// without the keys' locks: the walk only skips what could not be admitted anyway, and
/// [`rooms`] decides under the locks. No limit, no second statement.
async fn full_keys(conn: &mut PgConnection) -> Result<Vec<String>, StoreError> {
    let limits = limits_of(&mut *conn, None).await?;
    if limits.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<String> = limits.keys().cloned().collect();
    let places = places_of(conn, &keys).await?;
    Ok(limits
        .into_iter()
        .filter(|(key, max)| places.get(key).copied().unwrap_or(0) >= *max)
        .map(|(key, _)| key)
        .collect())
}

/// Locks `keys` for the rest of the transaction, in one order (so two claims never wait on
/// each other's), with transaction-scoped advisory locks of their own namespace. A claim holding
/// one is admitting into its places now; the wait is in line, so each claim of a busy key gets
/// its turn. A wait past the connection's `lock_timeout` (the scheduler's, a fraction of the
/// lease) is not the claim's failure: the locks are let go (a savepoint) and `false` returned,
/// and the claim's occurrences of these keys wait for a later claim, owed.
pub(crate) async fn lock_keys(
    tx: &mut Transaction<'_, Postgres>,
    keys: &[String],
) -> Result<bool, StoreError> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys.dedup();
    let mut savepoint = sqlx::Acquire::begin(&mut **tx).await?;
    let locked = crate::schema::query(
        "SELECT pg_advisory_xact_lock(hashtextextended('cm.limit:' || k, 0))
         FROM (SELECT k FROM unnest($1::text[]) AS k ORDER BY k) s",
    )
    .bind(&keys)
    .execute(&mut *savepoint)
    .await;
    match locked {
        Ok(_) => {
            savepoint.commit().await?;
            Ok(true)
        }
        Err(e)
            if e.as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|code| code == "55P03") =>
        {
            savepoint.rollback().await?;
            tracing::debug!(keys = ?keys, "concurrency keys busy past the lock timeout; their occurrences wait");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Those of `keys` that have a limit.
pub(crate) async fn limited(
    tx: &mut Transaction<'_, Postgres>,
    keys: &[String],
) -> Result<Vec<String>, StoreError> {
    Ok(limits_of(tx, Some(keys)).await?.into_keys().collect())
}

/// Each of `keys` that has a limit: the places left (its limit less the places held), read
/// after [`lock_keys`] locked them, in statements of their own, so they see every claim that
/// held a lock before this one. Places that cannot be counted are none left.
pub(crate) async fn rooms(
    tx: &mut Transaction<'_, Postgres>,
    keys: &[String],
) -> Result<HashMap<String, usize>, StoreError> {
    let limits = limits_of(tx, Some(keys)).await?;
    if limits.is_empty() {
        return Ok(HashMap::new());
    }
    let limited: Vec<String> = limits.keys().cloned().collect();
    // In a savepoint: on Citus the count reads every shard, and a worker that does not answer
    // fails it. The claim then goes on with no place for these keys (their occurrences wait,
    // owed) rather than failing for every routine of its group.
    let mut savepoint = sqlx::Acquire::begin(&mut **tx).await?;
    let places = match places_of(&mut savepoint, &limited).await {
        Ok(places) => {
            savepoint.commit().await?;
            places
        }
        Err(e) => {
            savepoint.rollback().await?;
            tracing::warn!(error = %e, keys = ?limited,
                "cannot count the places of these concurrency keys; their occurrences wait");
            limits.keys().map(|k| (k.clone(), u64::MAX)).collect()
        }
    };
    Ok(limits
        .into_iter()
        .map(|(key, max)| {
            let held = places.get(&key).copied().unwrap_or(0);
            let room = usize::try_from(max.saturating_sub(held)).unwrap_or(usize::MAX);
            (key, room)
        })
        .collect())
}
