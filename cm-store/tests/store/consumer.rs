//! The outbox's consumer contract against the real database: consumers share the table through
//! leased batches taken in `seq` order, a crashed consumer's batch is taken again after its
//! lease, acknowledging is idempotent, and acknowledged rows are pruned after the retention.

use std::collections::HashSet;
use std::time::Duration;

use chrono::TimeDelta;
use cm_domain::Occurrence;
use cm_store::{OutboxAck, OutboxConsumer, OutboxMessage, OutboxStore, OutboxTake, PgStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::jan1;

/// Writes `n` messages of one routine, one a minute from 1 January 2026; returns their seqs.
async fn fill(store: &PgStore, n: i64) -> Vec<i64> {
    let routine = Uuid::new_v4();
    for i in 0..n {
        let occurrence = Occurrence::new(routine, jan1(2026) + TimeDelta::minutes(i));
        store
            .outbox_insert(&OutboxMessage {
                occurrence,
                idempotency_key: occurrence.idempotency_key(),
                attempt: 1,
                payload: serde_json::json!({ "n": i }),
            })
            .await
            .unwrap();
    }
    store
        .outbox_read(0, 1000)
        .await
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect()
}

fn take(consumer: &str, limit: u32) -> OutboxTake {
    OutboxTake {
        group: None,
        consumer: consumer.into(),
        limit,
        lease: Duration::from_secs(60),
    }
}

async fn seqs(store: &PgStore, t: &OutboxTake) -> Vec<i64> {
    acks(store, t).await.iter().map(|a| a.seq).collect()
}

/// Takes a batch and returns the acknowledgements of its messages.
async fn acks(store: &PgStore, t: &OutboxTake) -> Vec<OutboxAck> {
    store
        .outbox_take(t)
        .await
        .unwrap()
        .iter()
        .map(|d| d.ack())
        .collect()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn consumers_share_the_outbox_in_seq_order(pool: PgPool) {
    let store = PgStore::new(pool);
    let all = fill(&store, 7).await;

    let a = acks(&store, &take("a", 3)).await;
    let b = seqs(&store, &take("b", 3)).await;
    let c = seqs(&store, &take("c", 3)).await;
    assert_eq!(a.iter().map(|a| a.seq).collect::<Vec<_>>(), all[0..3]);
    assert_eq!(b, all[3..6]);
    assert_eq!(c, all[6..]);
    // Everything is leased: a fourth consumer gets nothing.
    assert!(seqs(&store, &take("d", 3)).await.is_empty());

    let backlog = store.outbox_backlog(100).await.unwrap();
    assert_eq!((backlog.pending, backlog.leased), (7, 7));
    assert_eq!(backlog.messages[0].leased_by.as_deref(), Some("a"));
    assert_eq!(backlog.oldest, Some(backlog.messages[0].message.created_at));

    assert_eq!(store.outbox_ack("a", &a).await.unwrap(), 3);
    let backlog = store.outbox_backlog(100).await.unwrap();
    assert_eq!((backlog.pending, backlog.leased), (4, 4));
    assert_eq!(backlog.messages[0].message.seq, all[3]);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn consumers_taking_at_once_never_share_a_row(pool: PgPool) {
    let store = PgStore::new(pool);
    let all = fill(&store, 40).await;
    let takes = (0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move { seqs(&store, &take(&format!("c{i}"), 5)).await })
    });
    let mut seen = HashSet::new();
    for handle in takes {
        for seq in handle.await.unwrap() {
            assert!(seen.insert(seq), "seq {seq} taken twice");
        }
    }
    assert_eq!(seen, all.into_iter().collect());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_crashed_consumers_batch_is_taken_again_after_its_lease(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let all = fill(&store, 3).await;
    // "crashed" takes the first two and never acknowledges them.
    assert_eq!(seqs(&store, &take("crashed", 2)).await, all[0..2]);
    // While its lease is live, another consumer gets only the rest.
    assert_eq!(seqs(&store, &take("survivor", 10)).await, all[2..]);
    // Its lease runs out (time is moved in the database).
    sqlx::query("UPDATE cm.outbox_messages SET lease_expires_at = now() - interval '1 second' WHERE leased_by = 'crashed'")
        .execute(&pool)
        .await
        .unwrap();
    let again = store.outbox_take(&take("survivor", 10)).await.unwrap();
    let taken: Vec<_> = again
        .iter()
        .map(|d| (d.message.seq, d.deliveries))
        .collect();
    assert_eq!(taken, [(all[0], 2), (all[1], 2)]);
}

/// Acknowledging is fenced on the take: a consumer whose lease ran out, and whose rows another
/// consumer (or a later take under the same name) has taken since, acknowledges none of them;
/// they stay leased to the one that holds them, which acknowledges them.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_consumer_whose_lease_ran_out_cannot_acknowledge_rows_taken_again(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    fill(&store, 3).await;
    let expire = || async {
        sqlx::query("UPDATE cm.outbox_messages SET lease_expires_at = now() - interval '1 second'")
            .execute(&pool)
            .await
            .unwrap();
    };
    let slow = acks(&store, &take("slow", 10)).await;
    expire().await;
    let current = acks(&store, &take("current", 10)).await;
    assert_eq!(current.len(), 3);
    assert_eq!(store.outbox_ack("slow", &slow).await.unwrap(), 0);
    let backlog = store.outbox_backlog(10).await.unwrap();
    assert_eq!((backlog.pending, backlog.leased), (3, 3));

    // The same name taking again is another take: the first take's token no longer matches.
    expire().await;
    let again = acks(&store, &take("current", 10)).await;
    assert_eq!(store.outbox_ack("current", &current).await.unwrap(), 0);
    // Neither a token under another consumer's name.
    assert_eq!(store.outbox_ack("slow", &again).await.unwrap(), 0);
    assert_eq!(store.outbox_ack("current", &again).await.unwrap(), 3);
    assert_eq!(store.outbox_backlog(10).await.unwrap().pending, 0);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn acknowledging_is_idempotent_and_final(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let all = fill(&store, 2).await;
    let batch = acks(&store, &take("a", 10)).await;
    assert_eq!(store.outbox_ack("a", &batch).await.unwrap(), 2);
    assert_eq!(store.outbox_ack("a", &batch).await.unwrap(), 0);
    assert_eq!(store.outbox_ack("b", &batch).await.unwrap(), 0);
    // Acknowledged rows are not taken again, even with their lease long over.
    sqlx::query("UPDATE cm.outbox_messages SET lease_expires_at = now() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(seqs(&store, &take("b", 10)).await.is_empty());
    let backlog = store.outbox_backlog(10).await.unwrap();
    assert_eq!((backlog.pending, backlog.oldest), (0, None));
    let acked_by: Vec<String> =
        sqlx::query_scalar("SELECT acked_by FROM cm.outbox_messages ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(acked_by, ["a", "a"]);
    assert_eq!(all.len(), 2);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn only_acknowledged_rows_past_the_retention_are_pruned(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let all = fill(&store, 4).await;
    let retention = Duration::from_secs(30 * 86_400);
    let batch = acks(&store, &take("a", 3)).await;
    store.outbox_ack("a", &batch[0..2]).await.unwrap();
    // The first was acknowledged long ago; the second just now; the third is leased, not
    // acknowledged; the fourth pending.
    sqlx::query(
        "UPDATE cm.outbox_messages SET acked_at = now() - interval '31 days' WHERE seq = $1",
    )
    .bind(all[0])
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(store.outbox_prune_acked(retention, 100).await.unwrap(), 1);
    assert_eq!(store.outbox_prune_acked(retention, 100).await.unwrap(), 0);
    let left: Vec<i64> = store
        .outbox_read(0, 100)
        .await
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(left, all[1..]);
}
