//! Moving a database migrated before cm had a schema of its own: cm's tables and functions out
//! of `public` into `cm`, and cm's rows out of sqlx's default migrations table into
//! `cm.migrations`, in one transaction, before [`crate::PgStore::migrate`] applies what is new.
//!
//! Before, cm's migrations ran wherever the connection's `search_path` pointed (`public`, as a
//! rule), recorded in `public._sqlx_migrations`, which a sibling service's own migrator also
//! uses. A database is in that layout when `public._sqlx_migrations` holds cm's first migration
//! with its checksum and `public.routines` exists. Then, under the migrations' advisory lock (so
//! two schedulers starting at once move it once):
//!
//! - each of cm's tables in `public` is moved (`ALTER TABLE … SET SCHEMA cm`; its indexes,
//!   constraints, triggers and owned sequences go with it), and so are cm's functions there;
//! - every function of `cm` whose search path was pinned (to the old path, with `public`) is
//!   pinned to `cm, pg_catalog, pg_temp`, since their bodies name cm's tables unqualified;
//! - cm's rows (its versions, with matching checksums) are copied into `cm.migrations` and
//!   deleted from `public._sqlx_migrations`, which is dropped only when nothing else is left in
//!   it: a sibling's rows stay where they are.
//!
//! Only the default schema is moved into: a store set to another schema leaves `public` alone.

use sqlx::PgConnection;

use crate::schema::{DEFAULT_SCHEMA, Schema};
use crate::{PgStore, StoreError};

/// Every table of cm's, in the order they are moved.
pub(crate) const TABLES: [&str; 8] = [
    "routines",
    "routine_fires",
    "routine_requests",
    "routine_names",
    "outbox_messages",
    "cm_settings",
    "group_leases",
    "group_holders",
];

/// cm's functions created outside schema `cm` by the migrations before it had one.
const PUBLIC_FUNCTIONS: [&str; 2] = ["cm_group_of", "cm_fill_group_id"];

/// Moves cm's objects out of `public` when the database is in the old layout (see the module's
/// documentation). Returns whether it moved them.
pub(crate) async fn from_public(
    store: &PgStore,
    lock_id: impl Fn(&str) -> i64,
) -> Result<bool, StoreError> {
    let schema = Schema::current();
    if schema.name() != DEFAULT_SCHEMA {
        return Ok(false);
    }
    let mut conn = store.pool().acquire().await?;
    let mut tx = store.begin_on(&mut conn).await?;
    sqlx::raw_sql("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
        .execute(&mut *tx)
        .await?;
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_id(&database))
        .execute(&mut *tx)
        .await?;
    let moved = move_in(&mut tx).await?;
    tx.commit().await?;
    Ok(moved)
}

/// The move itself, in the caller's transaction (which holds the lock).
async fn move_in(conn: &mut PgConnection) -> Result<bool, StoreError> {
    let first = cm_migrations::EMBEDDED.iter().next().expect("a migration");
    let old_layout: bool = sqlx::query_scalar(
        "SELECT to_regclass('public._sqlx_migrations') IS NOT NULL \
             AND to_regclass('public.routines') IS NOT NULL",
    )
    .fetch_one(&mut *conn)
    .await?;
    if !old_layout {
        return Ok(false);
    }
    let ours: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM public._sqlx_migrations WHERE version = $1 AND checksum = $2)",
    )
    .bind(first.version)
    .bind(&*first.checksum)
    .fetch_one(&mut *conn)
    .await?;
    if !ours {
        // A `public.routines` of a sibling's own: not cm's to move.
        return Ok(false);
    }
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS cm; \
         CREATE TABLE IF NOT EXISTS cm.migrations ( \
             version BIGINT PRIMARY KEY, \
             description TEXT NOT NULL, \
             installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), \
             success BOOLEAN NOT NULL, \
             checksum BYTEA NOT NULL, \
             execution_time BIGINT NOT NULL)",
    )
    .execute(&mut *conn)
    .await?;
    for table in TABLES {
        let present: bool = sqlx::query_scalar("SELECT to_regclass('public.' || $1) IS NOT NULL")
            .bind(table)
            .fetch_one(&mut *conn)
            .await?;
        if present {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "ALTER TABLE public.{table} SET SCHEMA cm"
            )))
            .execute(&mut *conn)
            .await?;
        }
    }
    let functions: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
         WHERE p.pronamespace = 'public'::regnamespace AND p.proname = ANY($1)",
    )
    .bind(&PUBLIC_FUNCTIONS[..])
    .fetch_all(&mut *conn)
    .await?;
    for function in functions {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER FUNCTION {function} SET SCHEMA cm"
        )))
        .execute(&mut *conn)
        .await?;
    }
    // Functions created with `SET search_path FROM CURRENT` kept the path they were created
    // under; their bodies name cm's tables unqualified, now in `cm`.
    let pinned: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
         WHERE p.pronamespace = 'cm'::regnamespace \
           AND EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search\\_path=%')",
    )
    .fetch_all(&mut *conn)
    .await?;
    let path = Schema::current().pinned_search_path();
    for function in pinned {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER FUNCTION {function} SET search_path = {path}"
        )))
        .execute(&mut *conn)
        .await?;
    }
    let (versions, checksums): (Vec<i64>, Vec<Vec<u8>>) = cm_migrations::EMBEDDED
        .iter()
        .map(|m| (m.version, m.checksum.to_vec()))
        .unzip();
    sqlx::query(
        "WITH ours AS ( \
             DELETE FROM public._sqlx_migrations m \
             USING unnest($1::bigint[], $2::bytea[]) AS e(version, checksum) \
             WHERE m.version = e.version AND m.checksum = e.checksum \
             RETURNING m.*) \
         INSERT INTO cm.migrations \
             (version, description, installed_on, success, checksum, execution_time) \
         SELECT version, description, installed_on, success, checksum, execution_time FROM ours \
         ON CONFLICT (version) DO NOTHING",
    )
    .bind(&versions)
    .bind(&checksums)
    .execute(&mut *conn)
    .await?;
    let left: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM public._sqlx_migrations)")
        .fetch_one(&mut *conn)
        .await?;
    if !left {
        sqlx::raw_sql("DROP TABLE public._sqlx_migrations")
            .execute(&mut *conn)
            .await?;
    }
    tracing::info!(
        "cm's tables and migrations moved from schema public into schema cm (the migrations \
         table of another service, if any, left in place)"
    );
    Ok(true)
}
