//! Turns between concurrency keys: when more is due than a claim takes, the claim takes from
//! each key in turn, so a key of a few routines is not left behind another key's backlog; and
//! the drain behind it still claims every owed occurrence once.

use std::collections::HashMap;

use chrono::{DateTime, TimeDelta, Utc};
use cm_domain::MisfirePolicy;
use cm_store::{ClaimDueParams, FireLedger, PgStore, RoutineStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    EVERY_MINUTE, claim_params, db_now, message, minute_floor, minutes, rules, set_next_run,
};

/// `n` every-minute catch-up message routines on `key` (or none), their clocks `behind`
/// minutes back; their ids and the minute their clocks stand at.
async fn tenant(
    store: &PgStore,
    pool: &PgPool,
    key: Option<&str>,
    n: usize,
    behind: i64,
) -> (Vec<Uuid>, DateTime<Utc>) {
    let at: DateTime<Utc> = minute_floor(db_now(pool).await) - TimeDelta::minutes(behind);
    let mut ids = Vec::new();
    for _ in 0..n {
        let routine = store
            .create_routine(
                message(&format!("r {}", Uuid::new_v4().simple()), EVERY_MINUTE)
                    .into_builder()
                    .misfire(MisfirePolicy::CatchUp)
                    .concurrency_key(key.map(|k| k.parse().unwrap()))
                    .build()
                    .unwrap(),
            )
            .await
            .unwrap();
        set_next_run(pool, routine.id, at).await;
        ids.push(routine.id);
    }
    (ids, at)
}

/// A claim of at most 10 occurrences over at most 10 routines.
fn small_claims() -> ClaimDueParams {
    ClaimDueParams {
        max_routines: 10,
        ..claim_params("a", 10, rules(3600, 100))
    }
}

/// What a drain claimed: the first claim's routines, how many fires each routine got in all,
/// and the latest instant any fire was for.
struct Drained {
    first: Vec<Uuid>,
    fires: HashMap<Uuid, usize>,
    latest: Option<DateTime<Utc>>,
}

impl Drained {
    /// Every minute from `at` through the latest instant claimed: what a routine whose clock
    /// stood at `at` is owed once the drain ended. The clock may pass a minute while the test
    /// runs; the drain's last claim then owes every routine that minute too, and takes it.
    fn owed_since(&self, at: DateTime<Utc>) -> usize {
        self.latest.map_or(0, |latest| minutes(at, latest).len())
    }

    /// Checks that each of `routines`, whose clocks stood at `at`, got every minute it is owed
    /// once.
    #[track_caller]
    fn check_owed(&self, routines: &[Uuid], at: DateTime<Utc>) {
        let owed = self.owed_since(at);
        for id in routines {
            assert_eq!(self.fires.get(id), Some(&owed), "routine {id}");
        }
    }
}

/// Claims until nothing is due, resuming after each claim as a drain does.
async fn drain(store: &PgStore) -> Drained {
    let mut params = small_claims();
    let mut drained = Drained {
        first: Vec::new(),
        fires: HashMap::new(),
        latest: None,
    };
    for round in 0..100 {
        let claim = store.claim_due(&params).await.unwrap();
        assert!(claim.fires.len() <= 10, "{claim:?}");
        for fire in &claim.fires {
            *drained.fires.entry(fire.occurrence.routine_id).or_default() += 1;
            drained.latest = drained.latest.max(Some(fire.occurrence.scheduled_at));
        }
        if round == 0 {
            drained.first = claim
                .fires
                .iter()
                .map(|f| f.occurrence.routine_id)
                .collect();
        }
        if claim.more_due {
            params.after = claim.resume_after;
        } else if params.after.is_some() {
            params.after = None;
        } else {
            return drained;
        }
    }
    panic!("the drain did not end in 100 claims");
}

/// Thirty routines of key `big` owe three minutes each; two of key `small` owe their last two,
/// behind all of big's oldest. A claim of ten takes from both keys in turn: both small
/// routines are in the first claim, not after big's ninety occurrences. The drain then claims
/// every owed occurrence once.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_small_key_is_claimed_in_turn_beside_a_big_keys_backlog(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (big, big_at) = tenant(&store, &pool, Some("big"), 30, 2).await;
    let (small, small_at) = tenant(&store, &pool, Some("small"), 2, 1).await;
    let drained = drain(&store).await;
    let first = &drained.first;
    for id in &small {
        assert!(
            first.contains(id),
            "small routine {id} not in the first claim: {first:?}"
        );
    }
    assert!(first.iter().any(|id| big.contains(id)), "{first:?}");
    // Three minutes each for big and two for small, or one more each if the clock passed a
    // minute during the drain.
    assert!(drained.owed_since(big_at) >= 3);
    drained.check_owed(&big, big_at);
    drained.check_owed(&small, small_at);
}

/// The same routines with no keys: one bucket, taken in the order of instants, so the first
/// claim is all of the thirty's oldest. (What a key's turn changes.)
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn without_keys_the_claim_goes_by_instants(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (big, big_at) = tenant(&store, &pool, None, 30, 2).await;
    let (small, small_at) = tenant(&store, &pool, None, 2, 1).await;
    let drained = drain(&store).await;
    assert_eq!(drained.first.len(), 10);
    assert!(
        drained.first.iter().all(|id| big.contains(id)),
        "{:?}",
        drained.first
    );
    assert!(drained.owed_since(big_at) >= 3);
    drained.check_owed(&big, big_at);
    drained.check_owed(&small, small_at);
}

/// Many keys, each of one routine behind a big key's backlog: each gets its turn within a
/// claim or two, however many the big key owes, and nothing is claimed twice.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn many_small_keys_each_get_a_turn_early(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (big, big_at) = tenant(&store, &pool, Some("big"), 40, 2).await;
    let mut smalls = Vec::new();
    for i in 0..6 {
        smalls.push(tenant(&store, &pool, Some(&format!("t{i}")), 1, 1).await);
    }
    // Each claim of ten gives each small key's routine a turn before big's second routine:
    // the first two claims hold all six.
    let mut params = small_claims();
    let mut early = Vec::new();
    for _ in 0..2 {
        let claim = store.claim_due(&params).await.unwrap();
        early.extend(claim.fires.iter().map(|f| f.occurrence));
        params.after = claim.resume_after;
    }
    for (ids, _) in &smalls {
        for id in ids {
            assert!(
                early.iter().any(|o| o.routine_id == *id),
                "small key's routine {id} not in the first two claims"
            );
        }
    }
    // The rest drains; with the first two claims, each routine got every minute it is owed
    // once.
    let mut drained = drain(&store).await;
    for occurrence in &early {
        *drained.fires.entry(occurrence.routine_id).or_default() += 1;
        drained.latest = drained.latest.max(Some(occurrence.scheduled_at));
    }
    drained.check_owed(&big, big_at);
    for (ids, at) in &smalls {
        drained.check_owed(ids, *at);
    }
}
