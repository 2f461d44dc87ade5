//! Every SQL statement cm sends to PostgreSQL, and the migrations that make its schema.
//!
//! One file tree holds the whole conversation with the database, so a reviewer can read every
//! statement the system runs in one place. The crate is split by what each part does:
//!
//! - [`routines`]: creating, reading, pausing and deleting routines ([`RoutineStore`]).
//! - [`catalog`]: finding routines by name, paging through them, editing and importing them.
//! - [`ledger`]: the occurrence ledger, `routine_fires`: the tick's claim, settling, the reaper
//!   and listing fires ([`FireLedger`]).
//! - [`outbox`]: the message outbox ([`OutboxStore`]).
//! - [`status`]: the bounded read-only queries of the status page ([`StatusReader`]).
//! - `outcome`: a fire's outcome (a mission's is its run's) in SQL: what every count of
//!   failures reads.
//! - [`autopause`]: pausing routines whose last fires all failed ([`FailingRoutines`]).
//! - [`runs`]: mission runs watched after their launch ([`MissionRuns`]).
//! - [`groups`]: routine groups, the hash buckets every per-routine row carries, and the
//!   schedulers' leases on them.
//! - [`consumer`]: the outbox's consumer contract: leased batches in `seq` order,
//!   acknowledgement, the backlog, pruning ([`OutboxConsumer`]).
//! - [`pooler`]: running behind PgBouncer: what cm needs from a pooler, checked at start.
//! - [`explain`]: how PostgreSQL plans and runs the hot statements, for the tests and
//!   benchmarks that check each reads about what it returns.
//! - [`tx`]: every routine write as a function over the caller's connection, so another service
//!   creates its routines inside its own transaction.
//! - `planning`: the routines the SQL functions of the `cm` schema wrote, planned or paused
//!   ([`UnplannedRoutines`]).
//! - [`schema`]: the schema cm's objects live in (`cm` unless set), and the migrations applied
//!   into it; `relocate` moves a database migrated into `public` before.
//! - [`failover`]: multi-host URLs and `target_session_attrs`, read as libpq reads them.
//! - `model`: the routine types every part above shares ([`Routine`], [`NewRoutine`]).
//! - `options`: pool size and the statement, lock and idle timeouts ([`StoreOptions`]).
//!
//! [`PgStore`] implements every trait above on a connection pool. Callers depend on the traits,
//! so a test about the caller (the scheduler's loop) can use the `mockall` doubles behind the
//! `mock` feature instead of a database.
//!
//! Decisions are not made here: which occurrences are owed, what a claim's row means and how the
//! cap applies all come from `cm-domain`. This crate turns them into statements, runs them
//! atomically, and reads the database's clock (`now()`) so every node computes from one clock.
//!
//! # Depending on it
//!
//! The API names types of [`sqlx`] 0.9 (`&mut PgConnection`, `PgPool`, `sqlx::Error`),
//! [`chrono`] and [`uuid`]; the crate re-exports the three, so a service uses the very
//! versions it was built with (`cm_store::sqlx::PgPool`) instead of declaring its own: a
//! second sqlx (0.8, say) would resolve, and fail only when the two met in a call.
//! It turns on no runtime feature of Tokio: an importer chooses its own runtime flavour.
//!
//! # Example
//!
//! Another service creating a routine with this crate alone (see `examples/create_routine.rs`):
//!
//! ```no_run
//! # async fn run() -> Result<(), cm_store::StoreError> {
//! use cm_domain::{MisfirePolicy, Schedule};
//! use cm_store::{NewRoutine, PgStore, RoutineStore};
//!
//! let store = PgStore::connect("postgres://localhost/cm").await?;
//! store.migrate().await?;
//! let standup = NewRoutine::message(
//!     "standup",
//!     Schedule::parse("0 9 * * MON-FRI", "Europe/Berlin").unwrap(),
//!     "standup in 5",
//! )
//! .misfire(MisfirePolicy::FireOnce)
//! .build()?;
//! let routine = store.create_routine(standup).await?;
//! println!("{} first runs at {:?}", routine.id, routine.next_run_at);
//! # Ok(()) }
//! ```

/// The crate's README, whose example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Runs one statement (or a helper that runs several) as its own transaction: on the pool
/// directly, or, when the store's settings go with each transaction (a pooler), in a
/// transaction the store began, committed when the statement succeeded. `$e` is the executor:
/// `&PgPool` or `&mut PgConnection`.
macro_rules! on_store {
    ($store:expr, |$e:ident| $body:expr) => {{
        match $store.begin_statement() {
            None => {
                let $e = $store.pool();
                $body.await
            }
            Some(_) => {
                let mut tx = $store.begin().await?;
                let out = {
                    let $e = &mut *tx;
                    $body.await
                };
                if out.is_ok() {
                    tx.commit().await?;
                }
                out
            }
        }
    }};
}

