//! An occurrence abandoned after repeated unsettled attempts keeps what the last of them met,
//! through the real loop's passes against the real database: a backend that panics on every
//! dispatch leaves each attempt unsettled, and the abandon's error names the panic.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{PATIENCE, new_routine, wait_until};
use async_trait::async_trait;
use cm_dispatch::{Dispatch, DispatchError, Dispatcher, Receipt};
use cm_domain::{Lease, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::{FireFilter, FireLedger, PgStore, RoutineKind, RoutineStore};
use serde_json::json;
use sqlx::PgPool;

/// A backend that panics on every dispatch.
struct Panics;

#[async_trait]
impl Dispatcher for Panics {
    async fn dispatch(&self, _: &Dispatch) -> Result<Receipt, DispatchError> {
        panic!("the backend exploded (canary 7)");
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_abandoned_occurrence_keeps_the_last_attempts_error(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = store
        .create_routine(new_routine(
            "poison",
            "0 0 1 1 *",
            "UTC",
            RoutineKind::Message,
            json!({ "text": "hello" }),
        ))
        .await
        .unwrap();
    // Due now.
    sqlx::query("UPDATE cm.routines SET next_run_at = now() - interval '1 second' WHERE id = $1")
        .bind(routine.id)
        .execute(&pool)
        .await
        .unwrap();
    let config = SchedulerConfig {
        lease: Lease::new(Duration::from_millis(600)).unwrap(),
        dispatch_timeout: Duration::from_millis(300),
        max_attempts: 2,
        ..SchedulerConfig::default()
    };
    let scheduler = Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(Panics),
        config,
        "abandon-test",
    )
    .unwrap();
    // Attempt 1 (the tick), attempt 2 (a reaper pass after the lease), then the abandon.
    scheduler.tick().await.unwrap();
    // Reaper passes until one abandons it, each taking over what a lease left behind.
    let mut abandoned = 0;
    wait_until(
        "the occurrence abandoned",
        PATIENCE,
        async || {
            abandoned += scheduler.reap().await.unwrap().abandoned;
            abandoned
        },
        |abandoned| *abandoned >= 1,
    )
    .await;
    assert_eq!(abandoned, 1);
    let fires = store
        .list_fires(&FireFilter {
            routine_id: Some(routine.id),
            ..FireFilter::default()
        })
        .await
        .unwrap();
    let error = fires[0].error.clone().unwrap_or_default();
    assert_eq!(fires[0].status, "failed", "{fires:?}");
    assert!(error.contains("abandoned: 2 earlier attempts"), "{error}");
    assert!(
        error.contains("the dispatch panicked: the backend exploded (canary 7)"),
        "{error}"
    );
}
