//! The tick loop against `mockall` doubles of the ledger and the dispatcher: what each claim
//! outcome makes the loop do, how failures, timeouts and lost settles are settled and counted,
//! and how tick errors surface.
//!
//! Claims are built by hand (a token, and one `ClaimRow` per occurrence as the claim statement
//! would have returned it), so each test names exactly the rows the loop sees and nothing else.
//!
//! Timing: tokio's paused clock (`start_paused`) needs tokio's `test-util` feature, which this
//! crate's dev-dependencies do not enable, so the tests that involve time use real durations
//! kept to a few hundred milliseconds (a 100 ms dispatch timeout against a 10 s dispatch, a
//! 20 ms tick interval for runs of the loop).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use cm_dispatch::{DispatchError, Dispatcher, MemoryDispatcher, MockDispatcher, Receipt};
use cm_domain::{
    ClaimRow, ClaimToken, ConfigError, FireCap, FireStatus, Lease, Occurrence, SchedulerConfig,
    Settlement,
};
use cm_scheduler::{Scheduler, Stats, TickError, TickReport};
use cm_store::{
    ClaimedFire, FireLedger, FireRef, MockFireLedger, RoutineKind, SettleOutcome, StoreError,
    TickClaim,
};
use serde_json::json;
use uuid::Uuid;

/// The token of every claim this scheduler's ledger double returns.
const MINE: ClaimToken = ClaimToken(Uuid::from_u128(0xA));
/// The token another (live or crashed) scheduler's claim carries.
const OTHER: ClaimToken = ClaimToken(Uuid::from_u128(0xB));

/// How the row the claim statement returned for one occurrence stands.
#[derive(Debug, Clone, Copy)]
enum Row {
    /// Inserted by this claim.
    Fresh,
    /// An expired claim this claim took over, now at this attempt.
    Retry(u32),
    /// Claimed by another scheduler whose lease is live.
    InFlight,
    /// Already settled, by whoever held it.
    Settled(FireStatus),
}

/// The instant the `n`th occurrence of a test is scheduled at.
fn at(n: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 9, 0, 0).unwrap() + TimeDelta::seconds(i64::from(n))
}

/// The `n`th occurrence of a test: its own routine, its own instant.
fn occurrence(n: u32) -> Occurrence {
    Occurrence::new(Uuid::from_u128(u128::from(n) + 1), at(n))
}

/// The claimed fire of occurrence `n`, its row as `row` describes it.
fn fire(n: u32, row: Row) -> ClaimedFire {
    let lease_expires_at = at(n) + TimeDelta::seconds(60);
    let (inserted, status, token, attempt) = match row {
        Row::Fresh => (true, FireStatus::Claimed, MINE, 1),
        Row::Retry(attempt) => (false, FireStatus::Claimed, MINE, attempt),
        Row::InFlight => (false, FireStatus::Claimed, OTHER, 1),
        Row::Settled(status) => (false, status, OTHER, 1),
    };
    ClaimedFire {
        occurrence: occurrence(n),
        routine_name: format!("routine-{n}"),
        kind: RoutineKind::Message,
        origin: cm_domain::FireOrigin::Schedule,
        payload: json!({ "text": format!("message {n}") }),
        receipt: None,
        first_claimed_at: at(n),
        planned_at: at(n),
        retry: 0,
        retry_began: 1,
        row: ClaimRow {
            inserted,
            status,
            claimant: if token == MINE { "me" } else { "other" }.into(),
            token,
            attempt,
            lease_expires_at,
            last_error: None,
        },
    }
}

/// One tick of `scheduler`, which these doubles answer with one claim that is not full, so the
/// tick makes exactly one; the report without that count, as the cases write it.
async fn one_claim(scheduler: &Scheduler) -> TickReport {
    let report = scheduler.tick().await.unwrap();
    assert_eq!(report.claims, 1, "{report:?}");
    TickReport {
        claims: 0,
        ..report
    }
}

/// A claim holding one fire per row (occurrence `i` for row `i`) and `deferred` deferred ones.
fn claim(rows: &[Row], deferred: usize) -> TickClaim {
    TickClaim {
        now: at(30),
        began: std::time::Instant::now(),
        token: MINE,
        fires: (0u32..).zip(rows).map(|(n, row)| fire(n, *row)).collect(),
        deferred,
        held: 0,
        more_due: false,
        resume_after: None,
        skipped: 0,
        unusable: Vec::new(),
    }
}

/// A valid configuration: three attempts, a 1 s lease and a 100 ms dispatch timeout, so a
/// dispatch that hangs is cut off quickly in real time.
fn config() -> SchedulerConfig {
    SchedulerConfig {
        tick_interval: Duration::from_millis(20),
        max_fires_per_tick: FireCap::new(3).unwrap(),
        lease: Lease::new(Duration::from_secs(1)).unwrap(),
        dispatch_timeout: Duration::from_millis(100),
        max_attempts: 3,
        // One claim at a time: the doubles answer claims in the order they are asked, and the
        // tests below count and order them; `full_claims_open_the_other_lanes` has two.
        drain_lanes: 1,
        ..SchedulerConfig::default()
    }
}

/// Every settle the ledger double received, in order of arrival.
type Settles = Arc<Mutex<Vec<(FireRef, Settlement)>>>;

/// A ledger double whose successive `claim_due` calls return `claims` (and no more), and whose
/// `settle_fire` records each settle and answers with `answer()`.
fn ledger(
    claims: Vec<TickClaim>,
    answer: fn() -> Result<bool, StoreError>,
) -> (MockFireLedger, Settles) {
    let mut ledger = MockFireLedger::new();
    let count = claims.len();
    let queue = Mutex::new(VecDeque::from(claims));
    ledger
        .expect_claim_due()
        .times(count)
        .returning(move |_| Ok(queue.lock().unwrap().pop_front().unwrap()));
    let settles: Settles = Arc::default();
    let record = settles.clone();
    ledger.expect_settle_fires().returning(move |batch| {
        let mut record = record.lock().unwrap();
        record.extend(batch.iter().map(|s| (s.fire, s.settlement.clone())));
        answer().map(|held| vec![outcome(held); batch.len()])
    });
    (ledger, settles)
}

/// What the ledger double answers for a row: settled, or no longer held by the claim.
fn outcome(held: bool) -> SettleOutcome {
    if held {
        SettleOutcome::Settled
    } else {
        SettleOutcome::TakenOver
    }
}

