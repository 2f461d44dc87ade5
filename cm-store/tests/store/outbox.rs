//! The message outbox: one row per occurrence (a retried dispatch inserts nothing), read back
//! in `seq` order.

use chrono::TimeDelta;
use cm_domain::Occurrence;
use cm_store::{OutboxMessage, OutboxStore, PgStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{jan1, take_next_outbox_number};

fn message(occurrence: Occurrence, attempt: u32, text: &str) -> OutboxMessage {
    OutboxMessage {
        occurrence,
        idempotency_key: occurrence.idempotency_key(),
        attempt,
        payload: serde_json::json!({ "text": text }),
    }
}

async fn outbox_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.outbox_messages")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_second_insert_for_an_occurrence_is_a_no_op(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // The outbox is keyed by the occurrence alone; it needs no routine row.
    let occurrence = Occurrence::new(Uuid::new_v4(), jan1(2026));
    assert!(
        store
            .outbox_insert(&message(occurrence, 1, "first"))
            .await
            .unwrap()
    );
    // A retry after a crash (attempt 2, even with another payload) changes nothing.
    assert!(
        !store
            .outbox_insert(&message(occurrence, 2, "retry"))
            .await
            .unwrap()
    );
    assert_eq!(outbox_rows(&pool).await, 1);
    let rows = store.outbox_read(0, 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(
        (row.routine_id, row.scheduled_at),
        (occurrence.routine_id, occurrence.scheduled_at)
    );
    assert_eq!(row.idempotency_key, occurrence.idempotency_key().as_str());
    assert_eq!(row.attempt, 1);
    assert_eq!(row.payload, serde_json::json!({ "text": "first" }));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_number_already_taken_is_an_error_not_the_occurrences_message(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let occurrence = Occurrence::new(Uuid::new_v4(), jan1(2026));
    // A row written by hand holds the number the insert draws next, in the occurrence's group.
    take_next_outbox_number(&pool, occurrence.routine_id).await;

    // Not `false` ("already there"): the occurrence has no message, and the caller must know.
    let error = store
        .outbox_insert(&message(occurrence, 1, "first"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("outbox_messages_group_seq_key"),
        "{error}"
    );
    // The number is spent; the retry writes it.
    assert!(
        store
            .outbox_insert(&message(occurrence, 2, "retry"))
            .await
            .unwrap()
    );
    assert_eq!(outbox_rows(&pool).await, 2);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn messages_are_read_in_insertion_order(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = Uuid::new_v4();
    // Inserted newest occurrence first, so `seq` order differs from occurrence order.
    let occurrences: Vec<_> = (0..4)
        .rev()
        .map(|i| Occurrence::new(routine, jan1(2026) + TimeDelta::minutes(i)))
        .collect();
    for (i, occurrence) in occurrences.iter().enumerate() {
        assert!(
            store
                .outbox_insert(&message(*occurrence, 1, &format!("m{i}")))
                .await
                .unwrap()
        );
    }

    let all = store.outbox_read(0, 100).await.unwrap();
    let texts: Vec<_> = all.iter().map(|r| r.payload["text"].clone()).collect();
    assert_eq!(texts, ["m0", "m1", "m2", "m3"]);
    let read: Vec<_> = all.iter().map(|r| r.scheduled_at).collect();
    let inserted: Vec<_> = occurrences.iter().map(|o| o.scheduled_at).collect();
    assert_eq!(read, inserted);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));

    // A consumer resumes after the last `seq` it saw, a page at a time.
    let page = store.outbox_read(all[0].seq, 2).await.unwrap();
    assert_eq!(page, all[1..3]);
    let rest = store.outbox_read(page[1].seq, 2).await.unwrap();
    assert_eq!(rest, all[3..]);
    assert!(store.outbox_read(all[3].seq, 2).await.unwrap().is_empty());
}
