//! The "create" step: how fast routines are created, against the database's own floor. The
//! same N message routines (each its own cron expression and, in turn, its own zone) are
//! written three ways in one run: (a) a plain `COPY` of their rows into a scratch copy of
//! `routines` with its indexes (the floor), (b) `cm-scheduler routine import` of them as JSON
//! Lines, (c) one `SELECT cm.create_routines(…)` of them as a JSON array. (a) and (b) run in
//! turns, three times each up to 200,000 routines, and each is the median of its runs; (b) and
//! (c) are reported as ratios to (a); after each, exactly N routines must exist, each name once.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, ensure};
use sqlx::PgPool;

use super::{Options, Row, count, progress};
use crate::chaos::scheduler_output;

/// The step's rows: the three times and the two ratios.
pub(super) async fn create(
    options: &Options,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let n = options.sizes.create;
    let zones: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM pg_timezone_names
         WHERE name ~ '^(Africa|America|Asia|Australia|Europe|Pacific)/' ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    ensure!(!zones.is_empty(), "the server knows no zone");
    let lines: Vec<String> = (0..n).map(|i| line(i, &zones)).collect();
    let mut copy = String::new();
    for i in 0..n {
        let zone = &zones[i as usize % zones.len()];
        let _ = writeln!(
            copy,
            "{}\tr{i}\t{}\t{zone}\tmessage\t{{\"text\": \"hello {i}\"}}\tfire-once\tforbid\tf\t{}",
            uuid::Uuid::new_v4(),
            cron(i),
            i % 64
        );
    }
    let file = dir.join("create.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", file.display()))?;

    // (a) and (b) in turns, each the median of its runs: on a shared machine one COPY of a
    // second or so varies by half.
    let runs = runs_of(n);
    let (mut floors, mut imports) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        // (a) The floor: the same rows' columns, copied into a scratch copy of the table.
        progress!(
            "create: COPY of {} rows (run {run} of {runs})",
            count(u64::from(n))
        );
        floors.push(copy_floor(pool, &copy).await?);

        // (b) `routine import` of the same routines as JSON Lines.
        progress!(
            "create: routine import of {} lines (run {run} of {runs})",
            count(u64::from(n))
        );
        let started = Instant::now();
        let shown = file.to_string_lossy();
        scheduler_output(binary, url, &["routine", "import", &shown])?;
        imports.push(started.elapsed().as_secs_f64());
        check_all_once(pool, n, "routine import").await?;
        sqlx::query("TRUNCATE cm.routines, cm.routine_names CASCADE")
            .execute(pool)
            .await?;
    }
    let (floor, import) = (median(&mut floors), median(&mut imports));

    // (c) One call of `cm.create_routines` with the same routines as a JSON array.
    progress!(
        "create: cm.create_routines of {} routines",
        count(u64::from(n))
    );
    let array = format!("[{}]", lines.join(","));
    let started = Instant::now();
    let ids: i32 = sqlx::query_scalar("SELECT cardinality(cm.create_routines($1::jsonb))")
        .bind(&array)
        .fetch_one(pool)
        .await?;
    let sql = started.elapsed().as_secs_f64();
    ensure!(
        ids == i32::try_from(n)?,
        "cm.create_routines returned {ids} ids"
    );
    check_all_once(pool, n, "cm.create_routines").await?;
    sqlx::query("TRUNCATE cm.routines, cm.routine_names CASCADE")
        .execute(pool)
        .await?;

    let size = count(u64::from(n));
    let rate = |secs: f64| format!("{secs:.2} s ({:.0}/s)", f64::from(n) / secs);
    Ok(vec![
        Row::new(
            "create: COPY into a copy of routines with its indexes",
            &size,
            rate(floor),
            format!("the floor; the median of {runs}: {}", shown(&floors)),
        ),
        Row::new(
            "create: routine import (JSON Lines)",
            &size,
            rate(import),
            format!(
                "{:.2} × COPY; every routine once; the median of {runs}: {}",
                import / floor,
                shown(&imports)
            ),
        ),
        Row::new(
            "create: SELECT cm.create_routines(…)",
            &size,
            rate(sql),
            format!("{:.2} × COPY; every routine once", sql / floor),
        ),
    ])
}

/// How many times the COPY and the import of `n` routines are each run: three up to 200,000,
/// once beyond (a million takes most of a minute).
fn runs_of(n: u32) -> usize {
    if n <= 200_000 { 3 } else { 1 }
}

/// The median of `samples` (sorted in place).
fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// `samples` in seconds, as a report shows them.
fn shown(samples: &[f64]) -> String {
    samples
        .iter()
        .map(|s| format!("{s:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
        + " s"
}

/// The seconds one `COPY` of `rows` (tab-separated) into a scratch copy of `routines` with its
/// indexes takes; the copy is dropped after.
async fn copy_floor(pool: &PgPool, rows: &str) -> anyhow::Result<f64> {
    sqlx::query("CREATE TABLE cm.create_floor (LIKE cm.routines INCLUDING ALL)")
        .execute(pool)
        .await?;
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    let mut sink = conn
        .copy_in_raw(
            "COPY cm.create_floor (id, name, schedule, timezone, kind, payload, misfire_policy, \
             overlap, paused, group_id) FROM STDIN",
        )
        .await?;
    sink.send(rows.as_bytes().to_vec()).await?;
    sink.finish().await?;
    drop(conn);
    let floor = started.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE cm.create_floor")
        .execute(pool)
        .await?;
    Ok(floor)
}

/// Routine `i`'s cron expression: each of the first 483,840 its own.
fn cron(i: u32) -> String {
    format!(
        "{} {} {} {} *",
        i % 60,
        (i / 60) % 24,
        (i / 1440) % 28 + 1,
        (i / 40_320) % 12 + 1
    )
}

/// Routine `i` as a JSON line, in the `i`-th zone of `zones` (round).
fn line(i: u32, zones: &[String]) -> String {
    serde_json::json!({
        "name": format!("r{i}"),
        "schedule": cron(i),
        "timezone": zones[i as usize % zones.len()],
        "message": format!("hello {i}"),
    })
    .to_string()
}

/// Fails unless exactly `n` routines exist, each name once, with a name for each.
async fn check_all_once(pool: &PgPool, n: u32, how: &str) -> anyhow::Result<()> {
    let (routines, names, taken): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM cm.routines), (SELECT count(DISTINCT name) FROM cm.routines),
                (SELECT count(*) FROM cm.routine_names)",
    )
    .fetch_one(pool)
    .await?;
    ensure!(
        routines == i64::from(n) && names == routines && taken == routines,
        "after {how}: {routines} routines, {names} names, {taken} names taken; {n} expected"
    );
    Ok(())
}
