//! Retry policies: a failed attempt whose routine asks for retries stays `claimed` until its
//! retry's instant, when the reaper takes it over as the next attempt; a retry is never due at
//! or past the routine's next occurrence nor the occurrence's deadline; the last attempt's
//! outcome is the occurrence's, with every earlier one kept in its `tries`.

use chrono::{DateTime, TimeDelta, Timelike, Utc};
use cm_domain::{
    ClaimAction, ErrorText, MisfirePolicy, Occurrence, RetryDecision, RetryPolicy, RunState,
    Settlement,
};
use cm_store::{
    ClaimedFire, FireLedger, MissionRuns, PgStore, RoutineStore, RunRecord, RunTake, RunUpdate,
    SettleOutcome,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    Seed, db_now, due_yearly, expire_lease, fire_of, params, reap_params, seed_fire,
};

fn failed(text: &str) -> Settlement {
    Settlement::Failed(ErrorText::new(text))
}

/// Sets a routine's retry policy through the SQL function granted to writers.
async fn set_retries(pool: &PgPool, routine: Uuid, retries: i32, backoff: &str, cap: &str) {
    let found: bool =
        sqlx::query_scalar("SELECT cm.set_routine_retries($1, $2, $3::interval, $4::interval)")
            .bind(routine)
            .bind(retries)
            .bind(backoff)
            .bind(cap)
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(found);
}

/// The `routine.failed` events of a routine.
async fn failed_events(pool: &PgPool, routine: Uuid) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_events
         WHERE routine_id = $1 AND type = 'routine.failed'",
    )
    .bind(routine)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The claim of `routine`'s due occurrence, in its group (as on Citus, where a claim names it).
async fn claim_of(store: &PgStore, routine: Uuid) -> ClaimedFire {
    let group = cm_store::group_of(routine, store.group_count().await.unwrap());
    let claim = store
        .claim_due(&cm_store::ClaimDueParams {
            group: Some(group),
            ..params("a")
        })
        .await
        .unwrap();
    assert_eq!(claim.fires.len(), 1, "{claim:?}");
    claim.fires[0].clone()
}

/// Takes over the occurrence whose retry is due (its lease made to run out now) as `b`, in its
/// group.
async fn take_retry(store: &PgStore, pool: &PgPool, occurrence: Occurrence) -> ClaimedFire {
    expire_lease(pool, occurrence).await;
    let group = cm_store::group_of(occurrence.routine_id, store.group_count().await.unwrap());
    let reaped = store
        .reap_expired(&cm_store::ReapParams {
            group: Some(group),
            ..reap_params("b", 10)
        })
        .await
        .unwrap();
    assert_eq!(reaped.fires.len(), 1, "the retry is taken over");
    reaped.fires[0].clone()
}

/// Settles a mission's claim `fired`, as its launch's settle does.
async fn launched(pool: &PgPool, occurrence: Occurrence) {
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'fired', completed_at = now()
         WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(occurrence.routine_id)
    .bind(occurrence.scheduled_at)
    .execute(pool)
    .await
    .unwrap();
}

