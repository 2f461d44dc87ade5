//! Routine groups on plain PostgreSQL: the group cm computes in Rust is the one the schema's
//! function computes, every row of a routine carries it, names stay unique through
//! `routine_names`, and a claim or reaper pass kept in one group touches that group only.

use std::collections::BTreeSet;

use chrono::TimeDelta;
use cm_domain::MisfirePolicy;
use cm_store::{
    ClaimDueParams, FireLedger, GroupDirectory, GroupId, PgStore, ReapParams, RoutineStore,
    RoutineUpdate, StoreError, group_of,
};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    EVERY_MINUTE, YEARLY, create, create_named, db_now, expire_lease, params, reap_params,
    set_next_run,
};

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_group_cm_computes_is_the_one_sql_computes(pool: PgPool) {
    let mut ids: Vec<Uuid> = (0..300).map(|_| Uuid::new_v4()).collect();
    ids.extend((0..300).map(|_| Uuid::now_v7()));
    ids.push(Uuid::nil());
    ids.push(Uuid::max());
    for count in [1_u16, 7, 64, 256, 4096] {
        let sql: Vec<i16> =
            sqlx::query_scalar("SELECT cm.cm_group_of(id, $2) FROM UNNEST($1::uuid[]) AS t(id)")
                .bind(&ids)
                .bind(i32::from(count))
                .fetch_all(&pool)
                .await
                .unwrap();
        let rust: Vec<i16> = ids.iter().map(|id| group_of(*id, count)).collect();
        assert_eq!(rust, sql, "group count {count}");
        assert!(rust.iter().all(|g| (0..count as i16).contains(g)));
    }
    // Version 7 ids made in one millisecond still spread over the groups.
    let spread: BTreeSet<i16> = ids[300..600].iter().map(|id| group_of(*id, 64)).collect();
    assert!(spread.len() > 32, "{spread:?}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn every_row_of_a_routine_carries_its_group(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let count = store.group_count().await.unwrap();
    assert_eq!(count, 64, "the default count");
    let routine = create(&store, EVERY_MINUTE, MisfirePolicy::FireOnce).await;
    assert_eq!(routine.group_id, group_of(routine.id, count));
    set_next_run(
        &pool,
        routine.id,
        db_now(&pool).await - TimeDelta::minutes(1),
    )
    .await;
    store.trigger_routine(routine.id).await.unwrap();
    let stored: i16 = sqlx::query_scalar("SELECT group_id FROM cm.routine_requests")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, routine.group_id);
    store
        .claim_due(&crate::support::outbox_params("a"))
        .await
        .unwrap();
    for table in ["routine_fires", "outbox_messages", "routine_names"] {
        let groups: Vec<i16> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT DISTINCT group_id FROM cm.{table}"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(groups, [routine.group_id], "{table}");
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn names_stay_unique_through_their_own_table(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let first = create_named(&store, "standup", EVERY_MINUTE, MisfirePolicy::FireOnce).await;
    let taken = store
        .create_routine(
            cm_store::NewRoutine::builder(
                "standup",
                cm_domain::Schedule::parse(EVERY_MINUTE, "UTC").unwrap(),
                cm_store::RoutineKind::Message,
                serde_json::json!({ "text": "t" }),
            )
            .build()
            .unwrap(),
        )
        .await;
    assert!(matches!(taken, Err(StoreError::NameTaken(n)) if n == "standup"));
    let renamed = store
        .update_routine(
            first.id,
            &RoutineUpdate {
                name: Some("retro".into()),
                ..RoutineUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(renamed.name, "retro");
    // The old name is free again, the new one is not.
    let second = create_named(&store, "standup", EVERY_MINUTE, MisfirePolicy::FireOnce).await;
    let clash = store
        .update_routine(
            second.id,
            &RoutineUpdate {
                name: Some("retro".into()),
                ..RoutineUpdate::default()
            },
        )
        .await;
    assert!(matches!(clash, Err(StoreError::NameTaken(n)) if n == "retro"));
    store.delete_routine(first.id).await.unwrap();
    create_named(&store, "retro", EVERY_MINUTE, MisfirePolicy::FireOnce).await;
    let names: Vec<(String, Uuid)> =
        sqlx::query_as("SELECT name, routine_id FROM cm.routine_names ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&("standup".into(), second.id)));
}

/// Yearly routines due a minute ago (not again for months) until at least `groups` groups have
/// one.
async fn due_in_groups(store: &PgStore, pool: &PgPool, groups: usize) -> Vec<(Uuid, GroupId)> {
    let mut routines = Vec::new();
    let mut seen = BTreeSet::new();
    while seen.len() < groups {
        let routine = create(store, YEARLY, MisfirePolicy::FireOnce).await;
        set_next_run(pool, routine.id, db_now(pool).await - TimeDelta::minutes(1)).await;
        seen.insert(routine.group_id);
        routines.push((routine.id, routine.group_id));
    }
    routines
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_claim_in_one_group_leaves_the_others_due(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routines = due_in_groups(&store, &pool, 4).await;
    let groups: BTreeSet<GroupId> = routines.iter().map(|(_, g)| *g).collect();
    assert_eq!(
        store.due_groups().await.unwrap(),
        groups.iter().copied().collect::<Vec<_>>()
    );
    let mut claimed = BTreeSet::new();
    for (n, group) in groups.iter().enumerate() {
        let claim = store
            .claim_due(&ClaimDueParams {
                group: Some(*group),
                ..params("a")
            })
            .await
            .unwrap();
        let ids: BTreeSet<Uuid> = claim
            .fires
            .iter()
            .map(|f| f.occurrence.routine_id)
            .collect();
        let want: BTreeSet<Uuid> = routines
            .iter()
            .filter(|(_, g)| g == group)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(ids, want);
        claimed.extend(ids);
        assert_eq!(
            store.due_groups().await.unwrap().len(),
            groups.len() - n - 1
        );
    }
    assert_eq!(claimed.len(), routines.len());

    // Their leases run out; a reaper pass in one group takes that group's over only.
    let held: Vec<(Uuid, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT routine_id, scheduled_at FROM cm.routine_fires")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (id, at) in held {
        expire_lease(&pool, cm_domain::Occurrence::new(id, at)).await;
    }
    let first = *groups.first().unwrap();
    assert_eq!(
        store.expired_groups().await.unwrap(),
        groups.iter().copied().collect::<Vec<_>>()
    );
    let tick = store
        .reap_expired(&ReapParams {
            group: Some(first),
            ..reap_params("reaper", 100)
        })
        .await
        .unwrap();
    let reaped: BTreeSet<Uuid> = tick.fires.iter().map(|f| f.occurrence.routine_id).collect();
    let want: BTreeSet<Uuid> = routines
        .iter()
        .filter(|(_, g)| *g == first)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(reaped, want);
    assert!(!store.expired_groups().await.unwrap().contains(&first));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn schedulers_lease_groups_and_give_them_back(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let lease = std::time::Duration::from_secs(30);
    let a = store.lease_groups("a", &[0, 1, 2], lease).await.unwrap();
    assert_eq!(a, [0, 1, 2]);
    // A live lease is not taken by another; a free group is.
    let b = store.lease_groups("b", &[2, 3], lease).await.unwrap();
    assert_eq!(b, [3]);
    // Renewing keeps what one holds.
    assert_eq!(
        store.lease_groups("a", &[], lease).await.unwrap(),
        [0, 1, 2]
    );
    assert_eq!(store.live_holders().await.unwrap(), ["a", "b"]);
    store.release_groups("a", &[2]).await.unwrap();
    assert_eq!(store.lease_groups("b", &[2], lease).await.unwrap(), [2, 3]);
    // A lease that ran out is taken over.
    sqlx::query(
        "UPDATE cm.group_leases SET expires_at = now() - interval '1 second' WHERE holder = 'a'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        store.lease_groups("b", &[0, 1], lease).await.unwrap(),
        [0, 1, 2, 3]
    );
    let live = store.live_group_leases().await.unwrap();
    assert!(live.iter().all(|l| l.holder == "b"), "{live:?}");
    // Off Citus, no group has a node of its own.
    assert_eq!(store.group_node(0).await.unwrap(), None);
    // Each with what is left of it by the database's clock: at most the lease, nearly all of it.
    assert!(
        live.iter().all(
            |l| l.remaining <= lease && l.remaining > lease - std::time::Duration::from_secs(5)
        ),
        "{live:?}"
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_holder_back_after_its_leases_ran_out_takes_them_again(pool: PgPool) {
    // A scheduler killed and started again under the same instance id finds its old leases
    // expired: they are free groups to it, and one statement both renews what it holds and
    // takes what it wants.
    let store = PgStore::new(pool.clone());
    let lease = std::time::Duration::from_secs(30);
    assert_eq!(
        store.lease_groups("a", &[0, 1], lease).await.unwrap(),
        [0, 1]
    );
    sqlx::query("UPDATE cm.group_leases SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        store.lease_groups("a", &[0, 1, 2], lease).await.unwrap(),
        [0, 1, 2]
    );
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.group_leases WHERE holder = 'a' AND expires_at > now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(live, 3);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_group_is_due_while_a_routine_or_a_request_is(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routines = due_in_groups(&store, &pool, 2).await;
    let (routine, group) = routines[0];
    let others: BTreeSet<GroupId> = routines.iter().map(|(_, g)| *g).collect();
    let empty = (0..store.group_count().await.unwrap())
        .map(|g| g as GroupId)
        .find(|g| !others.contains(g))
        .unwrap();
    assert!(store.group_due(group).await.unwrap());
    assert!(!store.group_due(empty).await.unwrap());
    // Claimed, the group's routines are not due again for months.
    let claim = store
        .claim_due(&ClaimDueParams {
            group: Some(group),
            ..params("a")
        })
        .await
        .unwrap();
    assert!(!claim.fires.is_empty());
    assert!(!store.group_due(group).await.unwrap());
    // A trigger is a request, due at once.
    store.trigger_routine(routine).await.unwrap();
    assert!(store.group_due(group).await.unwrap());
}
