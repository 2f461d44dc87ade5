//! The "jitter" step: a million message routines whose one occurrence is the same second, with
//! `jitter 5m`, fired by two `cm-scheduler run` processes with defaults. Each routine is written
//! as cm writes one (its clock the occurrence's planned instant, `Schedule::planned`), and the
//! step reports how the claims spread over the five minutes: the count in each second, the
//! busiest second against the mean, a histogram in ten-second buckets, and the lateness from the
//! planned instant.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, SecondsFormat, TimeDelta, Timelike, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Options, Row, count, load, progress};
use crate::bench::processes::Fleet;

/// The jitter of the step's routines, in seconds.
const JITTER_SECONDS: i64 = 300;

/// The step's rows: the spread, the lateness and the histogram.
pub(super) async fn jitter(
    options: &Options,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let routines = options.sizes.jittered;
    // `CM_SCALE_JITTER_FLAGS` (space-separated) runs the schedulers with other flags than the
    // defaults, say `--tick-interval 200ms`.
    let flags: Vec<String> = std::env::var("CM_SCALE_JITTER_FLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    let shown_flags = if flags.is_empty() {
        "defaults".to_owned()
    } else {
        flags.join(" ")
    };
    load::reset(pool).await?;
    // Loaded parked first (nothing due), then given their one occurrence and its planned
    // instant, as `routine create --at T --jitter 5m` writes them.
    let far: DateTime<Utc> = sqlx::query_scalar("SELECT now() + interval '1 day'")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    load::add_due_routines(pool, routines, "@at 2000-01-01T00:00:00Z", far).await?;
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM cm.routines ORDER BY id")
        .fetch_all(pool)
        .await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    // The update takes about as long as the load did; the occurrence leaves room for both.
    let margin = TimeDelta::seconds(10 + 2 * started.elapsed().as_secs() as i64);
    let at = now.with_nanosecond(0).context("a whole second")? + margin;
    let text = format!(
        "@at {} jitter {JITTER_SECONDS}s",
        at.to_rfc3339_opts(SecondsFormat::Secs, true)
    );
    let schedule = cm_domain::Schedule::parse(&text, "UTC")?;
    for chunk in ids.chunks(50_000) {
        let planned: Vec<DateTime<Utc>> =
            chunk.iter().map(|id| schedule.planned(*id, at)).collect();
        sqlx::query(
            "UPDATE cm.routines r SET schedule = $1, next_run_at = t.planned
             FROM UNNEST($2::uuid[], $3::timestamptz[]) AS t(id, planned)
             WHERE r.id = t.id",
        )
        .bind(&text)
        .bind(chunk)
        .bind(&planned)
        .execute(pool)
        .await?;
    }
    sqlx::query("ANALYZE cm.routines").execute(pool).await?;
    let ready: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    ensure!(
        ready < at,
        "jitter: the routines were written at {ready}, after their occurrence {at}"
    );
    progress!("jitter: {routines} routines at {at} with jitter {JITTER_SECONDS}s, written");

    let mut fleet =
        Fleet::start_named(binary, url, &flags, dir, "jitter", &["scale-a", "scale-b"])?;
    tokio::task::block_in_place(|| fleet.wait_ready())?;
    let limit = Instant::now() + Duration::from_secs(900) + margin.to_std()?;
    loop {
        fleet.alive()?;
        if super::measure::drained_after(pool, at + TimeDelta::seconds(JITTER_SECONDS)).await? {
            break;
        }
        if Instant::now() > limit {
            bail!("jitter: routines still due 900 s after the jitter's end");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::task::block_in_place(|| fleet.stop())?;

    let per_second: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT floor(extract(epoch FROM claimed_at - $1))::bigint AS s, count(*)
         FROM cm.routine_fires GROUP BY 1 ORDER BY 1",
    )
    .bind(at)
    .fetch_all(pool)
    .await?;
    let (fires, fired, early, p50, p99, max): (i64, i64, i64, f64, f64, f64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 'fired'),
                count(*) FILTER (WHERE claimed_at < planned_at OR planned_at IS NULL),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY l),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
         FROM (SELECT *, extract(epoch FROM claimed_at - planned_at)::float8 AS l
               FROM cm.routine_fires) f",
    )
    .fetch_one(pool)
    .await?;
    let expected = i64::from(routines);
    ensure!(
        fires == expected && fired == expected && early == 0,
        "jitter: {fires} ledger rows, {fired} fired, {early} claimed before their planned \
         instant or without one; {expected} owed"
    );
    let mean = expected as f64 / JITTER_SECONDS as f64;
    let inside: Vec<i64> = (0..JITTER_SECONDS)
        .map(|s| {
            per_second
                .iter()
                .find(|(at, _)| *at == s)
                .map_or(0, |(_, n)| *n)
        })
        .collect();
    let after: i64 = per_second
        .iter()
        .filter(|(s, _)| *s >= JITTER_SECONDS)
        .map(|(_, n)| n)
        .sum();
    let busiest = inside.iter().copied().max().unwrap_or(0);
    let quietest = inside.iter().copied().min().unwrap_or(0);
    progress!(
        "jitter: busiest second {busiest}, quietest {quietest}, mean {mean:.0}; {after} claimed \
         after the five minutes; lateness p50 {:.0} ms p99 {:.0} ms max {:.0} ms",
        p50 * 1e3,
        p99 * 1e3,
        max * 1e3
    );
    let mut rows = vec![
        Row::new(
            format!("Jitter {JITTER_SECONDS}s: busiest second / mean, 2 processes, {shown_flags}"),
            count(routines.into()),
            format!("{:.2}", busiest as f64 / mean),
            format!(
                "claims per second over the {JITTER_SECONDS} s: busiest {busiest}, quietest \
                 {quietest}, mean {mean:.0}; {after} after them; target ≤ 1.5"
            ),
        ),
        Row::new(
            "Jitter: lateness from the planned instant p50 / p99 / max",
            count(routines.into()),
            format!("{:.0} / {:.0} / {:.0} ms", p50 * 1e3, p99 * 1e3, max * 1e3),
            "claimed_at − planned_at; every fire claimed at or after its planned instant",
        ),
    ];
    // The histogram: ten-second buckets, a bar of # per 2 % of the busiest bucket.
    let buckets: Vec<i64> = inside.chunks(10).map(|c| c.iter().sum()).collect();
    let top = buckets.iter().copied().max().unwrap_or(1).max(1);
    for (i, n) in buckets.iter().enumerate() {
        rows.push(Row::new(
            format!("Jitter histogram, {}–{} s", i * 10, i * 10 + 10),
            count(routines.into()),
            n.to_string(),
            "#".repeat((n * 50 / top) as usize),
        ));
    }
    Ok(rows)
}
