//! The transactional outbox: a message routine's fresh occurrence is inserted already `fired`
//! and its outbox row written by the claim statement itself, so a fire and its message exist
//! together or not at all; InFlight, Settled and Retry rows get no message from the claim.
//! Also batched settles: one statement, fenced per row, each row's outcome told apart.

use chrono::{DateTime, Utc};
use cm_domain::{ClaimOutcome, ErrorText, FireStatus, MisfirePolicy, Settlement};
use cm_store::{
    ClaimedFire, FireLedger, FireSettle, MAX_RECEIPT_BYTES, PgStore, RoutineStore, SettleOutcome,
};
use sqlx::PgPool;

use crate::support::{
    Seed, due_yearly, expire_lease, fire_count, fire_of, outbox_params, params, seed_fire,
    take_next_outbox_number,
};

/// How many outbox rows the database holds.
async fn outbox_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.outbox_messages")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Claims with the outbox and returns the claim's one fire, of `due`, fired in the claim.
async fn claim_fired_in_claim(store: &PgStore, due: DateTime<Utc>) -> ClaimedFire {
    let tick = store.claim_due(&outbox_params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 1);
    let fire = tick.fires.into_iter().next().unwrap();
    assert_eq!(fire.occurrence.scheduled_at, due);
    assert_eq!(
        fire.outcome(tick.token),
        ClaimOutcome::SettledInClaim(FireStatus::Fired)
    );
    fire
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_fresh_occurrence_and_its_message_are_written_together(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;

    let fire = &claim_fired_in_claim(&store, due).await;

    let row = fire_of(&store, fire.occurrence).await;
    assert_eq!((row.status.as_str(), row.attempt), ("fired", 1));
    assert!(row.completed_at.is_some());
    let (seq, key, payload): (i64, String, serde_json::Value) = sqlx::query_as(
        "SELECT seq, idempotency_key, payload FROM cm.outbox_messages
         WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(routine.id)
    .bind(due)
    .fetch_one(&pool)
    .await
    .unwrap();
    // The fire's receipt names the message's sequence number, and the message carries the
    // occurrence's key and the routine's payload.
    assert_eq!(row.receipt, Some(format!("outbox seq {seq}")));
    assert_eq!(fire.receipt, row.receipt);
    assert_eq!(key, fire.occurrence.idempotency_key().as_str());
    assert_eq!(payload, routine.payload);
    // The routine's clock moved past the occurrence in the same transaction.
    let after = store.get_routine(routine.id).await.unwrap();
    assert!(after.next_run_at > Some(due));
}

/// Installs a trigger that makes every insert into (or update of) `table` fail, as a database
/// refusing one statement of the claim would.
async fn refuse(pool: &PgPool, table: &str, event: &str) {
    sqlx::query(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TRIGGER refuse BEFORE {event} ON cm.{table} FOR EACH ROW EXECUTE FUNCTION refuse()"
    )))
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_failed_message_write_leaves_no_fire(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    refuse(&pool, "outbox_messages", "INSERT").await;

    let error = store.claim_due(&outbox_params("a")).await.unwrap_err();
    assert!(error.to_string().contains("refused by the test"), "{error}");
    // Neither the fire nor the message exists, and the clock did not move: the occurrence is
    // still owed, and the next tick claims it.
    assert_eq!((fire_count(&pool).await, outbox_count(&pool).await), (0, 0));
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!(after.next_run_at, Some(due));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_failure_after_the_message_leaves_neither(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    // The routine's advance is the claim's last write, after the fire and the message.
    refuse(&pool, "routines", "UPDATE").await;

    assert!(store.claim_due(&outbox_params("a")).await.is_err());
    assert_eq!((fire_count(&pool).await, outbox_count(&pool).await), (0, 0));
    sqlx::query("DROP TRIGGER refuse ON cm.routines")
        .execute(&pool)
        .await
        .unwrap();
    let tick = store.claim_due(&outbox_params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 1);
    assert_eq!(tick.fires[0].occurrence.scheduled_at, due);
    assert_eq!((fire_count(&pool).await, outbox_count(&pool).await), (1, 1));
    let _ = routine;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn rows_that_exist_get_no_message_from_the_claim(pool: PgPool) {
    // (the seeded row, the outcome the claim sees, the status the row keeps)
    let cases = [
        (Seed::claimed(30.0), "in-flight", "claimed"),
        (Seed::settled("fired"), "settled", "fired"),
        (Seed::settled("failed"), "settled", "failed"),
        // An expired claim is taken over and left to the dispatch path (Retry).
        (Seed::claimed(-1.0), "retry", "claimed"),
    ];
    for (seed, outcome, status) in cases {
        sqlx::query("TRUNCATE cm.routine_fires, cm.outbox_messages, cm.routines CASCADE")
            .execute(&pool)
            .await
            .unwrap();
        let store = PgStore::new(pool.clone());
        let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
        let occurrence = cm_domain::Occurrence::new(routine.id, due);
        seed_fire(&pool, occurrence, &seed).await;

        let tick = store.claim_due(&outbox_params("a")).await.unwrap();
        assert_eq!(tick.fires.len(), 1, "{outcome}");
        let got = match tick.fires[0].outcome(tick.token) {
            ClaimOutcome::InFlight { .. } => "in-flight",
            ClaimOutcome::Settled(_) => "settled",
            ClaimOutcome::Retry { .. } => "retry",
            other => panic!("{outcome}: unexpected {other:?}"),
        };
        assert_eq!(got, outcome);
        assert_eq!(
            fire_of(&store, occurrence).await.status,
            status,
            "{outcome}"
        );
        assert_eq!(outbox_count(&pool).await, 0, "{outcome}: no message");
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn without_an_in_claim_effect_a_message_routine_is_claimed_for_dispatch(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(tick.fires[0].outcome(tick.token), ClaimOutcome::Fresh);
    assert_eq!(tick.fires[0].receipt, None);
    assert_eq!(outbox_count(&pool).await, 0);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_batch_settle_is_fenced_and_tells_each_row_apart(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // Three routines, each with a fresh claim of this year's occurrence.
    let mut fires = Vec::new();
    for _ in 0..3 {
        due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    }
    let tick = store.claim_due(&params("a")).await.unwrap();
    fires.extend(tick.fires.iter().cloned());
    assert_eq!(fires.len(), 3);

    // The second claim is taken over by b after its lease; the third routine is deleted.
    expire_lease(&pool, fires[1].occurrence).await;
    let taken = store
        .reap_expired(&crate::support::reap_params("b", 10))
        .await
        .unwrap();
    assert_eq!(taken.fires.len(), 1);
    store
        .delete_routine(fires[2].occurrence.routine_id)
        .await
        .unwrap();

    let long = "é".repeat(MAX_RECEIPT_BYTES);
    let settles: Vec<FireSettle> = fires
        .iter()
        .map(|f| FireSettle {
            fire: f.fire_ref(),
            settlement: Settlement::Fired,
            receipt: Some(format!("HTTP 204 \0{long}")),
        })
        .collect();
    let outcomes = store.settle_fires(&settles).await.unwrap();
    assert_eq!(
        outcomes,
        [
            SettleOutcome::Settled,
            SettleOutcome::TakenOver,
            SettleOutcome::Gone
        ]
    );
    let first = fire_of(&store, fires[0].occurrence).await;
    assert_eq!(first.status, "fired");
    let receipt = first.receipt.unwrap();
    // The receipt is kept bounded, on a character boundary, without the NUL.
    assert!(receipt.starts_with("HTTP 204 é"), "{receipt:.20}");
    assert!(receipt.len() <= MAX_RECEIPT_BYTES);
    // b's claim is untouched by a's late settle.
    let second = fire_of(&store, fires[1].occurrence).await;
    assert_eq!((second.status.as_str(), second.attempt), ("claimed", 2));

    // Settling is terminal in a batch too, and a failure keeps its error.
    let again = store
        .settle_fires(&[FireSettle {
            fire: fires[0].fire_ref(),
            settlement: Settlement::Failed(ErrorText::new("late")),
            receipt: None,
        }])
        .await
        .unwrap();
    assert_eq!(again, [SettleOutcome::TakenOver]);
    let b = &taken.fires[0];
    let failed = store
        .settle_fires(&[FireSettle {
            fire: b.fire_ref(),
            settlement: Settlement::Failed(ErrorText::new("HTTP 500")),
            receipt: Some("HTTP 500".into()),
        }])
        .await
        .unwrap();
    assert_eq!(failed, [SettleOutcome::Settled]);
    let second = fire_of(&store, fires[1].occurrence).await;
    assert_eq!(
        (second.status.as_str(), second.error.as_deref()),
        ("failed", Some("HTTP 500"))
    );
    assert!(store.settle_fires(&[]).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_drawn_number_already_taken_rolls_the_claim_back(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    // A row written by hand holds the number the claim draws next, in the routine's group: a
    // message of another occurrence, under the `(group_id, seq)` key.
    let next = take_next_outbox_number(&pool, routine.id).await;

    // The claim fails whole: taken for the occurrence's own message, the conflict would have
    // recorded the fire as written with no message of its own.
    let error = store.claim_due(&outbox_params("a")).await.unwrap_err();
    assert!(
        error.to_string().contains("outbox_messages_group_seq_key"),
        "{error}"
    );
    assert_eq!((fire_count(&pool).await, outbox_count(&pool).await), (0, 1));
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!(after.next_run_at, Some(due));

    // The number is spent; the next claim draws past it and writes the occurrence's message.
    let fire = &claim_fired_in_claim(&store, due).await;
    let seq: i64 = sqlx::query_scalar(
        "SELECT seq FROM cm.outbox_messages WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(routine.id)
    .bind(due)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(seq > next);
    assert_eq!(fire.receipt, Some(format!("outbox seq {seq}")));
}
