//! cm in its own schema, beside a sibling service in one database: a database migrated the old
//! way (cm's tables in `public`, its rows in `public._sqlx_migrations`) moved into `cm` by
//! `migrate`; a sibling's own `sqlx::migrate!` and its own `routines` table beside cm's in
//! either order; and no search path a role or URL sets changing what cm migrates or reads.

use cm_domain::MisfirePolicy;
use cm_store::{FireLedger, PgStore};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{due_yearly, params};

/// The last migration released before cm had a schema of its own.
const LAST_IN_PUBLIC: i64 = 20261203000900;

/// Makes the database as cm did before it had a schema of its own: its migrations run by
/// sqlx's default migrator on the connection's search path (`public`), recorded in
/// `public._sqlx_migrations`. Then a routine written through the SQL functions, and a fire.
async fn replay_old_layout(pool: &PgPool) -> uuid::Uuid {
    sqlx::migrate!("../migrations")
        .run_to(LAST_IN_PUBLIC, pool)
        .await
        .unwrap();
    let id: uuid::Uuid =
        sqlx::query_scalar("SELECT cm.create_routine('moved', '0 0 1 1 *', 'UTC', 'hello')")
            .fetch_one(pool)
            .await
            .unwrap();
    sqlx::query(
        "INSERT INTO routine_fires
             (routine_id, scheduled_at, status, completed_at, claimant, claim_token, lease_expires_at)
         VALUES ($1, '2025-01-01T00:00:00Z', 'fired', now(), 'old', gen_random_uuid(), now())",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// The relations and functions of `schema` (their names, sorted).
async fn objects_in(pool: &PgPool, schema: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT relname::text FROM pg_class WHERE relnamespace = $1::regnamespace
         UNION ALL SELECT proname::text FROM pg_proc WHERE pronamespace = $1::regnamespace
         ORDER BY 1",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Makes `id` due now and claims: the claimed occurrences' routines.
async fn claim_now(store: &PgStore, pool: &PgPool, id: uuid::Uuid) -> Vec<uuid::Uuid> {
    sqlx::query("UPDATE cm.routines SET next_run_at = now() - interval '1 minute' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    let claim = store.claim_due(&params("a")).await.unwrap();
    claim
        .fires
        .iter()
        .map(|f| f.occurrence.routine_id)
        .collect()
}

#[sqlx::test(migrations = false)]
async fn a_database_migrated_into_public_is_moved_into_cm(pool: PgPool) {
    let id = replay_old_layout(&pool).await;
    // A sibling's row in the same migrations table stays, with the table.
    sqlx::query(
        "INSERT INTO public._sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (20250101000000, 'sibling', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = PgStore::new(pool.clone());
    store.migrate().await.unwrap();
    // Again: nothing left to move, nothing to apply.
    store.migrate().await.unwrap();

    assert_eq!(
        objects_in(&pool, "public").await,
        ["_sqlx_migrations", "_sqlx_migrations_pkey"]
    );
    let left: Vec<i64> = sqlx::query_scalar("SELECT version FROM public._sqlx_migrations")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [20250101000000]);
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.migrations WHERE success")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(applied as usize, cm_store::MIGRATOR.iter().count());
    let fires: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(fires, 1);
    // The SQL functions, whose bodies name cm's tables bare, find them from a caller whose
    // path is `public` alone.
    let other: uuid::Uuid =
        sqlx::query_scalar("SELECT cm.create_routine('after the move', '0 0 1 1 *', 'UTC', 'hi')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_ne!(other, id);
    assert_eq!(claim_now(&store, &pool, id).await, [id]);
}

#[sqlx::test(migrations = false)]
async fn the_old_layout_with_no_sibling_leaves_no_migrations_table_in_public(pool: PgPool) {
    replay_old_layout(&pool).await;
    PgStore::new(pool.clone()).migrate().await.unwrap();
    assert_eq!(objects_in(&pool, "public").await, Vec::<String>::new());
}

/// The sibling's own migrator: sqlx's default, its migrations table `public._sqlx_migrations`.
async fn sibling_migrates(pool: &PgPool) {
    sqlx::migrate!("tests/sibling_migrations")
        .run(pool)
        .await
        .unwrap();
}

/// Both live: the sibling's `routines` is its own, cm's is in `cm`, each migrations table holds
/// its own rows.
async fn both_intact(pool: &PgPool) {
    let title: String = sqlx::query_scalar("SELECT title FROM public.routines WHERE id = 1")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(title, "the sibling's own");
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM public._sqlx_migrations")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(versions, [20250101000000]);
    let cm: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.migrations")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(cm as usize, cm_store::MIGRATOR.iter().count());
}

#[sqlx::test(migrations = false)]
async fn a_sibling_migrated_first_and_cm_share_the_database(pool: PgPool) {
    sibling_migrates(&pool).await;
    let store = PgStore::new(pool.clone());
    store.migrate().await.unwrap();
    sibling_migrates(&pool).await;
    both_intact(&pool).await;
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    assert_eq!(claim_now(&store, &pool, routine.id).await, [routine.id]);
}

#[sqlx::test(migrations = false)]
async fn cm_migrated_first_and_a_sibling_share_the_database(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    store.migrate().await.unwrap();
    sibling_migrates(&pool).await;
    store.migrate().await.unwrap();
    both_intact(&pool).await;
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    assert_eq!(claim_now(&store, &pool, routine.id).await, [routine.id]);
}

/// A store whose every connection has `search_path` set as a role or a URL would set it.
async fn store_on_path(options: PgConnectOptions, path: &str) -> (PgStore, PgPool) {
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("search_path", path)]))
        .await
        .unwrap();
    (PgStore::new(pool.clone()), pool)
}

#[sqlx::test(migrations = false)]
async fn a_search_path_naming_cm_first_migrates_once_and_fires(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let (plain, _) = store_on_path(options.clone(), "\"$user\", public").await;
    plain.migrate().await.unwrap();
    let (store, pool) = store_on_path(options, "cm, public").await;
    store.migrate().await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT n.nspname || '.' || c.relname FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relname IN ('_sqlx_migrations', 'migrations') AND c.relkind = 'r'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(tables, ["cm.migrations"]);
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    assert_eq!(claim_now(&store, &pool, routine.id).await, [routine.id]);
}

#[sqlx::test(migrations = false)]
async fn a_search_path_of_public_alone_migrates_and_fires(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let (store, pool) = store_on_path(options, "public").await;
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(objects_in(&pool, "public").await, Vec::<String>::new());
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    assert_eq!(claim_now(&store, &pool, routine.id).await, [routine.id]);
    let by_sql: uuid::Uuid =
        sqlx::query_scalar("SELECT cm.create_routine('by sql', '0 0 1 1 *', 'UTC', 'hi')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_ne!(by_sql, routine.id);
}
