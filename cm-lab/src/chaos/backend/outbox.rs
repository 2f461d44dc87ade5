//! The transactional outbox, the product's default backend: every `fired` row has exactly one
//! `outbox_messages` row, written by one of its attempts, and no message lacks a fire.

use sqlx::postgres::PgPool;

use crate::chaos::report::Findings;

/// What the outbox holds, against the ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub(in crate::chaos) struct OutboxCheck {
    pub messages: i64,
    pub fired: i64,
    pub fired_without_message: i64,
    pub messages_without_fire: i64,
    /// Messages whose fire is `failed`: written once, but the ledger says it failed.
    pub messages_of_failed: i64,
    /// Messages written by an attempt the ledger never reached.
    pub messages_ahead_of_attempt: i64,
    /// Two messages for one occurrence (the primary key forbids it; checked all the same).
    pub duplicate_messages: i64,
    /// Messages written by an attempt after the first.
    pub messages_by_retry: i64,
}

impl OutboxCheck {
    pub fn doubled(&self) -> i64 {
        self.messages_without_fire + self.messages_ahead_of_attempt + self.duplicate_messages
    }

    pub fn findings(&self) -> Findings {
        let mut f = Findings::default();
        f.line(
            "missing",
            format!("{} fired without a message", self.fired_without_message),
        );
        f.line(
            "doubled",
            format!(
                "{} ({} messages for {} fired rows; {} without a fire, {} by an attempt the ledger never reached, {} second messages)",
                self.doubled(),
                self.messages,
                self.fired,
                self.messages_without_fire,
                self.messages_ahead_of_attempt,
                self.duplicate_messages
            ),
        );
        f.line(
            "messages",
            format!(
                "{} of failed rows, {} written by a retry",
                self.messages_of_failed, self.messages_by_retry
            ),
        );
        f.require(self.fired_without_message > 0, || {
            format!(
                "{} fired occurrences have no outbox message",
                self.fired_without_message
            )
        });
        f.require(self.doubled() > 0, || {
            format!(
                "doubled: {} messages without a fire, {} written by an attempt the ledger never \
                 reached, {} second messages for one occurrence",
                self.messages_without_fire, self.messages_ahead_of_attempt, self.duplicate_messages
            )
        });
        f
    }
}

pub(in crate::chaos) async fn check(pool: &PgPool) -> anyhow::Result<OutboxCheck> {
    let row: (i64, i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT
           (SELECT count(*) FROM cm.outbox_messages),
           (SELECT count(*) FROM cm.routine_fires WHERE status = 'fired'),
           (SELECT count(*) FROM cm.routine_fires f
            WHERE f.status = 'fired' AND NOT EXISTS (
              SELECT 1 FROM cm.outbox_messages o
              WHERE o.routine_id = f.routine_id AND o.scheduled_at = f.scheduled_at)),
           (SELECT count(*) FROM cm.outbox_messages o
            WHERE NOT EXISTS (
              SELECT 1 FROM cm.routine_fires f
              WHERE f.routine_id = o.routine_id AND f.scheduled_at = o.scheduled_at)),
           (SELECT count(*) FROM cm.outbox_messages o
            JOIN cm.routine_fires f USING (routine_id, scheduled_at) WHERE f.status = 'failed'),
           (SELECT count(*) FROM cm.outbox_messages o
            JOIN cm.routine_fires f USING (routine_id, scheduled_at) WHERE o.attempt > f.attempt),
           (SELECT count(*) - count(DISTINCT (routine_id, scheduled_at)) FROM cm.outbox_messages),
           (SELECT count(*) FROM cm.outbox_messages WHERE attempt > 1)",
    )
    .fetch_one(pool)
    .await?;
    Ok(OutboxCheck {
        messages: row.0,
        fired: row.1,
        fired_without_message: row.2,
        messages_without_fire: row.3,
        messages_of_failed: row.4,
        messages_ahead_of_attempt: row.5,
        duplicate_messages: row.6,
        messages_by_retry: row.7,
    })
}

/// Outbox rows, which a run with another backend must not have.
pub(in crate::chaos) async fn stray_rows(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM cm.outbox_messages")
            .fetch_one(pool)
            .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::ledger::tests::five_fires;

    /// A clean outbox passes; a message without a fire and a message from an attempt the
    /// ledger never reached are each found, and so is a fire whose message is gone.
    #[sqlx::test(migrator = "cm_store::MIGRATOR")]
    async fn the_check_finds_what_was_lost_or_doubled(pool: PgPool) {
        let (_, first) = five_fires(&pool).await;
        let at = |s: i64| first + chrono::TimeDelta::seconds(s);
        sqlx::query(
            "INSERT INTO cm.outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
             SELECT routine_id, scheduled_at, routine_id::text || scheduled_at::text, attempt, '{}'
             FROM cm.routine_fires",
        )
        .execute(&pool)
        .await
        .unwrap();
        let clean = check(&pool).await.unwrap();
        assert_eq!((clean.messages, clean.fired), (5, 5));
        assert!(clean.findings().problems.is_empty(), "{clean:?}");
        assert_eq!(stray_rows(&pool).await.unwrap(), 5);

        // Second 2 loses its message; second 3 keeps its message but loses its fire; second
        // 0's message claims to come from an attempt the ledger never reached.
        sqlx::query("DELETE FROM cm.outbox_messages WHERE scheduled_at = $1")
            .bind(at(2))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("DELETE FROM cm.routine_fires WHERE scheduled_at = $1")
            .bind(at(3))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("UPDATE cm.outbox_messages SET attempt = 2 WHERE scheduled_at = $1")
            .bind(at(0))
            .execute(&pool)
            .await
            .unwrap();
        let broken = check(&pool).await.unwrap();
        assert_eq!(broken.fired_without_message, 1, "{broken:?}");
        assert_eq!(broken.messages_without_fire, 1, "{broken:?}");
        assert_eq!(broken.messages_ahead_of_attempt, 1, "{broken:?}");
        assert_eq!(broken.doubled(), 2);
        assert_eq!(broken.findings().problems.len(), 2);
    }
}
