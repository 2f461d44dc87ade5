//! The claim statement through real SQL: each outcome (Fresh, Retry, InFlight, Settled) from the
//! row the statement returns, and the routine's clock moving past the occurrence.
//!
//! Each test makes this year's occurrence of a yearly routine due, seeds (or not) its ledger row
//! as another scheduler would have left it, runs `claim_due`, and reads both what the statement
//! returned and what the database now holds.

use chrono::{DateTime, Datelike, Utc};
use cm_domain::{ClaimOutcome, FireStatus, MisfirePolicy, Occurrence};
use cm_store::{ClaimedFire, FireLedger, PgStore, Routine, RoutineKind, RoutineStore, TickClaim};
use sqlx::PgPool;

use crate::support::{
    Seed, db_now, due_yearly, fire_of, jan1, lease_delta, ledger, params, seed_fire, token_of,
};

/// What one claim of a seeded occurrence produced.
struct Claimed {
    tick: TickClaim,
    fire: ClaimedFire,
    before: Routine,
    after: Routine,
    occurrence: Occurrence,
}

/// Makes a yearly routine due at this year's occurrence, writes `seed` as that occurrence's
/// ledger row (when given), and claims as `a`.
async fn claim_seeded(pool: &PgPool, seed: Option<&Seed>) -> Claimed {
    let store = PgStore::new(pool.clone());
    let (before, due) = due_yearly(&store, pool, MisfirePolicy::FireOnce).await;
    let occurrence = Occurrence::new(before.id, due);
    if let Some(seed) = seed {
        seed_fire(pool, occurrence, seed).await;
    }
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 1, "{tick:?}");
    assert_eq!((tick.deferred, tick.skipped), (0, 0));
    assert!(tick.unusable.is_empty());
    let fire = tick.fires[0].clone();
    assert_eq!(fire.occurrence, occurrence);
    let after = store.get_routine(before.id).await.unwrap();
    Claimed {
        tick,
        fire,
        before,
        after,
        occurrence,
    }
}

