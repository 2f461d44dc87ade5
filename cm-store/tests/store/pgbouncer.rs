//! The store behind PgBouncer (1.25.2, as `.ci/pgbouncer` builds it): in transaction mode, with
//! more client connections than PgBouncer has server connections, every transaction the store
//! begins carries cm's timeouts and `plan_cache_mode`, whichever server connection it lands on,
//! and none of them is left behind on a server connection for another client; the migrations,
//! a claim and a settle run through it; a store that sends its settings at connect is refused
//! by PgBouncer in words that name the fix. The same in session mode.
//!
//! `CM_TEST_PGBOUNCER_URL` names the transaction-mode PgBouncer and
//! `CM_TEST_PGBOUNCER_SESSION_URL` the session-mode one (`.ci/pgbouncer` and
//! `.ci/pgbouncer --session` print them). Both forward every database name to the server
//! `DATABASE_URL` names, where each test makes a database of its own and drops it at the end.
//! The tests are ignored unless asked for (`cargo xtask test` runs them where the variables
//! are set); asked for without them, they fail.

use std::collections::BTreeSet;
use std::time::Duration;

use cm_domain::{Lease, Settlement};
use cm_store::{FireLedger, PgStore, RoutineStore, SettleOutcome, StoreOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use crate::support::{params, set_next_run};

/// The lease the store's timeouts derive from: a statement 2.5 s, a lock wait 0.5 s.
const LEASE: Duration = Duration::from_secs(10);

/// More client connections than `.ci/pgbouncer` gives a database and user server connections
/// (20), so in transaction mode transactions are spread over server connections that others
/// used before.
const CLIENTS: u32 = 40;

/// In session mode each client holds a server connection for as long as it is open: fewer than
/// PgBouncer has, or the rest would wait.
const SESSION_CLIENTS: u32 = 10;

/// Transactions begun and checked.
const TRANSACTIONS: usize = 400;

fn pooler_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("{var} is not set: start PgBouncer with .ci/pgbouncer (--session)"),
    }
}

/// `url` with its database part replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
    format!("{base}/{database}")
}

/// A database of its own on the server behind the pooler, dropped by [`PooledDb::drop`].
struct PooledDb {
    direct: String,
    name: String,
    pooled: String,
}

impl PooledDb {
    async fn create(pooler: &str) -> PooledDb {
        let direct = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let name = format!(
            "cm_pgbouncer_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let mut admin = PgConnection::connect(&direct).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        PooledDb {
            pooled: with_database(pooler, &name),
            direct,
            name,
        }
    }

    async fn drop(self) {
        let mut admin = PgConnection::connect(&self.direct).await.unwrap();
        // PgBouncer keeps its server connections to the database open.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await
        .unwrap();
    }
}

/// The scheduler's options through a pooler: the timeouts of a 10 s lease, many connections.
fn pooled_options(clients: u32) -> StoreOptions {
    StoreOptions {
        max_connections: clients,
        acquire_timeout: Duration::from_secs(30),
        pooled: true,
        ..StoreOptions::for_lease(Lease::new(LEASE).unwrap())
    }
}

/// What every transaction must see: each setting the store sets, by name.
const EXPECTED: [(&str, &str); 4] = [
    ("statement_timeout", "2500ms"),
    ("lock_timeout", "500ms"),
    ("idle_in_transaction_session_timeout", "2500ms"),
    ("plan_cache_mode", "force_custom_plan"),
];

const SETTINGS_SQL: &str = "SELECT pg_backend_pid(), current_setting('statement_timeout'),
        current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'),
        current_setting('plan_cache_mode'), pg_sleep(0.005)::text";

type Seen = (i32, String, String, String, String, String);

/// Begins `TRANSACTIONS` transactions as the store does, `CLIENTS` at a time, and returns the
/// server backends they ran on, asserting each saw cm's settings.
async fn every_transaction_carries_the_settings(store: &PgStore, clients: u32) -> BTreeSet<i32> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let store = store.clone();
        tasks.spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..TRANSACTIONS / clients as usize {
                let mut tx = store.begin().await.unwrap();
                let row: Seen = sqlx::query_as(SETTINGS_SQL)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                seen.push(row);
            }
            seen
        });
    }
    let mut backends = BTreeSet::new();
    let mut checked = 0;
    while let Some(seen) = tasks.join_next().await {
        for (pid, statement, lock, idle, plan, _) in seen.unwrap() {
            let got = [
                ("statement_timeout", statement.as_str()),
                ("lock_timeout", lock.as_str()),
                ("idle_in_transaction_session_timeout", idle.as_str()),
                ("plan_cache_mode", plan.as_str()),
            ];
            assert_eq!(got, EXPECTED, "backend {pid}");
            backends.insert(pid);
            checked += 1;
        }
    }
    assert_eq!(checked, TRANSACTIONS / clients as usize * clients as usize);
    backends
}

