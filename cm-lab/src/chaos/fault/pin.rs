//! `--pin-xmin SECONDS`: a transaction held open in `REPEATABLE READ` for that long, a third
//! of the way into the run, so vacuum cannot remove the row versions the schedulers leave in
//! `routines` (every claim moves `next_run_at`) and `routine_fires`.
//!
//! Every 5 s of the whole run it samples the fire rate (fires settled in the last 5 s), the
//! tick's due query under `EXPLAIN (ANALYZE, BUFFERS)` (in a transaction rolled back) and the
//! dead tuples of both tables, and reports them before, during and after the pin. The rate in
//! the last half minute of the minute after the release must be back to at least 90 % of the
//! rate before. `--pin-baseline` samples the same run without the transaction, to compare.

use std::time::{Duration, Instant};

use sqlx::ConnectOptions as _;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use super::{Chaos, Fault, OWN_APPLICATION};
use crate::chaos::report::Findings;

const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// How long after the release the rate has to be back.
const RECOVERY: Duration = Duration::from_secs(60);

/// How many routines the measured due query locks, as a tick under the default cap would.
const DUE_LIMIT: u32 = 100;

/// How many requests it takes at most: a fifth of the routines, as a claim does.
const DUE_REQUESTS: usize = 20;

/// One sample.
#[derive(Debug, Clone, Default, PartialEq)]
struct Sample {
    after: Duration,
    fires_per_sec: f64,
    due_ms: f64,
    due_buffers: i64,
    dead_routines: i64,
    dead_fires: i64,
}

pub(in crate::chaos) struct Pin {
    start: Instant,
    pin_at: Instant,
    length: Duration,
    baseline: bool,
    next_sample: Instant,
    holder: Option<PgConnection>,
    pinned: bool,
    released: bool,
    samples: Vec<Sample>,
}

impl Pin {
    pub fn new(start: Instant, duration: Duration, length: Duration, baseline: bool) -> Self {
        Pin {
            start,
            pin_at: start + duration / 3,
            length,
            baseline,
            next_sample: start,
            holder: None,
            pinned: false,
            released: false,
            samples: Vec::new(),
        }
    }

    fn release_at(&self) -> Instant {
        self.pin_at + self.length
    }