/// Like [`on_store!`] for helpers that take a `&mut PgConnection` (and begin a transaction, or
/// a savepoint inside the store's, of their own).
macro_rules! on_store_conn {
    ($store:expr, |$c:ident| $body:expr) => {{
        match $store.begin_statement() {
            None => {
                let mut conn = $store.pool().acquire().await?;
                let $c: &mut sqlx::PgConnection = &mut conn;
                $body.await
            }
            Some(_) => {
                let mut tx = $store.begin().await?;
                let out = {
                    let $c: &mut sqlx::PgConnection = &mut tx;
                    $body.await
                };
                if out.is_ok() {
                    tx.commit().await?;
                }
                out
            }
        }
    }};
}

#[macro_use]
mod outcome;

/// The chrono whose `DateTime<Utc>` the API names.
pub use chrono;
/// The sqlx (0.9, PostgreSQL, Tokio) whose types the API names: use it rather than a sqlx of
/// your own, so the connection you pass is the one the store takes.
pub use sqlx;
/// The uuid whose `Uuid` (a routine's id) the API names.
pub use uuid;

pub mod autopause;
mod bulk;
pub mod calendars;
pub mod catalog;
pub mod consumer;
mod cursor;
mod error;
pub mod events;
pub mod explain;
pub mod failover;
pub mod groups;
pub mod ledger;
pub mod limits;
mod model;
mod options;
pub mod outbox;
mod planning;
pub mod pooler;
mod relocate;
pub mod routines;
pub mod runs;
mod schedules;
pub mod schema;
pub mod status;
pub mod tx;

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[cfg(feature = "mock")]
pub use autopause::MockFailingRoutines;
pub use autopause::{AutoPaused, FailingRoutines};
pub use bulk::{CHUNK as CREATE_CHUNK, Streamed};
#[cfg(feature = "mock")]
pub use calendars::MockCalendarStore;
pub use calendars::{CalendarEdit, CalendarStore, StoredCalendar};
pub use catalog::{
    ImportedRoutine, PendingRequest, PendingRequests, RoutineAction, RoutineCursor, RoutineUpdate,
    SyncAction, SyncedRoutine,
};
#[cfg(feature = "mock")]
pub use consumer::MockOutboxConsumer;
pub use consumer::{
    OutboxAck, OutboxBacklog, OutboxConsumer, OutboxDelivery, OutboxPending, OutboxTake,
};
pub use cursor::{FireCursor, ParseFireCursorError};
pub use error::StoreError;
#[cfg(feature = "mock")]
pub use events::MockEventLog;
pub use events::{EventFilter, EventLog, NewEvent, RoutineEvent, Skips};
pub use failover::{DatabaseUrl, TargetSessionAttrs};
pub use groups::{GroupDirectory, GroupId, LiveLease, group_of};
#[cfg(feature = "mock")]
pub use ledger::MockFireLedger;
pub use ledger::{
    ClaimDueParams, ClaimedFire, DueCursor, EarlierTry, Fire, FireFilter, FireLedger, FireRef,
    FireSettle, InClaimEffect, InClaimWrites, MAX_RECEIPT_BYTES, ReapParams, SettleOutcome,
    TickClaim, UnusableRoutine, request_share,
};
#[cfg(feature = "mock")]
pub use limits::MockLimitStore;
pub use limits::{ConcurrencyLimit, LimitStore};
pub use model::NewRoutineBuilder;
pub use options::{PLAN_CACHE_MODE, StoreOptions};
#[cfg(feature = "mock")]
pub use outbox::MockOutboxStore;
pub use outbox::{OutboxMessage, OutboxRow, OutboxStore};
pub use planning::{PLAN_BATCH, PlannedRoutine, UnplannedRoutines};
#[cfg(feature = "mock")]
pub use routines::MockRoutineStore;
pub use routines::{NewRoutine, Routine, RoutineKind, RoutineStore};
#[cfg(feature = "mock")]
pub use runs::MockMissionRuns;
pub use runs::{
    EndedRun, MAX_RUN_OUTPUT, MissionRuns, RunRecord, RunTake, RunUpdate, UnfinishedRun,
};
pub use schema::Schema;
pub use status::{
    FailedFire, FireDetail, FireRate, MinuteCount, OpenClaims, RecentFire, RoutineOrder,
    RoutineQuery, RoutineSummary, StatusReader,
};

