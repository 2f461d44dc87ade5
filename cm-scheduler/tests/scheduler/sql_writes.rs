//! Routines written through SQL (`cm.create_routine`) by a service in any language: the
//! scheduler's planning pass gives a valid one its first run and it fires; one whose cron
//! schedule only cm's Rust refuses is paused with the reason, counted, and fires nothing.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{PATIENCE, wait_until};
use cm_dispatch::{MemoryDispatcher, RoutedDispatcher};
use cm_domain::SchedulerConfig;
use cm_scheduler::{Scheduler, Stats};
use cm_store::{PgStore, RoutineStore};
use sqlx::PgPool;
use uuid::Uuid;

async fn create(pool: &PgPool, name: &str, schedule: &str) -> Uuid {
    sqlx::query_scalar("SELECT cm.create_routine($1, $2, 'UTC', 'hello from SQL')")
        .bind(name)
        .bind(schedule)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn scheduler(store: &PgStore, messages: &Arc<MemoryDispatcher>) -> Scheduler {
    Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(RoutedDispatcher::new(Some(messages.clone()), None)),
        SchedulerConfig::default(),
        "sql-writes",
    )
    .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routine_written_through_sql_fires_once_planned_and_a_bad_one_never(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let messages = Arc::new(MemoryDispatcher::new());
    let good = create(&pool, "every second", "* * * * * *").await;
    // SQL takes this schedule; only cm's Rust sees that its jitter is longer than its interval.
    let bad = create(&pool, "bad", "* * * * * * jitter 5s").await;

    // A scheduler that does not plan never fires them: unplanned is never due.
    let unplanned = scheduler(&store, &messages);
    // A second passes on purpose: planned, the every-second routine would be due by now.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(unplanned.tick().await.unwrap().fired, 0);

    let planning = scheduler(&store, &messages).with_planning(Arc::new(store.clone()));
    planning.tick().await.unwrap();
    let stats = planning.stats();
    assert_eq!(
        (
            Stats::get(&stats.planned),
            Stats::get(&stats.refused_at_planning)
        ),
        (1, 1)
    );
    wait_until(
        "a tick to fire the planned routine",
        PATIENCE,
        async || planning.tick().await.unwrap().fired,
        |fired| *fired > 0,
    )
    .await;
    assert!(
        messages
            .calls()
            .iter()
            .all(|d| d.occurrence.routine_id == good),
        "{:?}",
        messages.calls()
    );
    let bad = store.get_routine(bad).await.unwrap();
    assert!(bad.paused && bad.next_run_at.is_none(), "{bad:?}");
    assert!(
        bad.paused_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("refused when planned")),
        "{bad:?}"
    );
    let fires: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1")
            .bind(bad.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(fires, 0);
}
