//! The completers against a `mockall` double of the ledger: a batch settles many claims in one
//! statement and reports each row, a transient error is retried, a refused batch is settled row
//! by row, and what was handed over is written when the completer stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use cm_domain::{ClaimToken, Occurrence, Settlement};
use cm_scheduler::completer::{
    BatchCompleter, BatchOptions, Completed, Completer, InlineCompleter,
};
use cm_store::{FireRef, FireSettle, MockFireLedger, SettleOutcome, StoreError};
use uuid::Uuid;

/// The settle of test claim `n`.
fn settle(n: u32) -> FireSettle {
    let at =
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::TimeDelta::seconds(n.into());
    FireSettle {
        fire: FireRef {
            occurrence: Occurrence::new(Uuid::from_u128(u128::from(n) + 1), at),
            token: ClaimToken(Uuid::from_u128(0xA)),
            attempt: 1,
        },
        settlement: Settlement::Fired,
        receipt: Some(format!("HTTP 204 ({n})")),
    }
}

fn options(flush_every: Duration) -> BatchOptions {
    BatchOptions {
        flush_every,
        ..BatchOptions::default()
    }
}

fn transient() -> StoreError {
    StoreError::Database(sqlx::Error::PoolTimedOut)
}

fn refused() -> StoreError {
    StoreError::CorruptRoutine {
        routine_id: Uuid::nil(),
        reason: "refused".into(),
    }
}

#[tokio::test]
async fn a_batch_settles_together_and_reports_a_fenced_out_row() {
    let mut ledger = MockFireLedger::new();
    ledger
        .expect_settle_fires()
        .times(1)
        .withf(|batch| batch.len() == 3 && batch[1] == settle(1))
        .returning(|_| {
            Ok(vec![
                SettleOutcome::Settled,
                SettleOutcome::TakenOver,
                SettleOutcome::Gone,
            ])
        });
    let (completer, task) =
        BatchCompleter::start(Arc::new(ledger), options(Duration::from_millis(200)));
    let (a, b, c) = tokio::join!(
        completer.complete(settle(0)),
        completer.complete(settle(1)),
        completer.complete(settle(2)),
    );
    assert_eq!(
        (a, b, c),
        (
            Completed::Settled,
            Completed::NotHeld,
            Completed::RoutineDeleted
        )
    );
    drop(completer);
    task.finish().await;
}

#[tokio::test]
async fn a_full_batch_is_written_without_waiting_for_its_time() {
    let mut ledger = MockFireLedger::new();
    ledger
        .expect_settle_fires()
        .times(2)
        .withf(|batch| batch.len() == 2)
        .returning(|batch| Ok(vec![SettleOutcome::Settled; batch.len()]));
    let options = BatchOptions {
        flush_every: Duration::from_secs(3600),
        flush_at: 2,
        max_backlog: 10,
    };
    let (completer, task) = BatchCompleter::start(Arc::new(ledger), options);
    let results = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            completer.complete(settle(0)),
            completer.complete(settle(1)),
            completer.complete(settle(2)),
            completer.complete(settle(3)),
        )
    })
    .await
    .expect("full batches are written at once, not after an hour");
    assert_eq!(results.0, Completed::Settled);
    assert_eq!(results.3, Completed::Settled);
    drop(completer);
    task.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_is_retried_then_the_batch_settles() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let mut ledger = MockFireLedger::new();
    ledger.expect_settle_fires().returning(move |batch| {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            Err(transient())
        } else {
            Ok(vec![SettleOutcome::Settled; batch.len()])
        }
    });
    let (completer, task) = BatchCompleter::start(Arc::new(ledger), BatchOptions::default());
    assert_eq!(completer.complete(settle(0)).await, Completed::Settled);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    drop(completer);
    task.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_database_that_stays_down_leaves_the_rows_unwritten() {
    let mut ledger = MockFireLedger::new();
    ledger
        .expect_settle_fires()
        .times(5)
        .returning(|_| Err(transient()));
    let completer = InlineCompleter::new(Arc::new(ledger));
    assert!(matches!(
        completer.complete(settle(0)).await,
        Completed::Unwritten(e) if e.contains("pool timed out")
    ));
}

#[tokio::test]
async fn a_refused_batch_is_settled_row_by_row_so_only_the_bad_row_stays_claimed() {
    let mut ledger = MockFireLedger::new();
    ledger.expect_settle_fires().returning(|batch| {
        if batch.len() > 1 || batch[0] == settle(2) {
            Err(refused())
        } else {
            Ok(vec![SettleOutcome::Settled])
        }
    });
    let (completer, task) =
        BatchCompleter::start(Arc::new(ledger), options(Duration::from_millis(200)));
    let (a, b, c) = tokio::join!(
        completer.complete(settle(0)),
        completer.complete(settle(1)),
        completer.complete(settle(2)),
    );
    assert_eq!((a, b), (Completed::Settled, Completed::Settled));
    assert!(matches!(c, Completed::Unwritten(e) if e.contains("refused")));
    drop(completer);
    task.finish().await;
}

/// Results handed over by dispatches that did not wait for the answer (a cancelled task) are
/// still written when the last handle goes: stopping flushes, it does not drop.
#[tokio::test(start_paused = true)]
async fn what_was_handed_over_is_written_when_the_completer_stops() {
    let written = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = written.clone();
    let mut ledger = MockFireLedger::new();
    ledger.expect_settle_fires().returning(move |batch| {
        record.lock().unwrap().extend(batch.iter().cloned());
        Ok(vec![SettleOutcome::Settled; batch.len()])
    });
    // An hour between flushes: only stopping can write these.
    let (completer, task) =
        BatchCompleter::start(Arc::new(ledger), options(Duration::from_secs(3600)));
    for n in 0..3 {
        let handed = tokio::time::timeout(Duration::from_millis(10), completer.complete(settle(n)));
        assert!(
            handed.await.is_err(),
            "no answer before the batch is written"
        );
    }
    assert!(written.lock().unwrap().is_empty());
    drop(completer);
    task.finish().await;
    assert_eq!(
        *written.lock().unwrap(),
        vec![settle(0), settle(1), settle(2)]
    );
}
