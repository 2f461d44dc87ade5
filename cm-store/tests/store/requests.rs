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

/// Makes the routine a mission routine (the claim reads the kind from the row).
async fn make_mission(pool: &PgPool, id: Uuid) {
    sqlx::query("UPDATE cm.routines SET kind = 'mission' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

/// The requests still waiting, oldest first.
async fn waiting(pool: &PgPool) -> Vec<(Uuid, chrono::DateTime<chrono::Utc>)> {
    sqlx::query_as("SELECT routine_id, scheduled_at FROM cm.routine_requests ORDER BY scheduled_at")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Requested (trigger, backfill) missions take the mission room like scheduled ones, and
/// scheduled and requested missions together never exceed it; message requests still flow;
/// the mission requests past the room stay in the table and are taken by later claims, oldest
/// first, each once. `group` claims in one group (every routine is put in group 0 for it).
async fn mission_requests_within_the_room(pool: PgPool, group: Option<i16>) {
    if group.is_some() {
        // Before the store reads the count: every routine, request and fire in group 0.
        sqlx::query("UPDATE cm.cm_settings SET group_count = 1")
            .execute(&pool)
            .await
            .unwrap();
    }
    let store = PgStore::new(pool.clone());
    let now = db_now(&pool).await;
    // A backfill of six mission occurrences, the oldest due; three message occurrences after
    // them; and two mission routines whose scheduled occurrence is due.
    let mission = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    make_mission(&pool, mission.id).await;
    let mission_slots: Vec<_> = (1..=6).rev().map(|h| now - TimeDelta::hours(h)).collect();
    store
        .request_occurrences(mission.id, &mission_slots)
        .await
        .unwrap();
    let message = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let message_slots: Vec<_> = (1..=3).rev().map(|m| now - TimeDelta::minutes(m)).collect();
    store
        .request_occurrences(message.id, &message_slots)
        .await
        .unwrap();
    let mut scheduled = Vec::new();
    for _ in 0..2 {
        let (routine, _) = crate::support::due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
        make_mission(&pool, routine.id).await;
        scheduled.push(routine.id);
    }
    let with_room = |room| cm_store::ClaimDueParams {
        mission_room: Some(room),
        group,
        ..claim_params("a", 25, rules(0, 100))
    };
    let missions = |claim: &cm_store::TickClaim| -> Vec<_> {
        claim
            .fires
            .iter()
            .filter(|f| f.kind == cm_store::RoutineKind::Mission)
            .map(|f| f.occurrence)
            .collect()
    };
    let requested_missions = |claim: &cm_store::TickClaim| -> Vec<_> {
        claim
            .fires
            .iter()
            .filter(|f| f.occurrence.routine_id == mission.id)
            .map(|f| f.occurrence.scheduled_at)
            .collect()
    };
    let mut taken = Vec::new();

    // A room of three: the three oldest requested missions, no scheduled one (held), and every
    // message request.
    let claim = store.claim_due(&with_room(3)).await.unwrap();
    assert_eq!(missions(&claim).len(), 3, "{:?}", missions(&claim));
    assert_eq!(requested_missions(&claim), mission_slots[..3]);
    assert_eq!(claim.held, 2);
    let messages: Vec<_> = claim
        .fires
        .iter()
        .filter(|f| f.occurrence.routine_id == message.id)
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    assert_eq!(messages, message_slots, "message requests held back");
    taken.extend(requested_missions(&claim));
    // Nothing lost: the other three wait, and a request goes only with its claim.
    let left: Vec<_> = waiting(&pool).await.into_iter().map(|(_, at)| at).collect();
    assert_eq!(left, mission_slots[3..]);
    assert_eq!(crate::support::fire_count(&pool).await, 6);

    // No room: no mission at all, the requests stay.
    let none = store.claim_due(&with_room(0)).await.unwrap();
    assert!(none.fires.is_empty(), "{:?}", missions(&none));
    assert_eq!(waiting(&pool).await.len(), 3);

    // A room of two, then of ten: the rest in order, requests first, then the scheduled ones.
    let two = store.claim_due(&with_room(2)).await.unwrap();
    assert_eq!(missions(&two).len(), 2);
    taken.extend(requested_missions(&two));
    let rest = store.claim_due(&with_room(10)).await.unwrap();
    assert_eq!(missions(&rest).len(), 3);
    taken.extend(requested_missions(&rest));
    assert!(
        scheduled
            .iter()
            .all(|id| rest.fires.iter().any(|f| f.occurrence.routine_id == *id))
    );
    assert_eq!(
        taken, mission_slots,
        "each requested mission once, oldest first"
    );
    assert!(waiting(&pool).await.is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn mission_requests_take_only_the_mission_room_and_the_rest_wait_in_order(pool: PgPool) {
    mission_requests_within_the_room(pool, None).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn mission_requests_in_one_group_take_only_the_mission_room(pool: PgPool) {
    mission_requests_within_the_room(pool, Some(0)).await;
}

/// A cap of one with requests of both kinds: each claim takes one occurrence (a request first),
/// never more than the mission room, and the scheduled one waits; nothing underflows.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_cap_of_one_takes_one_request_and_never_a_mission_past_the_room(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let now = db_now(&pool).await;
    let mission = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    make_mission(&pool, mission.id).await;
    let mission_slots: Vec<_> = (3..=4).rev().map(|h| now - TimeDelta::hours(h)).collect();
    store
        .request_occurrences(mission.id, &mission_slots)
        .await
        .unwrap();
    let message = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let message_slot = now - TimeDelta::hours(1);
    store
        .request_occurrences(message.id, &[message_slot])
        .await
        .unwrap();
    let (due, due_at) = crate::support::due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let claim_one = async |room| {
        let claim = store
            .claim_due(&cm_store::ClaimDueParams {
                mission_room: Some(room),
                ..claim_params("a", 1, rules(0, 100))
            })
            .await
            .unwrap();
        assert!(claim.fires.len() <= 1, "{:?}", claim.fires.len());
        claim.fires.first().map(|f| f.occurrence)
    };
    // No mission room: the message request, then the scheduled occurrence; the missions wait.
    assert_eq!(
        claim_one(0).await,
        Some(Occurrence::new(message.id, message_slot))
    );
    assert_eq!(claim_one(0).await, Some(Occurrence::new(due.id, due_at)));
    assert_eq!(claim_one(0).await, None);
    assert_eq!(waiting(&pool).await.len(), 2);
    // Room for one mission a claim: the requests, oldest first.
    for at in &mission_slots {
        assert_eq!(claim_one(1).await, Some(Occurrence::new(mission.id, *at)));
    }
    assert_eq!(claim_one(1).await, None);
}
