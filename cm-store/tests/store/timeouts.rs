//! Server-side timeouts: a claim blocked on a lock gives up within the lock timeout instead of
//! holding its routines' locks indefinitely.

use std::time::{Duration, Instant};

use cm_domain::Lease;
use cm_store::{FireLedger, PgStore, StoreOptions};
use sqlx::PgPool;

use crate::support::{PATIENCE, due_and_held, params, wait_until};

/// A store on the test's database with `options`.
async fn store_with(pool: &PgPool, options: &StoreOptions) -> PgStore {
    PgStore::connect_with_options((*pool.connect_options()).clone(), options)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_timeouts_are_set_on_every_connection(pool: PgPool) {
    let lease = Lease::new(Duration::from_secs(60)).unwrap();
    let store = store_with(&pool, &StoreOptions::for_lease(lease)).await;
    for (name, value) in [
        ("statement_timeout", "15s"),
        ("lock_timeout", "3s"),
        ("idle_in_transaction_session_timeout", "15s"),
    ] {
        let shown: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(shown, value, "{name}");
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_claim_blocked_on_a_lock_gives_up_within_the_lock_timeout(pool: PgPool) {
    // A due routine whose occurrence row another session holds locked (a hung settle, say):
    // the claim statement has to wait for it.
    let (due, held) = due_and_held(&PgStore::new(pool.clone()), &pool).await;

    let lock_timeout = Duration::from_millis(300);
    let options = StoreOptions {
        lock_timeout: Some(lock_timeout),
        ..StoreOptions::default()
    };
    let store = store_with(&pool, &options).await;
    let started = Instant::now();
    // Without a lock timeout the claim waits as long as the lock is held: here, for ever.
    let claim = tokio::time::timeout(Duration::from_secs(30), store.claim_due(&params("a")))
        .await
        .expect("the claim kept waiting on the lock");
    let err = claim.expect_err("the claim should have given up");
    assert!(started.elapsed() >= lock_timeout);
    let code = match &err {
        cm_store::StoreError::Database(e) => e.as_database_error().and_then(|d| d.code()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("55P03"), "{err}");
    // It rolled back: the routine's clock did not move, and once the lock is gone the next
    // tick claims it.
    held.rollback().await.unwrap();
    // The failed claim's own rollback runs as its connection goes back to the pool, in the
    // background: until it has, the next claim skips the routine it still holds locked.
    let fires = wait_until(
        "a claim of the routine once the lock is gone",
        PATIENCE,
        async || store.claim_due(&params("a")).await.unwrap().fires,
        |fires| !fires.is_empty(),
    )
    .await;
    assert_eq!(fires.len(), 1);
    assert_eq!(fires[0].occurrence, due);
}
