//! The store on a real Citus cluster (a coordinator and workers), beside plain PostgreSQL: the
//! schema distributed by `group_id` (`PgStore::distribute_on_citus`), then the claim, settle,
//! reaper and outbox consumer through it, every claim statement routed to one shard (on Citus a
//! claim kept in a group runs per-table statements, `PgStore::explain_claim_on_one_shard`, in
//! place of the one-statement claim), and no two-phase commit during a claim: none recorded by the
//! coordinator, and no `PREPARE TRANSACTION` in the workers' own logs.
//!
//! `CM_TEST_CITUS_URL` names the coordinator (`.ci/citus` prints it). Each test makes a database
//! of its own on every node (`CREATE DATABASE` propagated by Citus, the extension created and the
//! workers registered in it), and drops it at the end. The tests are ignored unless asked for
//! (`cargo xtask test` runs them where the variable is set); asked for without it, they fail.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

use chrono::TimeDelta;
use cm_domain::{ClaimOutcome, FireStatus, MisfirePolicy, OverlapPolicy, RunState, Settlement};
use cm_store::explain::HotStatement;
use cm_store::{
    FailingRoutines, FireLedger, FireSettle, GroupDirectory, GroupId, MissionRuns, NewRoutine,
    OutboxAck, OutboxConsumer, OutboxTake, PgStore, RoutineStore, RunTake, RunUpdate,
    SettleOutcome, StatusReader, StoreError, SyncAction, group_of,
};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

use crate::support::{
    YEARLY, create, fire_of, message, outbox_params, page_summaries, params, reap_params,
    set_next_run, token_of, unfinished_occurrences,
};

/// A database of its own on the Citus cluster, migrated and distributed; dropped by
/// [`CitusDb::drop_all`].
struct CitusDb {
    coordinator: String,
    name: String,
    store: PgStore,
    pool: PgPool,
}

/// Serialises the tests' database set-up.
static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The coordinator's URL. These tests are ignored unless asked for (`cargo xtask test` asks
/// where the variable is set), so one that runs without it fails, saying what to start.
fn citus_url() -> String {
    match std::env::var("CM_TEST_CITUS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!("CM_TEST_CITUS_URL is not set: start the cluster with .ci/citus"),
    }
}

/// `url` with its database part replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
    format!("{base}/{database}")
}

async fn execute(conn: &mut PgConnection, sql: String) {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(conn)
        .await
        .unwrap();
}

