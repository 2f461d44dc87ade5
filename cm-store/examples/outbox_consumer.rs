//! A sibling service that consumes cm's message outbox the transactional-outbox way: it takes a
//! batch under a lease, does its own work for each message in its own transaction (here: queue
//! a mail in its `mails` table), records each message's idempotency key in the same transaction
//! (its *inbox*, `digest_inbox`), commits, and only then acknowledges the batch.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/cm \
//! SERVICE_DATABASE_URL=postgres://postgres@127.0.0.1:5432/mailer \
//!     cargo run -p cm-store --example outbox_consumer
//! ```
//!
//! `DATABASE_URL` is cm's database; `SERVICE_DATABASE_URL` the service's own (by default the
//! same one). A consumer that dies after its commit and before its acknowledgement leaves its
//! batch leased and unacknowledged; when the lease runs out, the next take delivers the batch
//! again, and the inbox's primary key tells the service it has done that work already: it drops
//! the duplicate and acknowledges it. Delivery is at least once; the service's work happens
//! once. `cargo test -p cm-store --example outbox_consumer` runs the test below against the
//! PostgreSQL `DATABASE_URL` names.

use std::time::Duration;

use cm_store::{OutboxConsumer, OutboxDelivery, OutboxTake, PgStore, StoreError};
use sqlx::PgPool;

/// The service's own tables: the inbox of keys it has handled, and the work itself.
const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS digest_inbox (
        idempotency_key TEXT PRIMARY KEY,
        outbox_seq BIGINT NOT NULL,
        received_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )",
    "CREATE TABLE IF NOT EXISTS mails (
        id BIGSERIAL PRIMARY KEY,
        idempotency_key TEXT NOT NULL,
        body TEXT NOT NULL
    )",
];

