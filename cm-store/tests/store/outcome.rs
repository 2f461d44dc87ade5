//! A fire's outcome is its run's: the listing filters by the domain's rule (the SQL rule itself
//! is checked against the domain in `cm-store/src/outcome.rs`), and every reader of failures
//! (the listing, recent failures, the minute chart, the automatic pause) counts a mission
//! fired whose run exited non-zero as failed.

use cm_domain::{
    ErrorText, FireOutcome, FireStatus, MisfirePolicy, Occurrence, RunState, RunStateName,
};
use cm_store::{
    FailingRoutines, FireFilter, FireLedger, MissionRuns, PgStore, RoutineStore, RunUpdate,
    StatusReader,
};
use sqlx::PgPool;
use std::time::Duration;

use crate::support::{Seed, create, failed_fires, page_summaries, seed_fire};

/// The occurrence `minute` minutes into the last hour of `routine`'s fires: recent enough for
/// the minute chart and the automatic pause's window.
async fn recent(pool: &PgPool, routine: uuid::Uuid, minute: i64) -> Occurrence {
    let now = crate::support::db_now(pool).await;
    let base = crate::support::minute_floor(now) - chrono::Duration::minutes(50);
    Occurrence::new(routine, base + chrono::Duration::minutes(minute))
}

/// A mission's fire launched, settled `fired`, and its run recorded in `state`.
async fn fired_with_run(store: &PgStore, pool: &PgPool, occurrence: Occurrence, state: RunState) {
    seed_fire(pool, occurrence, &Seed::claimed(30.0)).await;
    store.begin_run(occurrence).await.unwrap();
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'fired', completed_at = now(),
                claimed_at = clock_timestamp()
         WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(occurrence.routine_id)
    .bind(occurrence.scheduled_at)
    .execute(pool)
    .await
    .unwrap();
    if state.is_finished() {
        let ended = store
            .record_runs(&[(occurrence, RunUpdate::Observed(state))])
            .await
            .unwrap();
        assert_eq!(ended.len(), 1);
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_listing_filters_by_the_domain_s_outcome(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let statuses = [
        FireStatus::Claimed,
        FireStatus::Fired,
        FireStatus::Failed,
        FireStatus::Skipped,
    ];
    let runs = std::iter::once(None).chain(RunStateName::ALL.map(Some));
    let mut minute = 0;
    let mut expected = Vec::new();
    let base = recent(&pool, routine.id, 0).await.scheduled_at;
    for status in statuses {
        for run in runs.clone() {
            let occurrence = Occurrence::new(routine.id, base + chrono::Duration::minutes(minute));
            minute += 1;
            sqlx::query(
                "INSERT INTO cm.routine_fires
                     (routine_id, scheduled_at, status, completed_at, error, run_state,
                      claimant, claim_token, attempt, claimed_at, lease_expires_at)
                 VALUES ($1, $2, $3::text, CASE WHEN $3::text = 'claimed' THEN NULL ELSE now() END,
                         CASE WHEN $3::text IN ('failed', 'skipped') THEN 'why' END, $4,
                         'other', gen_random_uuid(), 1, now(), now() + interval '1 minute')",
            )
            .bind(occurrence.routine_id)
            .bind(occurrence.scheduled_at)
            .bind(status.as_str())
            .bind(run.map(RunStateName::as_str))
            .execute(&pool)
            .await
            .unwrap();
            expected.push((occurrence, FireOutcome::of(status, run)));
        }
    }

    for outcome in FireOutcome::ALL {
        let listed = store
            .list_fires(&FireFilter {
                outcome: Some(outcome),
                ..FireFilter::default()
            })
            .await
            .unwrap();
        let mut got: Vec<_> = listed.iter().map(|f| f.scheduled_at).collect();
        got.sort();
        // `--status failed` lists every failure, lost runs too.
        let matches = |o: FireOutcome| match outcome {
            FireOutcome::Failed => o.is_failure(),
            _ => o == outcome,
        };
        let want: Vec<_> = expected
            .iter()
            .filter(|(_, o)| matches(*o))
            .map(|(o, _)| o.scheduled_at)
            .collect();
        assert_eq!(got, want, "fires --status {outcome}");
        assert!(listed.iter().all(|f| matches(f.outcome())));
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_mission_whose_runs_exit_3_is_failing_everywhere_and_paused(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    let base = recent(&pool, routine.id, 0).await.scheduled_at;
    for minute in 0..3 {
        let occurrence = Occurrence::new(routine.id, base + chrono::Duration::minutes(minute));
        fired_with_run(&store, &pool, occurrence, RunState::exited(3, "")).await;
    }

    let failed = failed_fires(&store).await;
    assert_eq!(
        failed.len(),
        3,
        "fires --status failed lists the failed runs"
    );
    assert_eq!(failed[0].failure(), Some("exit code 3"));

    let recent_failures = store.recent_failures(10).await.unwrap();
    assert_eq!(recent_failures.len(), 3);
    assert_eq!(recent_failures[0].error.as_deref(), Some("exit code 3"));
    assert_eq!(recent_failures[0].outcome, "failed");
    assert_eq!(recent_failures[0].run_exit_code, Some(3));

    let rate = store.fire_rate().await.unwrap();
    let (fired, failed): (u64, u64) = rate
        .minutes
        .iter()
        .fold((0, 0), |(a, b), m| (a + m.fired, b + m.failed));
    assert_eq!((fired, failed), (0, 3), "the chart counts the runs failed");

    let summaries = page_summaries(&store).await;
    let last = summaries[0].last_fire().unwrap();
    assert_eq!(last.outcome(), FireOutcome::Failed);
    assert_eq!(last.error.as_deref(), Some("exit code 3"));

    let paused = store
        .pause_failing_routines(3, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        paused.len(),
        1,
        "three failed runs in a row pause the routine"
    );
    assert_eq!(
        paused[0].reason,
        "paused by cm: its last 3 fires failed; the latest: exit code 3"
    );
    assert!(store.get_routine(routine.id).await.unwrap().paused);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn runs_not_ended_and_skips_neither_break_nor_make_a_run_of_failures(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let lost = |why: &str| RunState::Lost {
        reason: ErrorText::new(why),
    };
    // Failed, lost, skipped, failed, then one still running: the last three known outcomes
    // failed, the skip and the running one say nothing.
    let routine = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    // One base for the whole case: a minute that turns between two reads would shift them.
    let (id, base) = (routine.id, recent(&pool, routine.id, 0).await.scheduled_at);
    let at = |m| async move { Occurrence::new(id, base + chrono::Duration::minutes(m)) };
    fired_with_run(&store, &pool, at(0).await, RunState::exited(1, "")).await;
    fired_with_run(&store, &pool, at(1).await, lost("no such container")).await;
    let skipped = at(2).await;
    seed_fire(&pool, skipped, &Seed::claimed(30.0)).await;
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'skipped', error = 'skipped: running',
                completed_at = now()
         WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(skipped.routine_id)
    .bind(skipped.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();
    fired_with_run(&store, &pool, at(3).await, RunState::exited(2, "")).await;
    fired_with_run(&store, &pool, at(4).await, RunState::Running).await;
    // Claimed in occurrence order.
    sqlx::query(
        "UPDATE cm.routine_fires SET claimed_at = now() + (scheduled_at - $2)
         WHERE routine_id = $1",
    )
    .bind(routine.id)
    .bind(at(0).await.scheduled_at)
    .execute(&pool)
    .await
    .unwrap();

    // A routine that succeeded last is not failing.
    let healthy = create(&store, "* * * * *", MisfirePolicy::FireOnce).await;
    // One base for the whole case: a minute that turns between two reads would shift them.
    let (id, base) = (healthy.id, recent(&pool, healthy.id, 0).await.scheduled_at);
    let at = |m| async move { Occurrence::new(id, base + chrono::Duration::minutes(m)) };
    fired_with_run(&store, &pool, at(0).await, RunState::exited(1, "")).await;
    fired_with_run(&store, &pool, at(1).await, RunState::exited(1, "")).await;
    fired_with_run(&store, &pool, at(2).await, RunState::Succeeded).await;

    let paused = store
        .pause_failing_routines(3, Duration::from_secs(3600))
        .await
        .unwrap();
    let ids: Vec<_> = paused.iter().map(|p| p.id).collect();
    assert_eq!(ids, [routine.id]);
    assert_eq!(
        paused[0].reason,
        "paused by cm: its last 3 fires failed; the latest: exit code 2"
    );
}