/// The migrations of the process's schema ([`Schema::current`], `cm` unless set), built on first
/// use from those `cm-migrations` embeds (see [`schema::migrator`]): applied into the schema with a
/// pinned search path, recorded in `<schema>.migrations`. [`PgStore::migrate`] runs them, after
/// moving a database migrated before cm had a schema of its own.
pub static MIGRATOR: std::sync::LazyLock<Migrator> =
    std::sync::LazyLock::new(|| schema::migrator(Schema::current()));

/// [`MIGRATOR`] without its session-level lock, for [`PgStore::migrate`] through a pooler,
/// which takes the lock itself.
static UNLOCKED_MIGRATOR: std::sync::LazyLock<Migrator> = std::sync::LazyLock::new(|| {
    let mut migrator = schema::migrator(Schema::current());
    migrator.set_locking(false);
    migrator
});

/// The advisory lock key sqlx's migrator takes for `database` (its `generate_lock_id`), so a
/// migrator through a pooler and one on a direct connection exclude each other.
fn migration_lock_id(database: &str) -> i64 {
    0x3d32ad9e * i64::from(crc32(database.as_bytes()))
}

/// CRC-32 (ISO-HDLC, the zlib one), bit by bit: it runs once per migration, on a name.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The PostgreSQL implementation of every store trait.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The schema's group count, read once (it never changes after the migration).
    group_count: std::sync::Arc<std::sync::OnceLock<u16>>,
    /// Whether the schema is distributed on Citus, read once.
    citus: std::sync::Arc<std::sync::OnceLock<bool>>,
    /// On a multi-host URL (or one with `target_session_attrs`): what follows the primary.
    follow: Option<std::sync::Arc<failover::FollowGuard>>,
    /// How each transaction begins when the connections go through a pooler
    /// ([`StoreOptions::begin_statement`]); `None` on direct connections, whose settings were
    /// set at connect.
    begin: Option<std::sync::Arc<str>>,
    /// The schedules the claim and the planning pass parsed, by their text (`schedules.rs`).
    schedules: std::sync::Arc<schedules::ScheduleCache>,
    /// The concurrency keys found full lately, shared by the claims of a moment
    /// (`limits::FullKeys`).
    full_keys: std::sync::Arc<limits::FullKeys>,
    /// Pause a routine in the transaction that records its Nth failed outcome in a row
    /// ([`PgStore::pausing_after_failures`]); `None`: never.
    pause_after: Option<std::num::NonZeroU32>,
}

impl PgStore {
    /// A store on an existing pool. Its connections should carry
    /// [`PLAN_CACHE_MODE`] (as [`StoreOptions::apply`] sets it): with PostgreSQL's
    /// generic plans, a large claim costs many times what it should.
    pub fn new(pool: PgPool) -> Self {
        PgStore {
            pool,
            group_count: std::sync::Arc::default(),
            citus: std::sync::Arc::default(),
            follow: None,
            begin: None,
            schedules: std::sync::Arc::default(),
            full_keys: std::sync::Arc::default(),
            pause_after: None,
        }
    }

    /// This store, pausing a routine in the same transaction that records its `failures`th
    /// failed outcome in a row (a failed dispatch's settle, the end of a mission's run that
    /// failed or was lost), so no later occurrence of it is claimed once that transaction
    /// commits; 0 never pauses. The reason is kept on the routine as
    /// [`FailingRoutines::pause_failing_routines`] keeps it, which stays the safety net for a
    /// failure whose pause could not be taken at once (its routine's row held by another
    /// transaction for more than a second).
    pub fn pausing_after_failures(mut self, failures: u32) -> Self {
        self.pause_after = std::num::NonZeroU32::new(failures);
        self
    }

