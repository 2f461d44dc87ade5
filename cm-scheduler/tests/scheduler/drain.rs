//! Fast by default, through the real loop against the real database: a claim that comes back
//! full is followed at once by another, so one tick drains what is due whatever the cap; and
//! missions reach their runtime at no more than the launch rate, the rest waiting unclaimed.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{PATIENCE, new_routine, poll};
use chrono::{DateTime, Datelike, TimeZone, Utc};
use cm_dispatch::{MemoryDispatcher, RoutedDispatcher};
use cm_domain::{FireCap, Lease, MisfirePolicy, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::{PgStore, RoutineKind, RoutineStore};
use serde_json::json;
use sqlx::PgPool;

/// Creates `n` yearly routines of `kind` whose occurrence of this 1 January is due (long past:
/// `fire-once` fires it once).
async fn due_yearly(store: &PgStore, pool: &PgPool, n: usize, kind: RoutineKind) {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap();
    let jan1 = Utc.with_ymd_and_hms(now.year(), 1, 1, 0, 0, 0).unwrap();
    for i in 0..n {
        let routine = store
            .create_routine(new_routine(
                format!("{kind:?} {i}").to_lowercase(),
                "0 0 1 1 *",
                "UTC",
                kind,
                match kind {
                    RoutineKind::Message => json!({ "text": "hello" }),
                    RoutineKind::Mission => {
                        json!({ "task": "hello", "repository": "https://git.example.com/r.git" })
                    }
                },
            ))
            .await
            .unwrap();
        sqlx::query("UPDATE cm.routines SET next_run_at = $2 WHERE id = $1")
            .bind(routine.id)
            .bind(jan1)
            .execute(pool)
            .await
            .unwrap();
    }
}

fn scheduler(
    store: &PgStore,
    dispatcher: Arc<RoutedDispatcher>,
    config: SchedulerConfig,
) -> Scheduler {
    Scheduler::new(Arc::new(store.clone()), dispatcher, config, "drain-test").unwrap()
}

/// A scheduler whose messages go to an in-memory backend, and that backend.
fn message_scheduler(
    store: &PgStore,
    config: SchedulerConfig,
) -> (Scheduler, Arc<MemoryDispatcher>) {
    let messages = Arc::new(MemoryDispatcher::new());
    let routed = RoutedDispatcher::new(Some(messages.clone()), None);
    (scheduler(store, Arc::new(routed), config), messages)
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_full_claim_is_followed_at_once_so_one_tick_drains_what_is_due(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    due_yearly(&store, &pool, 200, RoutineKind::Message).await;
    let config = SchedulerConfig {
        max_fires_per_tick: FireCap::new(5).unwrap(),
        max_in_flight: 1_000,
        ..SchedulerConfig::default()
    };
    let (scheduler, messages) = message_scheduler(&store, config);
    // One tick, not forty: every claim that came back full was followed by another.
    let report = scheduler.tick().await.unwrap();
    assert_eq!(report.fired, 200, "{report:?}");
    assert_eq!(messages.calls().len(), 200);
    assert!(report.claims > 1, "{report:?}");
    // The batch grows while claims come back full (5, 10, 20, ...), so 200 take a few claims.
    assert!(report.claims <= 8, "{report:?}");
    let due: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routines WHERE next_run_at <= now()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(due, 0);
}

/// Three lanes of claims on a backlog of 300, a cap of 5: the first claim comes back full and
/// opens the other two, whose claims run beside the first lane's, kept apart by the database;
/// every occurrence is claimed, dispatched and settled once.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn lanes_of_claims_drain_a_backlog_each_occurrence_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    due_yearly(&store, &pool, 300, RoutineKind::Message).await;
    let config = SchedulerConfig {
        max_fires_per_tick: FireCap::new(5).unwrap(),
        max_in_flight: 1_000,
        drain_lanes: 3,
        ..SchedulerConfig::default()
    };
    let (scheduler, messages) = message_scheduler(&store, config);
    let report = scheduler.tick().await.unwrap();
    assert_eq!(report.fired, 300, "{report:?}");
    let calls = messages.calls();
    assert_eq!(calls.len(), 300);
    let keys: std::collections::HashSet<_> = calls
        .iter()
        .map(|c| c.idempotency_key.to_string())
        .collect();
    assert_eq!(keys.len(), 300, "a message sent twice");
    let (rows, routines, fired): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT routine_id), count(*) FILTER (WHERE status = 'fired')
         FROM cm.routine_fires",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((rows, routines, fired), (300, 300, 300));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn missions_reach_the_runtime_at_no_more_than_the_launch_rate(pool: PgPool) {
    const RATE: u32 = 10;
    const MISSIONS: usize = 30;
    let store = PgStore::new(pool.clone());
    due_yearly(&store, &pool, MISSIONS, RoutineKind::Mission).await;
    due_yearly(&store, &pool, 50, RoutineKind::Message).await;
    let missions = Arc::new(MemoryDispatcher::new());
    let messages = Arc::new(MemoryDispatcher::new());
    let config = SchedulerConfig {
        tick_interval: Duration::from_millis(100),
        lease: Lease::new(Duration::from_secs(5)).unwrap(),
        dispatch_timeout: Duration::from_secs(1),
        max_mission_launches_per_second: NonZeroU32::new(RATE),
        ..SchedulerConfig::default()
    };
    let scheduler = Arc::new(scheduler(
        &store,
        Arc::new(RoutedDispatcher::new(
            Some(messages.clone()),
            Some(missions.clone()),
        )),
        config,
    ));
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = scheduler.clone().spawn(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    let settled = poll(
        PATIENCE,
        async || {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM cm.routine_fires f JOIN cm.routines r ON r.id = f.routine_id
                 WHERE r.kind = 'mission' AND f.status = 'fired'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        },
        |settled| *settled == MISSIONS as i64,
    )
    .await
    .unwrap_or_else(|last| last);
    stop.send(true).unwrap();
    run.await.unwrap();
    assert_eq!(settled, MISSIONS as i64, "not every mission was launched");
    // The messages were not held back by the missions' rate.
    assert_eq!(messages.calls().len(), 50);

    // Claimed (and launched) at most RATE in any second; the rest waited unclaimed, so each
    // claim's lease started when it was claimed, not when it came due.
    let claimed: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT f.claimed_at, f.lease_expires_at FROM cm.routine_fires f
         JOIN cm.routines r ON r.id = f.routine_id WHERE r.kind = 'mission' ORDER BY f.claimed_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (i, (at, lease)) in claimed.iter().enumerate() {
        assert_eq!(*lease - *at, chrono::TimeDelta::seconds(5));
        let in_window = claimed[i..]
            .iter()
            .take_while(|(later, _)| *later - *at < chrono::TimeDelta::seconds(1))
            .count();
        assert!(
            in_window <= RATE as usize,
            "{in_window} missions claimed within a second of {at}"
        );
    }
    let span = claimed.last().unwrap().0 - claimed[0].0;
    assert!(span >= chrono::TimeDelta::milliseconds(1_900), "{span}");
    assert!(
        span < chrono::TimeDelta::seconds(4),
        "{span}: late beyond the rate"
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn lateness_counts_scheduled_fires_only(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    due_yearly(&store, &pool, 1, RoutineKind::Message).await;
    let routine = store.list_routines().await.unwrap().remove(0);
    // A backfill of last week and a trigger are fired, but are not late.
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT date_trunc('second', now())")
        .fetch_one(&pool)
        .await
        .unwrap();
    let week_ago: Vec<_> = (0..3)
        .map(|h| now - chrono::TimeDelta::days(7) + chrono::TimeDelta::hours(h))
        .collect();
    store
        .request_occurrences(routine.id, &week_ago)
        .await
        .unwrap();
    store.trigger_routine(routine.id).await.unwrap();
    let messages = Arc::new(MemoryDispatcher::new());
    let scheduler = scheduler(
        &store,
        Arc::new(RoutedDispatcher::new(Some(messages.clone()), None)),
        SchedulerConfig::default(),
    );
    let report = scheduler.tick().await.unwrap();
    assert_eq!(report.fired, 5, "{report:?}");
    // Only the scheduled occurrence (this 1 January) is counted, however late it was.
    let lateness = &scheduler.stats().lateness;
    assert_eq!(lateness.count(), 1);
}

/// A backlog spread unevenly (some routines 40 s behind, others 2 s) is drained in one tick,
/// each occurrence exactly once: the claims lock as many routines as the last claim's owed
/// each, and a claim that locked too few (the routines behind it owe less) is followed at once.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_backlog_spread_over_routines_is_drained_whole_each_occurrence_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    for i in 0..30 {
        store
            .create_routine(
                new_routine(
                    format!("every second {i}"),
                    "* * * * * *",
                    "UTC",
                    RoutineKind::Message,
                    json!({ "text": "hello" }),
                )
                .into_builder()
                .misfire(MisfirePolicy::CatchUp)
                .build()
                .unwrap(),
            )
            .await
            .unwrap();
    }
    // The first ten owe 41 occurrences each, the rest 3; the clocks before the drain.
    let before: Vec<(uuid::Uuid, DateTime<Utc>)> = sqlx::query_as(
        "UPDATE cm.routines
         SET next_run_at = date_trunc('second', now())
             - make_interval(secs => CASE WHEN split_part(name, ' ', 3)::int < 10 THEN 40 ELSE 2 END)
         RETURNING id, next_run_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let config = SchedulerConfig {
        max_fires_per_tick: FireCap::new(25).unwrap(),
        max_in_flight: 2_000,
        misfire_grace: Duration::from_secs(600),
        max_backlog: 1_000,
        ..SchedulerConfig::default()
    };
    let (scheduler, messages) = message_scheduler(&store, config);
    let report = scheduler.tick().await.unwrap();
    // Every routine's clock moved past what it owed, and each second it moved over has one
    // fire, dispatched once.
    let mut owed = 0;
    for (id, was) in before {
        let (clock, fires): (DateTime<Utc>, i64) = sqlx::query_as(
            "SELECT r.next_run_at, count(f.*)
             FROM cm.routines r LEFT JOIN cm.routine_fires f ON f.routine_id = r.id
                  AND f.status = 'fired'
             WHERE r.id = $1 GROUP BY r.next_run_at",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        let seconds = (clock - was).num_seconds();
        assert!(seconds >= 3, "{id}: clock moved {seconds} s");
        assert_eq!(fires, seconds, "{id}");
        owed += seconds;
    }
    assert!(owed >= 10 * 41 + 20 * 3, "{owed}");
    assert_eq!(report.fired as i64, owed, "{report:?}");
    assert_eq!(messages.calls().len() as i64, owed);
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(all, owed);
}

/// A `forbid` mission whose earlier run is still running, due among 2,000 message routines:
/// deciding its overlap locks nothing the claims walk, so the drain's batches keep growing (25,
/// 50, 100, …) and one tick fires every message, the mission settled `skipped`. The batch sizes
/// are the claims' sizes, read back by claim token.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_held_forbid_mission_among_2000_messages_keeps_the_drains_batches_growing(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    due_yearly(&store, &pool, 2_000, RoutineKind::Message).await;
    due_yearly(&store, &pool, 1, RoutineKind::Mission).await;
    // Its fire of last year holds its run, still running.
    let held = sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, group_id, scheduled_at, status, completed_at, claimant, claim_token,
              attempt, claimed_at, lease_expires_at, run_state, holds_run)
         SELECT id, group_id, next_run_at - interval '1 year', 'fired', now(), 'earlier',
                gen_random_uuid(), 1, now() - interval '1 hour', now() - interval '1 hour',
                'running', true
         FROM cm.routines WHERE kind = 'mission'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(held.rows_affected(), 1);

    let messages = Arc::new(MemoryDispatcher::new());
    let missions = Arc::new(MemoryDispatcher::new());
    let mut runtime = cm_dispatch::runtime::MockMissionRuntime::new();
    runtime
        .expect_observe()
        .returning(|_, _| Ok(cm_domain::RunState::Running));
    runtime.expect_place().returning(|| None);
    let config = SchedulerConfig {
        max_in_flight: 10_000,
        ..SchedulerConfig::default()
    };
    let scheduler = scheduler(
        &store,
        Arc::new(RoutedDispatcher::new(
            Some(messages.clone()),
            Some(missions.clone()),
        )),
        config,
    )
    .with_run_watch(Arc::new(store.clone()), Arc::new(runtime));
    let report = scheduler.tick().await.unwrap();
    assert_eq!(report.fired, 2_000, "{report:?}");
    assert_eq!(report.overlap_skipped, 1, "{report:?}");
    assert!(
        missions.calls().is_empty(),
        "the held run was launched beside"
    );

    let batches: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires WHERE claimant <> 'earlier'
         GROUP BY claim_token ORDER BY min(claimed_at)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    eprintln!("the drain's batches: {batches:?}");
    assert_eq!(batches.iter().sum::<i64>(), 2_001);
    assert!(batches.len() <= 10, "{batches:?}");
    assert!(
        batches.iter().max().is_some_and(|&m| m >= 400),
        "the batches did not grow: {batches:?}"
    );
}
