//! Four schedulers racing on one real database fire every occurrence of fifty every-second
//! routines exactly once: no occurrence missing, none doubled, none left claimed or failed, and
//! exactly one outbox message for each.
//!
//! Each scheduler has its own pool, as separate processes would, so they really contend on the
//! routines' row locks and the ledger's primary key. The figures are printed (run with
//! `--nocapture`) so they can be quoted.

use crate::support::new_routine;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use cm_dispatch::OutboxDispatcher;
use cm_domain::{FireCap, Lease, Occurrence, SchedulerConfig};
use cm_scheduler::{RunSummary, Scheduler, Stats};
use cm_store::{PgStore, RoutineKind, RoutineStore};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

const ROUTINES: usize = 50;
const SCHEDULERS: usize = 4;
/// Long enough for every scheduler to run a hundred-odd ticks and for each routine to owe
/// about twenty occurrences.
const RUN_FOR: Duration = Duration::from_secs(21);

/// One routine's ledger, as the checks read it.
#[derive(sqlx::FromRow)]
struct Span {
    routine_id: Uuid,
    first: DateTime<Utc>,
    last: DateTime<Utc>,
    rows: i64,
    fired: i64,
    first_attempts: i64,
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn four_schedulers_fire_every_occurrence_exactly_once(pool: PgPool) {
    let setup = PgStore::new(pool.clone());
    // Each routine's first occurrence as its creation computed it: the ledger must start there.
    let mut first_due = HashMap::new();
    for i in 0..ROUTINES {
        let routine = setup
            .create_routine(new_routine(
                format!("race-{i}"),
                "* * * * * *",
                "UTC",
                RoutineKind::Message,
                json!({ "text": format!("every second {i}") }),
            ))
            .await
            .unwrap();
        first_due.insert(routine.id, routine.next_run_at.unwrap());
    }

    // Four schedulers, each on a pool of its own; slightly different tick intervals keep them
    // from ticking in lockstep.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut stores = Vec::new();
    let mut schedulers = Vec::new();
    let mut handles = Vec::new();
    for n in 0..SCHEDULERS {
        let own = PgPoolOptions::new()
            .max_connections(3)
            .connect_with((*pool.connect_options()).clone())
            .await
            .unwrap();
        let store = PgStore::new(own);
        let config = SchedulerConfig {
            tick_interval: Duration::from_millis(100 + 30 * n as u64),
            max_fires_per_tick: FireCap::DEFAULT,
            lease: Lease::new(Duration::from_secs(10)).unwrap(),
            dispatch_timeout: Duration::from_secs(5),
            ..SchedulerConfig::default()
        };
        let scheduler = Arc::new(
            Scheduler::new(
                Arc::new(store.clone()),
                Arc::new(OutboxDispatcher::new(store.clone())),
                config,
                format!("racer-{n}"),
            )
            .unwrap(),
        );
        let mut stopped = stopped.clone();
        handles.push(scheduler.clone().spawn(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
        stores.push(store);
        schedulers.push(scheduler);
    }

    // The race runs for a fixed time on purpose: the schedulers compete over every occurrence
    // due in it.
    tokio::time::sleep(RUN_FOR).await;
    stop.send(true).unwrap();
    let mut summaries: Vec<RunSummary> = Vec::new();
    for handle in handles {
        summaries.push(handle.await.expect("a scheduler panicked"));
    }
    for store in &stores {
        store.pool().close().await;
    }

    // With every scheduler stopped, each routine's clock must sit exactly one second past the
    // last occurrence the ledger holds: the clock never moved past an unrecorded occurrence.
    let clocks: HashMap<Uuid, Option<DateTime<Utc>>> =
        sqlx::query_as("SELECT id, next_run_at FROM cm.routines")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    for id in first_due.keys() {
        setup.set_routine_paused(*id, true).await.unwrap();
    }

    let spans: Vec<Span> = sqlx::query_as(
        "SELECT routine_id, min(scheduled_at) AS first, max(scheduled_at) AS last,
                count(*) AS rows,
                count(*) FILTER (WHERE status = 'fired') AS fired,
                count(*) FILTER (WHERE attempt = 1) AS first_attempts
         FROM cm.routine_fires GROUP BY routine_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(spans.len(), ROUTINES, "every routine fired");

    // Every second from a routine's first occurrence to its last has its row: no gap.
    let mut owed = 0;
    let mut missing = 0;
    for span in &spans {
        let seconds = (span.last - span.first).num_seconds() + 1;
        owed += seconds;
        missing += seconds - span.rows;
        let id = span.routine_id;
        assert_eq!(
            span.first, first_due[&id],
            "routine {id} starts where it was created"
        );
        assert_eq!(
            clocks[&id],
            Some(span.last + TimeDelta::seconds(1)),
            "routine {id}'s clock is just past its last occurrence"
        );
        assert_eq!(span.rows, seconds, "routine {id} has a gap");
        assert_eq!(span.fired, span.rows, "routine {id} has rows not fired");
        assert_eq!(
            span.first_attempts, span.rows,
            "routine {id} has retried rows"
        );
        assert!(
            seconds >= 15,
            "routine {id} fired only {seconds} times in {RUN_FOR:?}"
        );
    }
    // The same, as SQL over the whole ledger, in case the per-routine arithmetic hides a gap.
    let (series, absent): (i64, i64) = sqlx::query_as(
        "WITH spans AS (
             SELECT routine_id, min(scheduled_at) AS lo, max(scheduled_at) AS hi
             FROM cm.routine_fires GROUP BY routine_id)
         SELECT count(*),
                count(*) FILTER (WHERE NOT EXISTS (
                    SELECT 1 FROM cm.routine_fires f
                    WHERE f.routine_id = s.routine_id AND f.scheduled_at = at))
         FROM spans s, generate_series(s.lo, s.hi, interval '1 second') AS at",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((series, absent), (owed, 0));

    let (rows, distinct, unsettled): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT (routine_id, scheduled_at)),
                count(*) FILTER (WHERE status <> 'fired')
         FROM cm.routine_fires",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let duplicates = rows - distinct;
    assert_eq!((rows, duplicates, unsettled), (owed, 0, 0));

    // Exactly one outbox message per fired occurrence, and none without one.
    let (messages, fired_without_one, orphans): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM cm.outbox_messages),
                (SELECT count(*) FROM cm.routine_fires f WHERE f.status = 'fired' AND
                    (SELECT count(*) FROM cm.outbox_messages o
                     WHERE o.routine_id = f.routine_id AND o.scheduled_at = f.scheduled_at) <> 1),
                (SELECT count(*) FROM cm.outbox_messages o WHERE NOT EXISTS (
                    SELECT 1 FROM cm.routine_fires f
                    WHERE f.routine_id = o.routine_id AND f.scheduled_at = o.scheduled_at
                      AND f.status = 'fired'))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((messages, fired_without_one, orphans), (rows, 0, 0));
    // Each message carries its occurrence's key and was written by the first attempt.
    let keys: Vec<(Uuid, DateTime<Utc>, String, i32)> = sqlx::query_as(
        "SELECT routine_id, scheduled_at, idempotency_key, attempt FROM cm.outbox_messages",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (routine_id, scheduled_at, key, attempt) in &keys {
        let occurrence = Occurrence::new(*routine_id, *scheduled_at);
        assert_eq!(key, occurrence.idempotency_key().as_str());
        assert_eq!(*attempt, 1, "{key}");
    }

    // The work was shared: every claim names the scheduler that made it.
    let claimants: Vec<(String, i64)> = sqlx::query_as(
        "SELECT claimant, count(*) FROM cm.routine_fires GROUP BY claimant ORDER BY claimant",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(claimants.len() >= 2, "only {claimants:?} claimed");
    assert!(
        claimants.iter().all(|(c, _)| c.starts_with("racer-")),
        "{claimants:?}"
    );

    // Lateness: claim and settle time against the scheduled instant, by the database's clock.
    let (claim_p50, claim_p99, claim_max, settle_max): (f64, f64, f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY l),
                max(l), max(s)
         FROM (SELECT extract(epoch FROM claimed_at - scheduled_at)::float8 AS l,
                      extract(epoch FROM completed_at - scheduled_at)::float8 AS s
               FROM cm.routine_fires) t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    // Each scheduler's own counters agree with the ledger: nothing skipped, failed, lost or
    // erroring, and their fires add up to the rows.
    let fired_by_stats: u64 = schedulers
        .iter()
        .map(|s| Stats::get(&s.stats().fired))
        .sum();
    for (scheduler, summary) in schedulers.iter().zip(&summaries) {
        let stats = scheduler.stats();
        let id = scheduler.instance_id();
        assert_eq!(Stats::get(&stats.skipped), 0, "{id}");
        assert_eq!(summary.tick_errors, 0, "{id}: {:?}", summary.last_error);
        assert_eq!(summary.failed, 0, "{id}");
        assert_eq!(Stats::get(&stats.abandoned), 0, "{id}");
        assert_eq!(Stats::get(&stats.lost_settles), 0, "{id}");
        assert_eq!(Stats::get(&stats.settle_errors), 0, "{id}");
        assert_eq!(Stats::get(&stats.reaped), 0, "{id}");
    }
    assert_eq!(fired_by_stats, u64::try_from(rows).unwrap());

    println!(
        "exactly-once race: {SCHEDULERS} schedulers, {ROUTINES} routines at `* * * * * *`, {RUN_FOR:?}"
    );
    println!(
        "  occurrences owed {owed}, rows {rows}, fired {rows}, duplicates {duplicates}, \
         missing {missing}, not fired {unsettled}, outbox messages {messages}"
    );
    let claimed_by: HashMap<&str, i64> = claimants.iter().map(|(c, n)| (c.as_str(), *n)).collect();
    for (scheduler, summary) in schedulers.iter().zip(&summaries) {
        let stats = scheduler.stats();
        let id = scheduler.instance_id();
        println!(
            "  {id}: {} rows claimed; {} ticks, fired {}, in flight elsewhere {}, \
             already settled {}, deferred {}, skipped {}, tick errors {}",
            claimed_by.get(id).copied().unwrap_or(0),
            summary.ticks,
            summary.fired,
            Stats::get(&stats.in_flight),
            Stats::get(&stats.already_settled),
            Stats::get(&stats.deferred),
            Stats::get(&stats.skipped),
            summary.tick_errors,
        );
    }
    println!(
        "  lateness (claimed_at - scheduled_at): p50 {claim_p50:.3} s, p99 {claim_p99:.3} s, \
         max {claim_max:.3} s; settled at most {settle_max:.3} s after the scheduled instant"
    );
}
