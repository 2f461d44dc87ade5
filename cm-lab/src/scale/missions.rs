//! The "mission rate" step: mission routines due on one second, all launched by one
//! `cm-scheduler run` on the process backend (`/bin/true`), once at the default
//! `--max-mission-launches-per-second` and once at a higher rate. When each mission reached the
//! runtime is read from the backend's own record, the modification time of its
//! `<key>.launched` marker (written as the child starts); the rate is measured from those
//! times, not asserted.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, TimeDelta, Timelike, Utc};
use sqlx::PgPool;

use super::measure::only_at;
use super::{Options, Row, count, load, progress};
use crate::bench::processes::Fleet;

/// The binary's default `--max-mission-launches-per-second`.
const DEFAULT_RATE: u32 = 10;

/// The rates the step measures: `None` is the default (no flag).
const RATES: [Option<u32>; 2] = [None, Some(100)];

/// What the launch times say.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Launches {
    pub count: usize,
    /// From the first launch to the last, in seconds.
    pub span: f64,
    /// The most launches in any one-second window.
    pub max_in_a_second: usize,
}

impl Launches {
    /// From launch times in any order.
    pub fn of(mut times: Vec<SystemTime>) -> Launches {
        times.sort();
        let span = match (times.first(), times.last()) {
            (Some(first), Some(last)) => last.duration_since(*first).unwrap_or_default(),
            _ => Duration::ZERO,
        };
        // A window opening at each launch: how many launches fall within the second after it.
        let mut max_in_a_second = 0;
        let mut end = 0;
        for (start, at) in times.iter().enumerate() {
            while end < times.len()
                && times[end].duration_since(*at).unwrap_or_default() < Duration::from_secs(1)
            {
                end += 1;
            }
            max_in_a_second = max_in_a_second.max(end - start);
        }
        Launches {
            count: times.len(),
            span: span.as_secs_f64(),
            max_in_a_second,
        }
    }

    /// Launches a second after the first: the intervals over the span.
    pub fn mean_rate(&self) -> f64 {
        if self.span > 0.0 {
            (self.count.saturating_sub(1)) as f64 / self.span
        } else {
            f64::NAN
        }
    }
}

/// The step's rows: one a rate.
pub(super) async fn mission_rate(
    options: &Options,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let n = options.sizes.missions;
    let mut rows = Vec::new();
    for rate in RATES {
        let configured = rate.unwrap_or(DEFAULT_RATE);
        progress!("mission rate: {n} missions due at once, {configured} launches a second");
        let launches = burst(pool, binary, url, dir, n, rate).await?;
        rows.push(Row::new(
            "Mission launch rate (process backend, 1 process)",
            format!(
                "{} due at once, {}",
                count(u64::from(n)),
                match rate {
                    Some(r) => format!("--max-mission-launches-per-second {r}"),
                    None => format!("default ({DEFAULT_RATE}/s)"),
                }
            ),
            format!(
                "{:.1}/s mean over {:.1} s; at most {} in any 1 s",
                launches.mean_rate(),
                launches.span,
                launches.max_in_a_second
            ),
            format!(
                "{} of {n} launched and fired; configured {configured}/s: {}",
                launches.count,
                if launches.max_in_a_second as u32 <= configured {
                    "never above it"
                } else {
                    "ABOVE it"
                }
            ),
        ));
    }
    Ok(rows)
}

/// One burst: `n` mission routines due on one second, one scheduler at `rate` (the default
/// when `None`); the launch times once every occurrence is fired.
async fn burst(
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
    n: u32,
    rate: Option<u32>,
) -> anyhow::Result<Launches> {
    load::reset(pool).await?;
    let label = format!("missions-{}", rate.unwrap_or(DEFAULT_RATE));
    let workdir = dir.join(&label);
    let mut flags = vec![
        "--mission-backend".to_string(),
        "process".to_string(),
        "--mission-workdir".to_string(),
        workdir.display().to_string(),
    ];
    if let Some(rate) = rate {
        flags.push("--max-mission-launches-per-second".into());
        flags.push(rate.to_string());
    }
    // Last: it takes the rest of the command line.
    flags.extend(["--mission-command".to_string(), "/bin/true".to_string()]);
    let mut fleet = Fleet::start_named(binary, url, &flags, dir, &label, &["scale-m"])?;
    tokio::task::block_in_place(|| fleet.wait_ready())?;

    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let at = now.with_nanosecond(0).context("a whole second")? + TimeDelta::seconds(5);
    let loaded = load::add_due_missions(pool, n, &only_at(at), at).await?;
    ensure!(
        loaded < at,
        "{label}: the load committed at {loaded}, after the shared second {at}"
    );
    let expected = i64::from(n);
    let limit = Instant::now()
        + Duration::from_secs(120 + u64::from(n) / u64::from(rate.unwrap_or(DEFAULT_RATE)) * 3);
    loop {
        fleet.alive()?;
        let fired: i64 =
            sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE status = 'fired'")
                .fetch_one(pool)
                .await?;
        if fired == expected {
            break;
        }
        if Instant::now() > limit {
            bail!("{label}: {fired} of {expected} missions fired before the time limit");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::task::block_in_place(|| fleet.stop())?;
    let mut times = Vec::with_capacity(n as usize);
    for entry in std::fs::read_dir(&workdir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "launched") {
            times.push(std::fs::metadata(&path)?.modified()?);
        }
    }
    let launches = Launches::of(times);
    ensure!(
        launches.count == n as usize,
        "{label}: {} markers for {n} fired missions",
        launches.count
    );
    Ok(launches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_second_and_the_mean_are_read_from_the_times() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Ten a second for two seconds, then three within 100 ms.
        let mut times: Vec<SystemTime> = (0..20).map(|i| at(i * 100)).collect();
        times.extend([at(2_000), at(2_050), at(2_099)]);
        times.reverse();
        let l = Launches::of(times);
        assert_eq!(l.count, 23);
        assert!((l.span - 2.099).abs() < 1e-9);
        // 1.1 s to 2.099 s holds 9 of the steady ones and the three.
        assert_eq!(l.max_in_a_second, 12);
        assert!((l.mean_rate() - 22.0 / 2.099).abs() < 1e-9);
        assert_eq!(Launches::of(Vec::new()).count, 0);
        assert!(Launches::of(vec![t0]).mean_rate().is_nan());
    }
}