/// A plain client of the same pooler (no settings of its own) sees the server's defaults in
/// each of its transactions: nothing the store set outlived the store's transaction.
async fn nothing_is_left_behind(url: &str) -> BTreeSet<i32> {
    let connect: PgConnectOptions = url.parse::<PgConnectOptions>().unwrap();
    let plain = PgPoolOptions::new()
        .max_connections(CLIENTS)
        .connect_with(connect.extra_float_digits(None))
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let plain = plain.clone();
        tasks.spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..5 {
                let row: Seen = sqlx::query_as(SETTINGS_SQL)
                    .fetch_one(&plain)
                    .await
                    .unwrap();
                seen.push(row);
            }
            seen
        });
    }
    let mut backends = BTreeSet::new();
    while let Some(seen) = tasks.join_next().await {
        for (pid, statement, lock, idle, plan, _) in seen.unwrap() {
            assert_eq!(
                [
                    statement.as_str(),
                    lock.as_str(),
                    idle.as_str(),
                    plan.as_str()
                ],
                ["0", "0", "0", "auto"],
                "backend {pid} kept a setting of the store's"
            );
            backends.insert(pid);
        }
    }
    plain.close().await;
    backends
}

/// The whole check against the pooler `var` names.
async fn through(var: &str, transaction_mode: bool) {
    let pooler = pooler_url(var);
    let clients = if transaction_mode {
        CLIENTS
    } else {
        SESSION_CLIENTS
    };
    let db = PooledDb::create(&pooler).await;

    // Sent at connect, as on a direct connection, cm's settings are refused, in words that say
    // what to do.
    let direct_options = StoreOptions {
        pooled: false,
        ..pooled_options(clients)
    };
    let refused = PgStore::connect_with(&db.pooled, &direct_options)
        .await
        .expect_err("PgBouncer takes no settings it does not track");
    assert!(refused.is_refused_startup_parameter(), "{refused}");
    assert!(
        refused.explain().contains("--pooled"),
        "{}",
        refused.explain()
    );

    let store = PgStore::connect_with(&db.pooled, &pooled_options(clients))
        .await
        .unwrap();
    store.check_pooler().await.unwrap();
    // Twice at once: the lock that serialises them holds through the pooler.
    let (a, b) = tokio::join!(store.migrate(), store.migrate());
    a.unwrap();
    b.unwrap();
    store.check_schema().await.unwrap();

    let backends = every_transaction_carries_the_settings(&store, clients).await;
    if transaction_mode {
        // Forty clients shared PgBouncer's server connections, so the transactions of one
        // client ran on several of them, and several clients on each.
        assert!(backends.len() > 1, "{backends:?}");
        assert!(backends.len() <= 20, "{backends:?}");
        let plain = nothing_is_left_behind(&db.pooled).await;
        assert!(
            !plain.is_disjoint(&backends),
            "the plain client never ran on a server connection the store used: {plain:?} {backends:?}"
        );
    }

    // The scheduler's work: a routine created, claimed and settled.
    let routine = store
        .create_routine(crate::support::message("through-pgbouncer", "* * * * *"))
        .await
        .unwrap();
    let due = store.ping().await.unwrap() - chrono::TimeDelta::minutes(1);
    let pool = sqlx::PgPool::connect(&with_database(&db.direct, &db.name))
        .await
        .unwrap();
    set_next_run(&pool, routine.id, due).await;
    pool.close().await;
    let claim = store.claim_due(&params("pgbouncer")).await.unwrap();
    assert_eq!(claim.fires.len(), 1, "{:?}", claim.fires);
    let outcome = store
        .settle_fire(&claim.fires[0].fire_ref(), &Settlement::Fired)
        .await
        .unwrap();
    assert_eq!(outcome, SettleOutcome::Settled);

    store.pool().close().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PgBouncer in transaction mode: start it with .ci/pgbouncer and set CM_TEST_PGBOUNCER_URL to what it prints"]
async fn pgbouncer_transaction_mode_carries_the_settings_in_every_transaction() {
    through("CM_TEST_PGBOUNCER_URL", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PgBouncer in session mode: start it with .ci/pgbouncer --session and set CM_TEST_PGBOUNCER_SESSION_URL to what it prints"]
async fn pgbouncer_session_mode_carries_the_settings_in_every_transaction() {
    through("CM_TEST_PGBOUNCER_SESSION_URL", false).await;
}