    fn sample(&mut self, chaos: &Chaos<'_>) -> anyhow::Result<()> {
        let pool = &chaos.pool;
        let sample = chaos.rt.block_on(async {
            let fires: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM cm.routine_fires WHERE completed_at > now() - interval '5 s'",
            )
            .fetch_one(pool)
            .await?;
            let plan = cm_store::PgStore::new(pool.clone())
                .explain_analyze(&cm_store::explain::HotStatement::Due {
                    max_routines: DUE_LIMIT,
                    requests: DUE_REQUESTS,
                    mission_room: None,
                    after: None,
                    group: None,
                })
                .await?;
            let (dead_routines, dead_fires): (i64, i64) = sqlx::query_as(
                "SELECT COALESCE(sum(n_dead_tup) FILTER (WHERE relname = 'routines'), 0)::bigint,
                        COALESCE(sum(n_dead_tup) FILTER (WHERE relname = 'routine_fires'), 0)::bigint
                 FROM pg_stat_user_tables",
            )
            .fetch_one(pool)
            .await?;
            let top = &plan[0];
            let buffers = |key: &str| top["Plan"][key].as_i64().unwrap_or(0);
            Ok::<_, anyhow::Error>(Sample {
                after: self.start.elapsed(),
                fires_per_sec: fires as f64 / SAMPLE_EVERY.as_secs_f64(),
                due_ms: top["Execution Time"].as_f64().unwrap_or(0.0),
                due_buffers: buffers("Shared Hit Blocks") + buffers("Shared Read Blocks"),
                dead_routines,
                dead_fires,
            })
        })?;
        self.samples.push(sample);
        Ok(())
    }

    /// The samples of one phase, from `from` to `to` after the start.
    fn phase(&self, from: Duration, to: Duration) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.after >= from && s.after < to)
            .collect()
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Fault for Pin {
    fn next_at(&self) -> Option<Instant> {
        let mut next = self.next_sample;
        if !self.pinned {
            next = next.min(self.pin_at);
        } else if !self.released {
            next = next.min(self.release_at());
        }
        Some(next)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let now = Instant::now();
        if !self.pinned && now >= self.pin_at {
            self.pinned = true;
            if !self.baseline {
                let options = chaos
                    .server_url
                    .parse::<PgConnectOptions>()?
                    .database(&chaos.database)
                    .application_name(&format!("{OWN_APPLICATION}-pin"));
                let mut holder = chaos.rt.block_on(options.connect())?;
                chaos.rt.block_on(async {
                    sqlx::raw_sql(
                        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM cm.routines",
                    )
                    .execute(&mut holder)
                    .await
                })?;
                self.holder = Some(holder);
            }
            chaos.say(format!(
                "{} for {} s",
                if self.baseline {
                    "the pin's time begins (baseline: no transaction)"
                } else {
                    "a REPEATABLE READ transaction pins the xmin horizon"
                },
                self.length.as_secs()
            ));
            return Ok(());
        }
        if self.pinned && !self.released && now >= self.release_at() {
            self.released = true;
            if let Some(mut holder) = self.holder.take() {
                chaos
                    .rt
                    .block_on(sqlx::raw_sql("COMMIT").execute(&mut holder))?;
            }
            chaos.say("the pin is released");
            return Ok(());
        }
        if now >= self.next_sample {
            self.next_sample += SAMPLE_EVERY;
            // A sample the database could not answer (a restart, a starvation) is skipped.
            if let Err(e) = self.sample(chaos) {
                chaos.say(format!("no sample: {e:#}"));
            }
        }
        Ok(())
    }

    fn heal(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if let Some(mut holder) = self.holder.take() {
            chaos
                .rt
                .block_on(sqlx::raw_sql("COMMIT").execute(&mut holder))?;
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let pin_from = self.pin_at - self.start;
        let pin_to = pin_from + self.length;
        let phases = [
            ("before", Duration::ZERO, pin_from),
            ("pinned", pin_from, pin_to),
            ("after", pin_to, pin_to + RECOVERY),
        ];
        f.line(
            "xmin pin",
            format!(
                "{} s from {} s{}",
                self.length.as_secs(),
                pin_from.as_secs(),
                if self.baseline {
                    " (baseline: no transaction held)"
                } else {
                    ", REPEATABLE READ"
                }
            ),
        );
        for (name, from, to) in phases {
            let s = self.phase(from, to);
            f.line(
                &format!("  {name}"),
                format!(
                    "{:.1} fires/s; due query median {:.2} ms, {:.0} buffers; dead tuples up to {} routines, {} fires ({} samples)",
                    mean(s.iter().map(|s| s.fires_per_sec)),
                    median(s.iter().map(|s| s.due_ms).collect()),
                    median(s.iter().map(|s| s.due_buffers as f64).collect()),
                    s.iter().map(|s| s.dead_routines).max().unwrap_or(0),
                    s.iter().map(|s| s.dead_fires).max().unwrap_or(0),
                    s.len()
                ),
            );
        }
        // The first 10 s are the schedulers starting; the rate before is the steady one.
        let before = mean(
            self.phase(Duration::from_secs(10), pin_from)
                .iter()
                .map(|s| s.fires_per_sec),
        );
        let recovered = mean(
            self.phase(pin_to + RECOVERY / 2, pin_to + RECOVERY)
                .iter()
                .map(|s| s.fires_per_sec),
        );
        f.line(
            "  recovered",
            format!(
                "{recovered:.1} fires/s in the second half of the minute after the release, {:.0} % of before",
                if before > 0.0 { 100.0 * recovered / before } else { 0.0 }
            ),
        );
        f.require(recovered < 0.9 * before, || {
            format!(
                "the fire rate was not back within a minute of the pin's release ({recovered:.1}/s against {before:.1}/s before)"
            )
        });
        f
    }
}
