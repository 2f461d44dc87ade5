//! The per-claim cap across routines: routines in the order of their oldest owed occurrence,
//! each taken whole (the last one cut at the cap), the rest deferred, and nothing lost over the
//! following claims. Also `max_routines`, the bound on routines one tick
//! locks.
//!
//! The routines fire yearly at a minute of their own on 1 January (`i 0 1 1 *`), and their
//! clocks are set two years back, so each owes exactly three occurrences and no two routines
//! share an instant: "oldest first" names one order.

use std::collections::BTreeSet;

use chrono::{Datelike, TimeDelta};
use cm_domain::{ClaimOutcome, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, Routine, RoutineStore};
use sqlx::PgPool;

use crate::support::{
    claim_params, create_named, db_now, fire_count, jan1, ledger, params, rules, set_next_run,
};

/// Creates `n` catch-up routines, routine `i` firing at minute `i` of 1 January, each owing its
/// occurrences of the last three years (this one included). Returns them with every owed
/// occurrence, oldest first.
async fn backlog(store: &PgStore, pool: &PgPool, n: u32) -> (Vec<Routine>, Vec<Occurrence>) {
    let year = db_now(pool).await.year();
    let mut routines = Vec::new();
    let mut owed = Vec::new();
    for i in 0..n {
        let expr = format!("{i} 0 1 1 *");
        let routine = create_named(store, &format!("r{i}"), &expr, MisfirePolicy::CatchUp).await;
        let at = |y| jan1(y) + TimeDelta::minutes(i64::from(i));
        set_next_run(pool, routine.id, at(year - 2)).await;
        owed.extend((year - 2..=year).map(|y| Occurrence::new(routine.id, at(y))));
        routines.push(routine);
    }
    owed.sort();
    (routines, owed)
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_cap_claims_routines_whole_oldest_first_and_defers_the_rest(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routines, owed) = backlog(&store, &pool, 5).await;
    assert_eq!(owed.len(), 15);
    let params = claim_params("a", 4, rules(0, 100));

    // Each claim takes routines by their oldest occurrence still owed, each with all it owes,
    // until four are taken; the deferred count is what is left. A routine caught up in one
    // claim is one row write, however much it owed.
    let mut claimed: Vec<Occurrence> = Vec::new();
    for tick_no in 0..4 {
        let mut left: Vec<Vec<Occurrence>> = routines
            .iter()
            .map(|r| {
                owed.iter()
                    .filter(|o| o.routine_id == r.id && !claimed.contains(o))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .filter(|l| !l.is_empty())
            .collect();
        left.sort_by_key(|l| (l[0].scheduled_at, l[0].routine_id));
        let mut chunk: Vec<Occurrence> = left.into_iter().flatten().take(4).collect();
        chunk.sort();
        let tick = store.claim_due(&params).await.unwrap();
        let got: Vec<_> = tick.fires.iter().map(|f| f.occurrence).collect();
        assert_eq!(got, chunk, "tick {tick_no}");
        assert!(
            tick.fires
                .iter()
                .all(|f| f.outcome(tick.token) == ClaimOutcome::Fresh)
        );
        assert_eq!(
            tick.deferred,
            owed.len() - claimed.len() - chunk.len(),
            "tick {tick_no}"
        );
        assert_eq!(tick.skipped, 0);
        claimed.extend(got);
        // Every routine's clock is at its oldest occurrence not yet claimed, so a deferred
        // occurrence stays owed.
        for routine in &routines {
            let next = owed
                .iter()
                .find(|o| o.routine_id == routine.id && !claimed.contains(o))
                .map(|o| o.scheduled_at);
            let after = store.get_routine(routine.id).await.unwrap();
            if let Some(next) = next {
                assert_eq!(after.next_run_at, Some(next), "tick {tick_no}");
            } else {
                // All three claimed: the clock is at next year's occurrence.
                let minute = routine.schedule.split(' ').next().unwrap();
                let minute: i64 = minute.parse().unwrap();
                let year = owed.last().unwrap().scheduled_at.year() + 1;
                assert_eq!(
                    after.next_run_at,
                    Some(jan1(year) + TimeDelta::minutes(minute)),
                    "tick {tick_no}"
                );
            }
        }
    }
    claimed.sort();
    assert_eq!(claimed, owed);

    // Nothing is left, and every owed occurrence has exactly one ledger row.
    let idle = store.claim_due(&params).await.unwrap();
    assert!(idle.fires.is_empty());
    assert_eq!(idle.deferred, 0);
    assert_eq!(fire_count(&pool).await, 15);
    let mut rows = BTreeSet::new();
    for routine in &routines {
        for fire in ledger(&store, routine.id).await {
            assert_eq!((fire.status.as_str(), fire.attempt), ("claimed", 1));
            rows.insert(Occurrence::new(fire.routine_id, fire.scheduled_at));
        }
    }
    assert_eq!(rows, owed.into_iter().collect());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn max_routines_bounds_one_tick_oldest_due_first(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // Three routines, each owing this year's occurrence only; routine `i` fires at minute `i`,
    // and they are created newest first so creation order does not explain the result.
    let year = db_now(&pool).await.year();
    let mut due = Vec::new();
    for i in (0..3).rev() {
        let expr = format!("{i} 0 1 1 *");
        let routine = create_named(&store, &format!("r{i}"), &expr, MisfirePolicy::FireOnce).await;
        let at = jan1(year) + TimeDelta::minutes(i);
        set_next_run(&pool, routine.id, at).await;
        due.push(Occurrence::new(routine.id, at));
    }
    due.sort();
    let mut bounded = params("a");
    bounded.max_routines = 2;

    let first = store.claim_due(&bounded).await.unwrap();
    let got: Vec<_> = first.fires.iter().map(|f| f.occurrence).collect();
    assert_eq!(got, due[..2]);
    // The routine left out was not touched: still due, and claimed by the next tick.
    let left = store.get_routine(due[2].routine_id).await.unwrap();
    assert_eq!(left.next_run_at, Some(due[2].scheduled_at));
    let second = store.claim_due(&bounded).await.unwrap();
    let got: Vec<_> = second.fires.iter().map(|f| f.occurrence).collect();
    assert_eq!(got, due[2..]);
    assert!(store.claim_due(&bounded).await.unwrap().fires.is_empty());
}
