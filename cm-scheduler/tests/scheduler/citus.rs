//! Two schedulers, whole processes, claiming group by group in the groups they lease: against a
//! real Citus cluster (`CM_TEST_CITUS_URL`, the coordinator `.ci/citus` prints; the schema
//! migrated and distributed by `migrate --citus`), and on plain PostgreSQL with
//! `--claim-per-group`. No tick error, every occurrence claimed once. A mission routine's run
//! on Citus, launched and watched to its exit code. The Citus tests are ignored
//! unless asked for (`cargo xtask test` runs them where the variable is set); asked for without
//! it, they fail.

use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use uuid::Uuid;

use crate::cli::create_args;
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, cm_scheduler};

/// Makes `name` a Citus database on every node of the cluster with `.ci/citus --database`, and
/// returns its URL.
fn citus_database(name: &str) -> String {
    let configured = std::env::var("CM_TEST_CITUS_URL").is_ok_and(|u| !u.is_empty());
    assert!(
        configured,
        "CM_TEST_CITUS_URL is not set: start the cluster with .ci/citus"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/citus");
    let out = Command::new(script)
        .args(["--database", name])
        .stdin(Stdio::null())
        .output()
        .expect("running .ci/citus");
    assert!(
        out.status.success(),
        ".ci/citus --database failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn cli(url: &str, args: &[&str]) {
    let out = cm_scheduler()
        .arg("--database-url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running cm-scheduler");
    assert!(
        out.status.success(),
        "cm-scheduler {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The number after `key=` on the scheduler's exit line.
fn summary(log: &str, key: &str) -> u64 {
    log.lines()
        .find(|l| l.contains("scheduler exited"))
        .and_then(|l| l.split(&format!("{key}=")).nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= on the exit line:\n{log}"))
}

/// Creates 40 routines due every second, runs two schedulers (`run` with `args`) for 12 s and
/// until both have fired, stops them, and checks that neither had a tick error, both fired,
/// every occurrence was claimed once and settled, and both took part in the group leases.
async fn two_schedulers_share_the_groups(db: &TestDb, args: &[&str]) {
    for n in 0..40 {
        cli(
            &db.url,
            &create_args(
                &format!("every second {n}"),
                "* * * * * *",
                &["--message", "hello"],
            ),
        );
    }
    let started = std::time::Instant::now();
    let mut a = SchedulerProcess::start_with(db, "groups-a", args, &[]);
    let mut b = SchedulerProcess::start_with(db, "groups-b", args, &[]);
    // The one that starts second may find every group leased by the other, and fires once the
    // other has let its share go, at its next renewal: up to a third of a group lease (5 s at
    // the default) after both are up, more on a loaded machine.
    let both = crate::support::eventually_within(TAKEOVER_PATIENCE, async || {
        let claimants: i64 =
            sqlx::query_scalar("SELECT count(DISTINCT claimant) FROM cm.routine_fires")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        (claimants == 2).then_some(())
    })
    .await;
    // They run side by side for a fixed span on purpose: no tick of either may fail in it.
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(started.elapsed())).await;
    a.shut_down_gracefully().await;
    b.shut_down_gracefully().await;
    let (log_a, log_b) = (a.log(), b.log());
    assert!(
        both.is_some(),
        "both schedulers fire within {TAKEOVER_PATIENCE:?}:\n{log_a}\n{log_b}"
    );
    for log in [&log_a, &log_b] {
        assert_eq!(summary(log, "tick_errors"), 0, "{log}");
        assert!(!log.contains(" ERROR "), "{log}");
        assert!(summary(log, "fired") > 0, "both schedulers fire:\n{log}");
    }
    let (fires, distinct, unsettled): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT (routine_id, scheduled_at)),
                count(*) FILTER (WHERE status = 'claimed')
         FROM cm.routine_fires",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(fires, distinct);
    assert_eq!(unsettled, 0);
    assert_eq!(
        (summary(&log_a, "fired") + summary(&log_b, "fired")) as i64,
        fires
    );
    let holders: i64 = sqlx::query_scalar("SELECT count(DISTINCT holder) FROM cm.group_holders")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(holders, 2);
}

/// A database of its own on the Citus cluster, migrated and distributed by `migrate --citus`;
/// [`drop_citus`] drops it on every node.
async fn citus_test_db() -> TestDb {
    let name = format!("cm_citus_{}", &Uuid::new_v4().simple().to_string()[..12]);
    let url = citus_database(&name);
    cli(&url, &["migrate", "--citus"]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    TestDb { name, url, pool }
}

/// Drops the database of [`citus_test_db`] on every node.
async fn drop_citus(db: TestDb) {
    let name = db.name.clone();
    db.pool.close().await;
    drop(db);
    let coordinator = std::env::var("CM_TEST_CITUS_URL").unwrap();
    let mut admin = PgConnection::connect(&coordinator)
        .await
        .unwrap_or_else(|e| panic!("CM_TEST_CITUS_URL {coordinator:?}: {e}"));
    sqlx::query("SET citus.enable_create_database_propagation = on")
        .execute(&mut admin)
        .await
        .unwrap();
    let workers: Vec<(String, i32)> = sqlx::query_as(
        "SELECT nodename::text, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY 2",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    drop_retrying(&mut admin, &drop).await;
    // `.ci/citus --database` made the workers' copies one by one, so the coordinator's drop
    // does not reach them: each is dropped on its own node.
    for (host, port) in workers {
        let url = format!("postgres://postgres@{host}:{port}/postgres");
        if let Ok(mut worker) = PgConnection::connect(&url).await {
            drop_retrying(&mut worker, &drop).await;
        }
    }
}

/// Best effort: the coordinator's connections to the workers close a moment after ours.
async fn drop_retrying(conn: &mut PgConnection, drop: &str) {
    for _ in 0..20 {
        if sqlx::query(AssertSqlSafe(drop.to_owned()))
            .execute(&mut *conn)
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn two_schedulers_run_on_citus_without_tick_errors() {
    let db = citus_test_db().await;
    two_schedulers_share_the_groups(&db, &[]).await;
    drop_citus(db).await;
}

/// A mission routine's run on Citus: the launch's run take (the routine's row lock, through its
/// group) and the watch pass, through the binary, to the exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn a_mission_run_is_watched_to_its_exit_code_on_citus() {
    let db = citus_test_db().await;
    crate::missions::runs_are_watched_to_their_exit_code(&db).await;
    drop_citus(db).await;
}

/// The same on plain PostgreSQL with `--claim-per-group`: the claim loop walks group by group
/// there too.
#[tokio::test]
async fn two_schedulers_claim_per_group_on_plain_postgresql() {
    let db = TestDb::new().await;
    two_schedulers_share_the_groups(&db, &["--claim-per-group"]).await;
}

/// The groups with routines that `holder` leases live now.
async fn leased_by(db: &TestDb, holder: &str) -> Vec<i16> {
    sqlx::query_scalar(
        "SELECT l.group_id FROM cm.group_leases l
         WHERE l.holder = $1 AND l.expires_at > now()
           AND l.group_id IN (SELECT DISTINCT group_id FROM cm.routines)
         ORDER BY 1",
    )
    .bind(holder)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// How long a takeover may take before the test calls it stalled: generous, since a loaded
/// machine (the whole suite beside it, on two cores, with Citus's three nodes) stretches each
/// tick; how fast a takeover is is measured by the chaos runs, not asserted here.
const TAKEOVER_PATIENCE: Duration = Duration::from_secs(120);

/// How long after `since` (the database's clock) `claimant` fired in every one of `groups`,
/// waiting at most [`TAKEOVER_PATIENCE`]: the latest of each group's first fire.
async fn fired_in_all(db: &TestDb, claimant: &str, groups: &[i16], since: DateTime) -> Duration {
    let deadline = std::time::Instant::now() + TAKEOVER_PATIENCE;
    loop {
        let firsts: Vec<(i16, DateTime)> = sqlx::query_as(
            "SELECT group_id, min(claimed_at) FROM cm.routine_fires
             WHERE claimant = $1 AND claimed_at > $2 AND group_id = ANY($3)
             GROUP BY group_id",
        )
        .bind(claimant)
        .bind(since)
        .bind(groups)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        if firsts.len() == groups.len() {
            let last = firsts.iter().map(|(_, at)| *at).max().unwrap();
            return (last - since).to_std().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{claimant} fired in {} of the groups {groups:?} within {TAKEOVER_PATIENCE:?}: {firsts:?}",
            firsts.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

type DateTime = chrono::DateTime<chrono::Utc>;

async fn db_now(db: &TestDb) -> DateTime {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Waits until `holder` leases some groups with routines, and returns them.
async fn holds_groups(db: &TestDb, holder: &str, log: impl Fn() -> String) -> Vec<i16> {
    crate::crash::eventually(async || {
        let groups = leased_by(db, holder).await;
        (!groups.is_empty()).then_some(groups)
    })
    .await
    .unwrap_or_else(|| panic!("{holder} never leased a group; its log:\n{}", log()))
}

/// When `holder`'s live lease on each of `groups` runs out, by the database's clock.
async fn lease_ends(db: &TestDb, holder: &str, groups: &[i16]) -> Vec<(i16, DateTime)> {
    sqlx::query_as(
        "SELECT group_id, expires_at FROM cm.group_leases
         WHERE holder = $1 AND expires_at > now() AND group_id = ANY($2)
         ORDER BY 1",
    )
    .bind(holder)
    .bind(groups)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// When `claimant` first claimed in each of `groups` after `since` (the database's clock).
async fn first_claims(
    db: &TestDb,
    claimant: &str,
    groups: &[i16],
    since: DateTime,
) -> Vec<(i16, DateTime)> {
    sqlx::query_as(
        "SELECT group_id, min(claimed_at) FROM cm.routine_fires
         WHERE claimant = $1 AND claimed_at > $2 AND group_id = ANY($3)
         GROUP BY group_id ORDER BY 1",
    )
    .bind(claimant)
    .bind(since)
    .bind(groups)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Takeover, with the default `--group-lease` of 15 s:
///
/// - a scheduler stopped with SIGTERM gives its leases up as it stops (none of them is live once
///   it has exited), and the other claims in each of its groups (expected within a rebalance,
///   a third of the lease, and a tick: before the leases would have run out);
/// - the groups of one killed with SIGKILL are claimed in by the other once its leases run out
///   (expected within the lease's remainder and a tick).
///
/// Both takeovers are asserted to happen (within [`TAKEOVER_PATIENCE`]): no group is left
/// unclaimed in. The expected figures are printed, not asserted: a loaded machine
/// stretches them (a starved process rebalances late), and takeover times are measured in
/// the chaos runs and docs/BENCHMARKS.md.
async fn a_stopped_schedulers_groups_are_taken_over(db: &TestDb, args: &[&str]) {
    for n in 0..40 {
        cli(
            &db.url,
            &create_args(
                &format!("every second {n}"),
                "* * * * * *",
                &["--message", "hello"],
            ),
        );
    }
    let mut a = SchedulerProcess::start_with(db, "takeover-a", args, &[]);
    let b = SchedulerProcess::start_with(db, "takeover-b", args, &[]);
    // Both hold a share once they have seen each other (a rebalance every 5 s).
    let a_groups = holds_groups(db, "takeover-a", || a.log()).await;
    holds_groups(db, "takeover-b", || b.log()).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let a_groups = {
        let now = leased_by(db, "takeover-a").await;
        if now.is_empty() { a_groups } else { now }
    };

    // SIGTERM: a gives its leases up as it stops.
    let stopped = db_now(db).await;
    let would_end = lease_ends(db, "takeover-a", &a_groups).await;
    a.shut_down_gracefully().await;
    assert_eq!(
        leased_by(db, "takeover-a").await,
        Vec::<i16>::new(),
        "a stopped scheduler still holds live leases; its log:\n{}",
        a.log()
    );
    let after_stop = fired_in_all(db, "takeover-b", &a_groups, stopped).await;
    eprintln!(
        "after SIGTERM: b fired in all of a's {} groups within {after_stop:?}",
        a_groups.len()
    );
    // Printed, not asserted: how the handover compares with the expiry it saved waiting for.
    let firsts = first_claims(db, "takeover-b", &a_groups, stopped).await;
    let (least, most) = spread(&would_end, &firsts, |end, claimed| end - claimed);
    eprintln!("b claimed in each group {least}-{most} ms before a's lease would have run out");

    // SIGKILL: c's leases run out by themselves.
    let mut c = SchedulerProcess::start_with(db, "takeover-c", args, &[]);
    holds_groups(db, "takeover-c", || c.log()).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let c_groups = holds_groups(db, "takeover-c", || c.log()).await;
    let killed = db_now(db).await;
    let ends = lease_ends(db, "takeover-c", &c_groups).await;
    c.kill();
    let after_kill = fired_in_all(db, "takeover-b", &c_groups, killed).await;
    eprintln!(
        "after SIGKILL: b fired in all of c's {} groups within {after_kill:?}",
        c_groups.len()
    );
    // Printed, not asserted: how soon after its lease ran out each group was claimed in.
    let firsts = first_claims(db, "takeover-b", &c_groups, killed).await;
    let (least, most) = spread(&ends, &firsts, |end, claimed| claimed - end);
    eprintln!("b claimed in each group {least}-{most} ms after c's lease ran out");
}

/// The least and the most of `gap(lease end, first claim)` over the groups in both lists, in
/// milliseconds.
fn spread(
    ends: &[(i16, DateTime)],
    firsts: &[(i16, DateTime)],
    gap: impl Fn(DateTime, DateTime) -> chrono::Duration,
) -> (i64, i64) {
    let gaps: Vec<i64> = ends
        .iter()
        .filter_map(|(group, end)| {
            let (_, claimed) = firsts.iter().find(|(g, _)| g == group)?;
            Some(gap(*end, *claimed).num_milliseconds())
        })
        .collect();
    (
        gaps.iter().copied().min().unwrap_or_default(),
        gaps.iter().copied().max().unwrap_or_default(),
    )
}

#[tokio::test]
#[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
async fn a_stopped_schedulers_groups_are_taken_over_on_citus() {
    let db = citus_test_db().await;
    a_stopped_schedulers_groups_are_taken_over(&db, &[]).await;
    drop_citus(db).await;
}

#[tokio::test]
async fn a_stopped_schedulers_groups_are_taken_over_on_plain_postgresql() {
    let db = TestDb::new().await;
    a_stopped_schedulers_groups_are_taken_over(&db, &["--claim-per-group"]).await;
}
