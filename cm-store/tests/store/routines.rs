//! Routines: creating and reading them, pausing and resuming, deleting with their ledger rows,
//! and how refusals surface (`RoutineNotFound`, `database_kind`).

use chrono::{Datelike, TimeZone, Utc};
use cm_domain::{MisfirePolicy, Schedule};
use cm_store::{FireLedger, NewRoutine, PgStore, RoutineKind, RoutineStore, StoreError};
use sqlx::PgPool;
use sqlx::error::ErrorKind;
use uuid::Uuid;

use crate::support::{YEARLY, db_now, due_yearly, fire_count, jan1, ledger, params};

fn new_routine(name: &str, expr: &str, zone: &str) -> NewRoutine {
    NewRoutine::builder(
        name,
        Schedule::parse(expr, zone).unwrap(),
        RoutineKind::Mission,
        serde_json::json!({ "repository": "https://git.example.com/cm.git", "task": name }),
    )
    .misfire(MisfirePolicy::CatchUp)
    .build()
    .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_created_routine_is_stored_as_given(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let before = db_now(&pool).await;
    // Every day at 09:00 in Berlin.
    let created = store
        .create_routine(new_routine("standup", "0 9 * * *", "Europe/Berlin"))
        .await
        .unwrap();
    assert_eq!(created.name, "standup");
    assert_eq!(created.schedule, "0 9 * * *");
    assert_eq!(created.timezone, "Europe/Berlin");
    assert_eq!(created.kind, RoutineKind::Mission);
    assert_eq!(
        created.payload,
        serde_json::json!({ "repository": "https://git.example.com/cm.git", "task": "standup" })
    );
    assert_eq!(created.misfire_policy, MisfirePolicy::CatchUp);
    assert!(!created.paused);
    assert_eq!(created.last_run_at, None);
    // The first run is the schedule's first occurrence after the database's clock at creation.
    let schedule = created.parsed_schedule().unwrap();
    let next = created.next_run_at.unwrap();
    assert_eq!(Some(next), schedule.next_after(created.created_at));
    assert!(next > before);
    let berlin = schedule.zone().tz();
    let local = next.with_timezone(&berlin);
    assert_eq!(local.format("%H:%M").to_string(), "09:00");

    assert_eq!(store.get_routine(created.id).await.unwrap(), created);
    let second = store
        .create_routine(new_routine("second", YEARLY, "UTC"))
        .await
        .unwrap();
    let listed: Vec<_> = store
        .list_routines()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, [created.id, second.id]);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routine_created_paused_has_no_next_run(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let created = store
        .create_routine(
            new_routine("later", YEARLY, "UTC")
                .into_builder()
                .paused(true)
                .run_limit(None)
                .build()
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(created.paused);
    assert_eq!(created.next_run_at, None);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_paused_routine_is_never_due_and_resumes_from_now(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, due) = due_yearly(&store, &pool, MisfirePolicy::CatchUp).await;

    let paused = store.set_routine_paused(routine.id, true).await.unwrap();
    assert!(paused.paused);
    assert_eq!(paused.next_run_at, None);
    assert!(paused.updated_at >= routine.updated_at);
    // Pausing twice is a no-op that answers the routine as it is.
    assert_eq!(
        store.set_routine_paused(routine.id, true).await.unwrap(),
        paused
    );
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert!(tick.fires.is_empty(), "{tick:?}");
    assert!(ledger(&store, routine.id).await.is_empty());

    // On resume the next run is computed from now: this year's occurrence, owed when the
    // routine was paused, is not fired late; the next one is next year's.
    let resumed = store.set_routine_paused(routine.id, false).await.unwrap();
    assert!(!resumed.paused);
    assert_eq!(resumed.next_run_at, Some(jan1(due.year() + 1)));
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert!(tick.fires.is_empty(), "{tick:?}");
    assert_eq!(tick.skipped, 0);
    assert!(ledger(&store, routine.id).await.is_empty());
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn deleting_a_routine_deletes_its_fires(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (doomed, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let (kept, _) = due_yearly(&store, &pool, MisfirePolicy::FireOnce).await;
    let tick = store.claim_due(&params("a")).await.unwrap();
    assert_eq!(tick.fires.len(), 2);
    assert_eq!(fire_count(&pool).await, 2);

    store.delete_routine(doomed.id).await.unwrap();
    assert_eq!(fire_count(&pool).await, 1);
    assert_eq!(ledger(&store, kept.id).await.len(), 1);
    assert!(matches!(
        store.get_routine(doomed.id).await,
        Err(StoreError::RoutineNotFound(id)) if id == doomed.id
    ));
    assert!(matches!(
        store.delete_routine(doomed.id).await,
        Err(StoreError::RoutineNotFound(id)) if id == doomed.id
    ));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_missing_routine_is_not_found(pool: PgPool) {
    let store = PgStore::new(pool);
    let missing = Uuid::from_u128(42);
    for result in [
        store.get_routine(missing).await,
        store.set_routine_paused(missing, true).await,
        store.set_routine_paused(missing, false).await,
    ] {
        let err = result.unwrap_err();
        assert!(
            matches!(err, StoreError::RoutineNotFound(id) if id == missing),
            "{err:?}"
        );
        assert_eq!(err.database_kind(), None);
        assert!(!err.is_transient());
    }
    assert!(matches!(
        store.delete_routine(missing).await,
        Err(StoreError::RoutineNotFound(id)) if id == missing
    ));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_refused_row_surfaces_its_database_kind(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // Names of 1..=200 characters: a name outside is refused when the routine is built, in the
    // domain's words, before the schema's own bound could answer with a raw constraint error.
    for (name, said) in [
        (String::new(), "the name must not be empty"),
        (
            "n".repeat(201),
            "the name must be at most 200 characters (it has 201)",
        ),
    ] {
        let refused = NewRoutine::message(&*name, Schedule::parse(YEARLY, "UTC").unwrap(), "hi")
            .build()
            .unwrap_err();
        assert_eq!(refused.to_string(), said);
    }
    assert!(store.list_routines().await.unwrap().is_empty());
    // The boundary itself is accepted.
    store
        .create_routine(new_routine(&"n".repeat(200), YEARLY, "UTC"))
        .await
        .unwrap();

    // A request for a routine that does not exist is refused by the foreign key. (The ledger's
    // rows have none: every one is written by a claim holding its routine's lock, see
    // `delete.rs`.)
    let orphan = sqlx::query(
        "INSERT INTO cm.routine_requests (routine_id, scheduled_at, origin) VALUES ($1, $2, 'trigger')",
    )
    .bind(Uuid::from_u128(7))
    .bind(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap())
    .execute(&pool)
    .await
    .unwrap_err();
    let err = StoreError::from(orphan);
    assert_eq!(err.database_kind(), Some(ErrorKind::ForeignKeyViolation));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn migrating_again_is_a_no_op_and_ping_reads_the_database_clock(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = store
        .create_routine(new_routine("kept", YEARLY, "UTC"))
        .await
        .unwrap();
    // The test database is already migrated; a scheduler starting up migrates again.
    store.migrate().await.unwrap();
    assert_eq!(store.get_routine(routine.id).await.unwrap(), routine);
    let before = db_now(&pool).await;
    let pinged = store.ping().await.unwrap();
    assert!(pinged >= before && pinged <= db_now(&pool).await);
}
