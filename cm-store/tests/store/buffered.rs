//! Overlap that waits: a `buffer-one` or `buffer-all` mission whose run is busy is not planned
//! at all (its clock stays where it was, so nothing owed is claimed or lost); once its run is
//! over, `buffer-one` claims the newest owed occurrence and records the older ones `skipped`,
//! naming it, and `buffer-all` claims the oldest and keeps its clock at the next, one run at a
//! time.

use chrono::{DateTime, TimeDelta, Utc};
use cm_domain::MisfirePolicy;
use cm_store::{FireLedger, PgStore, RoutineStore};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    EVERY_MINUTE, claim_params, create, db_now, minute_floor, minutes, rules, set_next_run,
};

/// An every-minute mission under `overlap` whose clock is three minutes behind, and a run of
/// it, at an hour before, that is `running`. Returns the routine and its oldest owed minute.
async fn busy_mission(store: &PgStore, pool: &PgPool, overlap: &str) -> (Uuid, DateTime<Utc>) {
    let routine = create(store, EVERY_MINUTE, MisfirePolicy::FireOnce).await;
    sqlx::query(
        "UPDATE cm.routines SET kind = 'mission', overlap = $2,
                payload = '{\"repository\": \"https://git.example.com/r.git\"}'
         WHERE id = $1",
    )
    .bind(routine.id)
    .bind(overlap)
    .execute(pool)
    .await
    .unwrap();
    let now = db_now(pool).await;
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at,
              lease_expires_at, status, completed_at, origin, group_id, holds_run, run_state)
         SELECT id, $2, 'earlier', gen_random_uuid(), 1, $2, $2, 'fired', $2, 'schedule',
                group_id, true, 'running'
         FROM cm.routines WHERE id = $1",
    )
    .bind(routine.id)
    .bind(minute_floor(now) - TimeDelta::hours(1))
    .execute(pool)
    .await
    .unwrap();
    let oldest = minute_floor(now) - TimeDelta::minutes(3);
    set_next_run(pool, routine.id, oldest).await;
    (routine.id, oldest)
}

/// The routine's fires after the first: (minute, status, error).
async fn fires(pool: &PgPool, id: Uuid) -> Vec<(DateTime<Utc>, String, Option<String>)> {
    sqlx::query_as(
        "SELECT scheduled_at, status, error FROM cm.routine_fires
         WHERE routine_id = $1 AND claimant <> 'earlier' ORDER BY scheduled_at",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Ends the routine's runs: every fire's run `succeeded`, every claimed fire `fired`.
async fn end_runs(pool: &PgPool, id: Uuid) {
    sqlx::query(
        "UPDATE cm.routine_fires SET run_state = 'succeeded',
                completed_at = coalesce(completed_at, now()),
                status = CASE WHEN status = 'claimed' THEN 'fired' ELSE status END
         WHERE routine_id = $1 AND status <> 'skipped'",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn buffer_one_waits_for_the_run_then_launches_the_newest_and_skips_the_rest(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let params = claim_params("a", 100, rules(30, 100));
    let (id, oldest) = busy_mission(&store, &pool, "buffer-one").await;

    // While the run lasts: nothing claimed, the clock kept, nothing written.
    let held = store.claim_due(&params).await.unwrap();
    assert!(held.fires.is_empty());
    assert_eq!(
        store.get_routine(id).await.unwrap().next_run_at,
        Some(oldest)
    );
    assert!(fires(&pool, id).await.is_empty());

    end_runs(&pool, id).await;
    let tick = store.claim_due(&params).await.unwrap();
    let owed = minutes(oldest, tick.now);
    let newest = *owed.last().unwrap();
    let claimed: Vec<_> = tick
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    assert_eq!(claimed, [newest]);
    let rows = fires(&pool, id).await;
    assert_eq!(
        rows.len(),
        owed.len(),
        "every owed minute is in the ledger: {rows:?}"
    );
    for (at, status, error) in &rows[..rows.len() - 1] {
        assert_eq!(status, "skipped", "{at}");
        let error = error.as_deref().unwrap();
        assert!(
            error.contains("buffer-one")
                && error.contains(&newest.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            "{error}"
        );
    }
    assert_eq!(rows.last().unwrap().1, "claimed");
    assert_eq!(
        store.get_routine(id).await.unwrap().next_run_at,
        Some(newest + TimeDelta::minutes(1))
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn buffer_all_launches_every_owed_occurrence_in_turn_one_run_at_a_time(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let params = claim_params("a", 100, rules(30, 100));
    let (id, oldest) = busy_mission(&store, &pool, "buffer-all").await;
    assert!(store.claim_due(&params).await.unwrap().fires.is_empty());

    let mut launched = Vec::new();
    for _ in 0..10 {
        end_runs(&pool, id).await;
        let tick = store.claim_due(&params).await.unwrap();
        let claimed: Vec<_> = tick
            .fires
            .iter()
            .map(|f| f.occurrence.scheduled_at)
            .collect();
        assert!(claimed.len() <= 1, "{claimed:?}");
        // A claimed one holds the run: the next claim plans nothing.
        if let Some(at) = claimed.first() {
            launched.push(*at);
            assert!(store.claim_due(&params).await.unwrap().fires.is_empty());
        }
        if store.get_routine(id).await.unwrap().next_run_at > Some(tick.now) {
            break;
        }
    }
    let now = db_now(&pool).await;
    assert_eq!(launched, minutes(oldest, now)[..launched.len()]);
    assert!(launched.len() >= 4, "{launched:?}");
    assert!(
        fires(&pool, id)
            .await
            .iter()
            .all(|(_, status, _)| status != "skipped")
    );
}
