//! cm's objects in its own schema, seen from the binary: `run` on a migrated database whose
//! connections name `cm` first on their search path (as a role's setting or `PGOPTIONS` would),
//! or `public` alone, migrates nothing twice and fires; and a scheduler set to another schema
//! with `--schema` migrates, creates and fires there, with nothing in `cm` or `public`.

use sqlx::PgPool;

use crate::support::{
    PATIENCE, SERVER, TestDb, cm_scheduler, drop_database, end_scheduler, spawn_logged, wait_until,
};

/// `cm-scheduler [--schema schema] --database-url url routine create`, a message every minute,
/// made due now.
async fn due_routine(pool: &PgPool, url: &str, schema: &str) {
    let out = cm_scheduler()
        .args([
            "--schema",
            schema,
            "--database-url",
            url,
            "routine",
            "create",
        ])
        .args([
            "--name",
            "every minute",
            "--schedule",
            "* * * * *",
            "--message",
            "hi",
        ])
        .output()
        .expect("running routine create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The schema is the test's own constant, never input.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {schema}.routines SET next_run_at = now() - interval '1 second'"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// The fired occurrences in `schema`.
async fn fired(pool: &PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.routine_fires WHERE status = 'fired'"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Every table named like a migrations table, with its schema.
async fn migrations_tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT n.nspname || '.' || c.relname FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relname IN ('_sqlx_migrations', 'migrations') AND c.relkind = 'r' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `run` on `db` with `PGOPTIONS` setting `search_path`, until it fired once.
async fn runs_on_path(db: &TestDb, path: &str, log: &str) {
    due_routine(&db.pool, &db.url, "cm").await;
    let log = std::env::temp_dir().join(format!("{log}-{}.log", db.name));
    let options = format!("-c search_path={path}");
    let mut scheduler = spawn_logged(
        cm_scheduler().args(["--database-url", &db.url, "run", "--tick-interval", "100ms"]),
        &[("PGOPTIONS", &options)],
        &log,
    );
    wait_until(
        "a fire",
        PATIENCE,
        async || fired(&db.pool, "cm").await,
        |n| *n >= 1,
    )
    .await;
    assert!(
        matches!(scheduler.try_wait(), Ok(None)),
        "the scheduler exited: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    end_scheduler(&mut scheduler, &log);
    assert_eq!(migrations_tables(&db.pool).await, ["cm.migrations"]);
}

#[tokio::test]
async fn run_with_cm_first_on_the_search_path_migrates_nothing_twice_and_fires() {
    let db = TestDb::new().await;
    runs_on_path(&db, "cm,public", "cm-first").await;
}

#[tokio::test]
async fn run_with_public_alone_on_the_search_path_fires() {
    let db = TestDb::new().await;
    runs_on_path(&db, "public", "public-alone").await;
}

#[tokio::test]
async fn a_scheduler_in_another_schema_leaves_cm_and_public_empty() {
    let name = format!("cm_test_{}", uuid::Uuid::new_v4().simple());
    let url = format!("{SERVER}/{name}");
    let out = cm_scheduler()
        .args(["--schema", "other", "--database-url", &url, "migrate"])
        .output()
        .expect("running migrate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    due_routine(&pool, &url, "other").await;
    let log = std::env::temp_dir().join(format!("other-schema-{name}.log"));
    let mut scheduler = spawn_logged(
        cm_scheduler().args(["--database-url", &url, "run", "--tick-interval", "100ms"]),
        &[("CM_SCHEMA", "other")],
        &log,
    );
    wait_until(
        "a fire",
        PATIENCE,
        async || fired(&pool, "other").await,
        |n| *n >= 1,
    )
    .await;
    end_scheduler(&mut scheduler, &log);
    let elsewhere: (bool, i64) = sqlx::query_as(
        "SELECT to_regnamespace('cm') IS NOT NULL,
                (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace)
                + (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(elsewhere, (false, 0));
    assert_eq!(migrations_tables(&pool).await, ["other.migrations"]);
    pool.close().await;
    drop_database(&name);
}
