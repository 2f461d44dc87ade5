//! The bench database's set-up and its ledger check: every-second routines created in one
//! statement, their clocks put back at one instant, and afterwards a check that every occurrence
//! the clocks moved past is in the ledger once, settled, with its outbox row where one is owed.

use anyhow::ensure;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// Empties the bench database (routines, ledger, requests, outbox) and vacuums it, so every run
/// starts from the same small tables.
pub(super) async fn reset(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE cm.routine_fires, cm.outbox_messages, cm.routine_requests, cm.routines")
        .execute(pool)
        .await?;
    sqlx::query("VACUUM ANALYZE cm.routines, cm.routine_fires, cm.outbox_messages")
        .execute(pool)
        .await?;
    Ok(())
}

/// Creates `n` message routines firing every second (`catch-up`), all first due at the whole
/// second `seconds_ahead` from the database's now, and returns that instant. A far instant parks
/// them: nothing is due until their clocks are put back. Each routine's group is written with it
/// (`cm_group_of`, as cm writes it): on Citus the row is routed by its group, and no trigger
/// fills it in.
pub(super) async fn create_routines(
    pool: &PgPool,
    n: u32,
    seconds_ahead: u32,
) -> anyhow::Result<DateTime<Utc>> {
    create_routines_of(
        pool,
        &Routines {
            n,
            prefix: "bench",
            schedule: "* * * * * *",
            key: None,
        },
        seconds_ahead,
    )
    .await
}

/// Message routines to create in one statement.
#[derive(Debug, Clone, Copy)]
pub(super) struct Routines<'a> {
    /// How many.
    pub n: u32,
    /// Their names are `<prefix> 1` to `<prefix> <n>`.
    pub prefix: &'a str,
    /// Their schedule, in UTC (the first instant must be one of its occurrences).
    pub schedule: &'a str,
    /// Their concurrency key (`None`: none).
    pub key: Option<&'a str>,
}

/// Creates `routines` (`catch-up`), as [`create_routines`] does, all first due at the whole second
/// `seconds_ahead` from the database's now, and returns that instant.
pub(super) async fn create_routines_of(
    pool: &PgPool,
    routines: &Routines<'_>,
    seconds_ahead: u32,
) -> anyhow::Result<DateTime<Utc>> {
    let n = routines.n;
    // `date_trunc` keeps the first occurrence on a whole second, where `* * * * * *` has one, so
    // the routines' clocks are ones the engine itself would set.
    let (first, groups): (DateTime<Utc>, i16) = sqlx::query_as(
        "SELECT date_trunc('second', now()) + make_interval(secs => $1),
                (SELECT group_count FROM cm.cm_settings)",
    )
    .bind(f64::from(seconds_ahead))
    .fetch_one(pool)
    .await?;
    // One statement for any count.
    let made = sqlx::query(
        "INSERT INTO cm.routines
             (id, group_id, name, schedule, timezone, kind, payload, misfire_policy, next_run_at,
              concurrency_key)
         SELECT g.id, cm.cm_group_of(g.id, $3), $4 || ' ' || g.i, $5, 'UTC', 'message',
                jsonb_build_object('text', $4 || ' message ' || g.i), 'catch-up', $2, $6
         FROM (SELECT gen_random_uuid() AS id, i FROM generate_series(1, $1) AS i) g",
    )
    .bind(i64::from(n))
    .bind(first)
    .bind(i32::from(groups))
    .bind(routines.prefix)
    .bind(routines.schedule)
    .bind(routines.key)
    .execute(pool)
    .await?
    .rows_affected();
    ensure!(made == u64::from(n), "{made} routines made, not {n}");
    sqlx::query("VACUUM ANALYZE cm.routines")
        .execute(pool)
        .await?;
    Ok(first)
}

/// Where [`put_clocks_back`] put the clocks, and when.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClocksBack {
    /// The first owed instant: every routine's clock.
    pub start: DateTime<Utc>,
    /// The database's clock when the update began (its transaction's `now()`).
    pub began: DateTime<Utc>,
    /// The database's clock when the update was done, just before its commit: no scheduler can
    /// see the backlog before this, so rates are measured from here.
    pub done: DateTime<Utc>,
}

/// Puts every routine's clock back to `backlog` seconds before the database's current whole
/// second, in one statement, and says when (see [`ClocksBack`]).
pub(super) async fn put_clocks_back(pool: &PgPool, backlog: u32) -> anyhow::Result<ClocksBack> {
    // The instant is read in the update's transaction, so `now()` is the update's own; the
    // update then sets a constant, which Citus sends to every shard as it is.
    let mut tx = pool.begin().await?;
    let (start, began): (DateTime<Utc>, DateTime<Utc>) =
        sqlx::query_as("SELECT date_trunc('second', now()) - make_interval(secs => $1), now()")
            .bind(f64::from(backlog))
            .fetch_one(&mut *tx)
            .await?;
    sqlx::query("UPDATE cm.routines SET next_run_at = $1")
        .bind(start)
        .execute(&mut *tx)
        .await?;
    // Thousands of routines take tens of milliseconds to update, while the schedulers still see
    // the old clocks: that is the bench's work, not theirs.
    let done: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(ClocksBack { start, began, done })
}