/// A dispatcher double whose backend is external (nothing is written in the claim).
fn mock_dispatcher() -> MockDispatcher {
    let mut dispatcher = MockDispatcher::new();
    dispatcher.expect_in_claim_effect().returning(|_| None);
    dispatcher
}

fn scheduler(
    ledger: impl FireLedger + 'static,
    dispatcher: impl Dispatcher + 'static,
) -> Scheduler {
    Scheduler::new(Arc::new(ledger), Arc::new(dispatcher), config(), "me").unwrap()
}

/// A dispatcher double that counts its calls and answers every one with `answer`.
fn counting_dispatcher(
    answer: fn() -> Result<Receipt, DispatchError>,
) -> (MockDispatcher, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let mut dispatcher = mock_dispatcher();
    dispatcher.expect_dispatch().returning(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        answer()
    });
    (dispatcher, calls)
}

fn receipt() -> Result<Receipt, DispatchError> {
    Ok(Receipt {
        duplicate: false,
        detail: "posted".into(),
    })
}

/// How a settle is expected to read: its status and, for `failed`, a fragment of its error.
#[derive(Debug)]
enum Expect {
    Fired,
    Failed(&'static str),
}

/// One single-tick case: the rows the claim returns, how the dispatcher and the settle answer,
/// and what the tick must report, dispatch (occurrence index and attempt) and settle
/// (occurrence index, the attempt the settle is fenced on, and how it reads).
struct Case {
    name: &'static str,
    rows: &'static [Row],
    dispatch_error: Option<&'static str>,
    settle_answer: fn() -> Result<bool, StoreError>,
    report: TickReport,
    dispatched: &'static [(u32, u32)],
    settled: &'static [(u32, u32, Expect)],
}

fn settled_ok() -> Result<bool, StoreError> {
    Ok(true)
}

fn settle_lost() -> Result<bool, StoreError> {
    Ok(false)
}

fn settle_broken() -> Result<bool, StoreError> {
    Err(StoreError::Database(sqlx::Error::PoolTimedOut))
}

/// Runs one tick of `case` against a ledger double and a `MemoryDispatcher`, and checks the
/// report, the dispatches, the settles, and that the counters agree with the report.
async fn check(case: Case) {
    let name = case.name;
    let (ledger, settles) = ledger(vec![claim(case.rows, 0)], case.settle_answer);
    let dispatcher = Arc::new(MemoryDispatcher::new());
    dispatcher.fail_with(case.dispatch_error);
    let scheduler = scheduler(ledger, dispatcher.clone());

    let report = one_claim(&scheduler).await;
    assert_eq!(report, case.report, "{name}");

    // The dispatches carry the claimed attempt and the occurrence's own key, name and payload.
    let mut calls = dispatcher.calls();
    calls.sort_by_key(|d| d.occurrence);
    let got: Vec<_> = calls
        .iter()
        .map(|d| (occurrence_index(d.occurrence), d.attempt))
        .collect();
    assert_eq!(got, case.dispatched, "{name}: dispatches");
    for d in &calls {
        let n = occurrence_index(d.occurrence);
        assert_eq!(d.idempotency_key, d.occurrence.idempotency_key(), "{name}");
        assert_eq!(d.routine_name, format!("routine-{n}"), "{name}");
        assert_eq!(
            d.payload,
            json!({ "text": format!("message {n}") }),
            "{name}"
        );
    }

    // Each settle is fenced on the claim it settles (the row's token and attempt).
    let mut settles = settles.lock().unwrap().clone();
    settles.sort_by_key(|(r, _)| r.occurrence);
    assert_eq!(settles.len(), case.settled.len(), "{name}: {settles:?}");
    for ((fire_ref, settlement), (n, attempt, expect)) in settles.iter().zip(case.settled) {
        assert_eq!(fire_ref.occurrence, occurrence(*n), "{name}");
        assert_eq!(
            (fire_ref.token, fire_ref.attempt),
            (MINE, *attempt),
            "{name}"
        );
        match (expect, settlement) {
            (Expect::Fired, Settlement::Fired) => {}
            (Expect::Failed(fragment), Settlement::Failed(error)) => {
                assert!(
                    error.as_str().contains(fragment),
                    "{name}: {error:?} lacks {fragment:?}"
                );
            }
            (expect, got) => panic!("{name}: expected {expect:?}, settled {got:?}"),
        }
    }

    // The counters say what the report says.
    let stats = scheduler.stats();
    let r = &case.report;
    let counters = [
        ("ticks", Stats::get(&stats.ticks), 1),
        ("fired", Stats::get(&stats.fired), r.fired),
        ("failed", Stats::get(&stats.failed), r.failed),
        ("abandoned", Stats::get(&stats.abandoned), r.abandoned),
        ("in_flight", Stats::get(&stats.in_flight), r.in_flight),
        (
            "already_settled",
            Stats::get(&stats.already_settled),
            r.already_settled,
        ),
        (
            "lost or failed settles",
            Stats::get(&stats.lost_settles) + Stats::get(&stats.settle_errors),
            r.unsettled,
        ),
    ];
    for (counter, got, want) in counters {
        assert_eq!(got, want as u64, "{name}: {counter}");
    }
}

/// Which test occurrence a dispatch or settle is about.
fn occurrence_index(o: Occurrence) -> u32 {
    u32::try_from(o.routine_id.as_u128() - 1).unwrap()
}

#[tokio::test]
async fn each_claim_outcome_is_fired_left_or_abandoned() {
    use Row::*;
    let cases = [
        Case {
            name: "a fresh claim fires as attempt 1",
            rows: &[Fresh],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                fired: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 1)],
            settled: &[(0, 1, Expect::Fired)],
        },
        Case {
            name: "a claim in flight elsewhere is left alone",
            rows: &[InFlight],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                in_flight: 1,
                ..TickReport::default()
            },
            dispatched: &[],
            settled: &[],
        },
        Case {
            name: "a fired occurrence is not fired again",
            rows: &[Settled(FireStatus::Fired)],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                already_settled: 1,
                ..TickReport::default()
            },
            dispatched: &[],
            settled: &[],
        },
        Case {
            name: "a failed occurrence is not retried",
            rows: &[Settled(FireStatus::Failed)],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                already_settled: 1,
                ..TickReport::default()
            },
            dispatched: &[],
            settled: &[],
        },
        Case {
            name: "a retry fires with its attempt number",
            rows: &[Retry(2)],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                fired: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 2)],
            settled: &[(0, 2, Expect::Fired)],
        },
        Case {
            name: "a retry at the last allowed attempt still fires",
            rows: &[Retry(3)],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                fired: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 3)],
            settled: &[(0, 3, Expect::Fired)],
        },
        Case {
            name: "a retry past the limit is abandoned without dispatch",
            rows: &[Retry(4)],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                abandoned: 1,
                ..TickReport::default()
            },
            dispatched: &[],
            settled: &[(0, 4, Expect::Failed("3 earlier attempts"))],
        },
        Case {
            name: "a failing dispatch settles failed with its error",
            rows: &[Fresh],
            dispatch_error: Some("connection refused"),
            settle_answer: settled_ok,
            report: TickReport {
                failed: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 1)],
            settled: &[(0, 1, Expect::Failed("unavailable: connection refused"))],
        },
        Case {
            name: "a settle that lost the claim is not counted as fired",
            rows: &[Fresh],
            dispatch_error: None,
            settle_answer: settle_lost,
            report: TickReport {
                unsettled: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 1)],
            settled: &[(0, 1, Expect::Fired)],
        },
        Case {
            // The settle is tried five times before the claim is left to the reaper.
            name: "a settle the database keeps refusing leaves the claim unsettled",
            rows: &[Fresh],
            dispatch_error: None,
            settle_answer: settle_broken,
            report: TickReport {
                unsettled: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 1)],
            settled: &[
                (0, 1, Expect::Fired),
                (0, 1, Expect::Fired),
                (0, 1, Expect::Fired),
                (0, 1, Expect::Fired),
                (0, 1, Expect::Fired),
            ],
        },
        Case {
            name: "a mixed claim handles each row on its own",
            rows: &[
                Fresh,
                Retry(2),
                InFlight,
                Settled(FireStatus::Fired),
                Retry(9),
            ],
            dispatch_error: None,
            settle_answer: settled_ok,
            report: TickReport {
                fired: 2,
                abandoned: 1,
                in_flight: 1,
                already_settled: 1,
                ..TickReport::default()
            },
            dispatched: &[(0, 1), (1, 2)],
            settled: &[
                (0, 1, Expect::Fired),
                (1, 2, Expect::Fired),
                (
                    4,
                    9,
                    Expect::Failed("8 earlier attempts ended without settling"),
                ),
            ],
        },
    ];
    for case in cases {
        check(case).await;
    }
}

