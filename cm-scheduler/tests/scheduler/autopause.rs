//! Failing routines stop themselves, through the real loop against the real database: a
//! routine whose last N fires all failed is paused with the reason kept, a healthy one beside
//! it keeps running, and a resumed routine starts with a clean record.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{PATIENCE, new_routine, poll};
use cm_dispatch::{MemoryDispatcher, RoutedDispatcher};
use cm_domain::{Lease, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::{
    FailingRoutines, FireFilter, FireLedger, NewRoutine, PgStore, RoutineKind, RoutineStore,
};
use serde_json::json;
use sqlx::PgPool;

const AFTER: u32 = 3;

fn every_second(name: &str, kind: RoutineKind) -> NewRoutine {
    new_routine(
        name,
        "* * * * * *",
        "UTC",
        kind,
        match kind {
            RoutineKind::Message => json!({ "text": "hello" }),
            RoutineKind::Mission => {
                json!({ "repository": "https://git.example.com/r.git", "task": "t" })
            }
        },
    )
}

/// A broken mission routine and a healthy message routine, each due every second, in `store`.
async fn broken_and_healthy(store: &PgStore) -> (cm_store::Routine, cm_store::Routine) {
    // With no mission backend, every occurrence of the mission routine settles failed.
    let broken = store
        .create_routine(every_second("broken-mission", RoutineKind::Mission))
        .await
        .unwrap();
    let healthy = store
        .create_routine(every_second("healthy-message", RoutineKind::Message))
        .await
        .unwrap();
    (broken, healthy)
}

/// `scheduler` running its loop until the sender returned is sent `true`.
fn running(
    scheduler: Scheduler,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<cm_scheduler::RunSummary>,
) {
    let scheduler = Arc::new(scheduler);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = scheduler.spawn(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    (stop, run)
}

/// A scheduler on `store` with a memory message target and no mission backend.
fn scheduler(store: &PgStore, config: SchedulerConfig, name: &str) -> Scheduler {
    Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(RoutedDispatcher::new(
            Some(Arc::new(MemoryDispatcher::new())),
            None,
        )),
        config,
        name,
    )
    .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routine_whose_last_fires_all_failed_is_paused_with_its_reason(pool: PgPool) {
    let store = PgStore::new(pool);
    let (broken, healthy) = broken_and_healthy(&store).await;
    let config = SchedulerConfig {
        tick_interval: Duration::from_millis(100),
        // Maintenance (reaper, pruning, the automatic pause) runs every half lease.
        lease: Lease::new(Duration::from_secs(1)).unwrap(),
        dispatch_timeout: Duration::from_millis(500),
        ..SchedulerConfig::default()
    };
    let (stop, run) = running(
        scheduler(&store, config, "autopause-test").with_auto_pause(Arc::new(store.clone()), AFTER),
    );

    let paused = poll(
        PATIENCE,
        async || store.get_routine(broken.id).await.unwrap(),
        |routine| routine.paused,
    )
    .await;
    stop.send(true).unwrap();
    let summary = run.await.expect("the loop does not panic");
    let paused =
        paused.unwrap_or_else(|last| panic!("the failing routine was never paused: {last:?}"));

    let reason = paused.paused_reason.clone().unwrap_or_default();
    assert!(reason.contains("its last 3 fires failed"), "{reason:?}");
    assert!(
        reason.contains("no mission backend is configured"),
        "{reason:?}"
    );
    assert_eq!(paused.next_run_at, None);
    // It was paused on the evidence: its newest fires all failed, at least N of them.
    let fires = store
        .list_fires(&FireFilter {
            routine_id: Some(broken.id),
            outcome: None,
            limit: AFTER,
            after: None,
        })
        .await
        .unwrap();
    assert_eq!(fires.len(), AFTER as usize);
    assert!(fires.iter().all(|f| f.status == "failed"), "{fires:?}");
    // The healthy routine beside it kept running and firing.
    let healthy = store.get_routine(healthy.id).await.unwrap();
    assert!(!healthy.paused && healthy.paused_reason.is_none());
    assert!(summary.fired >= 1, "{summary:?}");

    // Resuming clears the reason, and the failures before it no longer count.
    let resumed = store.set_routine_paused(broken.id, false).await.unwrap();
    assert!(
        !resumed.paused && resumed.paused_reason.is_none(),
        "{resumed:?}"
    );
    let again = store
        .pause_failing_routines(AFTER, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
    // 0 disables the pause.
    assert!(
        store
            .pause_failing_routines(0, Duration::from_secs(3600))
            .await
            .unwrap()
            .is_empty()
    );
}

/// A store that pauses after N failures pauses in the settle that records the Nth, with no
/// maintenance pass at all: the routine fails every second and is paused with at most one
/// more occurrence claimed (one claimed while the Nth was being settled), its reason kept.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_settle_of_the_nth_failure_pauses_the_routine(pool: PgPool) {
    let store = PgStore::new(pool).pausing_after_failures(AFTER);
    let (broken, healthy) = broken_and_healthy(&store).await;
    let config = SchedulerConfig {
        tick_interval: Duration::from_millis(100),
        dispatch_timeout: Duration::from_millis(500),
        ..SchedulerConfig::default()
    };
    // No `with_auto_pause`: nothing but the settle can pause it.
    let (stop, run) = running(scheduler(&store, config, "autopause-settle-test"));
    let paused = poll(
        PATIENCE,
        async || store.get_routine(broken.id).await.unwrap(),
        |routine| routine.paused,
    )
    .await;
    // Two more seconds of ticks: nothing more of it is claimed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.send(true).unwrap();
    run.await.expect("the loop does not panic");
    let paused =
        paused.unwrap_or_else(|last| panic!("the failing routine was never paused: {last:?}"));
    let reason = paused.paused_reason.clone().unwrap_or_default();
    assert!(reason.contains("its last 3 fires failed"), "{reason:?}");
    let fires = store
        .list_fires(&FireFilter {
            routine_id: Some(broken.id),
            outcome: None,
            limit: 100,
            after: None,
        })
        .await
        .unwrap();
    assert!(
        fires.len() >= AFTER as usize && fires.len() <= AFTER as usize + 1,
        "{} fires: {fires:?}",
        fires.len()
    );
    let healthy = store.get_routine(healthy.id).await.unwrap();
    assert!(!healthy.paused, "{healthy:?}");
}
