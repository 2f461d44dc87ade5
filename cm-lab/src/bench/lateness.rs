//! Lateness of every-second routines under two in-process schedulers (separate pools, the real
//! loop through `Scheduler::spawn`), with and without one routine whose every dispatch a backend
//! double holds for a long time.
//!
//! The double stands for an external backend (a webhook, a broker, a container runtime): it writes
//! nothing and answers at once, except for the stalled routine, whose dispatches each sleep for
//! the stall. Lateness comes from the ledger: `claimed_at − scheduled_at` and
//! `completed_at − scheduled_at`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use async_trait::async_trait;
use cm_dispatch::{Dispatch, DispatchError, Dispatcher, Receipt};
use cm_domain::{FireCap, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::PgStore;
use sqlx::PgPool;
use uuid::Uuid;

use super::Options;
use super::ledger;

/// A backend double: answers at once, except that it holds every dispatch of one routine.
#[derive(Debug)]
struct StallingBackend {
    stalled: Option<Uuid>,
    hold: Duration,
}

#[async_trait]
impl Dispatcher for StallingBackend {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let stalled = self.stalled == Some(dispatch.occurrence.routine_id);
        if stalled {
            tokio::time::sleep(self.hold).await;
        }
        Ok(Receipt {
            duplicate: false,
            detail: if stalled {
                format!("held {:?} by the bench's double", self.hold)
            } else {
                "answered at once by the bench's double".into()
            },
        })
    }
}

/// Lateness percentiles in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Percentiles {
    /// Fires they cover.
    pub count: i64,
    /// p50, p99 and max of `claimed_at − scheduled_at`.
    pub claimed: [f64; 3],
    /// p50, p99 and max of `completed_at − scheduled_at`.
    pub settled: [f64; 3],
}

/// What one lateness run measured.
#[derive(Debug, Clone)]
pub(super) struct LatenessRun {
    /// The schedulers' tick interval.
    pub tick: Duration,
    /// Whether one routine's dispatches were held.
    pub stall: bool,
    /// Fires per scheduler.
    pub by_scheduler: Vec<i64>,
    /// Every routine but the stalled one.
    pub others: Percentiles,
    /// The stalled routine alone (with the stall).
    pub stalled: Option<Percentiles>,
    /// The median round trip of `SELECT now()` on scheduler A's pool during the run, and how many
    /// were measured: the in-run floor of any database lateness.
    pub ping_p50: f64,
    /// How many pings.
    pub pings: usize,
}

/// One lateness run: fresh routines first due together two seconds ahead, two schedulers
/// running their loop for the run's length (then finishing what is in flight), the ledger
/// checked and its lateness read.
pub(super) async fn run(
    pool: &PgPool,
    url: &str,
    options: &Options,
    tick: Duration,
    stall: bool,
) -> anyhow::Result<LatenessRun> {
    ledger::reset(pool).await?;
    // Two seconds ahead: a routine whose creation committed just after a tick's snapshot would
    // otherwise be claimed a whole tick late, a set-up artefact rather than the engine's lateness.
    let start = ledger::create_routines(pool, options.lateness_routines, 2).await?;
    let stalled = if stall {
        Some(ledger::first_routine(pool).await?)
    } else {
        None
    };
    let backend = Arc::new(StallingBackend {
        stalled,
        hold: Duration::from_secs(options.stall_seconds.into()),
    });
    let config = SchedulerConfig {
        tick_interval: tick,
        max_fires_per_tick: FireCap::new(options.lateness_cap).context("the cap is at least 1")?,
        // Room for a whole tick's claims beside the stalled routine's held dispatches (one a
        // second for the stall's length): a tick claims no more than it can start.
        max_in_flight: options.lateness_cap + 2 * options.stall_seconds as usize,
        // A grace and a backlog far beyond a stall, so nothing is skipped by policy and a gap in
        // the ledger can only be a loss.
        misfire_grace: Duration::from_secs(3600),
        max_backlog: SchedulerConfig::MAX_BACKLOG,
        ..SchedulerConfig::default()
    };
    let stop = tokio::time::Instant::now() + Duration::from_secs(options.lateness_seconds.into());
    let mut stores = Vec::new();
    let mut handles = Vec::new();
    for name in ["bench-a", "bench-b"] {
        let store = PgStore::connect(url).await?;
        let scheduler = Scheduler::new(
            Arc::new(store.clone()),
            backend.clone(),
            config.clone(),
            name,
        )?;
        handles.push(Arc::new(scheduler).spawn(tokio::time::sleep_until(stop)));
        stores.push(store);
    }
    let mut pings = Vec::new();
    while tokio::time::Instant::now() < stop {
        let sent = Instant::now();
        stores[0].ping().await?;
        pings.push(sent.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for handle in handles {
        let summary = handle.await?;
        ensure!(
            summary.tick_errors == 0 && summary.failed == 0,
            "a scheduler failed: {} tick errors (last: {:?}), {} fires failed",
            summary.tick_errors,
            summary.last_error,
            summary.failed
        );
    }
    for store in &stores {
        store.pool().close().await;
    }
    ledger::check(pool, start, false)
        .await?
        .ensure_sound(&format!("the lateness run ({tick:?} tick)"))?;

    let others = percentiles(pool, stalled, false).await?;
    ensure!(others.count > 0, "no routine fired in the lateness run");
    let stalled = match stalled {
        Some(_) => Some(percentiles(pool, stalled, true).await?),
        None => None,
    };
    pings.sort_by(f64::total_cmp);
    Ok(LatenessRun {
        tick,
        stall,
        by_scheduler: ledger::fires_by_claimant(pool).await?,
        others,
        stalled,
        ping_p50: pings.get(pings.len() / 2).copied().unwrap_or(f64::NAN),
        pings: pings.len(),
    })
}

/// The lateness of the stalled routine's fires (`only`), or of every other routine's.
async fn percentiles(
    pool: &PgPool,
    stalled: Option<Uuid>,
    only: bool,
) -> anyhow::Result<Percentiles> {
    type Row = (i64, Option<Vec<f64>>, Option<Vec<f64>>);
    let (count, claimed, settled): Row = sqlx::query_as(
        "WITH f AS (
             SELECT extract(epoch FROM claimed_at - scheduled_at)::float8 * 1000 AS claim_ms,
                    extract(epoch FROM completed_at - scheduled_at)::float8 * 1000 AS settle_ms
             FROM cm.routine_fires
             -- Without a stalled routine both are NULL and every row counts; with one, $2
             -- says whether to take its rows or everyone else's.
             WHERE (routine_id = $1) IS NOT DISTINCT FROM $2)
         SELECT count(*),
                percentile_disc(ARRAY[0.5, 0.99, 1.0]) WITHIN GROUP (ORDER BY claim_ms),
                percentile_disc(ARRAY[0.5, 0.99, 1.0]) WITHIN GROUP (ORDER BY settle_ms)
         FROM f",
    )
    .bind(stalled)
    .bind(stalled.map(|_| only))
    .fetch_one(pool)
    .await?;
    let triple = |v: Option<Vec<f64>>| -> [f64; 3] {
        match v.as_deref() {
            Some([a, b, c]) => [*a, *b, *c],
            _ => [f64::NAN; 3],
        }
    };
    Ok(Percentiles {
        count,
        claimed: triple(claimed),
        settled: triple(settled),
    })
}
