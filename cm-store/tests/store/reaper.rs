//! The reaper: it takes over exactly the `claimed` rows whose lease ran out, oldest claim first,
//! at most `limit` a pass, each with a new token, a new lease and the next attempt.
//!
//! Concurrent reapers are in `race.rs`.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cm_domain::{ClaimOutcome, FireStatus, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, RoutineKind};
use sqlx::PgPool;

use crate::support::{
    Seed, YEARLY, create, fire_of, jan1, lease_delta, reap_params, seed_fire, token_of,
};

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn only_expired_claims_are_taken_over(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let at = |year| Occurrence::new(routine.id, jan1(year));
    let expired = Seed::claimed(-1.0);
    let expired_third = Seed {
        attempt: 3,
        ..Seed::claimed(-30.0)
    };
    let live = Seed::claimed(30.0);
    seed_fire(&pool, at(2001), &expired).await;
    seed_fire(&pool, at(2002), &expired_third).await;
    seed_fire(&pool, at(2003), &live).await;
    seed_fire(&pool, at(2004), &Seed::settled("fired")).await;
    seed_fire(&pool, at(2005), &Seed::settled("failed")).await;
    let untouched = [
        fire_of(&store, at(2003)).await,
        fire_of(&store, at(2004)).await,
        fire_of(&store, at(2005)).await,
    ];

    let tick = store
        .reap_expired(&reap_params("reaper", 10))
        .await
        .unwrap();
    let got: Vec<_> = tick.fires.iter().map(|f| f.occurrence).collect();
    assert_eq!(got, [at(2001), at(2002)]);
    for (fire, attempt) in tick.fires.iter().zip([2, 4]) {
        let row = &fire.row;
        assert!(!row.inserted);
        assert_eq!(row.status, FireStatus::Claimed);
        assert_eq!(row.claimant, "reaper");
        assert_eq!(row.token, tick.token);
        assert_eq!(row.attempt, attempt);
        assert_eq!(row.lease_expires_at, tick.now + lease_delta());
        assert_eq!(fire.outcome(tick.token), ClaimOutcome::Retry { attempt });
        assert_eq!(fire.routine_name, routine.name);
        assert_eq!(fire.kind, RoutineKind::Message);
        assert_eq!(fire.payload, routine.payload);

        let stored = fire_of(&store, fire.occurrence).await;
        assert_eq!(
            (
                stored.status.as_str(),
                stored.claimant.as_str(),
                stored.attempt
            ),
            ("claimed", "reaper", attempt)
        );
        assert_eq!(stored.claimed_at, tick.now);
        assert_eq!(stored.lease_expires_at, tick.now + lease_delta());
        assert_eq!(token_of(&pool, fire.occurrence).await, tick.token);
    }
    // The live claim and the settled rows are exactly as they were.
    for before in &untouched {
        let occurrence = Occurrence::new(before.routine_id, before.scheduled_at);
        assert_eq!(&fire_of(&store, occurrence).await, before);
    }
    assert_eq!(token_of(&pool, at(2003)).await, live.token);

    // The claims just taken have live leases: a second pass finds nothing.
    let again = store.reap_expired(&reap_params("other", 10)).await.unwrap();
    assert!(again.fires.is_empty(), "{again:?}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_limit_takes_the_oldest_claims_first(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    // The order of the claims (how long ago each was taken) differs from the order of the
    // occurrences, so the test tells the reaper's order from the result's sort.
    let claimed_ago = [
        (2001, 100.0),
        (2002, 500.0),
        (2003, 300.0),
        (2004, 400.0),
        (2005, 200.0),
    ];
    for (year, ago) in claimed_ago {
        let seed = Seed {
            claimed_ago: ago,
            ..Seed::claimed(-1.0)
        };
        seed_fire(&pool, Occurrence::new(routine.id, jan1(year)), &seed).await;
    }
    let years = |fires: &[cm_store::ClaimedFire]| -> BTreeSet<DateTime<Utc>> {
        fires.iter().map(|f| f.occurrence.scheduled_at).collect()
    };
    let expect = |ys: &[i32]| -> BTreeSet<DateTime<Utc>> { ys.iter().map(|y| jan1(*y)).collect() };

    let first = store.reap_expired(&reap_params("r", 2)).await.unwrap();
    assert_eq!(years(&first.fires), expect(&[2002, 2004]));
    let second = store.reap_expired(&reap_params("r", 2)).await.unwrap();
    assert_eq!(years(&second.fires), expect(&[2003, 2005]));
    let third = store.reap_expired(&reap_params("r", 2)).await.unwrap();
    assert_eq!(years(&third.fires), expect(&[2001]));
    let fourth = store.reap_expired(&reap_params("r", 2)).await.unwrap();
    assert!(fourth.fires.is_empty());
    // Every row was taken over exactly once.
    for year in 2001..=2005 {
        let row = fire_of(&store, Occurrence::new(routine.id, jan1(year))).await;
        assert_eq!(row.attempt, 2, "{year}");
    }
}
