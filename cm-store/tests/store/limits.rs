//! Concurrency keys: the occurrences of routines sharing a limited key take its places, under
//! the key's lock, oldest first and in turns between routines; what finds no place waits,
//! owed (a clock kept, a request put back), and is never skipped for the limit. A place is held
//! by a claimed fire (an expired claim included: it is the reaper's to take over) and by a
//! running run.

use chrono::{DateTime, TimeDelta, Utc};
use cm_domain::{ConcurrencyKey, MisfirePolicy};
use cm_store::{FireLedger, LimitStore, PgStore, RoutineStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    EVERY_MINUTE, claim_params, db_now, lock_waiters, message, minute_floor, minutes, rules,
    set_next_run,
};

fn key(text: &str) -> ConcurrencyKey {
    text.parse().unwrap()
}

/// An every-minute message routine on `key`, under `policy`, whose clock is `behind` minutes
/// back. Returns it and its oldest owed minute.
async fn keyed(
    store: &PgStore,
    pool: &PgPool,
    on: Option<&str>,
    policy: MisfirePolicy,
    behind: i64,
) -> (Uuid, DateTime<Utc>) {
    let name = format!("keyed {}", Uuid::new_v4().simple());
    let routine = store
        .create_routine(
            message(&name, EVERY_MINUTE)
                .into_builder()
                .misfire(policy)
                .concurrency_key(on.map(key))
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(routine.concurrency_key.as_ref().map(|k| k.as_str()), on);
    let oldest = minute_floor(db_now(pool).await) - TimeDelta::minutes(behind);
    set_next_run(pool, routine.id, oldest).await;
    (routine.id, oldest)
}

/// Every claimed fire settled `fired`: their places free.
async fn settle_all(pool: &PgPool) {
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'fired', completed_at = now()
         WHERE status = 'claimed'",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// The fires claimed now of routines on `key`.
async fn claimed_on(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires f
         JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
         WHERE r.concurrency_key = $1 AND f.status = 'claimed'",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn next_run(store: &PgStore, id: Uuid) -> Option<DateTime<Utc>> {
    store.get_routine(id).await.unwrap().next_run_at
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_full_key_claims_no_more_and_what_waits_takes_turns_oldest_first(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let params = claim_params("a", 100, rules(3600, 100));
    assert!(store.set_concurrency_limit(&key("gpu"), 2).await.unwrap());
    let mut routines = Vec::new();
    for _ in 0..3 {
        routines.push(keyed(&store, &pool, Some("gpu"), MisfirePolicy::CatchUp, 2).await);
    }
    routines.sort();
    let oldest = routines[0].1;
    let (free, _) = keyed(&store, &pool, None, MisfirePolicy::CatchUp, 2).await;

    // Two places: the first two routines (by id, all owing the same minutes) take one each,
    // their oldest; the third waits with its clock kept; the routine without a key takes all
    // it owes.
    let tick = store.claim_due(&params).await.unwrap();
    let owed = minutes(oldest, tick.now).len();
    let of = |id: Uuid| {
        tick.fires
            .iter()
            .filter(|f| f.occurrence.routine_id == id)
            .map(|f| f.occurrence.scheduled_at)
            .collect::<Vec<_>>()
    };
    assert_eq!(of(routines[0].0), [oldest]);
    assert_eq!(of(routines[1].0), [oldest]);
    assert!(of(routines[2].0).is_empty());
    assert_eq!(of(free).len(), owed);
    assert_eq!(next_run(&store, routines[2].0).await, Some(oldest));
    assert_eq!(
        next_run(&store, routines[0].0).await,
        Some(oldest + TimeDelta::minutes(1))
    );
    assert_eq!(claimed_on(&pool, "gpu").await, 2);

    // Full: nothing more of the key, however often claimed.
    for _ in 0..3 {
        let tick = store.claim_due(&params).await.unwrap();
        assert!(
            tick.fires.iter().all(|f| f.occurrence.routine_id == free),
            "{tick:?}"
        );
    }
    assert_eq!(claimed_on(&pool, "gpu").await, 2);

    // Two places free: the oldest waiting occurrence first (the third routine's, which waited
    // longest), then the next in turn.
    // A new store from here on, after each settling by hand: a store keeps the keys it read
    // for half a second, and the full key read above would leave the waiting routines be.
    settle_all(&pool).await;
    let tick = PgStore::new(pool.clone()).claim_due(&params).await.unwrap();
    let keyed_fires: Vec<_> = tick
        .fires
        .iter()
        .filter(|f| f.occurrence.routine_id != free)
        .map(|f| f.occurrence)
        .collect();
    assert_eq!(keyed_fires.len(), 2, "{keyed_fires:?}");
    assert!(
        keyed_fires.contains(&cm_domain::Occurrence::new(routines[2].0, oldest)),
        "{keyed_fires:?}"
    );

    // Until every owed minute of every routine is claimed once: nothing skipped, nothing twice.
    for _ in 0..20 {
        settle_all(&pool).await;
        PgStore::new(pool.clone()).claim_due(&params).await.unwrap();
    }
    settle_all(&pool).await;
    for (id, from) in &routines {
        let at: Vec<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT scheduled_at FROM cm.routine_fires WHERE routine_id = $1 ORDER BY 1",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(at[..owed], minutes(*from, tick.now)[..], "routine {id}");
    }

    // Deleted, the limit holds no one back.
    assert!(store.delete_concurrency_limit(&key("gpu")).await.unwrap());
    assert!(!store.delete_concurrency_limit(&key("gpu")).await.unwrap());
}

/// Two claims at once on a key with one place left: one takes it, the other none, round after
/// round.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn two_claims_at_once_never_both_take_the_last_place(pool: PgPool) {
    let a = PgStore::new(pool.clone());
    let options = (*pool.connect_options()).clone();
    let b_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    a.set_concurrency_limit(&key("tenant:acme"), 1)
        .await
        .unwrap();
    for _ in 0..8 {
        keyed(&a, &pool, Some("tenant:acme"), MisfirePolicy::CatchUp, 5).await;
    }
    // Each claim walks four routines: the two walks lock different ones, as two schedulers'
    // do when many are due.
    let (pa, pb) = (
        cm_store::ClaimDueParams {
            max_routines: 4,
            ..claim_params("a", 100, rules(3600, 100))
        },
        cm_store::ClaimDueParams {
            max_routines: 4,
            ..claim_params("b", 100, rules(3600, 100))
        },
    );
    let mut total = 0;
    for round in 0..12 {
        // Both claims held at their first read of the limits, then let go together: they walk
        // and count at the same moment. Each round's stores are new: a store keeps the keys it
        // read for half a second, and the last round's "full" would let both claims skip the
        // read, and the walk, of a place this round frees.
        let (a, b) = (PgStore::new(pool.clone()), PgStore::new(b_pool.clone()));
        let mut gate = pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE cm.concurrency_limits IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *gate)
            .await
            .unwrap();
        let (x, y, ()) = tokio::join!(a.claim_due(&pa), b.claim_due(&pb), async {
            lock_waiters(&pool, 2).await;
            gate.commit().await.unwrap();
        });
        let n = x.unwrap().fires.len() + y.unwrap().fires.len();
        assert_eq!(n, 1, "round {round}: {n} claimed on a key of one place");
        assert_eq!(claimed_on(&pool, "tenant:acme").await, 1);
        total += n;
        settle_all(&pool).await;
    }
    assert_eq!(total, 12);
}

/// A claim left by a crashed scheduler (its lease run out) keeps its place until it settles,
/// as a running run does; then the place is taken again, by the routine that has not run
/// before the one that has, both owing the same minute.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_expired_claim_and_a_running_run_hold_their_places(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let params = claim_params("a", 100, rules(3600, 100));
    store.set_concurrency_limit(&key("k"), 1).await.unwrap();
    let (first, _) = keyed(&store, &pool, Some("k"), MisfirePolicy::FireOnce, 1).await;
    let (second, _) = keyed(&store, &pool, Some("k"), MisfirePolicy::FireOnce, 0).await;
    let tick = store.claim_due(&params).await.unwrap();
    assert_eq!(tick.fires.len(), 1);
    assert_eq!(tick.fires[0].occurrence.routine_id, first);

    sqlx::query("UPDATE cm.routine_fires SET lease_expires_at = now() - interval '1 minute'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(store.claim_due(&params).await.unwrap().fires.is_empty());

    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'fired', completed_at = now(), holds_run = true,
                run_state = 'running'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert!(store.claim_due(&params).await.unwrap().fires.is_empty());
    let listed = store.list_concurrency_limits().await.unwrap();
    assert_eq!(
        (
            listed[0].key.as_str(),
            listed[0].max_running,
            listed[0].running,
            listed[0].routines
        ),
        ("k", 1, 1, 2)
    );

    sqlx::query("UPDATE cm.routine_fires SET run_state = 'succeeded'")
        .execute(&pool)
        .await
        .unwrap();
    let tick = store.claim_due(&params).await.unwrap();
    assert_eq!(tick.fires.len(), 1);
    assert_eq!(tick.fires[0].occurrence.routine_id, second);
}

/// A trigger of a routine whose key is full stays asked for, and is claimed once a place frees.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_request_over_the_limit_stays_asked_for(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let params = claim_params("a", 100, rules(3600, 100));
    store.set_concurrency_limit(&key("k"), 1).await.unwrap();
    let (busy, _) = keyed(&store, &pool, Some("k"), MisfirePolicy::FireOnce, 0).await;
    let (asked, _) = keyed(&store, &pool, Some("k"), MisfirePolicy::FireOnce, 0).await;
    set_next_run(&pool, asked, db_now(&pool).await + TimeDelta::days(1)).await;
    let tick = store.claim_due(&params).await.unwrap();
    assert_eq!(tick.fires.len(), 1);
    assert_eq!(tick.fires[0].occurrence.routine_id, busy);

    let at = store.trigger_routine(asked).await.unwrap();
    for _ in 0..2 {
        assert!(store.claim_due(&params).await.unwrap().fires.is_empty());
    }
    // Still asked for, as a trigger: a request put back keeps when it was asked for.
    let pending: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT scheduled_at, requested_at FROM cm.routine_requests WHERE routine_id = $1",
    )
    .bind(asked)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(pending, [(at, at)]);

    settle_all(&pool).await;
    // The busy routine's next minute may be due as well: the trigger is older, so it goes first.
    // A new store: this one may have read the key full within the half second it keeps that.
    let tick = PgStore::new(pool.clone()).claim_due(&params).await.unwrap();
    assert_eq!(tick.fires.len(), 1, "{tick:?}");
    assert_eq!(
        tick.fires[0].occurrence,
        cm_domain::Occurrence::new(asked, at)
    );
}

