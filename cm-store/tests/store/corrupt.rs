//! A stored routine the domain refuses (its schedule or zone rewritten by hand, or by an older
//! version) is reported by the tick, paused with its reason so it stops coming due, and does not
//! keep the other due routines from being claimed. So is one whose schedule is too costly to
//! check (written before schedules had a budget): the claim refuses it within the budget.

use cm_domain::{ClaimOutcome, MisfirePolicy, Occurrence};
use cm_store::{FireLedger, PgStore, RoutineStore, StoreError};
use sqlx::PgPool;

use crate::support::{due_yearly, fire_count, ledger, params};

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_corrupt_routine_is_reported_paused_and_skipped(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (bad_schedule, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let (healthy, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let (bad_zone, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let (costly, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    sqlx::query("UPDATE cm.routines SET schedule = $2 WHERE id = $1")
        .bind(costly.id)
        .bind(
            "* * * * * * except 1-59 * * * * * except * 1-59 * * * * \
             except * * 1-4,6-9,11-14,16-19,21-23 * * * jitter 1s",
        )
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE cm.routines SET schedule = 'every other tuesday' WHERE id = $1")
        .bind(bad_schedule.id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE cm.routines SET timezone = 'Mars/Olympus_Mons' WHERE id = $1")
        .bind(bad_zone.id)
        .execute(&pool)
        .await
        .unwrap();

    let tick = store.claim_due(&params("a")).await.unwrap();
    // The healthy routine is claimed as usual.
    assert_eq!(tick.fires.len(), 1, "{tick:?}");
    assert_eq!(tick.fires[0].occurrence, Occurrence::new(healthy.id, due));
    assert_eq!(tick.fires[0].outcome(tick.token), ClaimOutcome::Fresh);
    // Both broken ones are reported, each with a reason naming what is wrong.
    let mut reported: Vec<_> = tick
        .unusable
        .iter()
        .map(|u| (u.routine_id, u.reason.clone()))
        .collect();
    reported.sort();
    let mut expected_ids = vec![bad_schedule.id, bad_zone.id, costly.id];
    expected_ids.sort();
    assert_eq!(
        reported.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        expected_ids
    );
    let reason_of = |id| {
        reported
            .iter()
            .find(|(r, _)| *r == id)
            .map(|(_, reason)| reason.clone())
            .unwrap()
    };
    assert!(reason_of(bad_zone.id).contains("Mars/Olympus_Mons"));
    assert!(!reason_of(bad_schedule.id).is_empty());
    assert!(
        reason_of(costly.id).contains("too costly to check"),
        "{}",
        reason_of(costly.id)
    );

    // They were paused, with no next run, and nothing was written for them.
    for id in [bad_schedule.id, bad_zone.id, costly.id] {
        let routine = store.get_routine(id).await.unwrap();
        assert!(routine.paused);
        let kept = routine.paused_reason.as_deref().unwrap_or_default();
        assert!(kept.starts_with("refused when claimed: "), "{kept:?}");
        assert!(kept.contains(&reason_of(id)), "{kept:?}");
        assert_eq!(routine.next_run_at, None);
        assert!(ledger(&store, id).await.is_empty());
        // Reading it back names the routine as corrupt, rather than failing obscurely.
        assert!(matches!(
            routine.parsed_schedule(),
            Err(StoreError::CorruptRoutine { routine_id, .. }) if routine_id == id
        ));
    }
    assert_eq!(fire_count(&pool).await, 1);

    // Resuming one cannot compute a next run: it is refused as corrupt and stays paused.
    let resumed = store.set_routine_paused(bad_zone.id, false).await;
    assert!(
        matches!(resumed, Err(StoreError::CorruptRoutine { routine_id, .. }) if routine_id == bad_zone.id),
        "{resumed:?}"
    );
    let still = store.get_routine(bad_zone.id).await.unwrap();
    assert!(still.paused);
    assert_eq!(still.next_run_at, None);

    // Paused, they stop coming due: the next tick is quiet.
    let next = store.claim_due(&params("a")).await.unwrap();
    assert!(
        next.fires.is_empty() && next.unusable.is_empty(),
        "{next:?}"
    );
}
