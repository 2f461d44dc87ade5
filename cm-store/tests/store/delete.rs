//! Deleting a routine while a tick claims it: the two take their locks in one order, so neither
//! waits for the other in a cycle, and both finish.

use std::time::Duration;

use cm_domain::{ClaimOutcome, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, RoutineStore, StoreError};
use sqlx::PgPool;

use crate::support::{YEARLY, create, due_and_held, fire_count, params};

/// Waits until `n` sessions of this database wait on a lock.
async fn lock_waiters(pool: &PgPool, n: i64) {
    for _ in 0..600 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} sessions never waited on a lock");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn deleting_a_routine_while_a_tick_claims_its_request_does_not_deadlock(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // `doomed` has a request waiting (a manual trigger); `busy` is due, and its occurrence's
    // row is held by another session, so the claim stops there, after taking the request and
    // before inserting the requested occurrence's row.
    let doomed = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let requested = store.trigger_routine(doomed.id).await.unwrap();
    let (busy_at, held) = due_and_held(&store, &pool).await;

    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim_due(&params("a")).await }
    });
    lock_waiters(&pool, 1).await;
    let delete = tokio::spawn({
        let store = store.clone();
        async move { store.delete_routine(doomed.id).await }
    });
    lock_waiters(&pool, 2).await;
    held.rollback().await.unwrap();

    let within = Duration::from_secs(30);
    let claim = tokio::time::timeout(within, claim).await.unwrap().unwrap();
    let delete = tokio::time::timeout(within, delete).await.unwrap().unwrap();
    // Before the lock order, one of the two failed with "deadlock detected" (40P01).
    let claim = claim.expect("the claim failed");
    delete.expect("the delete failed");
    // Oldest occurrence first: the busy routine's (in flight elsewhere), then the request.
    assert_eq!(claim.fires.len(), 2, "{claim:?}");
    assert_eq!(claim.fires[0].occurrence, busy_at);
    assert!(matches!(
        claim.fires[0].outcome(claim.token),
        ClaimOutcome::InFlight { .. }
    ));
    assert_eq!(
        claim.fires[1].occurrence,
        Occurrence::new(doomed.id, requested)
    );
    assert_eq!(claim.fires[1].outcome(claim.token), ClaimOutcome::Fresh);
    assert!(matches!(
        store.get_routine(doomed.id).await,
        Err(StoreError::RoutineNotFound(_))
    ));
    // The doomed routine's fire went with it; the busy routine's row stays.
    assert_eq!(fire_count(&pool).await, 1);
}
