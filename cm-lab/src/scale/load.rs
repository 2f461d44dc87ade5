//! Bulk loads of the scale database, each one `INSERT … SELECT … generate_series` statement (or a
//! few, for the ledger), with the columns and constraints of the migrations.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Empties every table and vacuums, so a step starts from small tables.
pub(super) async fn reset(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE cm.routine_fires, cm.outbox_messages, cm.routine_requests, cm.routines")
        .execute(pool)
        .await?;
    vacuum(pool).await
}

/// `VACUUM ANALYZE` of the tables the steps read, as autovacuum would leave them.
pub(super) async fn vacuum(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("VACUUM ANALYZE cm.routines, cm.routine_fires, cm.outbox_messages")
        .execute(pool)
        .await?;
    Ok(())
}

/// The SQL of the id of routine number `i` (the SQL expression `i`) of a load: derived from the
/// number, so the ledger's rows can name their routine without a join. Time-ordered, as the ids
/// cm gives routines are (UUIDv7: a millisecond, then random bits, here an md5 of the number):
/// routine `i` is made a millisecond after routine `i - 1`, so the ids ascend with the numbers
/// and the table is written in the order of its ids, as a `routine import` writes it. The group
/// of an id is read from its random end, as for every id.
fn routine_id_sql(i: &str) -> String {
    format!(
        "(lpad(to_hex(1750000000000 + {i}), 12, '0') || '7' \
         || substr(md5('cm-scale-' || {i}), 1, 3) || '8' \
         || substr(md5('cm-scale-' || {i}), 4, 15))::uuid"
    )
}

/// Adds routines numbered `from..to` (message routines, `catch-up`, hourly), parked: each one's
/// next run is between one and two hours ahead (spread over the hour), so nothing is due.
pub(super) async fn add_parked_routines(pool: &PgPool, from: u32, to: u32) -> anyhow::Result<()> {
    if to <= from {
        return Ok(());
    }
    let id = routine_id_sql("i");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO cm.routines
             (id, name, schedule, timezone, kind, payload, misfire_policy, next_run_at)
         SELECT {id}, 'scale ' || i, '0 0 * * * *', 'UTC', 'message',
                jsonb_build_object('text', 'scale message ' || i), 'catch-up',
                date_trunc('hour', now()) + interval '2 hours' + make_interval(secs => i % 3600)
         FROM generate_series($1::bigint, $2::bigint - 1) AS i"
    )))
    .bind(i64::from(from))
    .bind(i64::from(to))
    .execute(pool)
    .await?;
    vacuum(pool).await
}

/// Adds `n` message routines on `schedule`, all due at `at`, in one statement, then analyzes
/// the table; returns the instant the statement finished (just before its commit).
pub(super) async fn add_due_routines(
    pool: &PgPool,
    n: u32,
    schedule: &str,
    at: DateTime<Utc>,
) -> anyhow::Result<DateTime<Utc>> {
    add_due(
        pool,
        n,
        schedule,
        at,
        "'message', jsonb_build_object('text', 'scale message ' || i)",
    )
    .await
}

/// [`add_due_routines`] for mission routines (overlap `forbid`, the default), each asking for
/// the task `scale <i>` of one repository.
pub(super) async fn add_due_missions(
    pool: &PgPool,
    n: u32,
    schedule: &str,
    at: DateTime<Utc>,
) -> anyhow::Result<DateTime<Utc>> {
    add_due(
        pool,
        n,
        schedule,
        at,
        "'mission', jsonb_build_object('repository', 'https://git.example.com/scale/r.git', \
         'task', 'scale ' || i)",
    )
    .await
}

/// The load of [`add_due_routines`], `kind_and_payload` the SQL of those two columns.
async fn add_due(
    pool: &PgPool,
    n: u32,
    schedule: &str,
    at: DateTime<Utc>,
    kind_and_payload: &str,
) -> anyhow::Result<DateTime<Utc>> {
    let id = routine_id_sql("i");
    let done: DateTime<Utc> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH added AS (
             INSERT INTO cm.routines
                 (id, name, schedule, timezone, kind, payload, misfire_policy, next_run_at)
             SELECT {id}, 'scale ' || i, $2, 'UTC', {kind_and_payload}, 'catch-up', $3
             FROM generate_series(0, $1::bigint - 1) AS i
             RETURNING 1)
         SELECT clock_timestamp() FROM (SELECT count(*) FROM added) c"
    )))
    .bind(i64::from(n))
    .bind(schedule)
    .bind(at)
    .fetch_one(pool)
    .await?;
    sqlx::query("ANALYZE cm.routines").execute(pool).await?;
    Ok(done)
}

/// The id of routine number `i`, as [`add_parked_routines`] made it.
pub(super) async fn routine_id(pool: &PgPool, i: u32) -> anyhow::Result<uuid::Uuid> {
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {} FROM (SELECT $1::bigint AS i) n",
        routine_id_sql("i")
    )))
    .bind(i64::from(i))
    .fetch_one(pool)
    .await?)
}

/// Gives every routine `schedule` and the clock `at`, in one statement; returns the instant the
/// statement finished updating (just before its commit), from which rates are measured.
pub(super) async fn set_clocks(
    pool: &PgPool,
    schedule: &str,
    at: DateTime<Utc>,
) -> anyhow::Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar(
        "WITH moved AS (
             UPDATE cm.routines SET schedule = $1, timezone = 'UTC', next_run_at = $2
             RETURNING 1)
         SELECT clock_timestamp() FROM (SELECT count(*) FROM moved) c",
    )
    .bind(schedule)
    .bind(at)
    .fetch_one(pool)
    .await?)
}

/// Ledger rows numbered `from..to` of a ledger of `total` rows spread evenly over the `days` before
/// `end`, newest first: row `k` belongs to routine `k % routines` and is its occurrence at
/// `end - k * days / total`. One row in a hundred is `failed`, spread over the whole span; the
/// rest `fired`. Inserted a million rows a statement.
pub(super) async fn add_settled_fires(
    pool: &PgPool,
    (from, to): (u64, u64),
    total: u64,
    routines: u32,
    end: DateTime<Utc>,
    days: u32,
) -> anyhow::Result<()> {
    const CHUNK: u64 = 1_000_000;
    let step = f64::from(days) * 86_400.0 / total as f64;
    let mut at = from;
    while at < to {
        let until = (at + CHUNK).min(to);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO cm.routine_fires
                 (routine_id, scheduled_at, claimed_at, completed_at, status, error, claimant,
                  claim_token, attempt, lease_expires_at)
             SELECT {id}, s.at, s.at, s.at + interval '50 ms',
                    CASE WHEN s.k % 100 = 7 THEN 'failed' ELSE 'fired' END,
                    CASE WHEN s.k % 100 = 7 THEN 'scale: the target answered 500' END,
                    'scale', '00000000-0000-0000-0000-000000000001', 1,
                    s.at + interval '60 s'
             FROM (SELECT k, k % $5 AS i,
                          $3::timestamptz - make_interval(secs => k * $4) AS at
                   FROM generate_series($1::bigint, $2::bigint - 1) AS k) s",
            id = routine_id_sql("s.i")
        )))
        .bind(i64::try_from(at)?)
        .bind(i64::try_from(until)?)
        .bind(end)
        .bind(step)
        .bind(i64::from(routines))
        .execute(pool)
        .await?;
        super::progress!("ledger: {until} of {to} rows");
        at = until;
    }
    vacuum(pool).await
}
