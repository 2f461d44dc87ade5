//! Settling: fenced on the claim's token and attempt, terminal, and keeping a bounded error.

use cm_domain::claim::MAX_ERROR_BYTES;
use cm_domain::{ClaimOutcome, ErrorText, FireOutcome, MisfirePolicy, Settlement};
use cm_store::{
    ClaimedFire, FireFilter, FireLedger, FireRef, FireSettle, PgStore, RoutineStore, SettleOutcome,
};
use sqlx::PgPool;

use crate::support::{due_yearly, expire_lease, fire_of, params, reap_params};

/// Claims this year's occurrence of a new yearly routine as `a`; returns the fresh claim.
async fn fresh_claim(store: &PgStore, pool: &PgPool) -> ClaimedFire {
    due_yearly(store, pool, MisfirePolicy::FireOnce).await;
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 1);
    let fire = tick.fires[0].clone();
    assert_eq!(fire.outcome(tick.token), ClaimOutcome::Fresh);
    fire
}

fn failed(text: &str) -> Settlement {
    Settlement::Failed(ErrorText::new(text))
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_holder_settles_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let fire = fresh_claim(&store, &pool).await;
    let claimed = fire_of(&store, fire.occurrence).await;

    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let fired = fire_of(&store, fire.occurrence).await;
    assert_eq!(fired.status, "fired");
    assert_eq!(fired.error, None);
    assert!(fired.completed_at.is_some_and(|t| t >= claimed.claimed_at));
    // Settling touches only the status and completion: the claim's record stays.
    assert_eq!(
        (fired.claimant.as_str(), fired.attempt, fired.claimed_at),
        ("a", 1, claimed.claimed_at)
    );

    // Settling is terminal: neither the same settle again nor a contradicting one changes the
    // row.
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::TakenOver
    );
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &failed("late failure"))
            .await
            .unwrap(),
        SettleOutcome::TakenOver
    );
    assert_eq!(fire_of(&store, fire.occurrence).await, fired);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_stale_claimant_cannot_settle_the_row_taken_over(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let first = fresh_claim(&store, &pool).await;
    // The first claimant stalls past its lease; the reaper hands the occurrence to `b`.
    expire_lease(&pool, first.occurrence).await;
    let reaped = store.reap_expired(&reap_params("b", 10)).await.unwrap();
    assert_eq!(reaped.fires.len(), 1);
    let second = reaped.fires[0].clone();
    assert_eq!(
        second.outcome(reaped.token),
        ClaimOutcome::Retry { attempt: 2 }
    );
    let held = fire_of(&store, first.occurrence).await;

    // The stale claimant wakes up and reports: neither success nor failure lands.
    assert_eq!(
        store
            .settle_fire(&first.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::TakenOver
    );
    assert_eq!(
        store
            .settle_fire(&first.fire_ref(), &failed("stale"))
            .await
            .unwrap(),
        SettleOutcome::TakenOver
    );
    // Neither does the new token with the old attempt, nor the old token with the new attempt:
    // the fence is on both.
    let mixed = [
        FireRef {
            attempt: 1,
            ..second.fire_ref()
        },
        FireRef {
            attempt: 2,
            ..first.fire_ref()
        },
    ];
    for fire_ref in &mixed {
        assert_eq!(
            store
                .settle_fire(fire_ref, &Settlement::Fired)
                .await
                .unwrap(),
            SettleOutcome::TakenOver
        );
    }
    let unchanged = fire_of(&store, first.occurrence).await;
    assert_eq!(unchanged, held);
    assert_eq!(
        (
            unchanged.status.as_str(),
            unchanged.claimant.as_str(),
            unchanged.attempt
        ),
        ("claimed", "b", 2)
    );

    // The claimant holding attempt 2 settles normally.
    assert_eq!(
        store
            .settle_fire(&second.fire_ref(), &failed("target refused"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let settled = fire_of(&store, first.occurrence).await;
    assert_eq!(settled.status, "failed");
    assert_eq!(settled.attempt, 2);
    assert_eq!(settled.error.as_deref(), Some("target refused"));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_failure_keeps_its_error(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let fire = fresh_claim(&store, &pool).await;
    let text = "webhook answered 503: Service Unavailable";
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &failed(text))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let row = fire_of(&store, fire.occurrence).await;
    assert_eq!(row.status, "failed");
    assert_eq!(row.error.as_deref(), Some(text));
    assert!(row.completed_at.is_some());
    // A failure is terminal: a later success report does not turn it into a fire.
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::TakenOver
    );
    assert_eq!(fire_of(&store, fire.occurrence).await, row);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_huge_error_is_bounded_and_accepted(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let fire = fresh_claim(&store, &pool).await;
    // Two-byte characters, so the cut must land on a character boundary to stay valid UTF-8.
    let huge = "é".repeat(3 * MAX_ERROR_BYTES);

    // The bound matters: the schema refuses the raw text outright.
    let raw = sqlx::query(
        "UPDATE cm.routine_fires SET status = 'failed', error = $3, completed_at = now()
         WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(fire.occurrence.routine_id)
    .bind(fire.occurrence.scheduled_at)
    .bind(&huge)
    .execute(&pool)
    .await
    .unwrap_err();
    assert_eq!(
        raw.as_database_error().map(|e| e.kind()),
        Some(sqlx::error::ErrorKind::CheckViolation)
    );

    let bounded = ErrorText::new(huge.clone());
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &Settlement::Failed(bounded.clone()))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let row = fire_of(&store, fire.occurrence).await;
    let kept = row.error.unwrap();
    assert_eq!(kept, bounded.as_str());
    assert!(kept.len() <= MAX_ERROR_BYTES, "{} bytes", kept.len());
    assert!(kept.len() > MAX_ERROR_BYTES - 8, "{} bytes", kept.len());
    assert!(kept.ends_with('…'));
    assert!(huge.starts_with(kept.trim_end_matches('…')));
    let octets: i32 = sqlx::query_scalar(
        "SELECT octet_length(error) FROM cm.routine_fires WHERE routine_id = $1",
    )
    .bind(fire.occurrence.routine_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(usize::try_from(octets).unwrap(), kept.len());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn listing_filters_and_orders_fires(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // Three routines, each with this year's occurrence claimed; one fired, one failed.
    for _ in 0..3 {
        due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    }
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 3);
    let [one, two, three] = [&tick.fires[0], &tick.fires[1], &tick.fires[2]];
    assert_eq!(
        store
            .settle_fire(&one.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    assert_eq!(
        store
            .settle_fire(&two.fire_ref(), &failed("boom"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );

    let list = |routine_id, outcome, limit| {
        let store = store.clone();
        async move {
            store
                .list_fires(&FireFilter {
                    routine_id,
                    outcome,
                    limit,
                    after: None,
                })
                .await
                .unwrap()
        }
    };
    assert_eq!(list(None, None, 10).await.len(), 3);
    assert_eq!(list(None, None, 2).await.len(), 2);
    let failed_rows = list(None, Some(FireOutcome::Failed), 10).await;
    assert_eq!(failed_rows.len(), 1);
    assert_eq!(failed_rows[0].routine_id, two.occurrence.routine_id);
    let claimed_rows = list(None, Some(FireOutcome::Claimed), 10).await;
    assert_eq!(claimed_rows.len(), 1);
    assert_eq!(claimed_rows[0].routine_id, three.occurrence.routine_id);
    let mine = list(Some(one.occurrence.routine_id), None, 10).await;
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].status, "fired");
    assert!(
        list(
            Some(one.occurrence.routine_id),
            Some(FireOutcome::Failed),
            10
        )
        .await
        .is_empty()
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn pruning_deletes_only_settled_rows_past_the_retention(pool: PgPool) {
    use chrono::TimeDelta;
    use std::time::Duration;

    let store = PgStore::new(pool.clone());
    let routine = crate::support::create(
        &store,
        crate::support::YEARLY,
        cm_domain::MisfirePolicy::FireOnce,
    )
    .await;
    let now = crate::support::db_now(&pool).await;
    let day = TimeDelta::days(1);
    // (scheduled days ago, status, completed days ago)
    let rows = [
        (40, "fired", Some(40)),
        (41, "failed", Some(39)),
        (42, "claimed", None),
        (5, "fired", Some(5)),
        (43, "fired", Some(2)),
    ];
    for (scheduled, status, completed) in rows {
        sqlx::query(
            "INSERT INTO cm.routine_fires (routine_id, scheduled_at, status, completed_at, error,
                                        claimant, claim_token, lease_expires_at)
             VALUES ($1, $2, $3, $4, CASE WHEN $3 = 'failed' THEN 'boom' END, 'x', gen_random_uuid(), $2)",
        )
        .bind(routine.id)
        .bind(now - day * scheduled)
        .bind(status)
        .bind(completed.map(|c| now - day * c))
        .execute(&pool)
        .await
        .unwrap();
    }
    let retention = Duration::from_secs(30 * 24 * 3600);
    assert_eq!(
        store.prune_settled(retention, 1).await.unwrap(),
        1,
        "the limit holds"
    );
    assert_eq!(store.prune_settled(retention, 100).await.unwrap(), 1);
    assert_eq!(store.prune_settled(retention, 100).await.unwrap(), 0);
    // Left: the claimed row, the recent one, and the old one settled only recently.
    assert_eq!(crate::support::fire_count(&pool).await, 3);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_error_holding_nul_settles_with_the_nul_escaped(pool: PgPool) {
    // PostgreSQL text refuses NUL: stored raw, the settle would fail on every retry and the
    // occurrence be dispatched again until abandoned.
    let store = PgStore::new(pool.clone());
    let fire = fresh_claim(&store, &pool).await;
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &failed("peer said \0\u{1}bye\0"))
            .await
            .unwrap(),
        SettleOutcome::Settled
    );
    let row = fire_of(&store, fire.occurrence).await;
    assert_eq!(row.status, "failed");
    assert_eq!(row.error.as_deref(), Some("peer said \\0\u{1}bye\\0"));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_settle_after_the_routine_was_deleted_says_it_is_gone(pool: PgPool) {
    use cm_store::RoutineStore as _;
    let store = PgStore::new(pool.clone());
    let fire = fresh_claim(&store, &pool).await;
    store
        .delete_routine(fire.occurrence.routine_id)
        .await
        .unwrap();
    assert_eq!(
        store
            .settle_fire(&fire.fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::Gone
    );
}

/// Three routines with this year's occurrence claimed by `a`, and a store whose connections give
/// up a lock wait after 300 ms, as a scheduler's do (`StoreOptions::for_lease`).
async fn three_claimed(pool: &PgPool) -> (PgStore, Vec<ClaimedFire>) {
    let setup = PgStore::new(pool.clone());
    for _ in 0..3 {
        due_yearly(&setup, pool, MisfirePolicy::FireOnce).await;
    }
    let tick = setup.claim_due(&params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 3);
    let store = crate::support::impatient_store(pool).await;
    (store, tick.fires)
}

fn fired(fire: &ClaimedFire) -> FireSettle {
    FireSettle {
        fire: fire.fire_ref(),
        settlement: Settlement::Fired,
        receipt: Some("ok".into()),
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_batched_settle_settles_around_a_row_another_transaction_holds(pool: PgPool) {
    let (store, fires) = three_claimed(&pool).await;
    // A caller deletes the middle routine from SQL and keeps its transaction open: the
    // routine's fire rows are locked until it ends.
    let held = fires[1].occurrence.routine_id;
    let mut caller = pool.begin().await.unwrap();
    let deleted: bool = sqlx::query_scalar("SELECT cm.delete_routine($1)")
        .bind(held)
        .fetch_one(&mut *caller)
        .await
        .unwrap();
    assert!(deleted);

    let settles: Vec<FireSettle> = fires.iter().map(fired).collect();
    let outcomes = store.settle_fires(&settles).await.unwrap();
    assert_eq!(
        outcomes,
        [
            SettleOutcome::Settled,
            SettleOutcome::Locked,
            SettleOutcome::Settled
        ]
    );
    for fire in [&fires[0], &fires[2]] {
        assert_eq!(fire_of(&store, fire.occurrence).await.status, "fired");
    }
    // A single settle skips the locked row the same way, and a settle that waits for it gives
    // up after its wait, changing nothing.
    assert_eq!(
        store
            .settle_fire(&fires[1].fire_ref(), &Settlement::Fired)
            .await
            .unwrap(),
        SettleOutcome::Locked
    );
    assert_eq!(
        store
            .settle_waiting(&settles[1], std::time::Duration::from_millis(50))
            .await
            .unwrap(),
        SettleOutcome::Locked
    );

    // The caller changes its mind: the row is the claim's again, and settles.
    caller.rollback().await.unwrap();
    assert_eq!(
        store.settle_fires(&settles[1..2]).await.unwrap(),
        [SettleOutcome::Settled]
    );
    assert_eq!(fire_of(&store, fires[1].occurrence).await.status, "fired");
}

/// `fire` settled `fired` with `PgStore::settle_waiting` on a task of its own, waiting up to a
/// minute for a lock another transaction holds.
fn settle_in_background(
    store: &PgStore,
    fire: &ClaimedFire,
) -> tokio::task::JoinHandle<Result<SettleOutcome, cm_store::StoreError>> {
    let store = store.clone();
    let settle = fired(fire);
    tokio::spawn(async move {
        store
            .settle_waiting(&settle, std::time::Duration::from_secs(60))
            .await
    })
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_settle_waiting_on_a_lock_takes_the_row_when_its_holder_lets_go(pool: PgPool) {
    let (store, fires) = three_claimed(&pool).await;
    let occurrence = fires[0].occurrence;
    // The lease ran out while another transaction held the row.
    expire_lease(&pool, occurrence).await;
    let mut caller = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM cm.routine_fires WHERE routine_id = $1 FOR UPDATE")
        .bind(occurrence.routine_id)
        .execute(&mut *caller)
        .await
        .unwrap();

    // The settle queues on the lock; a reaper meanwhile skips the row rather than queue.
    let waiting = settle_in_background(&store, &fires[0]);
    crate::support::lock_waiters(&pool, 1).await;
    let reaped = store.reap_expired(&reap_params("b", 10)).await.unwrap();
    assert!(reaped.fires.is_empty(), "{reaped:?}");

    // The holder lets go without changing the row: the waiting settle has it first.
    caller.commit().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), SettleOutcome::Settled);
    let row = fire_of(&store, occurrence).await;
    assert_eq!((row.status.as_str(), row.attempt), ("fired", 1));
    let reaped = store.reap_expired(&reap_params("b", 10)).await.unwrap();
    assert!(reaped.fires.iter().all(|f| f.occurrence != occurrence));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_settle_whose_locked_row_was_deleted_says_it_is_gone(pool: PgPool) {
    let (store, fires) = three_claimed(&pool).await;
    let routine_id = fires[0].occurrence.routine_id;
    let mut caller = pool.begin().await.unwrap();
    sqlx::query("SELECT cm.delete_routine($1)")
        .bind(routine_id)
        .execute(&mut *caller)
        .await
        .unwrap();
    let waiting = settle_in_background(&store, &fires[0]);
    crate::support::lock_waiters(&pool, 1).await;
    caller.commit().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), SettleOutcome::Gone);
}

/// A store that pauses after three failures writes the pause in the settle of the third: the
/// first two failed settles leave the routine running, the third pauses it with the reason.
/// `per_group` claims in the routine's group (on Citus, on its shard), as a per-group
/// scheduler does.
pub(crate) async fn the_third_failed_settle_pauses(
    store: &PgStore,
    pool: &PgPool,
    per_group: bool,
) {
    use crate::support::{YEARLY, create, db_now, minute_floor};
    let store = store.clone().pausing_after_failures(3);
    // Never due by its schedule: each round asks for one past occurrence, as a backfill does.
    let failing = create(&store, YEARLY, MisfirePolicy::FireOnce).await;
    let count = store.group_count().await.unwrap();
    let now = minute_floor(db_now(pool).await);
    for round in 1..=3 {
        let at = now - chrono::TimeDelta::minutes(10 - round);
        store.request_occurrences(failing.id, &[at]).await.unwrap();
        let claim = store
            .claim_due(&cm_store::ClaimDueParams {
                group: per_group.then(|| cm_store::group_of(failing.id, count)),
                ..params("a")
            })
            .await
            .unwrap();
        assert_eq!(claim.fires.len(), 1, "round {round}: {claim:?}");
        let outcomes = store
            .settle_fires(&[FireSettle {
                fire: claim.fires[0].fire_ref(),
                settlement: failed("HTTP 503"),
                receipt: None,
            }])
            .await
            .unwrap();
        assert_eq!(outcomes, vec![SettleOutcome::Settled]);
        let routine = store.get_routine(failing.id).await.unwrap();
        assert_eq!(routine.paused, round == 3, "round {round}: {routine:?}");
        if round == 3 {
            let reason = routine.paused_reason.unwrap_or_default();
            assert!(
                reason.contains("its last 3 fires failed") && reason.contains("HTTP 503"),
                "{reason}"
            );
            assert_eq!(routine.next_run_at, None);
        }
    }
    // Each failure and the pause wrote its event, in order, in their transactions.
    let events = cm_store::EventLog::events(
        &store,
        &cm_store::EventFilter {
            routine: Some(failing.id),
            limit: 10,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let types: Vec<&str> = events.iter().rev().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "routine.failed",
            "routine.failed",
            "routine.failed",
            "routine.paused"
        ]
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_third_failed_settle_pauses_its_routine(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    the_third_failed_settle_pauses(&store, &pool, false).await;
}
