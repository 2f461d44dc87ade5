//! A sibling service's writes: routine writes in its own transaction through `cm_store::tx`,
//! committed or rolled back with its own rows, and the SQL functions in the `cm` schema, whose
//! rows the planning pass plans or pauses with the reason.

use cm_store::{PgStore, RoutineStore, StoreError, UnplannedRoutines};
use sqlx::{Connection as _, PgPool};
use uuid::Uuid;

use crate::support::{db_now, lock_waiters, message};

/// The caller's own table, as a sibling service has one.
async fn users_table(pool: &PgPool) {
    sqlx::query("CREATE TABLE users (email TEXT PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
}

async fn users(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn routine_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.routines")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routine_written_in_a_transaction_that_rolls_back_does_not_exist(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    users_table(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('ada@example.com')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let written = cm_store::tx::create_routine(&mut tx, &message("digest", "* * * * * *"))
        .await
        .unwrap();
    // Not seen outside the transaction before its commit: no claim finds it.
    assert!(store.get_routine(written.id).await.is_err());
    tx.rollback().await.unwrap();
    assert!(store.get_routine(written.id).await.is_err());
    assert_eq!((users(&pool).await, routine_count(&pool).await), (0, 0));
    // The name was never taken.
    store
        .create_routine(message("digest", "* * * * * *"))
        .await
        .unwrap();

    // Committed, both rows are there and the routine has its first run.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('grace@example.com')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let written = cm_store::tx::create_routine(&mut tx, &message("grace's digest", "0 9 * * *"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let stored = store.get_routine(written.id).await.unwrap();
    assert!(stored.next_run_at.unwrap() > db_now(&pool).await);
    assert_eq!(users(&pool).await, 1);
}

/// A refused write (a name taken) rolls back to its own savepoint: the caller's transaction is
/// still usable, and what the caller did before and after commits.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_refused_write_leaves_the_callers_transaction_usable(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    users_table(&pool).await;
    store
        .create_routine(message("digest", "0 9 * * *"))
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO users VALUES ('ada@example.com')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let refused = cm_store::tx::create_routine(&mut tx, &message("digest", "0 9 * * *")).await;
    assert!(
        matches!(&refused, Err(StoreError::NameTaken(name)) if name == "digest"),
        "{refused:?}"
    );
    let missing = cm_store::tx::set_routine_paused(&mut tx, Uuid::new_v4(), true).await;
    assert!(
        matches!(missing, Err(StoreError::RoutineNotFound(_))),
        "{missing:?}"
    );
    sqlx::query("INSERT INTO users VALUES ('grace@example.com')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((users(&pool).await, routine_count(&pool).await), (2, 1));
}

/// Every write the command line makes is there over the caller's connection, and rolls back
/// with it: update, pause, trigger, delete, import, sync.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn every_write_rolls_back_with_the_callers_transaction(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let kept = store
        .create_routine(message("kept", "0 9 * * *"))
        .await
        .unwrap();
    let before = store.get_routine(kept.id).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let update = cm_store::RoutineUpdate {
        expression: Some("0 7 * * *".into()),
        ..Default::default()
    };
    cm_store::tx::update_routine(&mut tx, kept.id, &update)
        .await
        .unwrap();
    cm_store::tx::set_routine_paused(&mut tx, kept.id, true)
        .await
        .unwrap();
    cm_store::tx::trigger_routine(&mut tx, kept.id)
        .await
        .unwrap();
    cm_store::tx::import_routines(&mut tx, &[message("imported", "0 8 * * *")], false, None)
        .await
        .unwrap();
    cm_store::tx::sync_routines(&mut tx, "crontab", &[message("synced", "0 8 * * *")])
        .await
        .unwrap();
    cm_store::tx::delete_routine(&mut tx, kept.id)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(store.get_routine(kept.id).await.unwrap(), before);
    assert_eq!(routine_count(&pool).await, 1);
    assert_eq!(store.pending_requests(kept.id, 5).await.unwrap().total, 0);
}

