//! Concurrency: two schedulers on separate connection pools racing for the same occurrences.
//!
//! Each race runs the two calls at once with `tokio::join!`; each store has its own pool, so
//! the two statements really run concurrently in the database. Races are repeated with fresh
//! rows, since any one round may happen to run the two calls one after the other.

use std::collections::BTreeSet;

use chrono::Datelike;
use cm_domain::{ClaimOutcome, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, RoutineStore, TickClaim};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::{
    Seed, YEARLY, create, due_yearly, fire_of, jan1, params, reap_params, seed_fire, token_of,
};

const ROUNDS: usize = 50;

/// Two stores on two pools of the test's database, as two scheduler processes would be.
async fn two_schedulers(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) -> (PgPool, PgPool, PgStore, PgStore) {
    let pool_a = pool_opts
        .clone()
        .connect_with(connect.clone())
        .await
        .unwrap();
    let pool_b = pool_opts.connect_with(connect).await.unwrap();
    let (a, b) = (PgStore::new(pool_a.clone()), PgStore::new(pool_b.clone()));
    (pool_a, pool_b, a, b)
}

/// The outcomes a claim reported for `occurrence`, as (claimant, outcome) pairs.
fn outcomes_for(
    claimant: &'static str,
    tick: &TickClaim,
    occurrence: Occurrence,
) -> Vec<(&'static str, ClaimOutcome)> {
    tick.fires
        .iter()
        .filter(|f| f.occurrence == occurrence)
        .map(|f| (claimant, f.outcome(tick.token)))
        .collect()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn two_schedulers_never_both_claim_an_occurrence(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool_a, pool_b, a, b) = two_schedulers(pool_opts, connect).await;
    for round in 0..ROUNDS {
        let (routine, due) = due_yearly(&a, &pool_a, MisfirePolicy::FireOnce).await;
        let occurrence = Occurrence::new(routine.id, due);
        let (pa, pb) = (params("a"), params("b"));
        let (ta, tb) = tokio::join!(a.claim_due(&pa), b.claim_due(&pb));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        // Earlier rounds' routines are not due any more: each tick sees this round's or nothing.
        for tick in [&ta, &tb] {
            assert!(
                tick.fires.iter().all(|f| f.occurrence == occurrence),
                "round {round}: {tick:?}"
            );
        }
        let mut seen = outcomes_for("a", &ta, occurrence);
        seen.extend(outcomes_for("b", &tb, occurrence));
        let fresh: Vec<_> = seen
            .iter()
            .filter(|(_, o)| *o == ClaimOutcome::Fresh)
            .map(|(c, _)| *c)
            .collect();
        assert_eq!(fresh.len(), 1, "round {round}: {seen:?}");
        // The loser either never saw the routine (it was locked, or already moved on) or saw the
        // winner's live claim.
        assert!(
            seen.iter()
                .all(|(_, o)| matches!(o, ClaimOutcome::Fresh | ClaimOutcome::InFlight { .. })),
            "round {round}: {seen:?}"
        );
        let row = fire_of(&a, occurrence).await;
        assert_eq!((row.claimant.as_str(), row.attempt), (fresh[0], 1));
        let after = a.get_routine(routine.id).await.unwrap();
        assert_eq!(after.next_run_at, Some(jan1(due.year() + 1)));
    }
    pool_a.close().await;
    pool_b.close().await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn two_reapers_never_take_the_same_row(pool_opts: PgPoolOptions, connect: PgConnectOptions) {
    let (pool_a, pool_b, a, b) = two_schedulers(pool_opts, connect).await;
    let routine = create(&a, YEARLY, MisfirePolicy::FireOnce).await;
    for round in 0..ROUNDS {
        // One crashed claim per round; earlier rounds' rows now hold live leases.
        let year = 1900 + i32::try_from(round).unwrap();
        let occurrence = Occurrence::new(routine.id, jan1(year));
        seed_fire(&pool_a, occurrence, &Seed::claimed(-1.0)).await;
        let (pa, pb) = (reap_params("a", 10), reap_params("b", 10));
        let (ta, tb) = tokio::join!(a.reap_expired(&pa), b.reap_expired(&pb));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        let mut seen = outcomes_for("a", &ta, occurrence);
        seen.extend(outcomes_for("b", &tb, occurrence));
        assert_eq!(seen.len(), 1, "round {round}: {seen:?}");
        let (winner, outcome) = &seen[0];
        assert_eq!(*outcome, ClaimOutcome::Retry { attempt: 2 });
        let row = fire_of(&a, occurrence).await;
        assert_eq!((row.claimant.as_str(), row.attempt), (*winner, 2));
        let token = if *winner == "a" { ta.token } else { tb.token };
        assert_eq!(token_of(&pool_a, occurrence).await, token);
    }
    pool_a.close().await;
    pool_b.close().await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_claim_and_a_reaper_never_both_take_over_a_row(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (pool_a, pool_b, a, b) = two_schedulers(pool_opts, connect).await;
    for round in 0..ROUNDS {
        // The routine is due at an occurrence whose claim crashed: the tick's claim statement
        // and the reaper both find it expired. The routine's lock does not protect the row here,
        // since the reaper never touches `routines`; only the row itself decides.
        let (routine, due) = due_yearly(&a, &pool_a, MisfirePolicy::FireOnce).await;
        let occurrence = Occurrence::new(routine.id, due);
        seed_fire(&pool_a, occurrence, &Seed::claimed(-1.0)).await;
        let (pa, pb) = (params("a"), reap_params("b", 10));
        let (ta, tb) = tokio::join!(a.claim_due(&pa), b.reap_expired(&pb));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        let mut seen = outcomes_for("a", &ta, occurrence);
        seen.extend(outcomes_for("b", &tb, occurrence));
        let retries: Vec<_> = seen
            .iter()
            .filter(|(_, o)| matches!(o, ClaimOutcome::Retry { .. }))
            .collect();
        assert_eq!(retries.len(), 1, "round {round}: {seen:?}");
        assert_eq!(retries[0].1, ClaimOutcome::Retry { attempt: 2 });
        // The tick always returns the row (the routine was due); if it lost, it saw the
        // reaper's live claim.
        assert!(
            seen.iter().all(|(_, o)| matches!(
                o,
                ClaimOutcome::Retry { .. } | ClaimOutcome::InFlight { .. }
            )),
            "round {round}: {seen:?}"
        );
        let row = fire_of(&a, occurrence).await;
        assert_eq!((row.claimant.as_str(), row.attempt), (retries[0].0, 2));
    }
    pool_a.close().await;
    pool_b.close().await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn concurrent_reapers_split_the_expired_rows(
    pool_opts: PgPoolOptions,
    connect: PgConnectOptions,
) {
    const ROWS: i32 = 20;
    let (pool_a, pool_b, a, b) = two_schedulers(pool_opts, connect).await;
    for round in 0..10 {
        let routine = create(&a, YEARLY, MisfirePolicy::FireOnce).await;
        let all: BTreeSet<Occurrence> = (0..ROWS)
            .map(|i| Occurrence::new(routine.id, jan1(2000 + i)))
            .collect();
        for occurrence in &all {
            seed_fire(&pool_a, *occurrence, &Seed::claimed(-1.0)).await;
        }
        // Neither limit covers every row alone, so both reapers are needed to take them all.
        let (pa, pb) = (reap_params("a", 12), reap_params("b", 12));
        let (ta, tb) = tokio::join!(a.reap_expired(&pa), b.reap_expired(&pb));
        let (ta, tb) = (ta.unwrap(), tb.unwrap());
        let took = |tick: &TickClaim| -> BTreeSet<Occurrence> {
            tick.fires
                .iter()
                .map(|f| f.occurrence)
                .filter(|o| o.routine_id == routine.id)
                .collect()
        };
        let (by_a, by_b) = (took(&ta), took(&tb));
        assert!(by_a.len() <= 12 && by_b.len() <= 12, "round {round}");
        let both: Vec<_> = by_a.intersection(&by_b).collect();
        assert!(both.is_empty(), "round {round}: both reapers took {both:?}");
        let missed: Vec<_> = all
            .iter()
            .filter(|o| !by_a.contains(o) && !by_b.contains(o))
            .collect();
        assert!(
            missed.is_empty(),
            "round {round}: no reaper took {missed:?}"
        );
        for occurrence in &all {
            assert_eq!(fire_of(&a, *occurrence).await.attempt, 2, "round {round}");
        }
    }
    pool_a.close().await;
    pool_b.close().await;
}
