//! Lateness of every-second message routines while a large backfill of mission occurrences
//! drains (what `routine backfill` of a mission routine asks for): one in-process scheduler
//! (its own pool, the real loop through `Scheduler::spawn`), messages written to the outbox in
//! the claim (the default backend), missions launched through a runtime double that answers
//! each launch after a short delay, at `--backfill-rate` launches a second.
//!
//! The backfill is asked for before the scheduler starts and the message routines first come due
//! two seconds later, so the whole drain runs beside them. Lateness comes from the ledger:
//! `claimed_at − scheduled_at` of the message fires scheduled while the backfill drained.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use cm_dispatch::{
    Dispatch, DispatchError, Dispatcher, OutboxDispatcher, Receipt, RoutedDispatcher,
};
use cm_domain::{Schedule, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::{NewRoutine, PgStore, RoutineKind, RoutineStore};
use sqlx::PgPool;

use super::Options;
use super::ledger;

/// How long the runtime double takes to accept each launch.
pub(super) const LAUNCH: Duration = Duration::from_millis(50);

/// A mission runtime double: accepts every launch after [`LAUNCH`].
#[derive(Debug)]
struct LaunchDouble;

#[async_trait]
impl Dispatcher for LaunchDouble {
    async fn dispatch(&self, _dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        tokio::time::sleep(LAUNCH).await;
        Ok(Receipt {
            duplicate: false,
            detail: "launched by the bench's runtime double".into(),
        })
    }
}

/// What one backfill run measured.
#[derive(Debug, Clone)]
pub(super) struct BackfillRun {
    /// The every-second message fires scheduled while the backfill drained.
    pub message_fires: i64,
    /// p50, p99 and max of their `claimed_at − scheduled_at`, in milliseconds.
    pub claimed: [f64; 3],
    /// From the first mission's claim to the last one's settle.
    pub drain: Duration,
    /// The most missions claimed within any one second.
    pub most_claimed_in_a_second: i64,
    /// Missions settled other than `fired`.
    pub missions_not_fired: i64,
    /// Missions claimed more than once (a lease that ran out before the launch).
    pub missions_retried: i64,
}

/// One backfill run: fresh routines, the backfill asked for, the scheduler's loop until every
/// mission is settled (at most `--backfill-limit` seconds) and two seconds more, then the
/// ledger read.
pub(super) async fn run(
    pool: &PgPool,
    url: &str,
    options: &Options,
) -> anyhow::Result<BackfillRun> {
    ledger::reset(pool).await?;
    let start = ledger::create_routines(pool, options.backfill_routines, 2).await?;
    let store = PgStore::connect(url).await?;
    let mission = store
        .create_routine(
            NewRoutine::builder(
                "backfilled mission",
                Schedule::parse("0 0 1 1 *", "UTC").context("a yearly schedule")?,
                RoutineKind::Mission,
                serde_json::json!({
                    "repository": "https://git.example.com/team/repo.git",
                    "task": "the bench's backfilled mission",
                }),
            )
            .build()?,
        )
        .await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT date_trunc('second', now())")
        .fetch_one(pool)
        .await?;
    // One a minute, the last a minute ago: a backfill of the past 1,000 minutes by default.
    let slots: Vec<DateTime<Utc>> = (1..=i64::from(options.backfill_missions))
        .map(|m| now - TimeDelta::minutes(m))
        .collect();
    let asked = store.request_occurrences(mission.id, &slots).await?;
    ensure!(
        asked == u64::from(options.backfill_missions),
        "{asked} occurrences asked for, not {}",
        options.backfill_missions
    );

    let dispatcher = RoutedDispatcher::new(
        Some(Arc::new(OutboxDispatcher::new(store.clone()))),
        Some(Arc::new(LaunchDouble)),
    );
    let config = SchedulerConfig {
        max_mission_launches_per_second: std::num::NonZeroU32::new(options.backfill_rate),
        // A grace and a backlog far beyond any stall, so nothing is skipped by policy.
        misfire_grace: Duration::from_secs(3600),
        max_backlog: SchedulerConfig::MAX_BACKLOG,
        ..SchedulerConfig::default()
    };
    let scheduler = Arc::new(Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(dispatcher),
        config,
        "bench-backfill",
    )?);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = scheduler.spawn(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });

    let limit = Instant::now() + Duration::from_secs(options.backfill_limit.into());
    let mut drained_at: Option<(Instant, DateTime<Utc>)> = None;
    let result = loop {
        let (settled, db_now): (i64, DateTime<Utc>) = sqlx::query_as(
            "SELECT count(*), now() FROM cm.routine_fires WHERE routine_id = $1 AND status <> 'claimed'",
        )
        .bind(mission.id)
        .fetch_one(pool)
        .await?;
        match drained_at {
            None if settled == i64::from(options.backfill_missions) => {
                drained_at = Some((Instant::now(), db_now));
            }
            // The message routines a little past the drain's end, so the last slots it delayed
            // are in the ledger.
            Some((at, db_now)) if at.elapsed() >= Duration::from_secs(2) => break Ok(db_now),
            None if Instant::now() >= limit => {
                break Err(anyhow::anyhow!(
                    "the backfill did not drain within {} s ({settled} of {} missions settled)",
                    options.backfill_limit,
                    options.backfill_missions
                ));
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.send(true).ok();
    let summary = handle.await?;
    store.pool().close().await;
    let drained = result?;
    ensure!(
        summary.tick_errors == 0,
        "the scheduler's ticks failed {} times (last: {:?})",
        summary.tick_errors,
        summary.last_error
    );

    type Row = (i64, Option<Vec<f64>>);
    let (message_fires, claimed): Row = sqlx::query_as(
        "SELECT count(*),
                percentile_disc(ARRAY[0.5, 0.99, 1.0]) WITHIN GROUP (
                    ORDER BY extract(epoch FROM f.claimed_at - f.scheduled_at)::float8 * 1000)
         FROM cm.routine_fires f JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
         WHERE r.kind = 'message' AND f.scheduled_at >= $1 AND f.scheduled_at <= $2",
    )
    .bind(start)
    .bind(drained)
    .fetch_one(pool)
    .await?;
    // Every slot of every message routine in the window has its fire (none lost or skipped).
    let owed = i64::from(options.backfill_routines) * ((drained - start).num_seconds() + 1);
    ensure!(
        message_fires == owed,
        "{message_fires} message fires between {start} and {drained}, not {owed}"
    );
    let (span, most, not_fired, retried): (f64, i64, i64, i64) = sqlx::query_as(
        "SELECT extract(epoch FROM max(completed_at) - min(claimed_at))::float8,
                (SELECT max(n) FROM (
                     SELECT count(*) OVER (ORDER BY claimed_at
                                           RANGE BETWEEN CURRENT ROW
                                                 AND interval '999 milliseconds' FOLLOWING) AS n
                     FROM cm.routine_fires WHERE routine_id = $1) w),
                count(*) FILTER (WHERE status <> 'fired'),
                count(*) FILTER (WHERE attempt > 1)
         FROM cm.routine_fires WHERE routine_id = $1",
    )
    .bind(mission.id)
    .fetch_one(pool)
    .await?;
    let triple = match claimed.as_deref() {
        Some([a, b, c]) => [*a, *b, *c],
        _ => [f64::NAN; 3],
    };
    Ok(BackfillRun {
        message_fires,
        claimed: triple,
        drain: Duration::from_secs_f64(span.max(0.0)),
        most_claimed_in_a_second: most,
        missions_not_fired: not_fired,
        missions_retried: retried,
    })
}
