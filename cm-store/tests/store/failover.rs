//! Multi-host URLs against the test server: a host that refuses connections is skipped, a
//! read-only one is refused with its reason, and a host that turns read-only under a running
//! store is reported (with statements failing) until it is writable again. The move to another
//! server is tested on a real pg_auto_failover formation (`.ci/pg-auto-failover`): here on one
//! store, and under schedulers by `cargo xtask chaos --auto-failover` (see `.ci/run`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm_store::{PgStore, StoreError, StoreOptions};
use sqlx::PgPool;

use crate::support::wait_until;

/// A URL naming `127.0.0.1:1` (nothing listens there) and then the test's server and database,
/// with `target_session_attrs=target`.
fn url_after_a_dead_host(pool: &PgPool, target: &str) -> String {
    let o = pool.connect_options();
    format!(
        "postgres://{}@127.0.0.1:1,{}:{}/{}?target_session_attrs={target}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap()
    )
}

async fn database_read_only(pool: &PgPool, on: bool) {
    let db = pool.connect_options().get_database().unwrap().to_string();
    let mut conn = pool.acquire().await.unwrap();
    // This session may have started read-only itself.
    sqlx::raw_sql("SET default_transaction_read_only = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    let statement = if on {
        format!("ALTER DATABASE \"{db}\" SET default_transaction_read_only = on")
    } else {
        format!("ALTER DATABASE \"{db}\" RESET default_transaction_read_only")
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(&mut *conn)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_host_that_refuses_connections_is_skipped(pool: PgPool) {
    for target in ["any", "read-write", "primary"] {
        let url = url_after_a_dead_host(&pool, target);
        PgStore::check_connection(&url).await.unwrap();
        let store = PgStore::connect(&url).await.unwrap();
        let port: i32 = sqlx::query_scalar("SELECT inet_server_port()")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(
            port,
            i32::from(pool.connect_options().get_port()),
            "{target}"
        );
        assert_eq!(store.failover_problem(), None);
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_read_only_host_is_refused_and_every_host_named(pool: PgPool) {
    database_read_only(&pool, true).await;
    let url = url_after_a_dead_host(&pool, "read-write");
    let e = PgStore::connect(&url).await.unwrap_err();
    assert!(matches!(e, StoreError::NoUsableHost(_)), "{e:?}");
    let shown = e.to_string();
    let o = pool.connect_options();
    assert!(shown.contains("127.0.0.1:1 connection refused"), "{shown}");
    assert!(
        shown.contains(&format!("{}:{} is read-only", o.get_host(), o.get_port())),
        "{shown}"
    );
    assert!(!shown.contains('\n'), "{shown}");
    // Not in recovery, so `primary` takes it, and `any` takes whatever answers.
    for target in ["primary", "any"] {
        PgStore::connect(&url_after_a_dead_host(&pool, target))
            .await
            .unwrap();
    }
    database_read_only(&pool, false).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_host_that_turns_read_only_is_reported_until_it_is_writable_again(pool: PgPool) {
    let options = StoreOptions {
        acquire_timeout: Duration::from_secs(1),
        ..StoreOptions::default()
    };
    let store = PgStore::connect_with(&url_after_a_dead_host(&pool, "read-write"), &options)
        .await
        .unwrap();
    store.ping().await.unwrap();

    // The database turns read-only for new sessions, and every session on it ends (as a
    // demoted primary's do when it restarts as a standby).
    database_read_only(&pool, true).await;
    let db = pool.connect_options().get_database().unwrap().to_string();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&db)
    .execute(&pool)
    .await
    .unwrap();

    let reason = wait_until(
        "the read-only host reported",
        Duration::from_secs(5),
        async || store.failover_problem(),
        Option::is_some,
    )
    .await
    .unwrap_or_default();
    assert!(reason.contains("is read-only"), "{reason}");
    // No connection is handed out: statements fail rather than run on a read-only host.
    assert!(store.ping().await.is_err());

    database_read_only(&pool, false).await;
    wait_until(
        "the host writable again, nothing reported",
        Duration::from_secs(5),
        async || store.failover_problem(),
        Option::is_none,
    )
    .await;
    store.ping().await.unwrap();
    drop(store);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_plain_url_has_no_follower(pool: PgPool) {
    let o = pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        o.get_username(),
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap()
    );
    let store = PgStore::connect(&url).await.unwrap();
    assert_eq!(store.failover_problem(), None);
    assert!(format!("{store:?}").contains("follow: None"));
}

/// `pg_autoctl perform failover` on the formation whose monitor is `monitor`, as the user
/// postgres when run as root (pg_autoctl refuses root); returns once the failover is done.
fn perform_failover(monitor: &str) {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    });
    let mut c = if root {
        let mut c = std::process::Command::new("runuser");
        c.args([
            "-u",
            "postgres",
            "--",
            "env",
            "HOME=/var/lib/postgresql",
            "pg_autoctl",
        ]);
        c
    } else {
        std::process::Command::new("pg_autoctl")
    };
    let out = c
        .args(["perform", "failover", "--monitor", monitor, "--wait", "60"])
        .output()
        .expect("running pg_autoctl");
    assert!(
        out.status.success(),
        "pg_autoctl perform failover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs pg_auto_failover: export CM_TEST_AUTO_FAILOVER_URL=\"$(.ci/pg-auto-failover)\" CM_TEST_AUTO_FAILOVER_MONITOR=\"$(.ci/pg-auto-failover --monitor)\""]
async fn a_store_follows_the_primary_pg_auto_failover_moves() {
    let url = std::env::var("CM_TEST_AUTO_FAILOVER_URL").unwrap();
    let monitor = std::env::var("CM_TEST_AUTO_FAILOVER_MONITOR").unwrap();
    let store = PgStore::connect(&url).await.unwrap();
    let port = |store: PgStore| async move {
        // A write: only a primary takes it.
        sqlx::query_scalar::<_, i32>("SELECT inet_server_port() FROM (SELECT txid_current()) t")
            .fetch_one(store.pool())
            .await
    };
    let before = port(store.clone()).await.unwrap();

    // What the store says on the way, kept for the check below. Read every few milliseconds
    // beside the writes: the store may find no usable host and then the new primary within
    // one write's reconnection, so reading it between writes alone can miss it.
    let reported = Arc::new(Mutex::new(None::<String>));
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn({
        let (store, reported) = (store.clone(), reported.clone());
        async move {
            while !*stopped.borrow() {
                if let Some(reason) = store.failover_problem() {
                    reported.lock().unwrap().get_or_insert(reason);
                }
                let _ = tokio::time::timeout(Duration::from_millis(5), stopped.changed()).await;
            }
        }
    });
    let failover = tokio::task::spawn_blocking(move || perform_failover(&monitor));
    let after = wait_until(
        "the store to write to another primary",
        Duration::from_secs(60),
        async || {
            tokio::time::timeout(Duration::from_millis(500), port(store.clone()))
                .await
                .ok()
                .and_then(Result::ok)
        },
        |now| now.is_some_and(|now| now != before),
    )
    .await;
    failover.await.unwrap();
    stop.send_replace(true);
    watcher.await.unwrap();
    assert_ne!(after, Some(before));
    // Between the demotion and the promotion no host qualified, and the store said why.
    let reason = reported
        .lock()
        .unwrap()
        .take()
        .expect("no failover problem was reported during the switch");
    assert!(reason.contains("no host is usable"), "{reason}");
    assert_eq!(store.failover_problem(), None);
}
