//! Least privilege: an application's role granted `cm_writer` manages routines through cm's
//! functions and cannot touch cm's tables; every cm function runs as its owner on a pinned
//! path that a caller's temporary tables cannot enter; and the deploy role file
//! (`deploy/postgres/roles.sql`) gives the migrator and the scheduler what they need.
//!
//! Roles are the cluster's, and tests run in parallel: each test makes login roles of its own,
//! with unique names, and drops them (and what they own in the test's database) when it ends.

use cm_store::{FireLedger, PgStore, RoutineStore, UnplannedRoutines};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};
use uuid::Uuid;

use crate::support::{due_yearly, fire_count, outbox_params};

/// Login roles a test made, each `<base>_<unique suffix>`; dropped when the test ends, pass or
/// fail, with whatever they own or were granted in the test's database.
struct TestRoles {
    admin: PgConnectOptions,
    names: Vec<String>,
}

impl TestRoles {
    /// Names for `bases`, unique to this test; none created yet.
    fn named(pool: &PgPool, bases: &[&str]) -> TestRoles {
        let suffix = Uuid::new_v4().simple().to_string()[..12].to_owned();
        TestRoles {
            admin: pool.connect_options().as_ref().clone(),
            names: bases.iter().map(|b| format!("{b}_{suffix}")).collect(),
        }
    }

    /// Creates each role as a login role, granted `granted` (if any).
    async fn create(pool: &PgPool, bases: &[&str], granted: Option<&str>) -> TestRoles {
        let roles = TestRoles::named(pool, bases);
        for name in &roles.names {
            let grant = granted.map_or(String::new(), |g| format!(" IN ROLE {g}"));
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE ROLE {name} LOGIN{grant}"
            )))
            .execute(pool)
            .await
            .unwrap();
        }
        roles
    }

    /// A pool of connections to the test's database as role `i`.
    async fn pool(&self, i: usize) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect_with(self.admin.clone().username(&self.names[i]))
            .await
            .unwrap()
    }
}

impl Drop for TestRoles {
    fn drop(&mut self) {
        let (admin, names) = (self.admin.clone(), self.names.clone());
        // A runtime of its own on a thread of its own: the test's runtime may be ending.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut conn = PgConnection::connect_with(&admin).await?;
                // A test that failed may leave a role's session in a transaction, holding
                // locks the drop below would wait for.
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE usename = ANY($1)",
                )
                .bind(&names)
                .execute(&mut conn)
                .await?;
                for name in names {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "REASSIGN OWNED BY {name} TO CURRENT_USER; DROP OWNED BY {name}; \
                         DROP ROLE IF EXISTS {name}"
                    )))
                    .execute(&mut conn)
                    .await?;
                }
                conn.close().await
            })
        })
        .join();
        if !std::thread::panicking() {
            dropped.unwrap().unwrap();
        }
    }
}

