//! The operations the command line and the status page share, against a real database: a
//! routine found by its id or its name, paused, resumed, triggered, edited and deleted.

use crate::support::new_routine;
use cm_scheduler::edit::{Edit, NOTHING_TO_CHANGE};
use cm_scheduler::operations::{self, Change, OperationError, Updated};
use cm_store::{PgStore, RoutineKind, StoreError};
use serde_json::json;
use sqlx::PgPool;

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routine_is_found_by_id_or_name_and_acted_on(pool: PgPool) {
    let store = PgStore::new(pool);
    let new = new_routine(
        "nightly",
        "0 3 * * *",
        "UTC",
        RoutineKind::Message,
        json!({ "text": "hello" }),
    );
    let created = operations::create(&store, new).await.unwrap();
    let by_name = operations::find(&store, " nightly ").await.unwrap();
    let by_id = operations::find(&store, &created.id.to_string())
        .await
        .unwrap();
    assert_eq!((by_name.id, by_id.name.as_str()), (created.id, "nightly"));
    assert!(matches!(
        operations::find(&store, "nobody").await,
        Err(OperationError::Store(StoreError::RoutineNameNotFound(_)))
    ));

    let paused = operations::pause(&store, &created).await.unwrap();
    assert!(paused.paused);
    let resumed = operations::resume(&store, &paused).await.unwrap();
    assert!(!resumed.paused);
    let at = operations::trigger(&store, &resumed).await.unwrap();
    assert!(at <= chrono::Utc::now() + chrono::Duration::seconds(5));

    // An edit is checked as `routine update` checks it, and one that changes nothing is said.
    let change = |edit| Change {
        edit,
        overlap_field: "overlap",
        ..Change::default()
    };
    let bad = change(Edit {
        schedule: Some("61 * * * *"),
        ..Edit::default()
    });
    assert!(matches!(
        operations::update(&store, resumed.clone(), &bad).await,
        Err(OperationError::Refused(reason)) if reason.contains("61")
    ));
    assert!(matches!(
        operations::update(&store, resumed.clone(), &change(Edit::default())).await,
        Ok(Updated::Unchanged(_))
    ));
    assert_eq!(
        Change::default()
            .edit
            .checked(RoutineKind::Message, None, "--overlap"),
        Err(NOTHING_TO_CHANGE.to_owned())
    );
    let moved = change(Edit {
        schedule: Some("0 4 * * *"),
        ..Edit::default()
    });
    let Updated::Changed(updated) = operations::update(&store, resumed, &moved).await.unwrap()
    else {
        panic!("the schedule did not change");
    };
    assert_eq!(updated.schedule, "0 4 * * *");

    assert_eq!(
        operations::delete(&store, &updated).await.unwrap(),
        created.id
    );
    assert!(operations::find(&store, "nightly").await.is_err());
}