/// Whether `at` is `wait` after the database's `now`, within a second.
fn about(at: DateTime<Utc>, now: DateTime<Utc>, wait: i64) -> bool {
    let d = at - now;
    d >= TimeDelta::seconds(wait) && d <= TimeDelta::seconds(wait + 1)
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_failure_is_retried_after_the_backoff_until_its_retries_are_spent(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    retried_until_spent(&store, &pool).await;
}

/// A failure retried twice, after 10 s then 15 s (capped), then settled failed with its retries
/// spent; one `routine.failed`, at the end.
pub(crate) async fn retried_until_spent(store: &PgStore, pool: &PgPool) {
    let (store, pool) = (store.clone(), pool.clone());
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, routine.id, 2, "10 seconds", "15 seconds").await;
    let stored = store.get_routine(routine.id).await.unwrap();
    assert_eq!(
        stored.retry,
        RetryPolicy::new(
            2,
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(15)
        )
        .unwrap()
    );
    let first = claim_of(&store, routine.id).await;
    assert_eq!(first.retry, 0);

    // The first failure: retried 10 s on, the row still claimed, nothing counted failed.
    let now = db_now(&pool).await;
    let SettleOutcome::Retrying { at } = store
        .settle_fire(&first.fire_ref(), &failed("HTTP 503"))
        .await
        .unwrap()
    else {
        panic!("a failure of a routine with retries left is retried");
    };
    assert!(about(at, now, 10), "retry 1 at {at}, now {now}");
    let row = fire_of(&store, first.occurrence).await;
    assert_eq!(
        (row.status.as_str(), row.retry, row.error.as_deref()),
        ("claimed", 1, Some("HTTP 503"))
    );
    assert_eq!(row.lease_expires_at, at);
    assert_eq!(row.tries.len(), 1);
    assert_eq!(
        (
            row.tries[0].attempt,
            row.tries[0].outcome.as_str(),
            row.tries[0].error.as_deref()
        ),
        (1, "failed", Some("HTTP 503"))
    );
    assert_eq!(row.tries[0].retry_at, at);
    assert_eq!(failed_events(&pool, routine.id).await, 0);
    // Not before it is due.
    let group = cm_store::group_of(routine.id, store.group_count().await.unwrap());
    assert!(
        store
            .reap_expired(&cm_store::ReapParams {
                group: Some(group),
                ..reap_params("b", 10)
            })
            .await
            .unwrap()
            .fires
            .is_empty()
    );

    // The second attempt: taken over as attempt 2 of retry 1, dispatched (a retry is no crash),
    // and failing again, retried after the doubled wait, capped at 15 s.
    let second = take_retry(&store, &pool, first.occurrence).await;
    assert_eq!((second.row.attempt, second.retry), (2, 1));
    assert_eq!(
        second
            .outcome(second.row.token)
            .action_after_retries(1, second.retry),
        ClaimAction::Dispatch { attempt: 2 }
    );
    let now = db_now(&pool).await;
    let SettleOutcome::Retrying { at } = store
        .settle_fire(&second.fire_ref(), &failed("HTTP 503"))
        .await
        .unwrap()
    else {
        panic!("retry 2 is left");
    };
    assert!(about(at, now, 15), "retry 2 at {at}, now {now}: capped");

    // The third attempt fails too: the retries are spent, the failure is the outcome.
    let third = take_retry(&store, &pool, first.occurrence).await;
    assert_eq!((third.row.attempt, third.retry), (3, 2));
    assert_eq!(
        store
            .settle_fire(&third.fire_ref(), &failed("HTTP 500"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let row = fire_of(&store, first.occurrence).await;
    assert_eq!(
        (row.status.as_str(), row.attempt, row.retry),
        ("failed", 3, 2)
    );
    assert_eq!(
        row.error.as_deref(),
        Some("HTTP 500; retries spent (2 of 2)")
    );
    assert_eq!(
        row.tries.iter().map(|t| t.attempt).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(
        failed_events(&pool, routine.id).await,
        1,
        "one failure heard"
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_retry_that_succeeds_settles_the_occurrence_fired(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, routine.id, 3, "1 second", "1 minute").await;
    let first = claim_of(&store, routine.id).await;
    assert!(matches!(
        store
            .settle_fire(&first.fire_ref(), &failed("HTTP 503"))
            .await
            .unwrap(),
        SettleOutcome::Retrying { .. }
    ));
    let second = take_retry(&store, &pool, first.occurrence).await;
    assert_eq!(
        store
            .settle_fire(&second.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let row = fire_of(&store, first.occurrence).await;
    assert_eq!(
        (row.status.as_str(), row.attempt, row.retry, row.error),
        ("fired", 2, 1, None)
    );
    assert_eq!(row.tries.len(), 1);
    // A stale settle of the first attempt changes nothing.
    assert_eq!(
        store
            .settle_fire(&first.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::TakenOver
    );
    assert_eq!(failed_events(&pool, routine.id).await, 0);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_retry_is_never_due_at_the_next_occurrence_nor_past_the_deadline(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let policy = RetryPolicy::new(
        3,
        std::time::Duration::from_secs(30),
        std::time::Duration::from_secs(30),
    )
    .unwrap();

    // The next occurrence is 20 s away: a retry in 30 s would pass it.
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, routine.id, 3, "30 seconds", "30 seconds").await;
    let first = claim_of(&store, routine.id).await;
    let next = db_now(&pool).await + TimeDelta::seconds(20);
    crate::support::set_next_run(&pool, routine.id, next).await;
    let now = db_now(&pool).await;
    assert_eq!(
        store
            .settle_fire(&first.fire_ref(), &failed("HTTP 503"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let row = fire_of(&store, first.occurrence).await;
    assert_eq!(row.status, "failed");
    // The store's words are the domain's.
    let RetryDecision::GiveUp(reason) = policy.decide(0, now, false, Some(next), None) else {
        panic!("the domain gives it up too");
    };
    let error = row.error.unwrap();
    assert!(
        error.starts_with("HTTP 503; not retried: retry 1 would be due at "),
        "{error}"
    );
    assert!(
        error.ends_with(&reason[reason.find(", not before").unwrap()..]),
        "{error} / {reason}"
    );

    // The next occurrence already claimed (the routine's next run moved past it): its instant
    // is the limit, not the routine's next run.
    let (claimed_next, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, claimed_next.id, 3, "30 seconds", "30 seconds").await;
    let fire = claim_of(&store, claimed_next.id).await;
    let later = Occurrence::new(
        claimed_next.id,
        (db_now(&pool).await + TimeDelta::seconds(20))
            .with_nanosecond(0)
            .unwrap(),
    );
    seed_fire(&pool, later, &Seed::claimed(1.0)).await;
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &failed("HTTP 503"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let error = fire_of(&store, fire.occurrence).await.error.unwrap();
    let named = later
        .scheduled_at
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        error.ends_with(&format!("not before the next occurrence at {named}")),
        "{error}"
    );

    // A deadline 10 s after the occurrence: long past, so no retry is made.
    let (other, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, other.id, 3, "30 seconds", "30 seconds").await;
    sqlx::query("SELECT cm.set_routine_deadline($1, '10 seconds')")
        .bind(other.id)
        .execute(&pool)
        .await
        .unwrap();
    let fire = claim_of(&store, other.id).await;
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &failed("HTTP 503"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let error = fire_of(&store, fire.occurrence).await.error.unwrap();
    assert!(error.contains("past the deadline at"), "{error}");

    // A paused routine's failure is not retried.
    let (paused, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, paused.id, 3, "1 second", "1 second").await;
    let fire = claim_of(&store, paused.id).await;
    store.set_routine_paused(paused.id, true).await.unwrap();
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &failed("HTTP 503"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let error = fire_of(&store, fire.occurrence).await.error.unwrap();
    assert_eq!(error, "HTTP 503; not retried: the routine is paused");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_failed_run_is_retried_under_a_new_name_and_holds_the_routines_run(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    run_retried_under_a_new_name(&store, &pool).await;
}

/// A mission's failed run retried under `<key>-r1`, holding the routine's run while it waits,
/// then lost with its retry spent.
pub(crate) async fn run_retried_under_a_new_name(store: &PgStore, pool: &PgPool) {
    let (store, pool) = (store.clone(), pool.clone());
    let (routine, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    set_retries(&pool, routine.id, 1, "5 seconds", "5 seconds").await;
    let first = claim_of(&store, routine.id).await.occurrence;
    assert_eq!(store.take_run(first, None).await.unwrap(), RunTake::Launch);
    launched(&pool, first).await;
    let unfinished = store.unfinished_runs(10).await.unwrap();
    assert_eq!(
        unfinished[0].run_name(),
        first.idempotency_key().to_string()
    );

    // The run exits 3; what it left is kept first, as the watch pass does.
    store
        .keep_run_record(
            first,
            &RunRecord {
                output: Some("step 1\nboom".into()),
                started_at: Some(db_now(&pool).await - TimeDelta::seconds(4)),
                finished_at: Some(db_now(&pool).await),
            },
        )
        .await
        .unwrap();
    let ended = store
        .record_runs(&[(first, RunUpdate::Observed(RunState::exited(3, "")))])
        .await
        .unwrap();
    assert_eq!(ended.len(), 1);
    let retry_at = ended[0].2.expect("the failed run is retried");
    let row = fire_of(&store, first).await;
    assert_eq!(
        (row.status.as_str(), row.run_state.as_deref(), row.retry),
        ("claimed", None, 1)
    );
    assert_eq!(row.lease_expires_at, retry_at);
    let try1 = &row.tries[0];
    assert_eq!(
        (
            try1.outcome.as_str(),
            try1.exit_code,
            try1.output.as_deref()
        ),
        ("failed", Some(3), Some("step 1\nboom"))
    );
    assert!(try1.started_at.is_some() && try1.finished_at.is_some());
    assert_eq!(failed_events(&pool, routine.id).await, 0);

    // While its retry waits, the occurrence still holds the routine's run: a later one is
    // skipped under `forbid`.
    let later = crate::support::minute_floor(db_now(&pool).await) - TimeDelta::minutes(1);
    store
        .request_occurrences(routine.id, &[later])
        .await
        .unwrap();
    let later = claim_of(&store, routine.id).await.occurrence;
    assert!(matches!(
        store.take_run(later, None).await.unwrap(),
        RunTake::Skip { holder, .. } if holder == first
    ));

    // The retry is taken over, finds the run its own, and its run has a new name.
    let retried = take_retry(&store, &pool, first).await;
    assert_eq!(retried.retry, 1);
    assert_eq!(store.take_run(first, None).await.unwrap(), RunTake::Launch);
    launched(&pool, first).await;
    let unfinished = store.unfinished_runs(10).await.unwrap();
    let mine = unfinished.iter().find(|r| r.occurrence == first).unwrap();
    assert_eq!(mine.run_name(), format!("{}-r1", first.idempotency_key()));

    // Lost this time, with its retry spent: the occurrence's outcome, said why.
    let ended = store
        .record_runs(&[(
            first,
            RunUpdate::Observed(RunState::Lost {
                reason: ErrorText::new("the container is gone"),
            }),
        )])
        .await
        .unwrap();
    assert_eq!(ended[0].2, None);
    let row = fire_of(&store, first).await;
    assert_eq!(
        (row.status.as_str(), row.run_state.as_deref()),
        ("fired", Some("lost"))
    );
    assert_eq!(
        row.run_reason.as_deref(),
        Some("the container is gone; retries spent (1 of 1)")
    );
    assert_eq!(failed_events(&pool, routine.id).await, 1);
}