/// The schema cm's tables live in (`public` today, `cm` once they move), for statements a test
/// sends as a role whose search path does not name it.
async fn tables_schema(pool: &PgPool) -> String {
    sqlx::query_scalar(
        "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'cm.routines'::regclass",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The SQLSTATE of a statement's error.
fn code(result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>) -> String {
    let err = result.expect_err("the statement was refused");
    err.as_database_error()
        .and_then(|d| d.code().map(|c| c.into_owned()))
        .unwrap_or_else(|| panic!("not a database error: {err}"))
}

/// A role granted only `cm_writer` creates, updates, pauses, resumes, triggers, reads and
/// deletes a routine through cm's functions; writing or reading cm's tables, or calling a
/// helper that skips the checks, is permission denied (42501). A temporary table of its own
/// named like one of cm's does not stand in for it inside a function.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_cm_writer_manages_routines_through_functions_only(pool: PgPool) {
    let roles = TestRoles::create(&pool, &["cm_test_app"], Some("cm_writer")).await;
    let app = roles.pool(0).await;
    let id: Uuid = sqlx::query_scalar(
        "SELECT cm.create_routine('app digest', '0 9 * * *', 'Europe/Berlin', 'hello')",
    )
    .fetch_one(&app)
    .await
    .unwrap();
    let read = |id: Uuid| {
        let app = app.clone();
        async move {
            sqlx::query_as::<_, (String, String, String, bool)>(
                "SELECT schedule, misfire_policy, payload ->> 'text', paused
                 FROM cm.get_routine($1)",
            )
            .bind(id)
            .fetch_optional(&app)
            .await
            .unwrap()
        }
    };
    let updated: bool = sqlx::query_scalar(
        "SELECT cm.update_routine($1, schedule => '0 10 * * *', message => 'hello again',
                                  misfire => 'skip')",
    )
    .bind(id)
    .fetch_one(&app)
    .await
    .unwrap();
    assert!(updated);
    assert_eq!(
        read(id).await,
        Some((
            "0 10 * * *".into(),
            "skip".into(),
            "hello again".into(),
            false
        ))
    );
    for (statement, paused) in [
        ("SELECT cm.set_routine_paused($1, true)", true),
        ("SELECT cm.set_routine_paused($1, false)", false),
    ] {
        let found: bool = sqlx::query_scalar(statement)
            .bind(id)
            .fetch_one(&app)
            .await
            .unwrap();
        assert!(found);
        assert_eq!(read(id).await.map(|r| r.3), Some(paused), "{statement}");
    }
    let asked: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT cm.trigger_routine($1)")
            .bind(id)
            .fetch_one(&app)
            .await
            .unwrap();
    assert!(asked.is_some());

    // A temporary table named like cm's settings would put every routine in group 0, and one
    // named like its names would take the name; inside the function, in the same session,
    // cm's own tables are read and written.
    let mut session = app.acquire().await.unwrap();
    sqlx::raw_sql(
        "CREATE TEMP TABLE cm_settings (group_count INTEGER);
         INSERT INTO pg_temp.cm_settings VALUES (1);
         CREATE TEMP TABLE routine_names (name TEXT, routine_id UUID, group_id SMALLINT);",
    )
    .execute(&mut *session)
    .await
    .unwrap();
    let second: Uuid =
        sqlx::query_scalar("SELECT cm.create_routine('second', '@every 90m', 'UTC', 'hello')")
            .fetch_one(&mut *session)
            .await
            .unwrap();
    let shadowed: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_temp.routine_names")
        .fetch_one(&mut *session)
        .await
        .unwrap();
    assert_eq!(shadowed, 0);
    drop(session);
    let (group, named): (i16, i64) = sqlx::query_as(
        "SELECT r.group_id, (SELECT count(*) FROM cm.routine_names n WHERE n.routine_id = r.id)
         FROM cm.routines r WHERE r.id = $1",
    )
    .bind(second)
    .fetch_one(&pool)
    .await
    .unwrap();
    let expected: i16 =
        sqlx::query_scalar("SELECT cm.cm_group_of($1, (SELECT group_count FROM cm.cm_settings))")
            .bind(second)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((group, named), (expected, 1));

    // Nothing of cm's tables is the writer's, and the helpers are not either.
    let schema = tables_schema(&pool).await;
    for statement in [
        format!(
            "INSERT INTO {schema}.routines (id, name, schedule, timezone, kind, payload)
             VALUES (gen_random_uuid(), 'direct', '* * * * * *', 'UTC', 'message',
                     '{{\"text\": \"x\"}}')"
        ),
        format!("UPDATE {schema}.routine_fires SET status = 'fired'"),
        format!("DELETE FROM {schema}.routine_names"),
        format!("SELECT * FROM {schema}.routines"),
        "SELECT cm.insert_unplanned('direct', '* * * * *', 'UTC', 'message', '{}', \
         'fire-once', 'forbid', false, NULL)"
            .to_owned(),
    ] {
        assert_eq!(
            code(
                sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                    .execute(&app)
                    .await
            ),
            "42501",
            "{statement}"
        );
    }

    let deleted: bool = sqlx::query_scalar("SELECT cm.delete_routine($1)")
        .bind(id)
        .fetch_one(&app)
        .await
        .unwrap();
    assert!(deleted);
    assert_eq!(read(id).await, None);
    app.close().await;
}

