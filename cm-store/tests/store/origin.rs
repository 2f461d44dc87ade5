//! Where a fire came from (schedule, trigger, backfill), kept on its row and listed; and the
//! order a claim numbers its outbox messages in: each routine's occurrences in `scheduled_at`
//! order. Also the mission room: missions past it stay due and unclaimed.

use chrono::{DateTime, TimeDelta, Utc};
use cm_domain::{FireOrigin, MisfirePolicy};
use cm_store::{FireFilter, FireLedger, PgStore, RoutineStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    YEARLY, claim_params, create, db_now, due_yearly, outbox_params, params, rules, set_next_run,
};

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn each_fire_records_its_origin(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let triggered = store.trigger_routine(routine.id).await.unwrap();
    let now = db_now(&pool).await;
    let backfilled: Vec<DateTime<Utc>> = (1..=2).map(|h| now - TimeDelta::hours(h)).collect();
    store
        .request_occurrences(routine.id, &backfilled)
        .await
        .unwrap();
    // A paused routine that only ever fired by hand has run all the same.
    let by_hand = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    store.set_routine_paused(by_hand.id, true).await.unwrap();
    let by_hand_at = store.trigger_routine(by_hand.id).await.unwrap();

    let claim = store.claim_due(&params("a")).await.unwrap();
    let origin_of = |at: DateTime<Utc>, id: Uuid| {
        claim
            .fires
            .iter()
            .find(|f| f.occurrence.scheduled_at == at && f.occurrence.routine_id == id)
            .map(|f| f.origin)
    };
    assert_eq!(origin_of(due, routine.id), Some(FireOrigin::Schedule));
    assert_eq!(origin_of(triggered, routine.id), Some(FireOrigin::Trigger));
    for at in &backfilled {
        assert_eq!(origin_of(*at, routine.id), Some(FireOrigin::Backfill));
    }
    assert_eq!(origin_of(by_hand_at, by_hand.id), Some(FireOrigin::Trigger));

    // The listing shows it.
    let listed = store.list_fires(&FireFilter::default()).await.unwrap();
    let listed_origin = |at: DateTime<Utc>| {
        listed
            .iter()
            .find(|f| f.scheduled_at == at)
            .map(|f| f.origin.clone())
    };
    assert_eq!(listed_origin(due).as_deref(), Some("schedule"));
    assert_eq!(listed_origin(triggered).as_deref(), Some("trigger"));
    assert_eq!(listed_origin(backfilled[0]).as_deref(), Some("backfill"));
    let by_hand = store.get_routine(by_hand.id).await.unwrap();
    assert!(by_hand.last_run_at.is_some(), "a triggered fire is a run");
}

/// The outbox sequence numbers of one routine's messages, in `scheduled_at` order.
async fn seqs(pool: &PgPool, routine: Uuid) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT seq FROM cm.outbox_messages WHERE routine_id = $1 ORDER BY scheduled_at",
    )
    .bind(routine)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_claim_numbers_each_routines_messages_oldest_first(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let now = db_now(&pool).await;
    // Three routines every ten seconds, a minute behind under catch-up, and a backfill of a
    // yearly one: one claim takes them all.
    let mut routines = Vec::new();
    for _ in 0..3 {
        let routine = create(&store, "*/10 * * * * *", MisfirePolicy::CatchUp).await;
        let from = now - TimeDelta::seconds(60);
        let from = from - TimeDelta::nanoseconds(i64::from(from.timestamp_subsec_nanos()));
        let from = from - TimeDelta::seconds(from.timestamp() % 10);
        set_next_run(&pool, routine.id, from).await;
        routines.push(routine.id);
    }
    let backfilled = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let slots: Vec<DateTime<Utc>> = (1..=6).map(|h| now - TimeDelta::hours(h)).collect();
    store
        .request_occurrences(backfilled.id, &slots)
        .await
        .unwrap();
    routines.push(backfilled.id);

    let claim = store
        .claim_due(&cm_store::ClaimDueParams {
            cap: cm_domain::FireCap::new(100).unwrap(),
            rules: rules(0, 100),
            ..outbox_params("a")
        })
        .await
        .unwrap();
    assert!(claim.fires.len() >= 3 * 6 + 6, "{}", claim.fires.len());
    for routine in routines {
        let seqs = seqs(&pool, routine).await;
        assert!(seqs.len() >= 6, "{seqs:?}");
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(
            seqs, sorted,
            "routine {routine}: seq not in scheduled_at order"
        );
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn missions_past_the_room_stay_due_and_unclaimed(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let mut missions = Vec::new();
    for _ in 0..5 {
        let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
        sqlx::query("UPDATE cm.routines SET kind = 'mission' WHERE id = $1")
            .bind(routine.id)
            .execute(&pool)
            .await
            .unwrap();
        missions.push((routine.id, due));
    }
    let (message, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let with_room = |room| cm_store::ClaimDueParams {
        mission_room: Some(room),
        ..claim_params("a", 25, rules(0, 100))
    };

    let claim = store.claim_due(&with_room(2)).await.unwrap();
    let kinds = |c: &cm_store::TickClaim| {
        c.fires
            .iter()
            .filter(|f| f.kind == cm_store::RoutineKind::Mission)
            .count()
    };
    assert_eq!(kinds(&claim), 2);
    assert_eq!(claim.held, 3);
    assert!(
        claim
            .fires
            .iter()
            .any(|f| f.occurrence.routine_id == message.id)
    );
    // The held ones have no ledger row, and their clocks have not moved.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 3);
    let mut still_due = 0;
    for (id, due) in &missions {
        if store.get_routine(*id).await.unwrap().next_run_at == Some(*due) {
            still_due += 1;
        }
    }
    assert_eq!(still_due, 3);

    // With no room, missions are not even locked; with room, the rest are claimed.
    let none = store.claim_due(&with_room(0)).await.unwrap();
    assert!(none.fires.is_empty() && none.held == 0);
    let rest = store.claim_due(&with_room(10)).await.unwrap();
    assert_eq!((kinds(&rest), rest.held), (3, 0));
}