/// Two services writing the same name in parallel transactions: the second waits for the
/// first and, once it commits, is refused with the name; one routine of the name exists.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn parallel_transactions_keep_names_unique(pool: PgPool) {
    let mut first = pool.begin().await.unwrap();
    cm_store::tx::create_routine(&mut first, &message("digest", "0 9 * * *"))
        .await
        .unwrap();
    let second_pool = pool.clone();
    let second = tokio::spawn(async move {
        let mut second = second_pool.begin().await.unwrap();
        let written =
            cm_store::tx::create_routine(&mut second, &message("digest", "0 10 * * *")).await;
        second.commit().await.unwrap();
        written
    });
    lock_waiters(&pool, 1).await;
    assert!(
        !second.is_finished(),
        "the second write did not wait for the first"
    );
    first.commit().await.unwrap();
    let refused = second.await.unwrap();
    assert!(
        matches!(&refused, Err(StoreError::NameTaken(name)) if name == "digest"),
        "{refused:?}"
    );
    assert_eq!(routine_count(&pool).await, 1);
}

/// The SQL functions check at insert what SQL can, each refusal one line (SQLSTATE 22023, a
/// taken name 23505) that leaves nothing written; a routine they write is unplanned (never due)
/// until a planning pass gives it its first run or pauses it with the reason (for what only
/// cm's Rust reads, such as a jitter longer than the schedule's interval).
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn sql_writes_are_checked_then_planned_or_paused_with_the_reason(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let create = |name: &str, schedule: &str, zone: &str, text: &str| {
        let pool = pool.clone();
        let (name, schedule, zone, text) = (
            name.to_owned(),
            schedule.to_owned(),
            zone.to_owned(),
            text.to_owned(),
        );
        async move {
            sqlx::query_scalar::<_, Uuid>("SELECT cm.create_routine($1, $2, $3, $4)")
                .bind(name)
                .bind(schedule)
                .bind(zone)
                .bind(text)
                .fetch_one(&pool)
                .await
        }
    };
    let good = create("  sql digest ", "0 9 * * MON-FRI", "Europe/Berlin", "hello")
        .await
        .unwrap();
    // A jitter longer than the schedule's shortest interval is what only cm's Rust reads: SQL
    // takes it, the planning pass refuses it.
    let long_jitter = create("long jitter", "* * * * * jitter 2m", "UTC", "hello")
        .await
        .unwrap();
    for (name, schedule, text, code, words) in [
        ("", "0 9 * * *", "hello", "22023", "must not be empty"),
        (
            "sql digest",
            "0 9 * * *",
            "hello",
            "23505",
            "a routine named 'sql digest' exists",
        ),
        (
            "x",
            "0 9 * * *",
            "",
            "22023",
            "the message must not be empty",
        ),
        (
            "01a23b2c-8679-73d6-ad8b-ba3769a234da",
            "0 9 * * *",
            "hello",
            "22023",
            "looks like an id",
        ),
        ("y", "", "hello", "22023", "cron expression"),
        ("bad cron", "61 * * * *", "hello", "22023", "minute field"),
    ] {
        let err = create(name, schedule, "UTC", text).await.unwrap_err();
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some(code), "{name:?}: {db}");
        assert!(db.message().contains(words), "{name:?}: {db}");
    }
    let long = "x".repeat(cm_domain::MAX_MESSAGE_BYTES + 1);
    assert!(create("long", "0 9 * * *", "UTC", &long).await.is_err());
    let misfire =
        sqlx::query("SELECT cm.create_routine('m', '0 9 * * *', 'UTC', 'hi', 'sometimes')")
            .execute(&pool)
            .await
            .unwrap_err();
    assert!(
        misfire.to_string().contains("fire-once, catch-up or skip"),
        "{misfire}"
    );
    let zone = create("bad zone", "0 9 * * *", "Mars/Olympus", "hello")
        .await
        .unwrap_err();
    assert!(zone.to_string().contains("time zone"), "{zone}");
    assert_eq!(routine_count(&pool).await, 2);

    // Written, not yet planned: never due.
    let unplanned = store.get_routine(good).await.unwrap();
    assert_eq!(
        (unplanned.name.as_str(), unplanned.next_run_at),
        ("sql digest", None)
    );

    let planned = store.plan_routines(None, 100).await.unwrap();
    assert_eq!(planned.len(), 2, "{planned:?}");
    let good = store.get_routine(good).await.unwrap();
    assert!(
        !good.paused && good.next_run_at.unwrap() > db_now(&pool).await,
        "{good:?}"
    );
    let bad = store.get_routine(long_jitter).await.unwrap();
    assert!(bad.paused && bad.next_run_at.is_none(), "{bad:?}");
    let reason = bad.paused_reason.unwrap_or_default();
    assert!(reason.starts_with("refused when planned: "), "{reason}");
    // A second pass has nothing to do.
    assert!(store.plan_routines(None, 100).await.unwrap().is_empty());

    // A resume through SQL is planned again; a trigger asks for an occurrence; a delete goes.
    let resumed: bool = sqlx::query_scalar("SELECT cm.set_routine_paused($1, true)")
        .bind(good.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(resumed);
    assert!(store.get_routine(good.id).await.unwrap().paused);
    sqlx::query("SELECT cm.set_routine_paused($1, false)")
        .bind(good.id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(store.get_routine(good.id).await.unwrap().next_run_at, None);
    assert_eq!(store.plan_routines(None, 100).await.unwrap().len(), 1);
    assert!(
        store
            .get_routine(good.id)
            .await
            .unwrap()
            .next_run_at
            .is_some()
    );
    let at: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT cm.trigger_routine($1)")
            .bind(good.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(at.is_some());
    assert_eq!(store.pending_requests(good.id, 5).await.unwrap().total, 1);
    let deleted: bool = sqlx::query_scalar("SELECT cm.delete_routine($1)")
        .bind(good.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(deleted);
    assert!(store.get_routine(good.id).await.is_err());
    // Its name is free again.
    create("sql digest", "0 9 * * *", "UTC", "again")
        .await
        .unwrap();
}

/// A mission written through SQL is read as `routine create --mission` reads one when planned:
/// credentials in its repository pause it with the reason.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_sql_mission_is_checked_when_planned(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let mission =
        |repository: &str| serde_json::json!({ "repository": repository, "task": "report" });
    let mut ids = Vec::new();
    for (name, repository) in [
        ("good", "https://git.example.com/team/repo.git"),
        (
            "with a password",
            "https://bot:hunter2@git.example.com/team/repo.git",
        ),
    ] {
        let id: Uuid = sqlx::query_scalar(
            "SELECT cm.create_mission_routine($1, '0 3 * * *', 'UTC', $2, overlap => 'replace')",
        )
        .bind(name)
        .bind(mission(repository))
        .fetch_one(&pool)
        .await
        .unwrap();
        ids.push(id);
    }
    store.plan_routines(None, 100).await.unwrap();
    let good = store.get_routine(ids[0]).await.unwrap();
    assert!(!good.paused && good.next_run_at.is_some(), "{good:?}");
    assert_eq!(good.overlap, cm_domain::OverlapPolicy::Replace);
    let refused = store.get_routine(ids[1]).await.unwrap();
    assert!(refused.paused, "{refused:?}");
    assert!(
        refused
            .paused_reason
            .as_deref()
            .unwrap_or_default()
            .contains("credentials"),
        "{refused:?}"
    );
    let not_object = sqlx::query("SELECT cm.create_mission_routine('m', '0 3 * * *', 'UTC', '[]')")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(
        not_object.to_string().contains("JSON object"),
        "{not_object}"
    );
}

/// A routine written through SQL in a transaction that rolls back is not there to plan.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_sql_write_rolled_back_leaves_nothing_to_plan(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT cm.create_routine('gone', '* * * * *', 'UTC', 'hi')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(store.plan_routines(None, 100).await.unwrap().is_empty());
    assert_eq!(routine_count(&pool).await, 0);
}

/// The psql example (`examples/sql-writes.sql`) runs as it is: an account and its routines in
/// one transaction, both routines planned by the next pass.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_sql_example_writes_an_account_and_its_routines(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    sqlx::raw_sql(include_str!("../../examples/sql-writes.sql"))
        .execute(&pool)
        .await
        .unwrap();
    let planned = store.plan_routines(None, 100).await.unwrap();
    assert_eq!(planned.len(), 2, "{planned:?}");
    assert!(planned.iter().all(|p| p.refused.is_none()), "{planned:?}");
    let report = store
        .get_routine_by_name("weekly report for acme")
        .await
        .unwrap();
    let account: Uuid = sqlx::query_scalar("SELECT report FROM accounts WHERE name = 'acme'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(account, report.id);
    assert_eq!(report.misfire_policy, cm_domain::MisfirePolicy::Skip);
}

/// The instant of a time-ordered id, to the microsecond as `cm.new_routine_id` writes it (its
/// first 48 bits the millisecond, the 12 after the version the fraction within it); `None` for
/// an id that is not a UUIDv7.
fn id_instant(id: Uuid) -> Option<(u64, u16)> {
    let bits = id.as_u128();
    (id.get_version_num() == 7).then_some(((bits >> 80) as u64, ((bits >> 64) & 0xfff) as u16))
}

/// Every way of creating a routine gives it a time-ordered id (a UUIDv7), so the routines
/// created one after another are written, claimed and indexed in one order: the library, one
/// routine through SQL, a mission through SQL, and each element of `cm.create_routines`, whose
/// ids ascend with the array. Each id's millisecond is the clock at the call, within a second.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn every_way_of_creating_a_routine_gives_it_a_time_ordered_id(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let before = db_now(&pool).await.timestamp_millis();
    let library = store
        .create_routine(message("library", "0 9 * * *"))
        .await
        .unwrap()
        .id;
    let one: Uuid = sqlx::query_scalar("SELECT cm.create_routine('one', '0 9 * * *', 'UTC', 'hi')")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mission: Uuid = sqlx::query_scalar(
        "SELECT cm.create_mission_routine('mission', '0 3 * * *', 'UTC', \
         '{\"repository\": \"https://git.example.com/r.git\", \"task\": \"t\"}')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let batch: Vec<serde_json::Value> = (0..500)
        .map(|i| serde_json::json!({"name": format!("batch {i}"), "schedule": "0 9 * * *", "message": "hi"}))
        .collect();
    let many: Vec<Uuid> = sqlx::query_scalar("SELECT cm.create_routines($1)")
        .bind(serde_json::Value::Array(batch))
        .fetch_one(&pool)
        .await
        .unwrap();
    let after = db_now(&pool).await.timestamp_millis();

    let mut ids = vec![library, one, mission];
    ids.extend(&many);
    let instants: Vec<(u64, u16)> = ids
        .iter()
        .map(|id| id_instant(*id).unwrap_or_else(|| panic!("{id} is not a UUIDv7")))
        .collect();
    for (id, (ms, _)) in ids.iter().zip(&instants) {
        let ms = i64::try_from(*ms).unwrap();
        assert!(
            (before - 1_000..=after + 1_000).contains(&ms),
            "{id}: {ms} ms, not between {before} and {after}"
        );
    }
    // The SQL-made ids carry the microsecond: none earlier than the one made before it. (The
    // library's carries a counter there, so it is compared to the millisecond.)
    assert!(instants[0].0 <= instants[1].0, "{library} then {one}");
    for (pair, ids) in instants[1..].windows(2).zip(ids[1..].windows(2)) {
        assert!(pair[0] <= pair[1], "{} then {}", ids[0], ids[1]);
    }
    // Each element of a batch reads the clock: its ids are not all of one instant.
    assert!(
        instants[3] < instants[instants.len() - 1],
        "{} and {}: one instant for the whole batch",
        many[0],
        many[many.len() - 1]
    );
    // The group is read from an id's random end: 500 ids are not all in one group.
    let groups: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT group_id) FROM cm.routines WHERE id = ANY($1)")
            .bind(&many)
            .fetch_one(&pool)
            .await
            .unwrap();
    let group_count: i16 = sqlx::query_scalar("SELECT group_count FROM cm.cm_settings")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        groups >= i64::from(group_count.min(8)),
        "{groups} groups of {group_count}"
    );
}
