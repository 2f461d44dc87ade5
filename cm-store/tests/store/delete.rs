//! Deleting a routine while a tick claims it: the two take their locks in one order, so neither
//! waits for the other in a cycle, and both finish; and the delete takes every row the claim
//! wrote for the routine with it (the ledger has no foreign key: the routine's lock is what keeps
//! a fire from outliving its routine).

use std::time::Duration;

use cm_domain::{ClaimOutcome, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, RoutineStore, StoreError, TickClaim};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{YEARLY, create, due_and_held, due_yearly, fire_count, lock_waiters, params};

/// Starts a claim that stops on the row `held` holds, then a delete of `doomed` once the claim
/// waits, then lets the claim go once the delete waits too; returns what each did, within 30 s.
async fn claim_then_delete(
    store: &PgStore,
    pool: &PgPool,
    doomed: Uuid,
    held: sqlx::Transaction<'static, sqlx::Postgres>,
) -> (Result<TickClaim, StoreError>, Result<(), StoreError>) {
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim_due(&params("a")).await }
    });
    lock_waiters(pool, 1).await;
    let delete = tokio::spawn({
        let store = store.clone();
        async move { store.delete_routine(doomed).await }
    });
    lock_waiters(pool, 2).await;
    held.rollback().await.unwrap();

    let within = Duration::from_secs(30);
    let claim = tokio::time::timeout(within, claim).await.unwrap().unwrap();
    let delete = tokio::time::timeout(within, delete).await.unwrap().unwrap();
    (claim, delete)
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

    let (claim, delete) = claim_then_delete(&store, &pool, doomed.id, held).await;
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

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn deleting_a_routine_a_tick_has_locked_takes_the_fire_the_tick_wrote(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // `doomed` is due on its schedule; `busy` is due too, its occurrence's row held by another
    // session, so the claim locks both routines and then waits on `busy`'s row before it can
    // write its fires and commit, holding `doomed` locked all the while.
    let (doomed, doomed_at) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let (busy_at, held) = due_and_held(&store, &pool).await;

    let (claim, delete) = claim_then_delete(&store, &pool, doomed.id, held).await;
    let claim = claim.expect("the claim failed");
    delete.expect("the delete failed");
    // The claim committed `doomed`'s fire before the delete could lock the routine ...
    let doomed_fire = claim
        .fires
        .iter()
        .find(|f| f.occurrence == Occurrence::new(doomed.id, doomed_at))
        .expect("the claim wrote the doomed routine's occurrence");
    assert_eq!(doomed_fire.outcome(claim.token), ClaimOutcome::Fresh);
    assert!(claim.fires.iter().any(|f| f.occurrence == busy_at));
    // ... and the delete, which waited for it, took that fire with the routine.
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1")
            .bind(doomed.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(left, 0, "a fire outlived its deleted routine");
    assert_eq!(fire_count(&pool).await, 1);
}