/// Whatever the outcome, the occurrence is accounted for, so the clock moves on to next year's
/// occurrence in the same transaction, and the routine counts as run by this tick.
fn assert_clock_moved(c: &Claimed) {
    let due = c.occurrence.scheduled_at;
    assert_eq!(c.after.next_run_at, Some(jan1(due.year() + 1)));
    assert_eq!(c.after.last_run_at, Some(c.tick.now));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_new_occurrence_is_fresh(pool: PgPool) {
    let c = claim_seeded(&pool, None).await;
    let row = &c.fire.row;
    assert!(row.inserted);
    assert_eq!(row.status, FireStatus::Claimed);
    assert_eq!(row.claimant, "a");
    assert_eq!(row.token, c.tick.token);
    assert_eq!(row.attempt, 1);
    assert_eq!(row.lease_expires_at, c.tick.now + lease_delta());
    assert_eq!(c.fire.outcome(c.tick.token), ClaimOutcome::Fresh);
    // The dispatch gets the routine's own name, kind and payload.
    assert_eq!(c.fire.routine_name, c.before.name);
    assert_eq!(c.fire.kind, RoutineKind::Message);
    assert_eq!(c.fire.payload, c.before.payload);
    assert_clock_moved(&c);

    let store = PgStore::new(pool.clone());
    let stored = fire_of(&store, c.occurrence).await;
    assert_eq!(
        (
            stored.status.as_str(),
            stored.claimant.as_str(),
            stored.attempt
        ),
        ("claimed", "a", 1)
    );
    assert_eq!(stored.claimed_at, c.tick.now);
    assert_eq!(stored.lease_expires_at, c.tick.now + lease_delta());
    assert_eq!(stored.completed_at, None);
    assert_eq!(token_of(&pool, c.occurrence).await, c.tick.token);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_expired_claim_is_taken_over_as_a_retry(pool: PgPool) {
    let seed = Seed::claimed(-5.0);
    let c = claim_seeded(&pool, Some(&seed)).await;
    let row = &c.fire.row;
    assert!(!row.inserted);
    assert_eq!(row.status, FireStatus::Claimed);
    assert_eq!(row.claimant, "a");
    assert_eq!(row.token, c.tick.token);
    assert_ne!(row.token, seed.token);
    assert_eq!(row.attempt, 2);
    assert_eq!(row.lease_expires_at, c.tick.now + lease_delta());
    assert_eq!(
        c.fire.outcome(c.tick.token),
        ClaimOutcome::Retry { attempt: 2 }
    );
    // The crashed claimant's token no longer names the row.
    assert!(matches!(
        c.fire.outcome(seed.token),
        ClaimOutcome::InFlight { .. }
    ));
    assert_clock_moved(&c);

    let store = PgStore::new(pool.clone());
    let stored = fire_of(&store, c.occurrence).await;
    assert_eq!((stored.claimant.as_str(), stored.attempt), ("a", 2));
    assert_eq!(stored.claimed_at, c.tick.now);
    assert_eq!(token_of(&pool, c.occurrence).await, c.tick.token);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_live_claim_of_another_scheduler_is_in_flight(pool: PgPool) {
    let seed = Seed::claimed(300.0);
    let c = claim_seeded(&pool, Some(&seed)).await;
    let store = PgStore::new(pool.clone());
    let stored = fire_of(&store, c.occurrence).await;
    let row = &c.fire.row;
    // The row comes back exactly as the other scheduler holds it.
    assert!(!row.inserted);
    assert_eq!(row.status, FireStatus::Claimed);
    assert_eq!(row.claimant, "other");
    assert_eq!(row.token, seed.token);
    assert_eq!(row.attempt, 1);
    assert_eq!(row.lease_expires_at, stored.lease_expires_at);
    assert!(stored.lease_expires_at > c.tick.now);
    assert_eq!(
        c.fire.outcome(c.tick.token),
        ClaimOutcome::InFlight {
            claimant: "other".into(),
            lease_expires_at: stored.lease_expires_at,
        }
    );
    // And the database still holds it unchanged: not taken over, not restarted.
    assert_eq!((stored.claimant.as_str(), stored.attempt), ("other", 1));
    assert!(stored.claimed_at < c.tick.now);
    assert_eq!(token_of(&pool, c.occurrence).await, seed.token);
    assert_clock_moved(&c);
}

/// A settled row comes back unchanged as Settled, moves the clock, and is never taken over,
/// although its lease ran out long ago.
async fn check_settled(pool: PgPool, status: &'static str, expected: FireStatus) {
    let seed = Seed::settled(status);
    let store = PgStore::new(pool.clone());
    let c = claim_seeded(&pool, Some(&seed)).await;
    let row = &c.fire.row;
    assert!(!row.inserted);
    assert_eq!(row.status, expected);
    assert_eq!(row.claimant, "other");
    assert_eq!(row.token, seed.token);
    assert_eq!(row.attempt, 1);
    assert_eq!(
        c.fire.outcome(c.tick.token),
        ClaimOutcome::Settled(expected)
    );
    assert_clock_moved(&c);

    let before = fire_of(&store, c.occurrence).await;
    // Claim the same occurrence once more (a manual trigger, or a clock set back): still
    // settled, still the same row.
    crate::support::set_next_run(&pool, c.occurrence.routine_id, c.occurrence.scheduled_at).await;
    let again = store.claim_due(&params("b")).await.unwrap();
    assert_eq!(again.fires.len(), 1);
    assert_eq!(
        again.fires[0].outcome(again.token),
        ClaimOutcome::Settled(expected)
    );
    let after = fire_of(&store, c.occurrence).await;
    assert_eq!(after, before);
    assert_eq!(after.status, status);
    assert_eq!(after.claimant, "other");
    assert_eq!(
        after.error.as_deref(),
        (status == "failed").then_some("seeded failure")
    );
    assert!(after.completed_at.is_some());
    assert_eq!(token_of(&pool, c.occurrence).await, seed.token);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_fired_occurrence_is_settled(pool: PgPool) {
    check_settled(pool, "fired", FireStatus::Fired).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_failed_occurrence_is_settled(pool: PgPool) {
    check_settled(pool, "failed", FireStatus::Failed).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn nothing_due_claims_nothing(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // A fresh routine's first run is in the future.
    let routine =
        crate::support::create(&store, crate::support::YEARLY, MisfirePolicy::FireOnce).await;
    let next: DateTime<Utc> = routine.next_run_at.unwrap();
    assert!(next > db_now(&pool).await);
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert!(tick.fires.is_empty());
    assert_eq!((tick.deferred, tick.skipped), (0, 0));
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!(after.next_run_at, Some(next));
    assert_eq!(after.last_run_at, None);
    assert!(ledger(&store, routine.id).await.is_empty());
}