/// Fires settled `fired` in `(from, to]`, by their `completed_at`, and the claims they came in
/// (their distinct claim tokens: the outbox backend settles a fire in its claim).
pub(super) async fn fired_between(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT count(*), count(DISTINCT claim_token) FROM cm.routine_fires
         WHERE status = 'fired' AND completed_at > $1 AND completed_at <= $2",
    )
    .bind(from)
    .bind(to)
    .fetch_one(pool)
    .await?)
}

/// Fires per claimant, in the claimants' order.
pub(super) async fn fires_by_claimant(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires GROUP BY claimant ORDER BY claimant",
    )
    .fetch_all(pool)
    .await?)
}

/// What the ledger holds after a run, and what would be wrong with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct LedgerCheck {
    /// Ledger rows.
    pub fires: i64,
    /// Rows still `claimed` (a stopped scheduler settles what it claimed).
    pub claimed: i64,
    /// Rows settled `failed`.
    pub failed: i64,
    /// Routines whose ledger rows are not exactly one per second from the start to their clock:
    /// an occurrence lost (the clock moved past it without a row) or fired beyond the clock.
    pub gaps: i64,
    /// `fired` rows without their outbox row (when the backend is the outbox).
    pub missing_outbox: i64,
    /// Outbox rows without a `fired` row. (Neither table can hold an occurrence twice: both are
    /// keyed by routine and instant, so these two counts make the match one to one.)
    pub orphan_outbox: i64,
}

impl LedgerCheck {
    /// Everything that is wrong, one line each; empty when the ledger is sound.
    pub fn problems(&self) -> Vec<String> {
        [
            (self.claimed, "rows left claimed"),
            (self.failed, "rows settled failed"),
            (
                self.gaps,
                "routines with an occurrence lost or fired beyond their clock",
            ),
            (self.missing_outbox, "fired rows without their outbox row"),
            (self.orphan_outbox, "outbox rows without a fired row"),
        ]
        .into_iter()
        .filter(|(n, _)| *n != 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
    }

    /// Fails with every problem unless the ledger is sound.
    pub fn ensure_sound(&self, run: &str) -> anyhow::Result<()> {
        let problems = self.problems();
        ensure!(
            problems.is_empty(),
            "the ledger after {run} is not sound ({} rows): {}",
            self.fires,
            problems.join("; ")
        );
        Ok(())
    }
}

/// Checks the ledger against the routines' clocks: each routine owes one occurrence a second
/// from `start` up to its `next_run_at`. With `outbox`, every `fired` row must have exactly one
/// outbox row and every outbox row its `fired` row; without it (a backend double that writes
/// nothing) the outbox must be empty. Every join names the group too (a function of the routine,
/// so the same rows on plain PostgreSQL), which makes each a co-located join on Citus.
pub(super) async fn check(
    pool: &PgPool,
    start: DateTime<Utc>,
    outbox: bool,
) -> anyhow::Result<LedgerCheck> {
    check_named(pool, start, outbox, None).await
}

/// [`check`], with the clocks of only the routines whose names start with `prefix` (`None`:
/// every routine) held to one occurrence a second; the other counts cover the whole ledger.
pub(super) async fn check_named(
    pool: &PgPool,
    start: DateTime<Utc>,
    outbox: bool,
    prefix: Option<&str>,
) -> anyhow::Result<LedgerCheck> {
    let (fires, claimed, failed, gaps): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT
             (SELECT count(*) FROM cm.routine_fires),
             (SELECT count(*) FROM cm.routine_fires WHERE status = 'claimed'),
             (SELECT count(*) FROM cm.routine_fires WHERE status = 'failed'),
             (SELECT count(*) FROM cm.routines r
              LEFT JOIN (SELECT group_id, routine_id, count(*) AS n,
                                count(*) FILTER (WHERE scheduled_at < $1) AS early,
                                max(scheduled_at) AS last
                         FROM cm.routine_fires GROUP BY group_id, routine_id) f
                ON f.group_id = r.group_id AND f.routine_id = r.id
              WHERE ($2::text IS NULL OR starts_with(r.name, $2))
                AND (coalesce(f.n, 0) <> extract(epoch FROM r.next_run_at - $1)::bigint
                     OR coalesce(f.early, 0) > 0
                     OR f.last >= r.next_run_at))",
    )
    .bind(start)
    .bind(prefix)
    .fetch_one(pool)
    .await?;
    let (missing_outbox, orphan_outbox): (i64, i64) = sqlx::query_as(
        "SELECT
             (SELECT count(*) FROM cm.routine_fires f WHERE f.status = 'fired' AND NOT EXISTS (
                  SELECT 1 FROM cm.outbox_messages o
                  WHERE o.group_id = f.group_id AND o.routine_id = f.routine_id
                    AND o.scheduled_at = f.scheduled_at)),
             (SELECT count(*) FROM cm.outbox_messages o WHERE NOT EXISTS (
                  SELECT 1 FROM cm.routine_fires f
                  WHERE f.group_id = o.group_id AND f.routine_id = o.routine_id
                    AND f.scheduled_at = o.scheduled_at AND f.status = 'fired'))",
    )
    .fetch_one(pool)
    .await?;
    Ok(LedgerCheck {
        fires,
        claimed,
        failed,
        gaps,
        missing_outbox: if outbox { missing_outbox } else { 0 },
        // Without the outbox backend, any outbox row at all is one too many.
        orphan_outbox,
    })
}

