//! `cm-scheduler run` through a pooler it cannot work through: Debian 12's PgBouncer 1.18 in
//! transaction mode, which loses prepared statements between transactions and drops the
//! settings cm sends at connect. The scheduler refuses to start, exit status 1, with one line
//! naming the fix, rather than failing every tick.
//!
//! `CM_TEST_PGBOUNCER_118_URL` names that PgBouncer (`.ci/pgbouncer --debian-1.18` prints it),
//! forwarding every database name to the server the tests' databases live on. Ignored unless
//! asked for (`cargo xtask test` runs it where the variable is set).

use std::process::Stdio;
use std::time::Duration;

use crate::support::{TestDb, cm_scheduler};

/// `url` with its database part replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
    format!("{base}/{database}")
}

/// Runs `cm-scheduler [--pooled] run` on `url` and returns its exit code and the last line it
/// wrote to stderr.
async fn run(url: &str, pooled: bool) -> (Option<i32>, String) {
    let mut c = cm_scheduler();
    c.args(["--database-url", url]);
    if pooled {
        c.arg("--pooled");
    }
    c.arg("run")
        .env_remove("CM_DATABASE_POOLED")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || c.output().expect("running cm-scheduler run")),
    )
    .await
    .expect("cm-scheduler run did not refuse within a minute")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
    (out.status.code(), last.to_string())
}

#[tokio::test]
#[ignore = "needs PgBouncer 1.18: start it with .ci/pgbouncer --debian-1.18 and set CM_TEST_PGBOUNCER_118_URL to what it prints"]
async fn run_refuses_pgbouncer_1_18_at_start_in_one_line() {
    let pooler = std::env::var("CM_TEST_PGBOUNCER_118_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .expect("CM_TEST_PGBOUNCER_118_URL is not set: start it with .ci/pgbouncer --debian-1.18");
    let db = TestDb::new().await;
    let url = with_database(&pooler, &db.name);

    // With its settings sent in each transaction, cm meets the prepared statements 1.18 loses.
    let (code, line) = run(&url, true).await;
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with(
            "cm-scheduler: the database URL goes through a pooler that loses prepared \
             statements between transactions ("
        ),
        "{line}"
    );
    assert!(
        line.ends_with(
            "use PgBouncer 1.21 or later with max_prepared_statements = 200 (its default from \
             1.25), or pool_mode = session"
        ),
        "{line}"
    );

    // Without --pooled, 1.18 drops the settings sent at connect (it is told to ignore them, or
    // sqlx could not connect at all): refused too, naming --pooled.
    let (code, line) = run(&url, false).await;
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with("cm-scheduler: the settings cm sends at connect did not arrive"),
        "{line}"
    );
    assert!(line.contains("--pooled"), "{line}");

    // Nothing was claimed: the scheduler never ticked.
    let fires: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(fires, 0);
}