impl CitusDb {
    async fn create() -> CitusDb {
        let coordinator = citus_url();
        // One database at a time: CREATE DATABASE copies template1, which refuses a second
        // copy while one is running.
        let _one = CREATING.lock().await;
        let name = format!("cm_citus_{}", &Uuid::new_v4().simple().to_string()[..12]);
        let mut admin = PgConnection::connect(&coordinator)
            .await
            .unwrap_or_else(|e| panic!("CM_TEST_CITUS_URL {coordinator:?}: {e}"));
        let nodes: Vec<(String, i32, i32)> = sqlx::query_as(
            "SELECT nodename::text, nodeport, groupid FROM pg_dist_node WHERE isactive ORDER BY 3",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap();
        assert!(
            nodes.iter().filter(|(_, _, g)| *g != 0).count() >= 2,
            "the cluster at {coordinator} should have two workers: {nodes:?}"
        );
        execute(
            &mut admin,
            "SET citus.enable_create_database_propagation = on".into(),
        )
        .await;
        execute(&mut admin, format!("CREATE DATABASE {name}")).await;
        let url = with_database(&coordinator, &name);
        for (host, port, group) in nodes.iter().filter(|(_, _, g)| *g != 0) {
            let worker = format!("postgres://postgres@{host}:{port}/{name}");
            let mut conn = PgConnection::connect(&worker).await.unwrap();
            execute(&mut conn, "CREATE EXTENSION citus".into()).await;
            let _ = group;
        }
        let mut conn = PgConnection::connect(&url).await.unwrap();
        execute(&mut conn, "CREATE EXTENSION citus".into()).await;
        let (host, port, _) = nodes.iter().find(|(_, _, g)| *g == 0).cloned().unwrap();
        execute(
            &mut conn,
            format!("SELECT citus_set_coordinator_host('{host}', {port})"),
        )
        .await;
        for (host, port, _) in nodes.iter().filter(|(_, _, g)| *g != 0) {
            execute(
                &mut conn,
                format!("SELECT citus_add_node('{host}', {port})"),
            )
            .await;
        }
        let store = PgStore::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        // Eight distributed or reference tables; the group leases and the schedulers' presence
        // stay on the coordinator.
        assert_eq!(store.distribute_on_citus().await.unwrap(), 8);
        // Again: nothing left to distribute, nothing changed.
        assert_eq!(store.distribute_on_citus().await.unwrap(), 0);
        let pool = store.pool().clone();
        // The per-group walks' indexes, which plain PostgreSQL does without, are there.
        assert_eq!(group_walk_indexes(&pool).await, 3);
        CitusDb {
            coordinator,
            name,
            store,
            pool,
        }
    }

    /// Drops the database on every node, best effort: the coordinator's connections to the
    /// workers in it close a moment after the test's, so a refused drop is tried again.
    async fn drop_all(self) {
        self.pool.close().await;
        let mut admin = PgConnection::connect(&self.coordinator).await.unwrap();
        execute(
            &mut admin,
            "SET citus.enable_create_database_propagation = on".into(),
        )
        .await;
        let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        for _ in 0..20 {
            let dropped = sqlx::query(sqlx::AssertSqlSafe(drop.clone()))
                .execute(&mut admin)
                .await;
            if dropped.is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        eprintln!(
            "could not drop {} on every node; .ci/citus --drop clears it",
            self.name
        );
    }

    /// How many two-phase commits the coordinator has recorded in this database (rows of
    /// `pg_dist_transaction`, kept until recovery, which the test cluster runs rarely).
    async fn two_phase_commits(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM pg_dist_transaction")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The URLs of this database on each worker.
    async fn on_workers(&self) -> Vec<String> {
        let workers: Vec<(String, i32)> = sqlx::query_as(
            "SELECT nodename::text, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY 2",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap();
        workers
            .into_iter()
            .map(|(host, port)| format!("postgres://postgres@{host}:{port}/{}", self.name))
            .collect()
    }
}

/// A worker's server log, from the length it had when it was recorded: the test reads only the
/// lines written after.
struct WorkerLog {
    /// This database on the worker.
    url: String,
    path: PathBuf,
    offset: u64,
}

/// The server log file of the cluster on `port`: `pg_current_logfile()` when the worker runs a
/// logging collector, else the file `pg_lsclusters` names for the port (Debian's clusters log
/// their stderr there).
async fn log_file(url: &str) -> PathBuf {
    let mut conn = PgConnection::connect(url).await.unwrap();
    let collected: Option<String> = sqlx::query_scalar("SELECT pg_current_logfile()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let (directory, port): (String, i32) =
        sqlx::query_as("SELECT current_setting('data_directory'), inet_server_port()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    if let Some(file) = collected {
        return PathBuf::from(directory).join(file);
    }
    let listed = std::process::Command::new("pg_lsclusters")
        .arg("-h")
        .output()
        .expect("pg_lsclusters, to find the workers' log files");
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.len() >= 7 && fields[2] == port.to_string())
        .map(|fields| PathBuf::from(fields[6]))
        .unwrap_or_else(|| panic!("pg_lsclusters names no log file for port {port}"))
}

impl WorkerLog {
    /// The worker's log as far as it is written now.
    async fn record(url: &str) -> WorkerLog {
        let path = log_file(url).await;
        let offset = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .len();
        WorkerLog {
            url: url.to_owned(),
            path,
            offset,
        }
    }

    /// The lines of `database` written since the log was recorded. A marker statement sent to
    /// the worker in that database comes last, and is waited for: everything before it is in
    /// the file, and the database's statements are being logged at all.
    async fn appended(&self, database: &str) -> Vec<String> {
        let marker = format!("cm log marker {}", Uuid::new_v4());
        let mut conn = PgConnection::connect(&self.url).await.unwrap();
        execute(&mut conn, format!("SELECT '{marker}'")).await;
        conn.close().await.unwrap();
        let ours = format!("@{database} ");
        for _ in 0..100 {
            let mut file = std::fs::File::open(&self.path).unwrap();
            // A log started afresh (shorter than the offset) is read from its beginning.
            let from = if file.metadata().unwrap().len() < self.offset {
                0
            } else {
                self.offset
            };
            file.seek(SeekFrom::Start(from)).unwrap();
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            if text.contains(&marker) {
                return text
                    .lines()
                    .filter(|line| line.contains(&ours))
                    .map(str::to_owned)
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{}: the marker statement never appeared (is log_statement = 'all' set for {database} on the worker?)",
            self.path.display()
        )
    }
}

/// The workers' logs of the database, recorded now.
async fn worker_logs(urls: &[String]) -> Vec<WorkerLog> {
    let mut logs = Vec::new();
    for url in urls {
        logs.push(WorkerLog::record(url).await);
    }
    logs
}

/// Every worker's lines of `database` since `logs` were recorded.
async fn appended(logs: &[WorkerLog], database: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for log in logs {
        lines.extend(log.appended(database).await);
    }
    lines
}

/// Routines, each due a minute ago (and, yearly, not again for months), in at least `groups`
/// different groups.
/// How many of the per-group walks' indexes the database has.
async fn group_walk_indexes(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_indexes WHERE indexname IN \
         ('routines_group_due_idx', 'routine_fires_group_lease_idx', \
          'outbox_messages_group_pending_idx')",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Plain PostgreSQL claims across the groups: the per-group walks' indexes would only cost it
/// an index entry per routine moved on and per message written, so it has none.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn plain_postgresql_has_no_per_group_walk_indexes(pool: sqlx::PgPool) {
    assert_eq!(group_walk_indexes(&pool).await, 0);
}

async fn due_routines(db: &CitusDb, groups: usize) -> Vec<(Uuid, GroupId)> {
    let count = db.store.group_count().await.unwrap();
    let mut routines = Vec::new();
    let mut seen = BTreeSet::new();
    while seen.len() < groups {
        let routine = create(&db.store, YEARLY, MisfirePolicy::FireOnce).await;
        assert_eq!(routine.group_id, group_of(routine.id, count));
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        set_next_run(&db.pool, routine.id, now - TimeDelta::minutes(1)).await;
        seen.insert(routine.group_id);
        routines.push((routine.id, routine.group_id));
    }
    routines
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn claims_settles_reaps_and_consumes_per_group_on_citus() {
    let db = CitusDb::create().await;
    let routines = due_routines(&db, 3).await;
    let groups: BTreeSet<GroupId> = routines.iter().map(|(_, g)| *g).collect();
    assert_eq!(
        db.store.due_groups().await.unwrap(),
        groups.iter().copied().collect::<Vec<_>>()
    );

    // A claim in one group takes that group's routines only.
    let first = *groups.first().unwrap();
    let claim = db
        .store
        .claim_due(&cm_store::ClaimDueParams {
            group: Some(first),
            ..params("a")
        })
        .await
        .unwrap();
    let in_first: BTreeSet<Uuid> = routines
        .iter()
        .filter(|(_, g)| *g == first)
        .map(|(id, _)| *id)
        .collect();
    let claimed: BTreeSet<Uuid> = claim
        .fires
        .iter()
        .map(|f| f.occurrence.routine_id)
        .collect();
    assert_eq!(claimed, in_first);
    for fire in &claim.fires {
        assert_eq!(fire.outcome(claim.token), ClaimOutcome::Fresh);
    }
    assert!(!db.store.due_groups().await.unwrap().contains(&first));

    // Settle them through the cross-group statement.
    let settles: Vec<FireSettle> = claim
        .fires
        .iter()
        .map(|f| FireSettle {
            fire: f.fire_ref(),
            settlement: Settlement::Fired,
            receipt: Some("ok".into()),
        })
        .collect();
    let outcomes = db.store.settle_fires(&settles).await.unwrap();
    assert!(outcomes.iter().all(|o| *o == SettleOutcome::Settled));

    // Every other group, claimed one at a time, then its leases run out: the reaper, group by
    // group, takes each over as a retry.
    let mut held = Vec::new();
    for group in groups.iter().skip(1) {
        let claim = db
            .store
            .claim_due(&cm_store::ClaimDueParams {
                group: Some(*group),
                ..params("b")
            })
            .await
            .unwrap();
        assert!(!claim.fires.is_empty());
        held.extend(claim.fires.iter().map(|f| f.occurrence));
    }
    sqlx::query(
        "UPDATE cm.routine_fires SET lease_expires_at = now() - interval '1 second'
         WHERE status = 'claimed'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let expired = db.store.expired_groups().await.unwrap();
    assert_eq!(expired, groups.iter().skip(1).copied().collect::<Vec<_>>());
    let mut reaped = Vec::new();
    for group in expired {
        let tick = db
            .store
            .reap_expired(&cm_store::ReapParams {
                group: Some(group),
                ..reap_params("reaper", 100)
            })
            .await
            .unwrap();
        for fire in &tick.fires {
            assert_eq!(fire.outcome(tick.token), ClaimOutcome::Retry { attempt: 2 });
            assert_eq!(token_of(&db.pool, fire.occurrence).await, tick.token);
        }
        reaped.extend(tick.fires.iter().map(|f| f.occurrence));
    }
    reaped.sort();
    held.sort();
    assert_eq!(reaped, held);

    // The outbox claim writes each fresh occurrence's message in the claim; a consumer takes
    // them group by group, in seq order within the group, and acknowledges them.
    let more = due_routines(&db, 2).await;
    let mut written = 0;
    for group in db.store.due_groups().await.unwrap() {
        let claim = db
            .store
            .claim_due(&cm_store::ClaimDueParams {
                group: Some(group),
                ..outbox_params("c")
            })
            .await
            .unwrap();
        for fire in &claim.fires {
            assert_eq!(fire.row.status, FireStatus::Fired);
            assert!(fire.receipt.as_deref().unwrap().starts_with("outbox seq "));
        }
        written += claim.fires.len();
    }
    assert_eq!(written, more.len());
    let mut delivered = 0;
    for group in more.iter().map(|(_, g)| *g).collect::<BTreeSet<_>>() {
        let batch = db
            .store
            .outbox_take(&OutboxTake {
                consumer: "consumer".into(),
                limit: 100,
                lease: std::time::Duration::from_secs(30),
                group: Some(group),
            })
            .await
            .unwrap();
        let seqs: Vec<i64> = batch.iter().map(|d| d.message.seq).collect();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, sorted);
        let acks: Vec<OutboxAck> = batch
            .iter()
            .map(|d| OutboxAck {
                seq: d.message.seq,
                lease_token: d.lease_token,
            })
            .collect();
        assert_eq!(
            db.store.outbox_ack("consumer", &acks).await.unwrap(),
            batch.len() as u64
        );
        delivered += batch.len();
    }
    assert_eq!(delivered, more.len());
    db.drop_all().await;
}

/// The automatic pause written in the settle of a routine's third failure, on Citus: the
/// pause statement names the routine's group, so it runs on its shard, in the settle's
/// transaction.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn the_third_failed_settle_pauses_its_routine_on_citus() {
    let db = CitusDb::create().await;
    crate::settle::the_third_failed_settle_pauses(&db.store, &db.pool, true).await;
    db.drop_all().await;
}

/// Retries on Citus: the settle and run-end statements decide them on the group's shard (the
/// routine and the next fire read there too), and the reaper takes them over.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn failures_are_retried_on_citus() {
    let db = CitusDb::create().await;
    crate::retries::retried_until_spent(&db.store, &db.pool).await;
    crate::retries::run_retried_under_a_new_name(&db.store, &db.pool).await;
    db.drop_all().await;
}

/// Concurrency keys on Citus: the limits on the coordinator, the places counted over every
/// shard under the coordinator's key locks, claims of many groups at once.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn a_key_of_one_place_is_one_claim_on_citus() {
    let db = CitusDb::create().await;
    crate::limits::one_place_across_groups(&db.store, &db.pool).await;
    db.drop_all().await;
    let db = CitusDb::create().await;
    crate::limits::keyed_groups_catch_up(&db.store, &db.pool).await;
    db.drop_all().await;
}

/// Calendars on Citus (a reference table read by the claim of one group): a moved occurrence
/// planned at the business day, and an edit re-planning the routines on the calendar.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn calendars_plan_and_re_plan_on_citus() {
    let db = CitusDb::create().await;
    crate::calendars::a_moved_occurrence_is_planned_at_the_business_day(&db.store, &db.pool, true)
        .await;
    db.drop_all().await;
    let db = CitusDb::create().await;
    crate::calendars::an_edit_re_plans_its_routines(&db.store, &db.pool).await;
    db.drop_all().await;
}

/// The event log on Citus: deadlines raised in one group, delivery marked, listing across the
/// shards, retention.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn the_event_log_round_on_citus() {
    let db = CitusDb::create().await;
    crate::events::the_event_log_round(&db.store, &db.pool, true).await;
    db.drop_all().await;
}

/// The claim statements' plans, as `EXPLAIN` prints them on the coordinator, with the group
/// bound: each is one task (a router query on one shard).
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn every_claim_statement_is_one_task_on_citus() {
    let db = CitusDb::create().await;
    let group: GroupId = 3;
    let after = cm_store::DueCursor {
        next_run_at: chrono::Utc::now(),
        routine_id: Uuid::new_v4(),
    };
    let due = |after| HotStatement::Due {
        max_routines: 10,
        requests: 2,
        mission_room: Some(1),
        after,
        group: Some(group),
    };
    let reap = cm_store::ReapParams {
        claimant: "a".into(),
        lease: cm_domain::Lease::new(Duration::from_secs(30)).unwrap(),
        limit: 10,
        group: Some(group),
    };
    let in_turns = |after| HotStatement::DueInTurns {
        max_routines: 10,
        requests: 2,
        mission_room: Some(1),
        after,
        group: Some(group),
        keys: vec!["big".into(), "small".into()],
    };
    let mut plans: Vec<(&str, String)> = Vec::new();
    for (name, statement) in [
        ("due", due(None)),
        ("due, resumed", due(Some(after))),
        ("due in turns", in_turns(None)),
        ("due in turns, resumed", in_turns(Some(after))),
        (
            "requests",
            HotStatement::TakeRequests {
                limit: 10,
                missions: Some(1),
                group: Some(group),
            },
        ),
    ] {
        plans.push((name, db.store.explain(&statement).await.unwrap()));
    }
    plans.extend(db.store.explain_claim_on_one_shard(group).await.unwrap());
    plans.push((
        "reaper",
        db.store.explain(&HotStatement::Reap(reap)).await.unwrap(),
    ));
    plans.push((
        "group due",
        db.store
            .explain(&HotStatement::GroupDue(group))
            .await
            .unwrap(),
    ));
    for (name, plan) in &plans {
        let text = plan;
        let tasks: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Task Count: "))
            .collect();
        assert_eq!(
            tasks,
            ["1"],
            "the {name} statement is not one task:\n{text}"
        );
    }
    db.drop_all().await;
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn group_leases_live_on_the_coordinator_and_each_group_names_its_worker_on_citus() {
    let db = CitusDb::create().await;
    // Not distributed, not a reference table: a write needs the coordinator alone, so a worker
    // that is down blocks no lease.
    for table in ["group_leases", "group_holders"] {
        let citus: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = $1::regclass",
        )
        .bind(format!("cm.{table}"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(citus, 0, "{table} is a Citus table");
    }
    let lease = std::time::Duration::from_secs(30);
    assert_eq!(
        db.store.lease_groups("a", &[0, 1], lease).await.unwrap(),
        [0, 1]
    );
    let live = db.store.live_group_leases().await.unwrap();
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(live.iter().all(|l| l.remaining <= lease), "{live:?}");
    // Every group is on a worker, each of the workers holding some, as the shard placements
    // say.
    let workers: Vec<String> = sqlx::query_scalar(
        "SELECT nodename || ':' || nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut seen = BTreeSet::new();
    for group in 0..db.store.group_count().await.unwrap() {
        let node = db
            .store
            .group_node(GroupId::try_from(group).unwrap())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("group {group} has no node"));
        assert!(workers.contains(&node), "{node} is not among {workers:?}");
        seen.insert(node);
    }
    assert_eq!(seen.len(), workers.len(), "{seen:?}");
    db.drop_all().await;
}

/// A claim commits on one worker with a plain `COMMIT`: the coordinator records no two-phase
/// commit for it, while a statement over every group (the control) records some.
/// The control of the two-phase checks: one transaction updating each of `routines` by its id
/// alone (each statement on every shard), which Citus commits in two phases.
async fn multi_shard_transaction(pool: &PgPool, routines: &[(Uuid, GroupId)]) {
    let mut tx = pool.begin().await.unwrap();
    for (id, _) in routines {
        sqlx::query("UPDATE cm.routines SET updated_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn a_claim_commits_without_two_phase_commit_on_citus() {
    let db = CitusDb::create().await;
    let routines = due_routines(&db, 2).await;
    let before = db.two_phase_commits().await;
    for group in db.store.due_groups().await.unwrap() {
        for params in [params("a"), outbox_params("b")] {
            db.store
                .claim_due(&cm_store::ClaimDueParams {
                    group: Some(group),
                    ..params
                })
                .await
                .unwrap();
        }
    }
    assert_eq!(db.two_phase_commits().await, before, "a claim used 2PC");
    assert!(db.store.due_groups().await.unwrap().is_empty());
    // The control: one transaction writing to several shards commits in two phases.
    multi_shard_transaction(&db.pool, &routines).await;
    assert!(db.two_phase_commits().await > before);
    db.drop_all().await;
}

/// The workers' own logs: with every statement of this database logged on each worker (its
/// sessions only, opened after the setting), a claim in each group, with and without the outbox
/// in the claim, logs no `PREPARE TRANSACTION` on any worker, while the multi-shard control does.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn no_worker_logs_prepare_transaction_during_a_claim_on_citus() {
    let db = CitusDb::create().await;
    let workers = db.on_workers().await;
    for url in &workers {
        let mut conn = PgConnection::connect(url).await.unwrap();
        // On the worker alone: nothing to propagate.
        execute(&mut conn, "SET citus.enable_ddl_propagation = off".into()).await;
        execute(
            &mut conn,
            format!("ALTER DATABASE {} SET log_statement = 'all'", db.name),
        )
        .await;
        conn.close().await.unwrap();
    }
    // The coordinator's sessions so far opened their connections to the workers before the
    // setting; a new pool's sessions open new ones, which log every statement.
    let store = PgStore::connect(&with_database(&db.coordinator, &db.name))
        .await
        .unwrap();

    // Routines due in at least two groups, claimed group by group; then as many again, claimed
    // with their messages written in the claim. Only the claims are watched: creating a routine
    // writes its name's shard too, in two phases.
    let mut routines = Vec::new();
    for params in [params("a"), outbox_params("b")] {
        let due = due_routines(&db, 2).await;
        let logs = worker_logs(&workers).await;
        let before = db.two_phase_commits().await;
        let mut claimed = 0;
        for group in store.due_groups().await.unwrap() {
            let claim = store
                .claim_due(&cm_store::ClaimDueParams {
                    group: Some(group),
                    ..params.clone()
                })
                .await
                .unwrap();
            claimed += claim.fires.len();
        }
        assert_eq!(claimed, due.len());
        assert_eq!(db.two_phase_commits().await, before, "a claim used 2PC");
        let during = appended(&logs, &db.name).await;
        assert!(
            during.iter().any(|l| l.contains("routine_fires")),
            "no statement of the claims was logged on the workers:\n{}",
            during.join("\n")
        );
        let prepared: Vec<&String> = during
            .iter()
            .filter(|l| l.contains("PREPARE TRANSACTION"))
            .collect();
        assert!(prepared.is_empty(), "a claim prepared: {prepared:#?}");
        routines.extend(due);
    }

    // The control: one transaction writing to several shards prepares on the workers.
    let logs = worker_logs(&workers).await;
    multi_shard_transaction(store.pool(), &routines).await;
    let control = appended(&logs, &db.name).await;
    assert!(
        control.iter().any(|l| l.contains("PREPARE TRANSACTION")),
        "the multi-shard control logged no PREPARE TRANSACTION:\n{}",
        control.join("\n")
    );
    store.pool().close().await;
    db.drop_all().await;
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn imports_and_syncs_create_update_and_delete_on_citus() {
    let db = CitusDb::create().await;
    // An import locks the routines it names through their groups.
    let batch = [message("a", YEARLY), message("b", YEARLY)];
    let written = db.store.import_routines(&batch, false, None).await.unwrap();
    assert!(written.iter().all(|w| w.created));
    let err = db
        .store
        .import_routines(&[message("a", "0 0 * * *")], false, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NameTaken(n) if n == "a"),
        "{err:?}"
    );
    let upserted = db
        .store
        .import_routines(
            &[message("a", "0 0 * * *"), message("z", YEARLY)],
            true,
            None,
        )
        .await
        .unwrap();
    let seen: Vec<(&str, bool, &str)> = upserted
        .iter()
        .map(|w| {
            (
                w.routine.name.as_str(),
                w.created,
                w.routine.schedule.as_str(),
            )
        })
        .collect();
    assert_eq!(seen, [("a", false, "0 0 * * *"), ("z", true, YEARLY)]);
    assert_eq!(upserted[0].routine.id, written[0].routine.id);

    // A sync takes over "a" (no source yet), creates "c"; the next creates "d", updates "a"
    // and deletes "c", which the file no longer has.
    let sync = async |file: &[NewRoutine]| -> Vec<(String, SyncAction)> {
        db.store
            .sync_routines("cron.toml", file)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.routine.name, s.action))
            .collect()
    };
    assert_eq!(
        sync(&[message("a", "0 0 * * *"), message("c", YEARLY)]).await,
        [
            ("a".into(), SyncAction::Adopted),
            ("c".into(), SyncAction::Created)
        ]
    );
    let file = [message("a", "0 1 * * *"), message("d", YEARLY)];
    assert_eq!(
        sync(&file).await,
        [
            ("a".into(), SyncAction::Updated),
            ("d".into(), SyncAction::Created),
            ("c".into(), SyncAction::Deleted)
        ]
    );
    assert!(
        sync(&file)
            .await
            .iter()
            .all(|(_, action)| *action == SyncAction::Unchanged)
    );
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM cm.routines ORDER BY name")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(names, ["a", "b", "d", "z"]);
    let listed: Vec<String> = sqlx::query_scalar("SELECT name FROM cm.routine_names ORDER BY name")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(listed, names, "routine_names follows the routines");
    assert_eq!(
        db.store.get_routine_by_name("a").await.unwrap().schedule,
        "0 1 * * *"
    );
    // A routine of another source is refused, and nothing changes.
    let err = db
        .store
        .sync_routines("other.toml", &[message("d", "0 2 * * *")])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidRoutine(_)), "{err:?}");
    assert_eq!(
        db.store.get_routine_by_name("d").await.unwrap().schedule,
        YEARLY
    );
    db.drop_all().await;
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn mission_runs_are_taken_and_watched_in_one_shard_on_citus() {
    let db = CitusDb::create().await;
    let routines = due_routines(&db, 2).await;
    let mut fires = Vec::new();
    for group in db.store.due_groups().await.unwrap() {
        let claim = db
            .store
            .claim_due(&cm_store::ClaimDueParams {
                group: Some(group),
                ..params("a")
            })
            .await
            .unwrap();
        fires.extend(claim.fires.iter().map(|f| f.occurrence));
    }
    assert_eq!(fires.len(), routines.len());
    let (first, rest) = fires.split_first().unwrap();
    assert!(
        db.store
            .set_overlap(first.routine_id, OverlapPolicy::Forbid)
            .await
            .unwrap()
    );
    assert!(
        !db.store
            .set_overlap(Uuid::new_v4(), OverlapPolicy::Forbid)
            .await
            .unwrap()
    );

    // Taking a run names the routine's group in every statement: no two-phase commit.
    let before = db.two_phase_commits().await;
    for occurrence in &fires {
        assert_eq!(
            db.store.take_run(*occurrence, None).await.unwrap(),
            RunTake::Launch
        );
    }
    assert_eq!(db.two_phase_commits().await, before, "a run take used 2PC");
    let holder: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT scheduled_at FROM cm.routine_fires WHERE routine_id = $1 AND holds_run",
    )
    .bind(first.routine_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(holder, Some(first.scheduled_at), "forbid keeps the holder");
    // A retry of the holder finds the run its own.
    assert_eq!(
        db.store.take_run(*first, None).await.unwrap(),
        RunTake::Launch
    );

    let mut unfinished = unfinished_occurrences(&db.store).await;
    unfinished.sort();
    let mut expected = fires.clone();
    expected.sort();
    assert_eq!(unfinished, expected);

    let mut updates = vec![(*first, RunUpdate::Observed(RunState::exited(3, "")))];
    updates.extend(
        rest.iter()
            .map(|o| (*o, RunUpdate::Observed(RunState::Succeeded))),
    );
    db.store.record_runs(&updates).await.unwrap();
    assert!(db.store.unfinished_runs(10).await.unwrap().is_empty());
    let fire = fire_of(&db.store, *first).await;
    assert_eq!(
        (fire.run_state.as_deref(), fire.run_exit_code),
        (Some("failed"), Some(3))
    );
    for occurrence in rest {
        assert_eq!(
            fire_of(&db.store, *occurrence).await.run_state.as_deref(),
            Some("succeeded")
        );
    }

    // What the page, `fires --status failed`, `routine list` and `fires show` read of the
    // outcome runs on Citus too: the failed run is a failure everywhere.
    db.store
        .keep_run_record(
            *first,
            &cm_store::RunRecord {
                output: Some("exit code 3 follows\n".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let failures = db.store.recent_failures(10).await.unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].error.as_deref(), Some("exit code 3"));
    let failed = db
        .store
        .list_fires(&cm_store::FireFilter {
            outcome: Some(cm_domain::FireOutcome::Failed),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    let ids: Vec<Uuid> = fires.iter().map(|o| o.routine_id).collect();
    let last = db.store.last_fires(&ids).await.unwrap();
    assert_eq!(last.len(), ids.len());
    let summaries = page_summaries(&db.store).await;
    assert_eq!(summaries.len(), routines.len());
    let rate = db.store.fire_rate().await.unwrap();
    let failed_in_chart: u64 = rate.minutes.iter().map(|m| m.failed).sum();
    assert!(failed_in_chart <= 1);
    let detail = db.store.fire(*first).await.unwrap().unwrap();
    assert_eq!(detail.run_output.as_deref(), Some("exit code 3 follows\n"));
    // On Citus the automatic pause runs a group at a time. It counts fires claimed since the
    // routine's last change (its overlap was set after this claim).
    let group = routines
        .iter()
        .find(|(id, _)| *id == first.routine_id)
        .map(|(_, group)| *group)
        .unwrap();
    sqlx::query(
        "UPDATE cm.routine_fires SET claimed_at = now() WHERE routine_id = $1 AND group_id = $2",
    )
    .bind(first.routine_id)
    .bind(group)
    .execute(&db.pool)
    .await
    .unwrap();
    let paused = db
        .store
        .pause_failing_routines_in(group, 1, Duration::from_secs(3600 * 24 * 365 * 30))
        .await
        .unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].id, first.routine_id);
    assert!(
        paused[0].reason.ends_with("the latest: exit code 3"),
        "{paused:?}"
    );
    db.drop_all().await;
}

/// On Citus a sibling's writes in its own transaction and through SQL work as on PostgreSQL:
/// a routine written in a transaction that rolls back is gone, one committed with the
/// caller's row is there, several routines (several groups: a distributed transaction) commit
/// as one, and the SQL functions' rows are planned or paused with the reason.
#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn writes_in_the_callers_transaction_and_from_sql_on_citus() {
    use cm_store::UnplannedRoutines as _;
    let db = CitusDb::create().await;
    let mut tx = db.pool.begin().await.unwrap();
    let gone = cm_store::tx::create_routine(&mut tx, &message("gone", YEARLY))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(db.store.get_routine(gone.id).await.is_err());

    let mut tx = db.pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for name in ["one", "two", "three", "four"] {
        ids.push(
            cm_store::tx::create_routine(&mut tx, &message(name, YEARLY))
                .await
                .unwrap()
                .id,
        );
    }
    let taken = cm_store::tx::create_routine(&mut tx, &message("one", YEARLY)).await;
    assert!(matches!(taken, Err(StoreError::NameTaken(_))), "{taken:?}");
    tx.commit().await.unwrap();
    for id in &ids {
        assert!(db.store.get_routine(*id).await.is_ok());
    }

    let good: Uuid =
        sqlx::query_scalar("SELECT cm.create_routine('sql', '0 9 * * *', 'UTC', 'hi')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    // A zone SQL can check is refused at insert, in the caller's transaction.
    let refused = sqlx::query_scalar::<_, Uuid>(
        "SELECT cm.create_routine('sql zone', '0 9 * * *', 'Mars/Olympus', 'hi')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap_err();
    assert!(
        refused.to_string().contains("unknown time zone"),
        "{refused}"
    );
    // A jitter longer than the schedule's interval only the planning pass can read: written,
    // then paused with the reason.
    let bad: Uuid = sqlx::query_scalar(
        "SELECT cm.create_routine('sql bad', '* * * * * jitter 2m', 'UTC', 'hi')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let planned = db.store.plan_routines(None, 100).await.unwrap();
    assert_eq!(planned.len(), 2, "{planned:?}");
    assert!(
        db.store
            .get_routine(good)
            .await
            .unwrap()
            .next_run_at
            .is_some()
    );
    assert!(db.store.get_routine(bad).await.unwrap().paused);
    let deleted: bool = sqlx::query_scalar("SELECT cm.delete_routine($1)")
        .bind(good)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(deleted);

    // Many at once, across the groups: all of them, or none with the element named. An RFC
    // 5545 rule is planned as a cron line is.
    let batch = |names: &[&str], schedule: &str| {
        serde_json::Value::Array(
            names
                .iter()
                .map(|n| serde_json::json!({"name": n, "schedule": schedule, "message": "hi"}))
                .collect(),
        )
    };
    let names: Vec<String> = (0..40).map(|i| format!("batch {i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let rule = "@rrule FREQ=MONTHLY;BYDAY=FR;BYSETPOS=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0";
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT cm.create_routines($1)")
        .bind(batch(&names, rule))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), 40);
    let mut bad_batch = batch(&["fine", "also fine"], "0 9 * * *");
    bad_batch.as_array_mut().unwrap()[1]["schedule"] = "0 24 * * *".into();
    let refused = sqlx::query_scalar::<_, Vec<Uuid>>("SELECT cm.create_routines($1)")
        .bind(bad_batch)
        .fetch_one(&db.pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("routine 2 of 2"), "{refused}");
    assert!(db.store.get_routine_by_name("fine").await.is_err());
    db.store.plan_routines(None, 100).await.unwrap();
    for id in &ids {
        let routine = db.store.get_routine(*id).await.unwrap();
        let next = routine
            .next_run_at
            .expect("a batch routine was not planned");
        // The last Friday of a month, at 09:00 UTC.
        assert_eq!(chrono::Datelike::weekday(&next), chrono::Weekday::Fri);
        assert!(chrono::Datelike::day(&(next + chrono::Duration::days(7))) <= 7);
        assert_eq!(chrono::Timelike::hour(&next), 9);
    }
    db.drop_all().await;
}