/// The routine the lateness runs stall: the first by name, so the choice is stable.
pub(super) async fn first_routine(pool: &PgPool) -> anyhow::Result<Uuid> {
    Ok(
        sqlx::query_scalar("SELECT id FROM cm.routines ORDER BY name, id LIMIT 1")
            .fetch_one(pool)
            .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check finds each way a ledger can be wrong, and passes a sound one. Without this, a
    /// check that always passes would make any rate look honest.
    #[sqlx::test(migrator = "cm_store::MIGRATOR")]
    async fn the_check_finds_what_was_lost_or_left_unsettled(pool: PgPool) {
        let first = create_routines(&pool, 3, 3600).await.unwrap();
        let start = put_clocks_back(&pool, 10).await.unwrap().start;
        assert!(start < first);
        let sound = check(&pool, start, true).await.unwrap();
        assert_eq!(sound, LedgerCheck::default(), "nothing fired, nothing owed");

        // Each routine fires its first 4 occurrences, with outbox rows, and its clock moves on.
        sqlx::query(
            "WITH f AS (
                 INSERT INTO cm.routine_fires (routine_id, scheduled_at, claimant, claim_token,
                                            lease_expires_at, status, completed_at)
                 SELECT r.id, $1 + make_interval(secs => s), 'bench-a', gen_random_uuid(),
                        now(), 'fired', now()
                 FROM cm.routines r, generate_series(0, 3) AS s
                 RETURNING routine_id, scheduled_at)
             INSERT INTO cm.outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
             SELECT routine_id, scheduled_at, routine_id || '/' || scheduled_at, 1, '{}' FROM f",
        )
        .bind(start)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("UPDATE cm.routines SET next_run_at = $1 + interval '4 s'")
            .bind(start)
            .execute(&pool)
            .await
            .unwrap();
        let sound = check(&pool, start, true).await.unwrap();
        assert_eq!(sound.fires, 12);
        assert!(sound.problems().is_empty(), "{:?}", sound.problems());
        // The same ledger without outbox rows is sound only for a backend that writes none.
        sqlx::query("TRUNCATE cm.outbox_messages")
            .execute(&pool)
            .await
            .unwrap();
        assert!(
            check(&pool, start, false)
                .await
                .unwrap()
                .problems()
                .is_empty()
        );
        let no_outbox = check(&pool, start, true).await.unwrap();
        assert_eq!(no_outbox.missing_outbox, 12);

        // One fault of each kind, each counted on its own line.
        let routine = first_routine(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO cm.outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
             SELECT routine_id, scheduled_at, routine_id || '/' || scheduled_at, 1, '{}'
             FROM cm.routine_fires",
        )
        .execute(&pool)
        .await
        .unwrap();
        for statement in [
            // A lost occurrence: the clock of one routine moves past a second with no row.
            "UPDATE cm.routines SET next_run_at = next_run_at + interval '1 s' WHERE id = $1",
            // A row left claimed.
            "UPDATE cm.routine_fires SET status = 'claimed', completed_at = NULL
             WHERE routine_id <> $1 AND scheduled_at = (SELECT min(scheduled_at) FROM cm.routine_fires)",
            // A message without a fired row.
            "INSERT INTO cm.outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
             VALUES ($1, '2001-01-01T00:00:00Z', 'orphan', 1, '{}')",
        ] {
            sqlx::query(statement)
                .bind(routine)
                .execute(&pool)
                .await
                .unwrap();
        }
        let faulty = check(&pool, start, true).await.unwrap();
        assert_eq!(
            (faulty.gaps, faulty.claimed, faulty.orphan_outbox),
            (1, 2, 3),
            "{faulty:?}"
        );
        assert_eq!(faulty.problems().len(), 3, "{:?}", faulty.problems());
        assert!(faulty.ensure_sound("the test").is_err());
        // The clocks held to the ledger can be narrowed by name, the other counts not.
        let lost: String = sqlx::query_scalar("SELECT name FROM cm.routines WHERE id = $1")
            .bind(routine)
            .fetch_one(&pool)
            .await
            .unwrap();
        let named = |prefix: String| {
            let pool = pool.clone();
            async move {
                check_named(&pool, start, true, Some(&prefix))
                    .await
                    .unwrap()
            }
        };
        assert_eq!(named(lost.clone()).await, faulty);
        let others = named(format!("{lost}-not")).await;
        assert_eq!((others.gaps, others.claimed), (0, 2), "{others:?}");
    }
}