/// One consumer: cm's store (the outbox) and the service's own database.
struct Consumer {
    outbox: PgStore,
    service: PgPool,
    take: OutboxTake,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
struct Pass {
    /// Messages taken.
    taken: usize,
    /// Messages whose work this pass did.
    handled: usize,
    /// Messages the inbox already had: a delivery after a crash before the ack.
    duplicates: usize,
    /// Acknowledgements the outbox accepted.
    acked: u64,
}

impl Consumer {
    /// Takes a batch, does its work in one transaction of the service's database, calls
    /// `after_commit` (nothing in the service; the test's crash point), then acknowledges.
    async fn pass(&self, after_commit: impl FnOnce()) -> Result<Pass, StoreError> {
        let batch = self.outbox.outbox_take(&self.take).await?;
        let mut pass = Pass {
            taken: batch.len(),
            ..Pass::default()
        };
        if batch.is_empty() {
            return Ok(pass);
        }
        let mut tx = self.service.begin().await?;
        for delivery in &batch {
            if remember(&mut tx, delivery).await? {
                let text = delivery.message.payload["text"]
                    .as_str()
                    .unwrap_or_default();
                sqlx::query("INSERT INTO mails (idempotency_key, body) VALUES ($1, $2)")
                    .bind(&delivery.message.idempotency_key)
                    .bind(text)
                    .execute(&mut *tx)
                    .await?;
                pass.handled += 1;
            } else {
                pass.duplicates += 1;
            }
        }
        tx.commit().await?;
        after_commit();
        let acks: Vec<_> = batch.iter().map(OutboxDelivery::ack).collect();
        pass.acked = self.outbox.outbox_ack(&self.take.consumer, &acks).await?;
        Ok(pass)
    }
}

/// Records the delivery's key in the inbox; `false` when it is there already (this work was
/// done and committed by an earlier delivery).
async fn remember(
    tx: &mut sqlx::PgConnection,
    delivery: &OutboxDelivery,
) -> Result<bool, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO digest_inbox (idempotency_key, outbox_seq) VALUES ($1, $2)
         ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(&delivery.message.idempotency_key)
    .bind(delivery.message.seq)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")?;
    let service_url = std::env::var("SERVICE_DATABASE_URL").unwrap_or_else(|_| url.clone());
    let service = PgPool::connect(&service_url).await?;
    for statement in SCHEMA {
        sqlx::query(statement).execute(&service).await?;
    }
    let consumer = Consumer {
        outbox: PgStore::connect(&url).await?,
        service,
        take: OutboxTake {
            consumer: format!("mailer-{}", std::process::id()),
            limit: 100,
            lease: Duration::from_secs(30),
            group: None,
        },
    };
    loop {
        let pass = consumer.pass(|| {}).await?;
        if pass.taken > 0 {
            println!("{pass:?}");
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use cm_domain::{Occurrence, Schedule};
    use cm_store::{NewRoutine, OutboxMessage, OutboxStore, RoutineKind, RoutineStore};
    use serde_json::json;

    /// A consumer with pools of its own (closed when it dies) on the test's database.
    async fn consumer(pool: &PgPool, name: &str, lease: Duration) -> Consumer {
        let options = (*pool.connect_options()).clone();
        let connect = || PgPool::connect_with(options.clone());
        Consumer {
            outbox: PgStore::new(connect().await.unwrap()),
            service: connect().await.unwrap(),
            take: OutboxTake {
                consumer: name.into(),
                limit: 10,
                lease,
                group: None,
            },
        }
    }

    async fn count(pool: &PgPool, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
    }

    /// Three messages in the outbox; a consumer commits its work for them and dies before its
    /// acknowledgement (its task panics at the crash point and its connections close). The
    /// batch stays leased until the lease runs out; a second consumer then gets the same three
    /// messages again (their second delivery), drops them as duplicates by their idempotency
    /// keys and acknowledges them. Each mail is queued once, and nothing is left pending.
    #[sqlx::test(migrator = "cm_store::MIGRATOR")]
    async fn a_consumer_that_dies_between_its_commit_and_its_ack_does_its_work_once(pool: PgPool) {
        for statement in SCHEMA {
            sqlx::query(statement).execute(&pool).await.unwrap();
        }
        let store = PgStore::new(pool.clone());
        let routine = store
            .create_routine(
                NewRoutine::builder(
                    "digest for ada",
                    Schedule::parse("0 9 * * *", "Europe/Berlin").unwrap(),
                    RoutineKind::Message,
                    json!({ "text": "Good morning" }),
                )
                .build()
                .unwrap(),
            )
            .await
            .unwrap();
        for day in 1..=3 {
            let occurrence = Occurrence::new(
                routine.id,
                Utc.with_ymd_and_hms(2026, 12, day, 8, 0, 0).unwrap(),
            );
            let written = store
                .outbox_insert(&OutboxMessage {
                    occurrence,
                    idempotency_key: occurrence.idempotency_key(),
                    attempt: 1,
                    payload: json!({ "text": format!("Good morning, day {day}") }),
                })
                .await
                .unwrap();
            assert!(written);
        }

        // The first consumer dies at the crash point, after its commit.
        let lease = Duration::from_secs(1);
        let first = consumer(&pool, "mailer-1", lease).await;
        let died = tokio::spawn(async move {
            first
                .pass(|| panic!("the consumer dies after its commit, before its ack"))
                .await
        })
        .await;
        assert!(
            died.is_err_and(|e| e.is_panic()),
            "the first consumer did not die"
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM mails").await, 3);
        let unacked = "SELECT count(*) FROM cm.outbox_messages WHERE acked_at IS NULL";
        assert_eq!(
            count(&pool, unacked).await,
            3,
            "the dead consumer's batch was acked"
        );

        // While its lease lasts, nobody else gets the batch.
        let second = consumer(&pool, "mailer-2", Duration::from_secs(30)).await;
        assert_eq!(second.pass(|| {}).await.unwrap(), Pass::default());

        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let again = second.pass(|| {}).await.unwrap();
        assert_eq!(
            again,
            Pass {
                taken: 3,
                handled: 0,
                duplicates: 3,
                acked: 3
            }
        );
        let delivered: Vec<i32> =
            sqlx::query_scalar("SELECT deliveries FROM cm.outbox_messages ORDER BY seq")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(
            delivered,
            [2, 2, 2],
            "the batch was not delivered a second time"
        );
        assert_eq!(count(&pool, "SELECT count(*) FROM mails").await, 3);
        assert_eq!(
            count(&pool, "SELECT count(DISTINCT idempotency_key) FROM mails").await,
            3
        );
        assert_eq!(count(&pool, unacked).await, 0);
        assert_eq!(second.pass(|| {}).await.unwrap(), Pass::default());
    }
}