/// A routine whose misfire policy skips late occurrences, waiting on a key of no places (limit
/// 0) for minutes: once the limit allows it, every minute it waited through is claimed, none
/// skipped for the limit.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn what_waits_on_its_key_is_owed_not_skipped(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let strict = claim_params("a", 100, rules(0, 100));
    store.set_concurrency_limit(&key("k"), 0).await.unwrap();
    let (id, oldest) = keyed(&store, &pool, Some("k"), MisfirePolicy::Skip, 0).await;
    // Its minute is owed (within a grace), and waits.
    let tick = store
        .claim_due(&claim_params("a", 100, rules(3600, 100)))
        .await
        .unwrap();
    assert!(tick.fires.is_empty());
    assert_eq!(tick.held, 1);
    assert_eq!(next_run(&store, id).await, Some(oldest));

    // Minutes pass while it waits (its clock set back, as the minutes would have passed).
    let waited = oldest - TimeDelta::minutes(4);
    sqlx::query("UPDATE cm.routines SET next_run_at = $2 WHERE id = $1")
        .bind(id)
        .bind(waited)
        .execute(&pool)
        .await
        .unwrap();
    assert!(store.claim_due(&strict).await.unwrap().fires.is_empty());

    store.set_concurrency_limit(&key("k"), 100).await.unwrap();
    let tick = store.claim_due(&strict).await.unwrap();
    let at: Vec<_> = tick
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    assert_eq!(
        at,
        minutes(waited, tick.now),
        "every minute it waited through"
    );
    assert!(
        !sqlx::query_scalar::<_, bool>("SELECT key_wait FROM cm.routines WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    );
}

/// A key whose routines are in several groups, claimed group by group by two schedulers at
/// once (as on Citus, where each claim is one group's): one place, one claim, round after
/// round. `pool` is a pool on `store`'s database.
pub(crate) async fn one_place_across_groups(store: &PgStore, pool: &PgPool) {
    // Each claim holds a connection while it waits for the key's lock: two pools of their own,
    // one connection per claim.
    let wide = async || {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(40)
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap()
    };
    let (pool_a, pool_b) = (wide().await, wide().await);
    store.set_concurrency_limit(&key("span"), 1).await.unwrap();
    let count = store.group_count().await.unwrap();
    let mut groups = Vec::new();
    for _ in 0..6 {
        let (id, _) = keyed(store, pool, Some("span"), MisfirePolicy::CatchUp, 3).await;
        groups.push(cm_store::group_of(id, count));
    }
    groups.sort_unstable();
    groups.dedup();
    assert!(
        groups.len() > 1,
        "the routines landed in one group: {groups:?}"
    );
    for round in 0..6 {
        // Each round's stores are new: a store keeps the keys it read for half a second, and
        // the last round's "full" would leave this round's place untaken.
        let (store_a, other) = (PgStore::new(pool_a.clone()), PgStore::new(pool_b.clone()));
        let mut claims = tokio::task::JoinSet::new();
        for (i, group) in groups.iter().enumerate() {
            for (claimant, s) in [("a", store_a.clone()), ("b", other.clone())] {
                let params = cm_store::ClaimDueParams {
                    group: Some(*group),
                    ..claim_params(&format!("{claimant}{i}"), 100, rules(3600, 100))
                };
                claims.spawn(async move { s.claim_due(&params).await.unwrap().fires.len() });
            }
        }
        let total: usize = claims.join_all().await.into_iter().sum();
        assert_eq!(
            total, 1,
            "round {round}: {total} claimed on a key of one place"
        );
        assert_eq!(claimed_on(pool, "span").await, 1);
        settle_all(pool).await;
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn one_place_is_one_claim_across_groups(pool: PgPool) {
    one_place_across_groups(&PgStore::new(pool.clone()), &pool).await;
}

/// With the outbox written in the claim, a place is free again once the claim commits: a claim
/// that held occurrences back says more is due, and the next takes the next place at once.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn places_settled_in_the_claim_free_for_the_next_claim_at_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let params = cm_store::ClaimDueParams {
        rules: rules(3600, 100),
        ..crate::support::outbox_params("a")
    };
    store.set_concurrency_limit(&key("k"), 1).await.unwrap();
    for _ in 0..3 {
        keyed(&store, &pool, Some("k"), MisfirePolicy::CatchUp, 0).await;
    }
    let mut taken = Vec::new();
    for _ in 0..3 {
        let tick = store.claim_due(&params).await.unwrap();
        assert_eq!(tick.fires.len(), 1, "{tick:?}");
        assert_eq!(tick.fires[0].row.status, cm_domain::FireStatus::Fired);
        taken.push(tick.fires[0].occurrence.routine_id);
        assert!(tick.more_due || taken.len() == 3, "{tick:?}");
    }
    taken.sort_unstable();
    taken.dedup();
    assert_eq!(taken.len(), 3, "each routine once");
}

/// Five routines of a key of two places, each behind, claimed group by group with the outbox
/// written in the claim, round after round: every routine comes up to date.
pub(crate) async fn keyed_groups_catch_up(store: &PgStore, pool: &PgPool) {
    let params = cm_store::ClaimDueParams {
        rules: rules(3600, 100),
        ..crate::support::outbox_params("a")
    };
    store.set_concurrency_limit(&key("catch"), 2).await.unwrap();
    let count = store.group_count().await.unwrap();
    let mut routines = Vec::new();
    for _ in 0..5 {
        let (id, _) = keyed(store, pool, Some("catch"), MisfirePolicy::CatchUp, 6).await;
        routines.push((id, cm_store::group_of(id, count)));
    }
    for _ in 0..40 {
        for (_, group) in &routines {
            let params = cm_store::ClaimDueParams {
                group: Some(*group),
                ..params.clone()
            };
            loop {
                let tick = store.claim_due(&params).await.unwrap();
                if !tick.more_due {
                    break;
                }
            }
        }
    }
    let now = db_now(pool).await;
    for (id, _) in &routines {
        let next = next_run(store, *id).await.unwrap();
        assert!(
            next > now - TimeDelta::seconds(2),
            "routine {id} is behind: next {next}, now {now}"
        );
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn keyed_routines_in_many_groups_catch_up(pool: PgPool) {
    keyed_groups_catch_up(&PgStore::new(pool.clone()), &pool).await;
}
