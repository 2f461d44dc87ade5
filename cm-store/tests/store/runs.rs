//! Mission runs: begun on a claimed fire, read back while unfinished (through their index), and
//! recorded once, even by two watch passes at once.

use chrono::{DateTime, Utc};
use cm_domain::{ErrorText, FireStatus, MisfirePolicy, Occurrence, RunState};
use cm_store::{MissionRuns, PgStore, RunUpdate};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Seed, create, fire_of, lock_waiters, seed_fire, unfinished_occurrences};

/// The occurrence `minute` minutes into a fixed hour of `routine`.
fn minute_of(routine: &cm_store::Routine, minute: i64) -> Occurrence {
    Occurrence::new(
        routine.id,
        chrono::DateTime::from_timestamp(1_790_000_000 + minute * 60, 0).unwrap(),
    )
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn runs_are_begun_watched_and_recorded_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let at = |minute| minute_of(&routine, minute);
    let (running, launching, not_launched, message) = (at(0), at(1), at(2), at(3));
    for o in [running, launching, not_launched, message] {
        seed_fire(&pool, o, &Seed::claimed(30.0)).await;
    }
    for o in [running, launching, not_launched] {
        store.begin_run(o).await.unwrap();
    }
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'fired', completed_at = now()
         WHERE scheduled_at = $1",
    )
    .bind(running.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'failed', error = 'refused', completed_at = now()
         WHERE scheduled_at = $1",
    )
    .bind(not_launched.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();

    let mut unfinished = store.unfinished_runs(10).await.unwrap();
    unfinished.sort_by_key(|r| r.occurrence);
    let seen: Vec<(Occurrence, FireStatus)> = unfinished
        .iter()
        .map(|r| (r.occurrence, r.status))
        .collect();
    assert_eq!(
        seen,
        [
            (running, FireStatus::Fired),
            (launching, FireStatus::Claimed),
            (not_launched, FireStatus::Failed),
        ],
        "a message fire has no run"
    );

    let failed = RunState::exited(3, "");
    let updates = [
        (running, RunUpdate::Observed(failed.clone())),
        (launching, RunUpdate::Launching),
        (not_launched, RunUpdate::NotLaunched),
    ];
    // Only the run this call ended comes back: it is what the run counters count.
    assert_eq!(
        store.record_runs(&updates).await.unwrap(),
        [(running, failed.clone(), None)]
    );
    // A second scheduler's pass that read the run while it was running, and saw it end too,
    // ends nothing: each run is counted once, whichever scheduler watched it.
    assert_eq!(
        store
            .record_runs(&[(running, RunUpdate::Observed(failed.clone()))])
            .await
            .unwrap(),
        []
    );
    // A second pass that saw the run still running (older news) changes nothing ended.
    store
        .record_runs(&[(running, RunUpdate::Observed(RunState::Running))])
        .await
        .unwrap();
    let fire = fire_of(&store, running).await;
    assert_eq!(
        (
            fire.run_state.as_deref(),
            fire.run_exit_code,
            fire.run_reason.as_deref()
        ),
        (Some("failed"), Some(3), Some("exit code 3"))
    );
    assert_eq!(
        fire_of(&store, launching).await.run_state.as_deref(),
        Some("running")
    );
    assert_eq!(fire_of(&store, not_launched).await.run_state, None);
    assert_eq!(fire_of(&store, message).await.run_state, None);
    let left = unfinished_occurrences(&store).await;
    assert_eq!(left, [launching]);

    // A lost run keeps its reason.
    store
        .record_runs(&[(
            launching,
            RunUpdate::Observed(RunState::Lost {
                reason: ErrorText::new("no container"),
            }),
        )])
        .await
        .unwrap();
    let fire = fire_of(&store, launching).await;
    assert_eq!(fire.run_state.as_deref(), Some("lost"));
    assert_eq!(fire.run_reason.as_deref(), Some("no container"));
    assert!(store.unfinished_runs(10).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_watch_read_uses_the_running_index(pool: PgPool) {
    // A ledger of finished fires and a few runs: the plan reads the partial index only.
    sqlx::query("SET enable_seqscan = off")
        .execute(&pool)
        .await
        .unwrap();
    let plan = PgStore::new(pool.clone())
        .explain(&cm_store::explain::HotStatement::UnfinishedRuns {
            limit: 100,
            group: None,
        })
        .await
        .unwrap();
    assert!(plan.contains("routine_fires_running_idx"), "{plan}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn overlap_is_decided_one_decider_at_a_time(pool: PgPool) {
    use cm_domain::OverlapPolicy;
    use cm_store::RunTake;
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let at = |minute| minute_of(&routine, minute);
    let (first, second, third) = (at(0), at(1), at(2));
    for o in [first, second, third] {
        seed_fire(&pool, o, &Seed::claimed(30.0)).await;
    }
    // Two schedulers take the run of two occurrences at once: one launches, one is skipped
    // naming the other (the default policy is forbid).
    let (a, b) = tokio::join!(store.take_run(first, None), store.take_run(second, None));
    let (a, b) = (a.unwrap(), b.unwrap());
    let launched = [&a, &b]
        .iter()
        .filter(|t| matches!(t, RunTake::Launch))
        .count();
    assert_eq!(launched, 1, "{a:?} {b:?}");
    let (winner, loser) = if a == RunTake::Launch {
        (first, second)
    } else {
        (second, first)
    };
    let skipped = if a == RunTake::Launch { &b } else { &a };
    assert!(
        matches!(skipped, RunTake::Skip { holder, .. } if *holder == winner),
        "{skipped:?}"
    );
    // The winner's retry (same occurrence) finds the run its own.
    // The retry begins the run again, recording where its runtime keeps it.
    let place_a = || Some("host-a:/var/lib/cm/missions".to_owned());
    assert_eq!(
        store.take_run(winner, place_a()).await.unwrap(),
        RunTake::Launch
    );
    let _ = loser;
    // Once launched and running, replace asks to stop it; allow launches regardless.
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'fired', completed_at = now() WHERE scheduled_at = $1",
    )
    .bind(winner.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();
    store
        .set_overlap(routine.id, OverlapPolicy::Replace)
        .await
        .unwrap();
    assert_eq!(
        store.take_run(third, None).await.unwrap(),
        RunTake::Replace {
            holder: winner,
            place: place_a(),
            run_name: winner.run_name(0),
        }
    );
    // Asking to replace takes nothing: until the stop is confirmed the winner keeps the run,
    // and asking again still names it.
    assert_eq!(
        holder_of(&pool, routine.id).await,
        Some(winner.scheduled_at)
    );
    assert_eq!(
        store.take_run(third, None).await.unwrap(),
        RunTake::Replace {
            holder: winner,
            place: place_a(),
            run_name: winner.run_name(0),
        }
    );
    // Once the runtime confirmed the winner's run stopped, the run is the third's.
    let place_b = Some("host-b:/srv/cm-missions".to_owned());
    assert_eq!(
        store
            .take_replaced(third, winner, place_b.clone())
            .await
            .unwrap(),
        RunTake::Launch
    );
    assert_eq!(holder_of(&pool, routine.id).await, Some(third.scheduled_at));
    let watched = store.unfinished_runs(10).await.unwrap();
    let place_of = |o: Occurrence| {
        watched
            .iter()
            .find(|r| r.occurrence == o)
            .unwrap()
            .place
            .clone()
    };
    assert_eq!((place_of(winner), place_of(third)), (place_a(), place_b));
    // A replace that stopped a run which no longer holds the routine decides again: the third
    // is still being launched, so the second is skipped.
    assert!(
        matches!(
            store.take_replaced(second, winner, None).await.unwrap(),
            RunTake::Skip { holder, state: cm_domain::RunHolder::Launching } if holder == third
        ),
        "a replace launched beside a run it did not stop"
    );
    store
        .set_overlap(routine.id, OverlapPolicy::Allow)
        .await
        .unwrap();
    assert_eq!(
        store.take_run(winner, None).await.unwrap(),
        RunTake::Gone,
        "settled: not launched again"
    );
}

/// The fire that holds the routine's run.
async fn holder_of(pool: &PgPool, routine_id: Uuid) -> Option<DateTime<Utc>> {
    sqlx::query_scalar(
        "SELECT scheduled_at FROM cm.routine_fires WHERE routine_id = $1 AND holds_run",
    )
    .bind(routine_id)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_claim_whose_routine_was_deleted_launches_nothing(pool: PgPool) {
    use cm_store::{RoutineStore, RunTake};
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let claimed = minute_of(&routine, 0);
    seed_fire(&pool, claimed, &Seed::claimed(30.0)).await;
    // Deleted between its claim and its launch: the take finds nothing to launch, and writes
    // nothing (no run begun that nothing would watch).
    store.delete_routine(routine.id).await.unwrap();
    assert_eq!(store.take_run(claimed, None).await.unwrap(), RunTake::Gone);
    assert!(store.unfinished_runs(10).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_abandoned_launch_holds_the_run_until_the_watch_finds_it_gone(pool: PgPool) {
    use cm_domain::RunHolder;
    use cm_store::RunTake;
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let (abandoned, next) = (minute_of(&routine, 0), minute_of(&routine, 1));
    for o in [abandoned, next] {
        seed_fire(&pool, o, &Seed::claimed(30.0)).await;
    }
    assert_eq!(
        store.take_run(abandoned, None).await.unwrap(),
        RunTake::Launch
    );
    // Its launches went unconfirmed until the attempts ran out: settled `failed`, while its
    // container may exist.
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'failed', error = 'abandoned', completed_at = now()
         WHERE scheduled_at = $1",
    )
    .bind(abandoned.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();
    assert!(
        matches!(
            store.take_run(next, None).await.unwrap(),
            RunTake::Skip { holder, state: RunHolder::Running } if holder == abandoned
        ),
        "a launch beside a container that may exist"
    );
    // The watch still asks about it, and once the runtime says it never ran, the run is free.
    let watched: Vec<_> = store
        .unfinished_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.occurrence, r.status))
        .collect();
    assert_eq!(watched, [(abandoned, FireStatus::Failed)]);
    store
        .record_runs(&[(abandoned, RunUpdate::NotLaunched)])
        .await
        .unwrap();
    assert_eq!(store.take_run(next, None).await.unwrap(), RunTake::Launch);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_run_being_decided_hides_its_routine_from_no_claim(pool: PgPool) {
    use cm_store::{FireLedger, RunTake};
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let deciding = minute_of(&routine, 0);
    seed_fire(&pool, deciding, &Seed::claimed(30.0)).await;
    crate::support::set_next_run(&pool, routine.id, crate::support::db_now(&pool).await).await;
    // A decider of the routine's run holds its turn (as one does for the whole of its
    // transaction); another waits for it.
    let mut turn = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('cm.run:' || $1::text, 0))")
        .bind(routine.id)
        .execute(&mut *turn)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.take_run(deciding, None).await }
    });
    lock_waiters(&pool, 1).await;
    // Meanwhile the routine's row is free: a claim locks it and claims its due occurrence.
    let claim = store
        .claim_due(&crate::support::params("other"))
        .await
        .unwrap();
    assert_eq!(
        claim
            .fires
            .iter()
            .filter(|f| f.occurrence.routine_id == routine.id)
            .count(),
        1,
        "the claim skipped a routine whose run was being decided"
    );
    turn.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), RunTake::Launch);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_watch_pass_records_the_runs_around_a_row_another_transaction_holds(pool: PgPool) {
    let store = crate::support::impatient_store(&pool).await;
    let held_routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let other_routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let (held, other) = (minute_of(&held_routine, 0), minute_of(&other_routine, 0));
    for o in [held, other] {
        seed_fire(&pool, o, &Seed::claimed(30.0)).await;
        store.begin_run(o).await.unwrap();
    }
    // A caller deletes one routine from SQL and keeps its transaction open.
    let mut caller = pool.begin().await.unwrap();
    sqlx::query("SELECT cm.delete_routine($1)")
        .bind(held_routine.id)
        .execute(&mut *caller)
        .await
        .unwrap();

    let ended = RunState::exited(0, "");
    let updates = [
        (held, RunUpdate::Observed(ended.clone())),
        (other, RunUpdate::Observed(ended.clone())),
    ];
    // The other routine's run is ended; the held one is skipped, not waited on.
    assert_eq!(
        store.record_runs(&updates).await.unwrap(),
        [(other, ended.clone(), None)]
    );
    assert_eq!(
        fire_of(&store, other).await.run_state.as_deref(),
        Some("succeeded")
    );
    // The caller lets go without deleting: the next pass ends the held run.
    caller.rollback().await.unwrap();
    assert_eq!(unfinished_occurrences(&store).await, [held]);
    assert_eq!(
        store.record_runs(&updates).await.unwrap(),
        [(held, ended, None)]
    );
}
