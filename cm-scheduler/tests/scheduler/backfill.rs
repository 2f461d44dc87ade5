//! A backfill of mission occurrences obeys the same bounds as scheduled missions, through the
//! real loop against the real database: it drains at the launch rate, each claim taking no more
//! than the rate and the in-flight room leave, while an every-second message routine beside it
//! keeps firing every second.

use crate::support::new_routine;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use cm_dispatch::{
    Dispatch, DispatchError, Dispatcher, OutboxDispatcher, Receipt, RoutedDispatcher,
};
use cm_domain::{Lease, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_store::{PgStore, RoutineKind, RoutineStore};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

/// A mission runtime double that takes a while to accept each launch, and records when each
/// launch reached it.
#[derive(Debug, Default)]
struct SlowRuntime {
    reached: Mutex<Vec<Instant>>,
}

impl SlowRuntime {
    const LAUNCH: Duration = Duration::from_millis(300);
}

#[async_trait]
impl Dispatcher for SlowRuntime {
    async fn dispatch(&self, _dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        self.reached.lock().unwrap().push(Instant::now());
        // A launch takes this long: the runtime's latency is what the test is about.
        tokio::time::sleep(SlowRuntime::LAUNCH).await;
        Ok(Receipt {
            duplicate: false,
            detail: "launched by the test's slow runtime".into(),
        })
    }
}

async fn routine(store: &PgStore, name: &str, schedule: &str, kind: RoutineKind) -> Uuid {
    store
        .create_routine(new_routine(
            name,
            schedule,
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
        .unwrap()
        .id
}

async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// How many of the every-second routine's slots from `from` up to `behind` before the
/// database's clock have no fire yet.
async fn slots_missing(
    pool: &PgPool,
    routine: Uuid,
    from: DateTime<Utc>,
    behind: TimeDelta,
) -> i64 {
    let (now, fired): (DateTime<Utc>, i64) = sqlx::query_as(
        "SELECT now(), count(*) FROM cm.routine_fires
         WHERE routine_id = $1 AND scheduled_at >= $2 AND scheduled_at <= now() - $3",
    )
    .bind(routine)
    .bind(from)
    .bind(behind)
    .fetch_one(pool)
    .await
    .unwrap();
    let until = now - behind;
    let owed = if until < from {
        0
    } else {
        (until - from).num_seconds() + 1
    };
    owed - fired
}

/// The most of `instants` within any one second (`within`) of each other.
fn most_within<T: Copy + Ord>(mut instants: Vec<T>, within: impl Fn(T, T) -> bool) -> usize {
    instants.sort();
    (0..instants.len())
        .map(|i| {
            instants[i..]
                .iter()
                .take_while(|later| within(instants[i], **later))
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// A backfill of 60 mission occurrences (a slow runtime, 300 ms a launch, 10 launches a
/// second, room for 20 dispatches) beside a message routine due every second, its messages
/// written to the outbox in the claim: every second's message is claimed while the backfill
/// drains (at every look, each slot more than two seconds old has its fire), the missions are
/// claimed and reach the runtime no faster than the rate, and each is launched on its first
/// claim (none outlived its lease waiting for room).
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_mission_backfill_drains_at_the_launch_rate_beside_an_every_second_routine(pool: PgPool) {
    const RATE: u32 = 10;
    const MISSIONS: usize = 60;
    let store = PgStore::new(pool.clone());
    let every_second = routine(&store, "every second", "* * * * * *", RoutineKind::Message).await;
    let mission = routine(&store, "backfilled", "0 0 1 1 *", RoutineKind::Mission).await;
    let now = db_now(&pool).await;
    let slots: Vec<_> = (1..=MISSIONS as i64)
        .map(|m| now - TimeDelta::minutes(m))
        .collect();
    assert_eq!(
        store.request_occurrences(mission, &slots).await.unwrap(),
        MISSIONS as u64
    );

    let runtime = Arc::new(SlowRuntime::default());
    let dispatcher = RoutedDispatcher::new(
        Some(Arc::new(OutboxDispatcher::new(store.clone()))),
        Some(runtime.clone()),
    );
    let config = SchedulerConfig {
        lease: Lease::new(Duration::from_secs(10)).unwrap(),
        dispatch_timeout: Duration::from_secs(3),
        max_in_flight: 20,
        max_mission_launches_per_second: NonZeroU32::new(RATE),
        ..SchedulerConfig::default()
    };
    let scheduler = Arc::new(
        Scheduler::new(
            Arc::new(store.clone()),
            Arc::new(dispatcher),
            config,
            "backfill-test",
        )
        .unwrap(),
    );
    // The slots counted start a second after the loop's first tick could have run.
    let from = db_now(&pool)
        .await
        .duration_trunc(TimeDelta::seconds(1))
        .unwrap()
        + TimeDelta::seconds(2);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let run = scheduler.clone().spawn(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });

    let behind = TimeDelta::seconds(2);
    let mut worst_missing = 0;
    let mut launched = 0;
    let patience = Instant::now() + Duration::from_secs(60);
    let mut drained_at = None;
    while Instant::now() < patience {
        worst_missing = worst_missing.max(slots_missing(&pool, every_second, from, behind).await);
        launched = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1 AND status <> 'claimed'",
        )
        .bind(mission)
        .fetch_one(&pool)
        .await
        .unwrap();
        // Watch the routine a few seconds past the drain's end.
        match drained_at {
            None if launched == MISSIONS as i64 => drained_at = Some(Instant::now()),
            Some(at) if at.elapsed() > Duration::from_secs(3) => break,
            _ => {}
        }
        // Paces the watch: each pass samples the slots, so this loop is a measurement over
        // time, not a wait for one state.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send(true).unwrap();
    run.await.unwrap();

    assert_eq!(launched, MISSIONS as i64, "the backfill did not drain");
    assert_eq!(
        worst_missing, 0,
        "every-second slots more than {behind} old had no fire while the backfill drained"
    );
    assert!(
        slots_missing(&pool, every_second, from, behind).await == 0,
        "a slot of the every-second routine never fired"
    );
    // Each backfilled mission launched once, on its first claim.
    let outcomes: Vec<(String, i32, String)> = sqlx::query_as(
        "SELECT status, attempt, origin FROM cm.routine_fires WHERE routine_id = $1",
    )
    .bind(mission)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(outcomes.len(), MISSIONS);
    for outcome in &outcomes {
        assert_eq!(
            (outcome.0.as_str(), outcome.1, outcome.2.as_str()),
            ("fired", 1, "backfill")
        );
    }
    assert_eq!(runtime.reached.lock().unwrap().len(), MISSIONS);
    // Claimed, and launched, no faster than the rate.
    let claimed: Vec<DateTime<Utc>> =
        sqlx::query_scalar("SELECT claimed_at FROM cm.routine_fires WHERE routine_id = $1")
            .bind(mission)
            .fetch_all(&pool)
            .await
            .unwrap();
    let claimed_together = most_within(claimed, |a, b| b - a < TimeDelta::seconds(1));
    assert!(
        claimed_together <= RATE as usize,
        "{claimed_together} backfilled missions claimed within a second"
    );
    let reached = runtime.reached.lock().unwrap().clone();
    let reached_together = most_within(reached, |a, b| b - a < Duration::from_secs(1));
    assert!(
        reached_together <= RATE as usize,
        "{reached_together} launches reached the runtime within a second"
    );
}