/// InFlight and Settled rows are checked with a strict double as well: any call to the
/// dispatcher or to `settle_fires` is a failure, whatever the tick reports.
#[tokio::test]
async fn in_flight_and_settled_rows_never_reach_the_dispatcher() {
    let rows = [
        Row::InFlight,
        Row::Settled(FireStatus::Fired),
        Row::Settled(FireStatus::Failed),
        Row::InFlight,
    ];
    let mut ledger = MockFireLedger::new();
    ledger
        .expect_claim_due()
        .times(1)
        .return_once(move |_| Ok(claim(&rows, 0)));
    ledger.expect_settle_fires().never();
    let mut dispatcher = mock_dispatcher();
    dispatcher.expect_dispatch().never();
    let scheduler = scheduler(ledger, dispatcher);

    let report = one_claim(&scheduler).await;
    let expected = TickReport {
        in_flight: 2,
        already_settled: 2,
        ..TickReport::default()
    };
    assert_eq!(report, expected);
    let stats = scheduler.stats();
    assert_eq!(Stats::get(&stats.in_flight), 2);
    assert_eq!(Stats::get(&stats.already_settled), 2);
    assert_eq!(Stats::get(&stats.fired) + Stats::get(&stats.failed), 0);
}

/// A failing dispatch settles `failed` once; on the next tick the claim statement returns the
/// row as settled `failed`, and the dispatcher is not called again.
#[tokio::test]
async fn a_failing_dispatch_settles_failed_once_and_is_not_retried() {
    // The row keeps the first tick's claimant and token; the second tick claims with a token
    // of its own, as every claim statement does.
    let mut settled = fire(0, Row::Settled(FireStatus::Failed));
    settled.row.claimant = "me".into();
    settled.row.token = MINE;
    let second = TickClaim {
        token: ClaimToken(Uuid::from_u128(0xC)),
        fires: vec![settled],
        ..claim(&[], 0)
    };
    let mut ledger = MockFireLedger::new();
    let mut queue = VecDeque::from([claim(&[Row::Fresh], 0), second]);
    ledger
        .expect_claim_due()
        .times(2)
        .returning(move |_| Ok(queue.pop_front().unwrap()));
    ledger
        .expect_settle_fires()
        .times(1)
        .withf(|batch| {
            let [settle] = batch else { return false };
            settle.fire.occurrence == occurrence(0)
                && settle.fire.token == MINE
                && settle.fire.attempt == 1
                && matches!(&settle.settlement, Settlement::Failed(e) if e.as_str() == "rejected: HTTP 400: bad payload")
        })
        .returning(|_| Ok(vec![SettleOutcome::Settled]));
    let (dispatcher, calls) =
        counting_dispatcher(|| Err(DispatchError::Rejected("HTTP 400: bad payload".into())));
    let scheduler = scheduler(ledger, dispatcher);

    let first = one_claim(&scheduler).await;
    assert_eq!(
        first,
        TickReport {
            failed: 1,
            ..TickReport::default()
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let second = one_claim(&scheduler).await;
    assert_eq!(
        second,
        TickReport {
            already_settled: 1,
            ..TickReport::default()
        }
    );
    // Still one call: failure is terminal, the occurrence is never dispatched again.
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let stats = scheduler.stats();
    assert_eq!(Stats::get(&stats.failed), 1);
    assert_eq!(Stats::get(&stats.already_settled), 1);
}

/// The tick asks the ledger for at most the cap, reports the claim's deferred count, dispatches
/// only the claimed occurrences, and adds the deferred count to the counter on every tick.
#[tokio::test]
async fn the_cap_is_asked_for_and_deferred_occurrences_are_counted_not_fired() {
    let mut ledger = MockFireLedger::new();
    let mut queue = VecDeque::from([
        claim(&[Row::Fresh, Row::Fresh, Row::Fresh], 7),
        claim(&[Row::Fresh, Row::Fresh], 4),
    ]);
    ledger
        .expect_claim_due()
        .times(2)
        .withf(|p| {
            p.cap.get() == 3
                && p.claimant == "me"
                && p.lease.duration() == Duration::from_secs(1)
                && p.max_routines >= 3
        })
        .returning(move |_| Ok(queue.pop_front().unwrap()));
    ledger
        .expect_settle_fires()
        .returning(|batch| Ok(vec![SettleOutcome::Settled; batch.len()]));
    let (dispatcher, calls) = counting_dispatcher(receipt);
    let scheduler = scheduler(ledger, dispatcher);

    let first = one_claim(&scheduler).await;
    assert_eq!(
        first,
        TickReport {
            fired: 3,
            deferred: 7,
            ..TickReport::default()
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(Stats::get(&scheduler.stats().deferred), 7);

    let second = one_claim(&scheduler).await;
    assert_eq!(
        second,
        TickReport {
            fired: 2,
            deferred: 4,
            ..TickReport::default()
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(Stats::get(&scheduler.stats().deferred), 11);
    assert_eq!(Stats::get(&scheduler.stats().fired), 5);
}

/// A dispatch that outlives the dispatch timeout is cut off and settled `failed`, saying it
/// timed out; the settle is fenced on the claim it holds.
#[tokio::test]
async fn a_dispatch_past_the_timeout_settles_failed_as_timed_out() {
    let (ledger, settles) = ledger(vec![claim(&[Row::Fresh, Row::Retry(2)], 0)], settled_ok);
    let dispatcher = MemoryDispatcher::new();
    // A hundred times the 100 ms timeout: only the timeout can end this dispatch in time.
    dispatcher.set_delay(Duration::from_secs(10));
    let scheduler = scheduler(ledger, dispatcher);

    let started = std::time::Instant::now();
    let report = one_claim(&scheduler).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        report,
        TickReport {
            failed: 2,
            ..TickReport::default()
        }
    );
    let settles = settles.lock().unwrap().clone();
    assert_eq!(settles.len(), 2, "{settles:?}");
    for (_, settlement) in &settles {
        let error = settlement.error().unwrap_or_default();
        assert!(error.contains("timed out after 100ms"), "{error:?}");
    }
    assert_eq!(Stats::get(&scheduler.stats().failed), 2);
}

#[tokio::test]
async fn a_claim_error_fails_the_tick() {
    let missing = Uuid::from_u128(0xDEAD);
    let mut ledger = MockFireLedger::new();
    ledger
        .expect_claim_due()
        .times(1)
        .returning(move |_| Err(StoreError::RoutineNotFound(missing)));
    let mut dispatcher = mock_dispatcher();
    dispatcher.expect_dispatch().never();
    let scheduler = scheduler(ledger, dispatcher);

    let error = scheduler.tick().await.unwrap_err();
    assert!(matches!(error, TickError::Claim(StoreError::RoutineNotFound(id)) if id == missing));
    assert!(
        error
            .to_string()
            .contains(&format!("no routine has id {missing}")),
        "{error}"
    );
}

/// One run of the loop: which ticks (every `fail_every`th, counting from the first) and whether
/// reaper passes fail, and what the summary must say.
struct RunCase {
    name: &'static str,
    fail_every: Option<usize>,
    reap_fails: bool,
    last_error: &'static str,
    any_success: bool,
}

/// Runs the loop for 300 ms of 20 ms ticks against a ledger whose claims or reaper passes fail
/// as `case` says, and checks that the loop kept going and reported the errors.
async fn check_run(case: RunCase) {
    let name = case.name;
    let missing = Uuid::from_u128(0xDEAD);
    let claims = Arc::new(AtomicUsize::new(0));
    let counted = claims.clone();
    let mut ledger = MockFireLedger::new();
    let fail_every = case.fail_every;
    ledger.expect_claim_due().returning(move |_| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        match fail_every {
            Some(every) if n.is_multiple_of(every) => Err(StoreError::RoutineNotFound(missing)),
            _ => Ok(claim(&[], 0)),
        }
    });
    let reap_fails = case.reap_fails;
    ledger.expect_reap_expired().returning(move |_| {
        if reap_fails {
            Err(StoreError::Database(sqlx::Error::PoolTimedOut))
        } else {
            Ok(claim(&[], 0))
        }
    });
    // Pruning runs with the reaper; it finds nothing old enough here.
    ledger.expect_prune_settled().returning(|_, _| Ok(0));
    let mut dispatcher = mock_dispatcher();
    dispatcher.expect_dispatch().never();
    let scheduler = Arc::new(scheduler(ledger, dispatcher));

    // The loop runs for a fixed span on purpose: the ticks it makes in it are what is counted.
    let summary = scheduler
        .clone()
        .spawn(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .expect("the loop does not panic");

    // The loop kept ticking through the errors instead of stopping at the first.
    let attempts = claims.load(Ordering::SeqCst);
    assert!(attempts >= 5, "{name}: only {attempts} ticks in 300 ms");
    assert!(summary.tick_errors >= 1, "{name}: {summary:?}");
    let last = summary.last_error.clone().unwrap_or_default();
    assert!(
        last.contains(case.last_error),
        "{name}: {last:?} lacks {:?}",
        case.last_error
    );
    let stats = scheduler.stats();
    assert_eq!(
        Stats::get(&stats.tick_errors),
        summary.tick_errors,
        "{name}"
    );
    assert_eq!(stats.last_error(), summary.last_error, "{name}");
    if let Some(every) = case.fail_every {
        // Every failed claim is counted (the reaper's failures come on top).
        let failed_claims = attempts.div_ceil(every) as u64;
        assert!(
            summary.tick_errors >= failed_claims,
            "{name}: {summary:?}, {attempts} claims"
        );
        // `ticks` counts at least the ticks whose claim went through; whether a failed tick
        // counts as run is the loop's choice (today it does not), so only the bounds are fixed.
        let attempts = attempts as u64;
        assert!(
            (attempts - failed_claims..=attempts).contains(&summary.ticks),
            "{name}: {summary:?}, {attempts} claims"
        );
    }
    // Health sees a success only when a whole pass (tick and any reaper pass) went through.
    assert_eq!(stats.last_success().is_some(), case.any_success, "{name}");
}

#[tokio::test]
async fn a_run_with_failing_ticks_counts_and_reports_them_and_keeps_going() {
    let cases = [
        RunCase {
            name: "every claim fails",
            fail_every: Some(1),
            reap_fails: false,
            last_error: "tick failed: claim failed: no routine has id",
            any_success: false,
        },
        RunCase {
            name: "every other claim fails",
            fail_every: Some(2),
            reap_fails: false,
            last_error: "tick failed: claim failed: no routine has id",
            any_success: true,
        },
        RunCase {
            // Reaper passes run every half lease (500 ms), so only the first one falls in
            // the run, and the later ticks succeed.
            name: "the reaper pass fails",
            fail_every: None,
            reap_fails: true,
            last_error: "reaper pass failed: claim failed: database error",
            any_success: true,
        },
    ];
    for case in cases {
        check_run(case).await;
    }
}

#[tokio::test]
async fn new_refuses_a_dispatch_timeout_not_shorter_than_the_lease() {
    // (lease, dispatch timeout) in milliseconds, and whether the scheduler accepts them.
    let cases = [
        (1_000, 999, true),
        (1_000, 1_000, false),
        (1_000, 5_000, false),
        (60_000, 30_000, true),
    ];
    for (lease_ms, timeout_ms, accepted) in cases {
        let lease = Duration::from_millis(lease_ms);
        let timeout = Duration::from_millis(timeout_ms);
        let config = SchedulerConfig {
            lease: Lease::new(lease).unwrap(),
            dispatch_timeout: timeout,
            ..SchedulerConfig::default()
        };
        let result = Scheduler::new(
            Arc::new(MockFireLedger::new()),
            Arc::new(mock_dispatcher()),
            config,
            "me",
        );
        match result {
            Ok(_) => assert!(accepted, "{lease_ms}/{timeout_ms} accepted"),
            Err(e) => {
                assert!(!accepted, "{lease_ms}/{timeout_ms} refused: {e}");
                assert_eq!(
                    e,
                    ConfigError::TimeoutNotShorterThanLease { timeout, lease }
                );
            }
        }
    }
}

#[tokio::test]
async fn a_claim_whose_lease_is_used_up_before_dispatch_is_left_to_the_reaper() {
    // The claim's transaction began longer ago than the 1 s lease (a slow tick): dispatching
    // now could outlive the lease, so the occurrence is neither dispatched nor settled.
    let slow = TickClaim {
        began: std::time::Instant::now() - Duration::from_secs(2),
        ..claim(&[Row::Fresh], 0)
    };
    let mut ledger = MockFireLedger::new();
    ledger.expect_claim_due().return_once(move |_| Ok(slow));
    ledger.expect_settle_fires().never();
    // Why it was left is noted on the row, for an abandon that may follow.
    ledger
        .expect_note_unsettled()
        .withf(|_, why| why.as_str().contains("not dispatched: the claim took"))
        .times(1)
        .returning(|_, _| Ok(true));
    let mut dispatcher = mock_dispatcher();
    dispatcher.expect_dispatch().never();
    let scheduler = scheduler(ledger, dispatcher);
    let report = one_claim(&scheduler).await;
    assert_eq!(report.unsettled, 1);
    assert_eq!(report.fired + report.failed, 0);
    assert_eq!(Stats::get(&scheduler.stats().unstarted), 1);
}

/// A dispatch's deadline is counted from when its budget was, not from when its task first ran:
/// a backend that blocks its thread for 300 ms delays the start of the other dispatch of the
/// claim, and that wait must come out of the other's 100 ms budget, not be added to it.
#[tokio::test]
async fn a_dispatch_deadline_is_fixed_when_its_budget_is_counted() {
    let claim = claim(&[Row::Fresh, Row::Fresh], 0);
    let began = claim.began;
    let mut ledger = MockFireLedger::new();
    ledger.expect_claim_due().return_once(move |_| Ok(claim));
    ledger
        .expect_settle_fires()
        .returning(|batch| Ok(vec![SettleOutcome::Settled; batch.len()]));
    let deadlines = Arc::new(Mutex::new(Vec::new()));
    let seen = deadlines.clone();
    let mut dispatcher = mock_dispatcher();
    dispatcher.expect_dispatch().returning(move |d| {
        seen.lock().unwrap().push((d.deadline, d.first_attempt_age));
        // A backend doing blocking work on the runtime's only thread.
        std::thread::sleep(Duration::from_millis(300));
        receipt()
    });
    let scheduler = scheduler(ledger, dispatcher);
    let report = scheduler.tick().await.unwrap();
    assert_eq!(report.fired, 2, "{report:?}");
    let deadlines = deadlines.lock().unwrap().clone();
    assert_eq!(deadlines.len(), 2);
    for (deadline, first_attempt_age) in deadlines {
        let after_claim = deadline.duration_since(began);
        assert!(
            after_claim < Duration::from_millis(200),
            "a deadline {after_claim:?} after the claim began, for a 100 ms dispatch timeout"
        );
        // Each occurrence was first claimed 30 s or 29 s before the claim's clock (at(30)),
        // and the dispatch is told so.
        assert!(
            (Duration::from_secs(29)..Duration::from_secs(31)).contains(&first_attempt_age),
            "{first_attempt_age:?}"
        );
    }
}

/// A backend double that holds every dispatch of one routine for 20 s and answers the others at
/// once, recording when each dispatch started.
struct HoldsOneRoutine {
    slow: Uuid,
    started: Mutex<Vec<(Occurrence, tokio::time::Instant)>>,
}

#[async_trait::async_trait]
impl Dispatcher for HoldsOneRoutine {
    async fn dispatch(&self, dispatch: &cm_dispatch::Dispatch) -> Result<Receipt, DispatchError> {
        self.started
            .lock()
            .unwrap()
            .push((dispatch.occurrence, tokio::time::Instant::now()));
        if dispatch.occurrence.routine_id == self.slow {
            tokio::time::sleep(Duration::from_secs(20)).await;
        }
        receipt()
    }
}

/// With the loop running (paused time), one routine's dispatches each take 20 s while another
/// routine comes due every second: the ticks keep their one-second cadence, the fast routine's
/// occurrences are dispatched and settled within the tick that claimed them, and the slow
/// dispatches overlap instead of queueing behind one another.
#[tokio::test(start_paused = true)]
async fn a_dispatch_held_for_20_s_does_not_hold_back_other_routines() {
    const SLOW: Uuid = Uuid::from_u128(0x51);
    const FAST: Uuid = Uuid::from_u128(0xFA);
    type Times = Arc<Mutex<Vec<(Occurrence, tokio::time::Instant)>>>;
    let claimed: Times = Arc::default();
    let settled: Times = Arc::default();

    let mut ledger = MockFireLedger::new();
    let record = claimed.clone();
    let ticks = Arc::new(AtomicUsize::new(0));
    ledger.expect_claim_due().returning(move |_| {
        let n = u32::try_from(ticks.fetch_add(1, Ordering::SeqCst)).unwrap();
        let now = tokio::time::Instant::now();
        let fires: Vec<ClaimedFire> = [SLOW, FAST]
            .into_iter()
            .map(|routine| {
                let mut f = fire(n, Row::Fresh);
                f.occurrence = Occurrence::new(routine, at(n));
                record.lock().unwrap().push((f.occurrence, now));
                f
            })
            .collect();
        Ok(TickClaim {
            fires,
            ..claim(&[], 0)
        })
    });
    ledger
        .expect_reap_expired()
        .returning(|_| Ok(claim(&[], 0)));
    ledger.expect_prune_settled().returning(|_, _| Ok(0));
    let record = settled.clone();
    ledger.expect_settle_fires().returning(move |batch| {
        let now = tokio::time::Instant::now();
        let mut record = record.lock().unwrap();
        record.extend(batch.iter().map(|s| (s.fire.occurrence, now)));
        Ok(vec![SettleOutcome::Settled; batch.len()])
    });
    let dispatcher = Arc::new(HoldsOneRoutine {
        slow: SLOW,
        started: Mutex::default(),
    });
    let config = SchedulerConfig {
        tick_interval: Duration::from_secs(1),
        max_fires_per_tick: FireCap::new(10).unwrap(),
        lease: Lease::new(Duration::from_secs(60)).unwrap(),
        dispatch_timeout: Duration::from_secs(30),
        ..SchedulerConfig::default()
    };
    let scheduler =
        Arc::new(Scheduler::new(Arc::new(ledger), dispatcher.clone(), config, "me").unwrap());
    // The loop runs for a fixed span on purpose (paused time): what it did in it is checked.
    let summary = scheduler
        .clone()
        .spawn(tokio::time::sleep(Duration::from_secs(30)))
        .await
        .unwrap();

    let claimed = claimed.lock().unwrap().clone();
    let settled: std::collections::HashMap<_, _> =
        settled.lock().unwrap().iter().copied().collect();
    let started: std::collections::HashMap<_, _> =
        dispatcher.started.lock().unwrap().iter().copied().collect();
    let tick_times: Vec<_> = claimed
        .iter()
        .filter(|(o, _)| o.routine_id == FAST)
        .map(|(_, at)| *at)
        .collect();
    assert!(
        tick_times.len() >= 29,
        "only {} ticks in 30 s",
        tick_times.len()
    );
    for pair in tick_times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap <= Duration::from_millis(1_010),
            "a tick waited {gap:?} for the one before it"
        );
    }
    let mut slow_overlap = 0;
    for (occurrence, at) in &claimed {
        let began = started[occurrence] - *at;
        assert!(
            began <= Duration::from_millis(10),
            "{occurrence:?} started {began:?} after its claim"
        );
        // Every occurrence is settled before the run returns, the slow ones 20 s after their
        // claim, the others within a few milliseconds (one completer batch).
        let done = settled[occurrence] - *at;
        if occurrence.routine_id == FAST {
            assert!(
                done <= Duration::from_millis(50),
                "{occurrence:?} settled {done:?} after its claim"
            );
        } else {
            assert!(
                done >= Duration::from_secs(20),
                "{occurrence:?} settled after {done:?}"
            );
            if *at + Duration::from_secs(20) > claimed.last().unwrap().1 {
                slow_overlap += 1;
            }
        }
    }
    // The slow dispatches of the last 20 s were all in flight at once.
    assert!(
        slow_overlap >= 19,
        "only {slow_overlap} slow dispatches overlapped"
    );
    assert_eq!(summary.fired as usize, claimed.len(), "{summary:?}");
    assert_eq!(summary.tick_errors, 0, "{summary:?}");
}

/// A transient failure of cm's own database while the outbox is written (dispatched mode) is
/// retried within the dispatch's deadline, and the occurrence ends `fired`: it is not the
/// target's failure.
#[tokio::test]
async fn a_transient_outbox_error_is_retried_and_the_occurrence_fires() {
    let mut outbox = cm_store::MockOutboxStore::new();
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    outbox.expect_outbox_insert().returning(move |_| {
        if counted.fetch_add(1, Ordering::SeqCst) == 0 {
            Err(StoreError::Database(sqlx::Error::PoolTimedOut))
        } else {
            Ok(true)
        }
    });
    let (ledger, settles) = ledger(vec![claim(&[Row::Fresh], 0)], settled_ok);
    let scheduler = scheduler(ledger, cm_dispatch::OutboxDispatcher::dispatched(outbox));

    let report = one_claim(&scheduler).await;
    assert_eq!(
        report,
        TickReport {
            fired: 1,
            ..TickReport::default()
        }
    );
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    let settles = settles.lock().unwrap().clone();
    assert_eq!(settles.len(), 1);
    assert_eq!(settles[0].1, Settlement::Fired);
}

/// A database that stays down through the whole dispatch deadline leaves the occurrence
/// `claimed` for a retry after its lease, not settled `failed`.
#[tokio::test]
async fn a_database_down_through_the_deadline_leaves_the_claim_for_a_retry() {
    let mut outbox = cm_store::MockOutboxStore::new();
    outbox
        .expect_outbox_insert()
        .returning(|_| Err(StoreError::Database(sqlx::Error::PoolTimedOut)));
    let mut ledger = MockFireLedger::new();
    ledger
        .expect_claim_due()
        .return_once(|_| Ok(claim(&[Row::Fresh], 0)));
    ledger.expect_settle_fires().never();
    let scheduler = scheduler(ledger, cm_dispatch::OutboxDispatcher::dispatched(outbox));

    let report = one_claim(&scheduler).await;
    assert_eq!(
        report,
        TickReport {
            unsettled: 1,
            ..TickReport::default()
        }
    );
    assert_eq!(Stats::get(&scheduler.stats().left_for_retry), 1);
    assert_eq!(Stats::get(&scheduler.stats().failed), 0);
}

/// The maintenance pass prunes in batches until a batch comes back short, so retention keeps
/// up with a ledger that grows by thousands of rows a second.
#[tokio::test]
async fn pruning_repeats_full_batches_until_one_comes_back_short() {
    let mut ledger = MockFireLedger::new();
    ledger.expect_claim_due().returning(|_| Ok(claim(&[], 0)));
    ledger
        .expect_reap_expired()
        .returning(|_| Ok(claim(&[], 0)));
    let batches = Arc::new(Mutex::new(VecDeque::from([10_000u64, 10_000, 5])));
    let left = batches.clone();
    ledger
        .expect_prune_settled()
        .times(3)
        .withf(|_, limit| *limit == 10_000)
        .returning(move |_, _| Ok(left.lock().unwrap().pop_front().unwrap_or(0)));
    let scheduler = Arc::new(scheduler(ledger, mock_dispatcher()));
    // One maintenance pass falls in the run (the next is half a lease, 500 ms, later).
    let summary = scheduler
        .clone()
        .spawn(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(summary.tick_errors, 0, "{summary:?}");
    assert_eq!(Stats::get(&scheduler.stats().pruned), 20_005);
    assert!(batches.lock().unwrap().is_empty());
}

/// The outbox's retention repeats full batches too (it deleted one batch of 1,000 a pass, far
/// fewer rows than the engine writes), and the ledger's pruning follows it in the same pass.
#[tokio::test]
async fn outbox_pruning_repeats_full_batches_until_one_comes_back_short() {
    let mut ledger = MockFireLedger::new();
    ledger.expect_claim_due().returning(|_| Ok(claim(&[], 0)));
    ledger
        .expect_reap_expired()
        .returning(|_| Ok(claim(&[], 0)));
    ledger
        .expect_prune_settled()
        .times(1)
        .returning(|_, _| Ok(0));
    let batches = Arc::new(Mutex::new(VecDeque::from([10_000u64, 10_000, 10_000, 7])));
    let left = batches.clone();
    let mut outbox = cm_store::MockOutboxConsumer::new();
    outbox
        .expect_outbox_prune_acked()
        .times(4)
        .withf(|_, limit| *limit == cm_scheduler::PRUNE_BATCH)
        .returning(move |_, _| Ok(left.lock().unwrap().pop_front().unwrap_or(0)));
    let scheduler =
        Arc::new(scheduler(ledger, mock_dispatcher()).with_outbox_pruning(Arc::new(outbox)));
    // One maintenance pass falls in the run (the next is half a lease, 500 ms, later).
    let summary = scheduler
        .clone()
        .spawn(tokio::time::sleep(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(summary.tick_errors, 0, "{summary:?}");
    assert!(batches.lock().unwrap().is_empty());
}

/// A taken-over claim (attempt 2: its claimant stopped before settling, perhaps after the
/// target took the occurrence) whose target is unavailable now is left for the next attempt,
/// not settled `failed`: "unavailable" does not say the earlier attempt failed. A first
/// attempt that meets the same answer is the target's failure and settles `failed`.
#[tokio::test]
async fn a_retried_dispatch_whose_target_is_unavailable_is_left_for_the_next_attempt() {
    let (ledger, settles) = ledger(vec![claim(&[Row::Fresh, Row::Retry(2)], 0)], settled_ok);
    let (dispatcher, calls) =
        counting_dispatcher(|| Err(DispatchError::Unavailable("HTTP 503".into())));
    let scheduler = scheduler(ledger, dispatcher);

    let report = scheduler.tick().await.unwrap();
    assert_eq!(
        report,
        TickReport {
            failed: 1,
            unsettled: 1,
            claims: 1,
            ..TickReport::default()
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let settles = settles.lock().unwrap().clone();
    assert_eq!(settles.len(), 1, "{settles:?}");
    assert_eq!(settles[0].0.occurrence, occurrence(0));
    assert_eq!(Stats::get(&scheduler.stats().left_for_retry), 1);
}

/// What a scheduler's claims asked for: each claim's cap and the most routines it may lock.
type Asked = Arc<Mutex<Vec<(usize, u32)>>>;

/// A scheduler of cap 6 whose ledger answers its claims with `claims`, in order (and no more),
/// recording what each asked for; every settle succeeds.
fn asking_scheduler(claims: Vec<TickClaim>) -> (Scheduler, Asked) {
    asking_scheduler_in_lanes(claims, 1)
}

/// [`asking_scheduler`] with `lanes` lanes of claims.
fn asking_scheduler_in_lanes(claims: Vec<TickClaim>, lanes: usize) -> (Scheduler, Asked) {
    let count = claims.len();
    let mut queue = VecDeque::from(claims);
    let asked = Asked::default();
    let record = asked.clone();
    let mut ledger = MockFireLedger::new();
    ledger.expect_claim_due().times(count).returning(move |p| {
        record.lock().unwrap().push((p.cap.get(), p.max_routines));
        Ok(queue.pop_front().unwrap())
    });
    ledger
        .expect_settle_fires()
        .returning(|batch| Ok(vec![SettleOutcome::Settled; batch.len()]));
    let (dispatcher, _calls) = counting_dispatcher(receipt);
    let config = SchedulerConfig {
        max_fires_per_tick: FireCap::new(6).unwrap(),
        max_in_flight: 100,
        drain_lanes: lanes,
        ..config()
    };
    let scheduler = Scheduler::new(Arc::new(ledger), Arc::new(dispatcher), config, "me").unwrap();
    (scheduler, asked)
}

/// A claim of `rows` that came back full (more is due).
fn full_claim(rows: &[Row]) -> TickClaim {
    TickClaim {
        more_due: true,
        ..claim(rows, 0)
    }
}

/// A claim of routines behind by many occurrences each (a backlog, claimed whole) is followed
/// by one that locks only as many routines as that many occurrences each fills its batch with,
/// not the batch's count of routines; a claim that fires nothing sets it back to one a routine.
#[tokio::test]
async fn routines_locked_follow_what_each_routine_of_the_last_claim_owed() {
    // Six fires of two routines, three each; the claim came back full.
    let mut backlog = full_claim(&[Row::Fresh; 6]);
    for (n, fire) in (0u32..).zip(&mut backlog.fires) {
        fire.occurrence = Occurrence::new(Uuid::from_u128(u128::from(n % 2) + 1), at(n));
    }
    let (scheduler, asked) = asking_scheduler(vec![backlog, claim(&[], 0), claim(&[], 0)]);

    // The first tick: the full claim, then (the batch grown to 24) one that locks 24 ÷ 3.
    let report = scheduler.tick().await.unwrap();
    assert_eq!((report.claims, report.fired), (2, 6), "{report:?}");
    // The next tick starts over at the cap (the last one claimed no more than the cap), one
    // occurrence a routine again.
    scheduler.tick().await.unwrap();
    // Six routines and one more for six; eight (24 ÷ 3) and one more for 24; six and one more
    // for six.
    assert_eq!(*asked.lock().unwrap(), vec![(6, 7), (24, 9), (6, 7)]);
}

/// A tick's first claim takes twice what the previous tick claimed when that was more than the
/// cap (the cap otherwise), so a load due every second is claimed without the ramp from the cap each time; a tick that
/// claimed nothing sends the next one back to the cap.
#[tokio::test]
async fn a_tick_starts_at_what_the_last_one_claimed() {
    let (scheduler, asked) = asking_scheduler(vec![
        full_claim(&[Row::Fresh; 6]),
        claim(&[Row::Fresh; 10], 0),
        claim(&[], 0),
        claim(&[], 0),
    ]);
    for _ in 0..3 {
        scheduler.tick().await.unwrap();
    }
    // The cap, then grown fourfold; the next tick at twice the 16 the first claimed; then the
    // cap again.
    let caps: Vec<usize> = asked.lock().unwrap().iter().map(|(cap, _)| *cap).collect();
    assert_eq!(caps, vec![6, 24, 32, 6]);
}

/// A backend double that holds each dispatch of the routines in `held` for `hold` and answers
/// the others at once, recording which occurrences it was asked for and when each ended.
struct HoldsSome {
    held: Vec<Uuid>,
    hold: Duration,
    ended: Mutex<Vec<(Occurrence, std::time::Instant)>>,
}

#[async_trait::async_trait]
impl Dispatcher for HoldsSome {
    async fn dispatch(&self, dispatch: &cm_dispatch::Dispatch) -> Result<Receipt, DispatchError> {
        if self.held.contains(&dispatch.occurrence.routine_id) {
            tokio::time::sleep(self.hold).await;
        }
        self.ended
            .lock()
            .unwrap()
            .push((dispatch.occurrence, std::time::Instant::now()));
        receipt()
    }
}

/// The in-flight places a claim counted are its own from before the claim: a reaper pass that
/// runs while the claim is under way finds no room (it takes nothing over), and the claim's
/// occurrences start at once instead of waiting, their lease running, for dispatches the reaper
/// started in their places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaper_pass_during_a_claim_cannot_take_the_claims_room() {
    let (entered, entered_rx) = std::sync::mpsc::channel::<()>();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let (entered, go_rx) = (Mutex::new(entered), Mutex::new(go_rx));
    let mut ledger = MockFireLedger::new();
    // The tick's claim: two occurrences, answered once the test says so.
    ledger.expect_claim_due().times(1).returning(move |_| {
        entered.lock().unwrap().send(()).unwrap();
        go_rx
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        Ok(claim(&[Row::Fresh, Row::Fresh], 0))
    });
    // The reaper takes over as many expired claims as it asks for (occurrences 10 and on),
    // each of whose dispatches the backend holds.
    let reaper_asked = Arc::new(Mutex::new(Vec::new()));
    let asked = reaper_asked.clone();
    ledger.expect_reap_expired().returning(move |params| {
        asked.lock().unwrap().push(params.limit);
        let mut taken = claim(&[], 0);
        taken.fires = (10..10 + params.limit)
            .map(|n| fire(n, Row::Retry(2)))
            .collect();
        Ok(taken)
    });
    ledger
        .expect_settle_fires()
        .returning(|batch| Ok(vec![SettleOutcome::Settled; batch.len()]));
    let backend = Arc::new(HoldsSome {
        held: (10..20).map(|n| occurrence(n).routine_id).collect(),
        hold: Duration::from_millis(1_500),
        ended: Mutex::default(),
    });
    let config = SchedulerConfig {
        max_fires_per_tick: FireCap::new(2).unwrap(),
        max_in_flight: 2,
        lease: Lease::new(Duration::from_secs(10)).unwrap(),
        dispatch_timeout: Duration::from_secs(5),
        ..config()
    };
    let scheduler =
        Arc::new(Scheduler::new(Arc::new(ledger), backend.clone(), config, "me").unwrap());

    let ticking = scheduler.clone();
    let tick = tokio::spawn(async move { ticking.tick().await });
    tokio::task::spawn_blocking(move || entered_rx.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .unwrap();
    // While the claim is under way, a whole reaper pass.
    let reaped = scheduler.clone();
    let reap = tokio::spawn(async move { reaped.reap().await });
    // Let the pass take what it can (and start its dispatches) before the claim comes back.
    crate::support::eventually_within(Duration::from_secs(5), async || {
        (reap.is_finished() || !reaper_asked.lock().unwrap().is_empty()).then_some(())
    })
    .await
    .unwrap();
    // Time passes on purpose: room for the pass to take over what it must not.
    tokio::time::sleep(Duration::from_millis(100)).await;
    go.send(()).unwrap();
    let report = tick.await.unwrap().unwrap();
    let reap_report = reap.await.unwrap().unwrap();

    assert_eq!(report.fired, 2, "{report:?}");
    assert_eq!(
        *reaper_asked.lock().unwrap(),
        Vec::<u32>::new(),
        "the reaper took over claims in the room the tick's claim had counted: {reap_report:?}"
    );
    // Neither of the claim's occurrences waited for a dispatch the reaper started.
    let ended = backend.ended.lock().unwrap().clone();
    let mine: Vec<_> = ended
        .iter()
        .filter(|(o, _)| *o == occurrence(0) || *o == occurrence(1))
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(mine.len(), 2);
    let first_reaped = ended
        .iter()
        .filter(|(o, _)| !(*o == occurrence(0) || *o == occurrence(1)))
        .map(|(_, at)| *at)
        .min();
    if let Some(first_reaped) = first_reaped {
        assert!(
            mine.iter().all(|at| *at < first_reaped),
            "the claim's dispatches waited for the reaper's"
        );
    }
}

/// With two lanes, a tick's first claim that comes back full opens the second lane beside the
/// first: three claims where one lane makes two (its full claim and the one after it). A first
/// claim that takes all that is due is the tick's only claim: a quiet tick is no heavier.
#[tokio::test]
async fn full_claims_open_the_other_lanes() {
    let (scheduler, asked) = asking_scheduler_in_lanes(
        vec![full_claim(&[Row::Fresh; 6]), claim(&[], 0), claim(&[], 0)],
        2,
    );
    let report = scheduler.tick().await.unwrap();
    assert_eq!((report.claims, report.fired), (3, 6), "{report:?}");
    // The first claim at the cap; then the first lane's next claim and the second lane's
    // first, both at the grown batch.
    let caps: Vec<usize> = asked.lock().unwrap().iter().map(|&(cap, _)| cap).collect();
    assert_eq!(caps, vec![6, 24, 24]);

    let (scheduler, asked) = asking_scheduler_in_lanes(vec![claim(&[Row::Fresh; 4], 0)], 2);
    let report = scheduler.tick().await.unwrap();
    assert_eq!((report.claims, report.fired), (1, 4), "{report:?}");
    assert_eq!(asked.lock().unwrap().len(), 1);
}
