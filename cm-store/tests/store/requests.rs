//! Manual triggers and backfills: asked-for occurrences are claimed by the next tick through the
//! same ledger, with a guaranteed share of the cap, and never fire a settled slot again.

use chrono::TimeDelta;
use cm_domain::{ClaimOutcome, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, RoutineStore, StoreError};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    Seed, YEARLY, claim_params, create, db_now, fire_count, params, rules, seed_fire,
};

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_trigger_is_claimed_fresh_by_the_next_tick(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let at = store.trigger_routine(routine.id).await.unwrap();
    assert!(at <= db_now(&pool).await);

    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 1);
    let fire = &claim.fires[0];
    assert_eq!(fire.occurrence, Occurrence::new(routine.id, at));
    assert_eq!(fire.outcome(claim.token), ClaimOutcome::Fresh);
    // The request is consumed with its claim: a second tick finds nothing.
    assert!(
        store
            .claim_due(&params("b"))
            .await
            .unwrap()
            .fires
            .is_empty()
    );
    // The routine's own clock is untouched by a manual trigger.
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!(after.next_run_at, routine.next_run_at);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_paused_routine_can_be_triggered(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    store.set_routine_paused(routine.id, true).await.unwrap();
    store.trigger_routine(routine.id).await.unwrap();
    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 1);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_backfill_skips_slots_the_ledger_holds(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let now = db_now(&pool).await;
    let slots: Vec<_> = (1..=4).map(|h| now - TimeDelta::hours(h)).collect();
    // The oldest slot was already fired.
    seed_fire(
        &pool,
        Occurrence::new(routine.id, slots[3]),
        &Seed::settled("fired"),
    )
    .await;

    assert_eq!(
        store.request_occurrences(routine.id, &slots).await.unwrap(),
        3
    );
    // Asking again asks for nothing new.
    assert_eq!(
        store.request_occurrences(routine.id, &slots).await.unwrap(),
        0
    );

    let claim = store.claim_due(&params("a")).await.unwrap();
    let mut claimed: Vec<_> = claim
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    claimed.sort();
    let mut want = slots[..3].to_vec();
    want.sort();
    assert_eq!(
        claimed, want,
        "claimed oldest first, the fired slot left alone"
    );
    assert!(
        claim
            .fires
            .iter()
            .all(|f| f.outcome(claim.token) == ClaimOutcome::Fresh)
    );
    assert_eq!(fire_count(&pool).await, 4);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_request_for_a_slot_settled_meanwhile_is_not_fired_again(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let slot = db_now(&pool).await - TimeDelta::hours(1);
    assert_eq!(
        store
            .request_occurrences(routine.id, &[slot])
            .await
            .unwrap(),
        1
    );
    // Settled by someone after the request was made (a racing scheduler).
    seed_fire(
        &pool,
        Occurrence::new(routine.id, slot),
        &Seed::settled("failed"),
    )
    .await;

    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 1);
    assert!(matches!(
        claim.fires[0].outcome(claim.token),
        ClaimOutcome::Settled(_)
    ));
}

/// A sustained backlog of scheduled work must not starve a trigger: requests get a fifth of the
/// cap (at least one) before the scheduled occurrences, and the rest of the cap stays theirs.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn requests_get_a_share_of_the_cap_under_a_backlog(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let now = db_now(&pool).await;
    // Ten routines, each owing years of occurrences: far more than any tick's cap.
    for i in 0..10 {
        let routine = crate::support::create_named(
            &store,
            &format!("busy {i}"),
            YEARLY,
            MisfirePolicy::CatchUp,
        )
        .await;
        crate::support::set_next_run(&pool, routine.id, crate::support::jan1(2000)).await;
    }
    let asked = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let slots: Vec<_> = (1..=3).map(|m| now - TimeDelta::minutes(m)).collect();
    store.request_occurrences(asked.id, &slots).await.unwrap();

    // (cap, requests claimed by the tick): a fifth of the cap, at least one.
    for (cap, share) in [(10, 2), (4, 1)] {
        let claim = store
            .claim_due(&claim_params("a", cap, rules(u64::MAX / 4, 1000)))
            .await
            .unwrap();
        assert_eq!(claim.fires.len(), cap, "cap {cap}");
        let requested = claim
            .fires
            .iter()
            .filter(|f| f.occurrence.routine_id == asked.id)
            .count();
        assert_eq!(requested, share, "cap {cap}");
        assert!(claim.deferred > 0, "the backlog is still there");
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn requests_fill_the_cap_when_nothing_else_is_due(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let now = db_now(&pool).await;
    let slots: Vec<_> = (1..=5).map(|m| now - TimeDelta::minutes(m)).collect();
    store.request_occurrences(routine.id, &slots).await.unwrap();

    let mut seen = Vec::new();
    for expected in [2, 2, 1, 0] {
        let claim = store
            .claim_due(&claim_params("a", 2, rules(0, 100)))
            .await
            .unwrap();
        assert_eq!(claim.fires.len(), expected);
        seen.extend(claim.fires.iter().map(|f| f.occurrence.scheduled_at));
    }
    let mut want = slots.clone();
    want.sort();
    assert_eq!(seen, want, "oldest first, each once");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn requests_for_a_missing_routine_are_refused(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let missing = Uuid::new_v4();
    assert!(
        matches!(store.trigger_routine(missing).await, Err(StoreError::RoutineNotFound(id)) if id == missing)
    );
    let now = db_now(&pool).await;
    assert!(matches!(
        store.request_occurrences(missing, &[now]).await,
        Err(StoreError::RoutineNotFound(_))
    ));
}
