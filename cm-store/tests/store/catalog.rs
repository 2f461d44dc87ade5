//! The operator's reads and edits: names are unique (and the migration that made them so
//! renames old duplicates deterministically), routines by name, pages in creation order,
//! updates under the row's lock, all-or-nothing imports, and pending requests.

use cm_domain::{MisfirePolicy, OverlapPolicy, Schedule, Zone};
use cm_store::{
    NewRoutine, PgStore, RoutineAction, RoutineCursor, RoutineKind, RoutineStore, RoutineUpdate,
    StoreError, SyncAction,
};
use sqlx::PgPool;
use sqlx::error::ErrorKind;

use crate::support::{YEARLY, create_named, db_now, message};

async fn names(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM cm.routines ORDER BY created_at, id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_names_migration_renames_duplicates_and_control_characters(pool: PgPool) {
    // As cm applies a migration: into its schema, on a pinned search path.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA cm; SET LOCAL search_path TO cm, pg_catalog, pg_temp; {}",
        include_str!("../../../migrations/20261129000001_routines_and_fires.sql")
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(
        "INSERT INTO cm.routines (id, name, schedule, kind, payload, created_at) VALUES
         ('00000000-0000-0000-0000-000000000001', 'a', '* * * * *', 'message', '{}', '2025-01-01'),
         ('00000000-0000-0000-0000-000000000002', 'a', '* * * * *', 'message', '{}', '2025-01-02'),
         ('00000000-0000-0000-0000-000000000003', E'a\\nb', '* * * * *', 'message', '{}', '2025-01-03'),
         ('00000000-0000-0000-0000-000000000004', 'a b', '* * * * *', 'message', '{}', '2025-01-01'),
         ('00000000-0000-0000-0000-000000000005', E'\\u001b[31mred', '* * * * *', 'message', '{}', '2025-01-04')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET LOCAL search_path TO cm, pg_catalog, pg_temp; {}",
        include_str!("../../../migrations/20261130000500_routine_names.sql")
    )))
    .execute(&pool)
    .await
    .unwrap();
    // The oldest keeps each name; later ones get their id appended.
    assert_eq!(
        names(&pool).await,
        [
            "a",
            "a b",
            "a (00000000-0000-0000-0000-000000000002)",
            "a b (00000000-0000-0000-0000-000000000003)",
            " [31mred",
        ]
    );
    // From now on the database refuses both.
    for name in ["a", "x\ty"] {
        let err = sqlx::query(
            "INSERT INTO cm.routines (id, name, schedule, kind, payload)
             VALUES (gen_random_uuid(), $1, '* * * * *', 'message', '{}')",
        )
        .bind(name)
        .execute(&pool)
        .await
        .unwrap_err();
        let kind = StoreError::from(err).database_kind();
        assert!(
            matches!(
                kind,
                Some(ErrorKind::UniqueViolation | ErrorKind::CheckViolation)
            ),
            "{name:?}: {kind:?}"
        );
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn names_are_unique_and_find_their_routine(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let first = create_named(&store, "standup", YEARLY, MisfirePolicy::FireOnce).await;
    let err = store
        .create_routine(message("standup", YEARLY))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NameTaken(n) if n == "standup"),
        "{err:?}"
    );
    assert_eq!(store.get_routine_by_name("standup").await.unwrap(), first);
    assert!(matches!(
        store.get_routine_by_name("nobody").await,
        Err(StoreError::RoutineNameNotFound(n)) if n == "nobody"
    ));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn pages_cover_every_routine_once_in_creation_order(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    for i in 0..5 {
        create_named(&store, &format!("r{i}"), YEARLY, MisfirePolicy::FireOnce).await;
    }
    let mut seen = Vec::new();
    let mut after = None;
    let mut sizes = Vec::new();
    loop {
        let page = store.list_routines_page(after, 2).await.unwrap();
        sizes.push(page.len());
        let Some(last) = page.last() else { break };
        after = Some(RoutineCursor::after(last));
        seen.extend(page.into_iter().map(|r| r.name));
    }
    assert_eq!(sizes, [2, 2, 1, 0]);
    assert_eq!(seen, names(&pool).await);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_update_recomputes_the_next_run_only_for_a_new_schedule(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create_named(&store, "r", YEARLY, MisfirePolicy::FireOnce).await;
    create_named(&store, "taken", YEARLY, MisfirePolicy::FireOnce).await;

    let renamed = store
        .update_routine(
            routine.id,
            &RoutineUpdate {
                name: Some("renamed".into()),
                misfire: Some(MisfirePolicy::Skip),
                action: Some(RoutineAction {
                    kind: RoutineKind::Mission,
                    payload: serde_json::json!({
                        "repository": "https://example.invalid/r.git",
                        "task": "t"
                    }),
                }),
                ..RoutineUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (
            renamed.name.as_str(),
            renamed.misfire_policy.as_str(),
            renamed.kind
        ),
        ("renamed", "skip", RoutineKind::Mission)
    );
    assert_eq!(renamed.next_run_at, routine.next_run_at);

    let now = db_now(&pool).await;
    let rescheduled = store
        .update_routine(
            routine.id,
            &RoutineUpdate {
                zone: Some(Zone::parse("Asia/Tokyo").unwrap()),
                ..RoutineUpdate::default()
            },
        )
        .await
        .unwrap();
    let tokyo = Schedule::parse(YEARLY, "Asia/Tokyo").unwrap();
    let next = rescheduled.next_run_at.unwrap();
    assert!(next > now);
    assert_eq!(Some(next), tokyo.next_after(rescheduled.updated_at));

    let err = store
        .update_routine(
            routine.id,
            &RoutineUpdate {
                name: Some("taken".into()),
                ..RoutineUpdate::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NameTaken(n) if n == "taken"),
        "{err:?}"
    );
    assert_eq!(store.get_routine(routine.id).await.unwrap(), rescheduled);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_import_writes_everything_or_nothing(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let existing = create_named(&store, "existing", YEARLY, MisfirePolicy::FireOnce).await;
    let batch = [message("new", YEARLY), message("existing", "0 0 * * *")];

    let err = store
        .import_routines(&batch, false, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NameTaken(n) if n == "existing"),
        "{err:?}"
    );
    assert_eq!(names(&pool).await, ["existing"], "nothing was written");

    // Every routine written records the import's source, the one made by hand included.
    let written = store
        .import_routines(&batch, true, Some("batch.jsonl"))
        .await
        .unwrap();
    assert_eq!(
        written
            .iter()
            .map(|w| (
                w.routine.name.as_str(),
                w.created,
                w.routine.source.as_deref()
            ))
            .collect::<Vec<_>>(),
        [
            ("new", true, Some("batch.jsonl")),
            ("existing", false, Some("batch.jsonl"))
        ]
    );
    assert_eq!(written[1].routine.id, existing.id);
    assert_eq!(written[1].routine.schedule, "0 0 * * *");
    assert_eq!(
        store.get_routine(existing.id).await.unwrap(),
        written[1].routine
    );
}

/// A mission routine named `name`, yearly, with the overlap policy `overlap`.
fn mission(name: &str, overlap: OverlapPolicy) -> NewRoutine {
    NewRoutine::mission(
        name,
        Schedule::parse(YEARLY, "UTC").unwrap(),
        serde_json::json!({ "repository": "https://git.example.com/r.git", "task": "t" }),
    )
    .overlap(overlap)
    .build()
    .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_overlap_policy_is_written_with_the_routine_and_an_import_is_all_or_nothing(
    pool: PgPool,
) {
    let store = PgStore::new(pool.clone());
    // Created with its policy by the one insert: no later statement touched the row.
    let created = store
        .create_routine(mission("replacing", OverlapPolicy::Replace))
        .await
        .unwrap();
    assert_eq!(created.overlap, OverlapPolicy::Replace);
    let stored = store.get_routine(created.id).await.unwrap();
    assert_eq!(stored.overlap, OverlapPolicy::Replace);
    assert_eq!(stored.updated_at, stored.created_at);

    // A message routine has no run to overlap: refused when built, before any store.
    let refused = message("talker", YEARLY)
        .into_builder()
        .overlap(OverlapPolicy::Allow)
        .build()
        .unwrap_err();
    assert_eq!(refused, cm_domain::DefinitionError::OverlapOfMessage);
    // An import where one routine is refused by the store (its one instant is past) writes
    // none of them.
    let invalid = NewRoutine::message(
        "talker",
        Schedule::parse("@at 2020-01-01T00:00", "UTC").unwrap(),
        "too late",
    )
    .build()
    .unwrap();
    let batch = [mission("buffered", OverlapPolicy::BufferOne), invalid];
    let err = store
        .import_routines(&batch, false, None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidRoutine(_)), "{err:?}");
    assert_eq!(names(&pool).await, ["replacing"], "nothing was written");

    // A valid import writes each mission's policy, and an upsert changes it.
    let batch = [
        mission("buffered", OverlapPolicy::BufferAll),
        message("talker", YEARLY),
    ];
    let written = store.import_routines(&batch, false, None).await.unwrap();
    assert_eq!(
        written[0].routine.overlap.to_string(),
        OverlapPolicy::BufferAll.as_str()
    );
    let again = [mission("buffered", OverlapPolicy::Allow)];
    let updated = store.import_routines(&again, true, None).await.unwrap();
    assert_eq!(
        updated[0].routine.overlap.to_string(),
        OverlapPolicy::Allow.as_str()
    );

    // A sync tells a changed policy from an unchanged one.
    let file = [mission("synced", OverlapPolicy::Forbid)];
    let action = |synced: Vec<cm_store::SyncedRoutine>| synced[0].action;
    assert_eq!(
        action(store.sync_routines("f", &file).await.unwrap()),
        SyncAction::Created
    );
    assert_eq!(
        action(store.sync_routines("f", &file).await.unwrap()),
        SyncAction::Unchanged
    );
    let changed = [mission("synced", OverlapPolicy::Replace)];
    let synced = store.sync_routines("f", &changed).await.unwrap();
    assert_eq!(synced[0].action, SyncAction::Updated);
    assert_eq!(
        synced[0].routine.overlap.to_string(),
        OverlapPolicy::Replace.as_str()
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn pending_requests_tell_triggers_from_backfills(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create_named(&store, "r", "0 * * * *", MisfirePolicy::FireOnce).await;
    assert_eq!(
        store.pending_requests(routine.id, 10).await.unwrap().total,
        0
    );
    let hours: Vec<_> = (1..=3)
        .map(|h| {
            chrono::DateTime::parse_from_rfc3339(&format!("2025-01-01T0{h}:00:00Z"))
                .unwrap()
                .to_utc()
        })
        .collect();
    store.request_occurrences(routine.id, &hours).await.unwrap();
    let triggered = store.trigger_routine(routine.id).await.unwrap();
    let pending = store.pending_requests(routine.id, 2).await.unwrap();
    assert_eq!(pending.total, 4);
    assert_eq!(
        pending
            .oldest
            .iter()
            .map(|r| (r.scheduled_at, r.is_trigger()))
            .collect::<Vec<_>>(),
        [(hours[0], false), (hours[1], false)]
    );
    let all = store.pending_requests(routine.id, 10).await.unwrap();
    assert_eq!(
        all.oldest.last().map(|r| (r.scheduled_at, r.is_trigger())),
        Some((triggered, true))
    );
}