    /// A pool on `url`'s hosts that follows the primary (see [`failover`]): every new
    /// connection is checked for the URL's `target_session_attrs`, and idle ones opened before
    /// the pool last changed hosts are closed. `start` is the host to begin with.
    fn followed(url: DatabaseUrl, options: &StoreOptions, start: usize) -> (PgPool, PgStore) {
        let hosts: Vec<PgConnectOptions> =
            url.hosts.into_iter().map(|h| options.apply(h)).collect();
        let follower = std::sync::Arc::new(failover::Follower::new(hosts, url.target, start));
        let on_connect = std::sync::Arc::clone(&follower);
        let on_acquire = std::sync::Arc::clone(&follower);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _meta| {
                let follower = std::sync::Arc::clone(&on_connect);
                Box::pin(async move {
                    follower.start();
                    match failover::qualifies(conn, follower.target()).await? {
                        Ok(()) => Ok(()),
                        Err(why) => {
                            follower.wake();
                            Err(sqlx::Error::Configuration(
                                format!("the database host {why}").into(),
                            ))
                        }
                    }
                })
            })
            .before_acquire(move |_conn, meta| {
                let stale = on_acquire.is_stale(meta.age);
                Box::pin(async move { Ok(!stale) })
            })
            .connect_lazy_with(follower.current_options());
        follower.attach(pool.clone());
        let store = PgStore {
            follow: Some(std::sync::Arc::new(failover::FollowGuard(follower))),
            ..PgStore::new(pool.clone())
        }
        .with_settings(options);
        (pool, store)
    }

    /// Why no host of a multi-host URL is usable now (each host and why it was refused), while
    /// none is; `None` when the host in use qualifies, or the URL names one host and asks
    /// nothing of it.
    pub fn failover_problem(&self) -> Option<String> {
        self.follow.as_ref().and_then(|f| f.0.problem())
    }

    /// `self` with `options`' per-transaction settings (when [`StoreOptions::pooled`]).
    fn with_settings(mut self, options: &StoreOptions) -> Self {
        self.begin = options.begin_statement().map(Into::into);
        self
    }

    /// The statement each of the store's transactions begins with when its connections go
    /// through a pooler; `None` when they are direct.
    pub fn begin_statement(&self) -> Option<&str> {
        self.begin.as_deref()
    }

    /// Begins a transaction on a connection of the pool, with the store's settings: on a
    /// direct connection those it was opened with, through a pooler
    /// ([`StoreOptions::pooled`]) those of [`StoreOptions::begin_statement`], set for this
    /// transaction alone. Callers that run the [`tx`] functions through a pooler begin their
    /// transaction here.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        Ok(match &self.begin {
            None => self.pool.begin().await?,
            Some(statement) => {
                self.pool
                    .begin_with(sqlx::AssertSqlSafe(statement.clone()))
                    .await?
            }
        })
    }

    /// [`PgStore::begin`] on a connection the caller acquired.
    pub(crate) async fn begin_on<'c>(
        &self,
        conn: &'c mut sqlx::PgConnection,
    ) -> Result<sqlx::Transaction<'c, sqlx::Postgres>, StoreError> {
        use sqlx::Connection as _;
        Ok(match &self.begin {
            None => conn.begin().await?,
            Some(statement) => {
                conn.begin_with(sqlx::AssertSqlSafe(statement.clone()))
                    .await?
            }
        })
    }

    /// Connects a pool of up to ten connections to `url`. A statement waits at most five
    /// seconds for a connection, so a tick against an unreachable database fails quickly and
    /// visibly instead of hanging.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, &StoreOptions::default()).await
    }

    /// Connects a pool to `url` with `options`: its size, and the statement, lock and
    /// idle-in-transaction timeouts of every connection (see [`StoreOptions::for_lease`]).
    ///
    /// `url` may name several hosts and a `target_session_attrs` as libpq reads them
    /// (`postgres://h1:5432,h2:5433/cm?target_session_attrs=read-write`): the store connects to
    /// the first host that qualifies, fails naming each host and why it was refused when none
    /// does, and follows the primary when it moves (see [`failover`]).
    pub async fn connect_with(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let url = DatabaseUrl::parse(url)?;
        if url.is_plain() {
            let connect = url.hosts.into_iter().next().expect("one host");
            return Self::connect_with_options(connect, options).await;
        }
        let applied: Vec<PgConnectOptions> =
            url.hosts.iter().map(|h| options.apply(h.clone())).collect();
        let (start, conn) = failover::resolve(&applied, url.target)
            .await
            .map_err(StoreError::NoUsableHost)?;
        {
            use sqlx::Connection;
            let _ = conn.close().await;
        }
        let (pool, store) = Self::followed(url, options, start);
        pool.acquire().await?;
        Ok(store)
    }

    /// [`PgStore::connect_with`] from parsed connection options.
    pub async fn connect_with_options(
        connect: PgConnectOptions,
        options: &StoreOptions,
    ) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(options.apply(connect))
            .await?;
        Ok(PgStore::new(pool).with_settings(options))
    }

    /// A pool like [`PgStore::connect`]'s that connects on first use instead of now, so a
    /// process can start while the database is down; statements fail until it answers, and
    /// the pool reconnects by itself. Fails only when `url` cannot be parsed.
    pub fn connect_lazy(url: &str) -> Result<Self, StoreError> {
        Self::connect_lazy_with(url, &StoreOptions::default())
    }

    /// [`PgStore::connect_lazy`] with [`StoreOptions`]: the pool connects on first use, and
    /// every connection it opens gets the options' timeouts.
    ///
    /// On a multi-host URL (see [`PgStore::connect_with`]) the pool starts on the first host
    /// and, within [`failover::FOLLOW_INTERVAL`] of its first use in a Tokio runtime, moves to
    /// the first that qualifies.
    pub fn connect_lazy_with(url: &str, options: &StoreOptions) -> Result<Self, StoreError> {
        let url = DatabaseUrl::parse(url)?;
        if !url.is_plain() {
            return Ok(Self::followed(url, options, 0).1);
        }
        let connect = url.hosts.into_iter().next().expect("one host");
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(options.apply(connect));
        Ok(PgStore::new(pool).with_settings(options))
    }

    /// Creates the database `url` names if it does not exist yet (connecting to the server's
    /// maintenance database to do so). Returns whether it created it.
    /// On a multi-host URL, the database is created on the first host that qualifies.
    pub async fn create_database_if_missing(url: &str) -> Result<bool, StoreError> {
        use sqlx::migrate::MigrateDatabase;
        let parsed = DatabaseUrl::parse(url)?;
        let single;
        let url = if parsed.is_plain() {
            url
        } else {
            let (index, conn) = failover::resolve(
                &parsed
                    .hosts
                    .iter()
                    .map(|h| h.clone().database("postgres"))
                    .collect::<Vec<_>>(),
                parsed.target,
            )
            .await
            .map_err(StoreError::NoUsableHost)?;
            {
                use sqlx::Connection;
                let _ = conn.close().await;
            }
            // That host's URL as written, its TLS parameters whole.
            let (mut host_urls, _) = failover::split_hosts(url)?;
            single = host_urls.swap_remove(index);
            &single
        };
        if sqlx::Postgres::database_exists(url).await? {
            return Ok(false);
        }
        match sqlx::Postgres::create_database(url).await {
            Ok(()) => Ok(true),
            // Another process created it between the check and the create.
            Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42P04") => {
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The pool, for callers that share it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies every migration not yet applied, into the process's schema ([`Schema`]). Safe to
    /// run from several processes at once: the migrator serialises them with an advisory lock.
    ///
    /// A database migrated before cm had a schema of its own (cm's tables in `public`, its
    /// migrations in `public._sqlx_migrations`) is first moved into `cm`, in one transaction
    /// under the same lock, leaving a sibling's migrations where they are.
    ///
    /// sqlx's migrator holds a session-level lock, which a transaction pooler would leave on
    /// whichever server connection took it (and release, or not, on another). Through a pooler
    /// ([`StoreOptions::pooled`]) the same lock is taken transaction-scoped instead, in a
    /// transaction of its own held open while the migrations run on other connections of the
    /// pool; it excludes the session-level one of a migrator on a direct connection.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        relocate::from_public(self, migration_lock_id).await?;
        if self.begin.is_none() {
            MIGRATOR.run(&self.pool).await?;
            return Ok(());
        }
        let mut lock = self.begin().await?;
        // The lock waits for another process's migrations, and is held idle while this one's
        // run: none of the store's timeouts applies to it.
        crate::schema::raw_sql(
            "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; \
             SET LOCAL idle_in_transaction_session_timeout = 0",
        )
        .execute(&mut *lock)
        .await?;
        let database: String = crate::schema::query_scalar("SELECT current_database()")
            .fetch_one(&mut *lock)
            .await?;
        crate::schema::query("SELECT pg_advisory_xact_lock($1)")
            .bind(migration_lock_id(&database))
            .execute(&mut *lock)
            .await?;
        UNLOCKED_MIGRATOR.run(&self.pool).await?;
        lock.commit().await?;
        Ok(())
    }

    /// Whether the database answers, and its clock.
    pub async fn ping(&self) -> Result<chrono::DateTime<chrono::Utc>, StoreError> {
        on_store!(self, |e| crate::schema::query_scalar("SELECT now()")
            .fetch_one(e))
        .map_err(StoreError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_lock_is_sqlx_s() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
        // sqlx's key for a database named `cm` (0x3d32ad9e times zlib's CRC-32 of the name).
        assert_eq!(migration_lock_id("cm"), 1_034_229_154_904_171_972);
    }
}