/// Every function of schema `cm` is SECURITY DEFINER with a pinned path that searches
/// `pg_temp` last, and no function is PUBLIC's to call; `cm_writer` may call exactly the write
/// and read functions and holds no privilege on any of cm's tables. A later migration that adds
/// a function and forgets any of this fails here.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn every_cm_function_runs_as_its_owner_on_a_pinned_path(pool: PgPool) {
    let functions: Vec<(String, bool, String, bool, bool)> = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, p.prosecdef,
                coalesce(array_to_string(p.proconfig, ';'), ''),
                EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                        WHERE a.grantee = 0),
                has_function_privilege('cm_writer', p.oid, 'EXECUTE')
         FROM pg_proc p WHERE p.pronamespace = 'cm'::regnamespace ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(functions.len() > 10, "{functions:?}");
    let mut callable = Vec::new();
    for (function, definer, config, public, writer) in &functions {
        assert!(*definer, "{function} is not SECURITY DEFINER");
        let path = config
            .split(';')
            .find_map(|c| c.strip_prefix("search_path="))
            .unwrap_or_else(|| panic!("{function} has no pinned search_path: {config:?}"));
        assert!(
            path.trim_end().ends_with("pg_temp") && !path.contains("$user"),
            "{function}: {path}"
        );
        assert!(!public, "PUBLIC may call {function}");
        if *writer {
            callable.push(function.split('(').next().unwrap_or_default().to_owned());
        }
    }
    assert_eq!(
        callable,
        [
            "cm.create_calendar",
            "cm.create_mission_routine",
            "cm.create_routine",
            "cm.create_routines",
            "cm.delete_calendar",
            "cm.delete_concurrency_limit",
            "cm.delete_routine",
            "cm.edit_calendar_dates",
            "cm.get_calendar",
            "cm.get_routine",
            "cm.set_concurrency_limit",
            "cm.set_routine_calendar",
            "cm.set_routine_concurrency_key",
            "cm.set_routine_deadline",
            "cm.set_routine_paused",
            "cm.set_routine_retries",
            "cm.trigger_routine",
            "cm.update_routine",
        ]
    );
    let schema = tables_schema(&pool).await;
    let writable: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
           AND (has_table_privilege('cm_writer', c.oid, 'SELECT')
                OR has_table_privilege('cm_writer', c.oid, 'INSERT')
                OR has_table_privilege('cm_writer', c.oid, 'UPDATE')
                OR has_table_privilege('cm_writer', c.oid, 'DELETE')
                OR has_table_privilege('cm_writer', c.oid, 'TRUNCATE'))",
    )
    .bind(&schema)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(writable, Vec::<String>::new());
}

/// The deploy role file, its roles renamed for this test, run on an empty database: its
/// migrator migrates, and its scheduler then does what `cm-scheduler run --no-migrate` does
/// (checks the schema, plans a routine an application wrote through `cm_writer`, creates a
/// routine, claims it with its message written to the outbox) and cannot create a table.
#[sqlx::test(migrations = false)]
async fn the_role_file_gives_the_migrator_and_the_scheduler_what_they_need(pool: PgPool) {
    let roles = TestRoles::named(
        &pool,
        &["cm_test_migrator", "cm_test_scheduler", "cm_test_app"],
    );
    let file = include_str!("../../../deploy/postgres/roles.sql")
        .replace("cm_migrator", &roles.names[0])
        .replace("cm_scheduler", &roles.names[1]);
    sqlx::raw_sql(sqlx::AssertSqlSafe(file))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {} LOGIN IN ROLE cm_writer",
        roles.names[2]
    )))
    .execute(&pool)
    .await
    .unwrap();

    let migrator = roles.pool(0).await;
    PgStore::new(migrator.clone()).migrate().await.unwrap();
    migrator.close().await;

    let app = roles.pool(2).await;
    let written: Uuid =
        sqlx::query_scalar("SELECT cm.create_routine('from the app', '@every 1h', 'UTC', 'hi')")
            .fetch_one(&app)
            .await
            .unwrap();
    app.close().await;

    let scheduler_pool = roles.pool(1).await;
    let scheduler = PgStore::new(scheduler_pool.clone());
    scheduler.check_schema().await.unwrap();
    let planned = scheduler.plan_routines(None, 10).await.unwrap();
    assert_eq!(
        planned
            .iter()
            .map(|p| (p.id, p.refused.is_none()))
            .collect::<Vec<_>>(),
        [(written, true)]
    );
    let (routine, _) = due_yearly(
        &scheduler,
        &scheduler_pool,
        cm_domain::MisfirePolicy::FireOnce,
    )
    .await;
    let claim = scheduler.claim_due(&outbox_params("roles")).await.unwrap();
    assert_eq!(claim.fires.len(), 1, "{:?}", claim.fires);
    assert_eq!(fire_count(&scheduler_pool).await, 1);
    assert_eq!(
        scheduler.get_routine(routine.id).await.unwrap().id,
        routine.id
    );
    assert_eq!(
        code(
            sqlx::query("CREATE TABLE cm.mine (x INTEGER)")
                .execute(&scheduler_pool)
                .await
        ),
        "42501"
    );
    scheduler_pool.close().await;
}
