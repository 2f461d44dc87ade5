//! Mission runs: begun on a claimed fire, read back while unfinished (through their index), and
//! recorded once, even by two watch passes at once.

use cm_domain::{ErrorText, FireStatus, MisfirePolicy, Occurrence, RunState};
use cm_store::{MissionRuns, PgStore, RunUpdate};
use sqlx::PgPool;

use crate::support::{Seed, create, fire_of, seed_fire};

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
        "UPDATE routine_fires SET status = 'fired', completed_at = now()
         WHERE scheduled_at = $1",
    )
    .bind(running.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE routine_fires SET status = 'failed', error = 'refused', completed_at = now()
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
    store.record_runs(&updates).await.unwrap();
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
    let left: Vec<Occurrence> = store
        .unfinished_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.occurrence)
        .collect();
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
    // The statement is the crate's own constant with its limit written in.
    let plan: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN {}",
        cm_store::runs::UNFINISHED_RUNS_SQL.replace("$1", "100")
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    let plan: String = plan.into_iter().map(|(l,)| l + "\n").collect();
    assert!(plan.contains("routine_fires_running_idx"), "{plan}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn overlap_is_decided_under_the_routines_lock(pool: PgPool) {
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
    let (a, b) = tokio::join!(store.take_run(first), store.take_run(second));
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
    assert_eq!(store.take_run(winner).await.unwrap(), RunTake::Launch);
    let _ = loser;
    // Once launched and running, replace asks to stop it; allow launches regardless.
    sqlx::query(
        "UPDATE routine_fires SET status = 'fired', completed_at = now() WHERE scheduled_at = $1",
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
        store.take_run(third).await.unwrap(),
        RunTake::Replace { holder: winner }
    );
    store
        .set_overlap(routine.id, OverlapPolicy::Allow)
        .await
        .unwrap();
    assert_eq!(store.take_run(winner).await.unwrap(), RunTake::Launch);
}
