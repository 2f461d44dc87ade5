//! Events: written in the transaction of their change (failures, the pause at the Nth, a
//! person's resume, the recovery), never for a change that rolled back, missed deadlines raised
//! once, and delivery marked per event.

use chrono::{TimeDelta, Timelike};
use cm_domain::{EventType, MisfirePolicy, Settlement};
use cm_store::{
    EventFilter, EventLog, FireLedger, FireSettle, PgStore, RoutineEvent, RoutineStore,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{YEARLY, create, db_now, minute_floor, params};

/// The routine's events, oldest first, as their type names.
async fn types_of(store: &PgStore, routine: Uuid) -> Vec<String> {
    let mut events = events_of(store, routine).await;
    events.reverse();
    events.into_iter().map(|e| e.event_type).collect()
}

async fn events_of(store: &PgStore, routine: Uuid) -> Vec<RoutineEvent> {
    store
        .events(&EventFilter {
            routine: Some(routine),
            limit: 100,
            ..EventFilter::default()
        })
        .await
        .unwrap()
}

/// Asks for one past occurrence of `routine` (`minutes_ago` before `now`), claims it and settles
/// it with `settlement`.
async fn fire_once(
    store: &PgStore,
    routine: Uuid,
    at: chrono::DateTime<chrono::Utc>,
    settlement: Settlement,
) {
    store.request_occurrences(routine, &[at]).await.unwrap();
    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 1, "{claim:?}");
    store
        .settle_fires(&[FireSettle {
            fire: claim.fires[0].fire_ref(),
            settlement,
            receipt: None,
        }])
        .await
        .unwrap();
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn failures_the_pause_a_resume_and_the_recovery_each_write_one_event(pool: PgPool) {
    let store = PgStore::new(pool.clone()).pausing_after_failures(3);
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let now = minute_floor(db_now(&pool).await);
    for round in 1..=3 {
        let at = now - TimeDelta::minutes(10 - round);
        let error = cm_domain::ErrorText::new(format!("HTTP 503 round {round}"));
        fire_once(&store, routine.id, at, Settlement::Failed(error)).await;
    }
    assert_eq!(
        types_of(&store, routine.id).await,
        [
            "routine.failed",
            "routine.failed",
            "routine.failed",
            "routine.paused"
        ]
    );
    let events = events_of(&store, routine.id).await;
    assert_eq!(events[0].data["by"], "cm", "{:?}", events[0]);
    assert!(
        events[0].data["reason"]
            .as_str()
            .unwrap()
            .contains("round 3"),
        "{:?}",
        events[0]
    );
    assert_eq!(
        events[1].data["error"], "HTTP 503 round 3",
        "{:?}",
        events[1]
    );
    assert_eq!(events[1].scheduled_at, Some(now - TimeDelta::minutes(7)));
    assert_eq!(events[1].routine_name, routine.name);

    store.set_routine_paused(routine.id, false).await.unwrap();
    fire_once(
        &store,
        routine.id,
        now - TimeDelta::minutes(5),
        Settlement::Fired,
    )
    .await;
    // A second success after the recovery is not one.
    fire_once(
        &store,
        routine.id,
        now - TimeDelta::minutes(4),
        Settlement::Fired,
    )
    .await;
    // A message's settles that fail nothing write no event (the common settle stays one
    // statement): its recovery is not heard; a mission's is, from its run's end.
    assert_eq!(types_of(&store, routine.id).await[4..], ["routine.resumed"]);
    let ids: std::collections::HashSet<Uuid> = events_of(&store, routine.id)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids.len(), 5, "every event has an id of its own");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_success_with_no_failure_before_it_writes_nothing(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let now = minute_floor(db_now(&pool).await);
    fire_once(
        &store,
        routine.id,
        now - TimeDelta::minutes(3),
        Settlement::Fired,
    )
    .await;
    assert!(types_of(&store, routine.id).await.is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_pause_through_sql_writes_its_event_and_a_rolled_back_one_writes_none(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT cm.set_routine_paused($1, true)")
        .bind(routine.id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(types_of(&store, routine.id).await.is_empty());
    assert!(!store.get_routine(routine.id).await.unwrap().paused);

    for paused in [true, true, false] {
        sqlx::query("SELECT cm.set_routine_paused($1, $2)")
            .bind(routine.id)
            .bind(paused)
            .execute(&pool)
            .await
            .unwrap();
    }
    // Pausing a paused routine is no change, and no event.
    assert_eq!(
        types_of(&store, routine.id).await,
        ["routine.paused", "routine.resumed"]
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_missed_deadline_is_raised_once_whether_claimed_or_not(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let late = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let on_time = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let now = db_now(&pool).await.with_nanosecond(0).unwrap();
    let owed = now - TimeDelta::seconds(10);
    // Both owed 10 s ago, never claimed (every scheduler down): `late` has 2 s to succeed,
    // `on_time` a minute.
    for (routine, deadline) in [(late.id, 2), (on_time.id, 60)] {
        sqlx::query("UPDATE cm.routines SET next_run_at = $2, deadline_secs = $3 WHERE id = $1")
            .bind(routine)
            .bind(owed)
            .bind(deadline)
            .execute(&pool)
            .await
            .unwrap();
    }
    let raised = store.raise_missed_deadlines(None).await.unwrap();
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert_eq!(raised[0].routine_id, late.id);
    assert_eq!(raised[0].event_type, EventType::DeadlineMissed.as_str());
    assert_eq!(raised[0].scheduled_at, Some(owed));
    assert_eq!(raised[0].data["state"], "not claimed");
    assert!(store.raise_missed_deadlines(None).await.unwrap().is_empty());

    // Claimed now, still unsettled: the same occurrence, not raised again.
    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 2, "{claim:?}");
    assert!(store.raise_missed_deadlines(None).await.unwrap().is_empty());
    assert_eq!(types_of(&store, on_time.id).await, Vec::<String>::new());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_claimed_occurrence_not_settled_by_its_deadline_is_raised(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    sqlx::query("UPDATE cm.routines SET deadline_secs = 2 WHERE id = $1")
        .bind(routine.id)
        .execute(&pool)
        .await
        .unwrap();
    let at = db_now(&pool).await.with_nanosecond(0).unwrap() - TimeDelta::seconds(30);
    store.request_occurrences(routine.id, &[at]).await.unwrap();
    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 1);
    let raised = store.raise_missed_deadlines(None).await.unwrap();
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert_eq!(raised[0].data["state"], "claimed");
    // Settled fired afterwards: late, but the miss stands and is not raised twice.
    store
        .settle_fires(&[FireSettle {
            fire: claim.fires[0].fire_ref(),
            settlement: Settlement::Fired,
            receipt: None,
        }])
        .await
        .unwrap();
    assert!(store.raise_missed_deadlines(None).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn delivery_marks_each_event_and_keeps_the_last_error(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    store.set_routine_paused(routine.id, true).await.unwrap();
    store.set_routine_paused(routine.id, false).await.unwrap();
    let pending = store.pending_events(None, 10).await.unwrap();
    assert_eq!(pending.len(), 2);
    assert!(pending[0].seq < pending[1].seq);
    let retry_at = db_now(&pool).await + TimeDelta::seconds(5);
    store
        .mark_delivery_failed((pending[0].group_id, pending[0].seq), "HTTP 502", retry_at)
        .await
        .unwrap();
    let marked = store
        .mark_delivered(&[(pending[1].group_id, pending[1].seq)])
        .await
        .unwrap();
    assert_eq!(marked, 1);
    let left = store.pending_events(None, 10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].delivery_error.as_deref(), Some("HTTP 502"));
    assert_eq!(left[0].delivery_attempts, 1);
    // Marking twice counts once.
    let again = store
        .mark_delivered(&[(pending[1].group_id, pending[1].seq)])
        .await
        .unwrap();
    assert_eq!(again, 0);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_misfire_decision_is_one_event_with_its_count(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(
        &store,
        crate::support::EVERY_MINUTE,
        MisfirePolicy::FireOnce,
    )
    .await;
    let now = minute_floor(db_now(&pool).await);
    // Down 90 minutes: fire-once fires the latest and skips the 90 before it (91 if the
    // clock passed a minute before the claim).
    crate::support::set_next_run(&pool, routine.id, now - TimeDelta::minutes(90)).await;
    let claim = store.claim_due(&params("a")).await.unwrap();
    let skipped = crate::support::minutes(now - TimeDelta::minutes(90), claim.now).len() - 1;
    assert!(skipped >= 90, "{skipped}");
    assert_eq!(claim.fires.len(), 1, "{claim:?}");
    assert_eq!(claim.skipped, u64::try_from(skipped).unwrap());
    let events = events_of(&store, routine.id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].event_type, "routine.misfired");
    assert_eq!(events[0].data["skipped"], skipped);
    assert_eq!(events[0].data["policy"], "fire-once");
    assert_eq!(
        events[0].scheduled_at,
        Some(now - TimeDelta::minutes(90)),
        "{events:?}"
    );
    // Beside the misfires, an occurrence its overlap skipped and one buffering left.
    for (minutes, claimant) in [(200, "a"), (100, "buffer-one")] {
        sqlx::query(
            "INSERT INTO cm.routine_fires (routine_id, scheduled_at, status, claimant, claim_token,
                                           lease_expires_at, completed_at, error)
             VALUES ($1, $2, 'skipped', $3, gen_random_uuid(), now(), now(), 'skipped: held')",
        )
        .bind(routine.id)
        .bind(now - TimeDelta::minutes(minutes))
        .bind(claimant)
        .execute(&pool)
        .await
        .unwrap();
    }
    let skips = store.skips(routine.id, routine.group_id).await.unwrap();
    assert_eq!(
        (skips.misfired, skips.overlap, skips.buffered),
        (i64::try_from(skipped).unwrap(), 1, 1),
        "{skips:?}"
    );
    assert_eq!(skips.last_misfired, Some(events[0].occurred_at));
    assert_eq!(skips.last_buffered, Some(now - TimeDelta::minutes(100)));
    let quiet = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    assert_eq!(
        store.skips(quiet.id, quiet.group_id).await.unwrap(),
        cm_store::Skips::default()
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routine_whose_run_limit_is_spent_is_finished_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let name = format!("limited {}", Uuid::new_v4().simple());
    let routine = store
        .create_routine(
            crate::support::message(&name, crate::support::EVERY_MINUTE)
                .into_builder()
                .run_limit(Some(1))
                .deadline(Some(std::time::Duration::from_secs(30)))
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(routine.deadline, Some(std::time::Duration::from_secs(30)));
    let now = minute_floor(db_now(&pool).await);
    crate::support::set_next_run(&pool, routine.id, now).await;
    let claim = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(claim.fires.len(), 1, "{claim:?}");
    assert!(
        store
            .claim_due(&params("a"))
            .await
            .unwrap()
            .fires
            .is_empty()
    );
    let events = events_of(&store, routine.id).await;
    assert_eq!(types_of(&store, routine.id).await, ["routine.finished"]);
    assert_eq!(events[0].data["reason"], "its run limit was reached");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_deadline_set_through_sql_is_checked_and_read_back(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let set = |deadline: &'static str| {
        sqlx::query_scalar::<_, bool>("SELECT cm.set_routine_deadline($1, $2::interval)")
            .bind(routine.id)
            .bind(deadline)
            .fetch_one(&pool)
    };
    assert!(set("90 seconds").await.unwrap());
    assert_eq!(
        store.get_routine(routine.id).await.unwrap().deadline,
        Some(std::time::Duration::from_secs(90))
    );
    let refused = set("1.5 seconds").await.unwrap_err().to_string();
    assert!(
        refused.contains("a deadline must be whole seconds"),
        "{refused}"
    );
    let refused = set("400 days").await.unwrap_err().to_string();
    assert!(
        refused.contains("a deadline must be whole seconds"),
        "{refused}"
    );
    assert_eq!(
        store.get_routine(routine.id).await.unwrap().deadline,
        Some(std::time::Duration::from_secs(90))
    );
}

/// The event log's whole round on `store` (per group, as Citus runs it, when `per_group`):
/// a deadline raised once, delivered and failed posts marked, listed, and retention.
pub(crate) async fn the_event_log_round(store: &PgStore, pool: &PgPool, per_group: bool) {
    let routine = create(store, YEARLY, MisfirePolicy::FireOnce).await;
    let group = per_group.then_some(routine.group_id);
    let owed = db_now(pool).await.with_nanosecond(0).unwrap() - TimeDelta::seconds(10);
    sqlx::query("UPDATE cm.routines SET next_run_at = $2, deadline_secs = 2 WHERE id = $1")
        .bind(routine.id)
        .bind(owed)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(store.deadline_groups().await.unwrap(), [routine.group_id]);
    assert!(store.pending_groups(None).await.unwrap().is_empty());
    let raised = store.raise_missed_deadlines(group).await.unwrap();
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert_eq!(
        store.pending_groups(None).await.unwrap(),
        [routine.group_id]
    );
    let elsewhere = [routine.group_id + 1];
    assert!(
        store
            .pending_groups(Some(&elsewhere))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .raise_missed_deadlines(group)
            .await
            .unwrap()
            .is_empty()
    );
    store.set_routine_paused(routine.id, true).await.unwrap();
    let pending = store.pending_events(group, 10).await.unwrap();
    let types: Vec<&str> = pending.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["routine.deadline_missed", "routine.paused"]);
    let retry_at = db_now(pool).await + TimeDelta::seconds(5);
    store
        .mark_delivery_failed((pending[0].group_id, pending[0].seq), "HTTP 503", retry_at)
        .await
        .unwrap();
    let marked = store
        .mark_delivered(&[(pending[1].group_id, pending[1].seq)])
        .await
        .unwrap();
    assert_eq!(marked, 1);
    let listed = events_of(store, routine.id).await;
    assert_eq!(listed.len(), 2);
    assert!(listed[0].delivered_at.is_some(), "{listed:?}");
    assert_eq!(listed[1].delivery_error.as_deref(), Some("HTTP 503"));
    // Past the retention: the delivered one goes; the undelivered one stays until twice it.
    sqlx::query("UPDATE cm.routine_events SET occurred_at = now() - interval '3 days'")
        .execute(pool)
        .await
        .unwrap();
    let day = std::time::Duration::from_secs(86_400);
    let prune = |retention| {
        let store = store.clone();
        async move {
            match group {
                Some(g) => store.prune_events_in(g, retention, 100).await.unwrap(),
                None => store.prune_events(retention, 100).await.unwrap(),
            }
        }
    };
    assert_eq!(prune(day * 2).await, 1);
    assert_eq!(events_of(store, routine.id).await.len(), 1);
    assert_eq!(prune(day).await, 1);
    assert!(events_of(store, routine.id).await.is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_event_log_round_on_postgresql(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    the_event_log_round(&store, &pool, false).await;
}
