//! Helpers the whole-process tests share: the server their databases live on, a fresh database
//! per test (dropped when the test ends), the binary as a command that reaches no other
//! database, and waiting for a state instead of sleeping.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use cm_dispatch::fakes::wait::gave_up;
pub use cm_dispatch::fakes::wait::{PATIENCE, poll, wait_until};
use cm_domain::Schedule;
use cm_store::{NewRoutine, RoutineKind};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool};
use uuid::Uuid;

/// The PostgreSQL server the tests create their own databases on.
pub const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

/// The `cm-scheduler` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_cm-scheduler");

/// A database URL where nothing answers (port 1 of the loopback): what a command that must not
/// reach a database is given.
pub const NOWHERE: &str = "postgres://postgres@127.0.0.1:1/x";

/// The binary as a command that can reach no database the test did not name.
///
/// Its `DATABASE_URL` is [`NOWHERE`] and `DATABASE_URL_FILE` is unset, whatever the test's own
/// environment holds (cargo's `[env]` sets `DATABASE_URL` for the tests): a command given no
/// `--database-url` fails to connect instead of falling back to the binary's default,
/// `postgres://postgres@127.0.0.1:5432/cm`, which is a developer's own database. A test that
/// names its database another way (`--database-url-file`, `DATABASE_URL_FILE`) removes
/// `DATABASE_URL` itself, and then gives the file.
pub fn cm_scheduler() -> std::process::Command {
    let mut command = std::process::Command::new(BIN);
    command
        .env("DATABASE_URL", NOWHERE)
        .env_remove("DATABASE_URL_FILE");
    command
}

/// `cm-scheduler --database-url url run args`, its output discarded: a scheduler the test
/// stops itself.
pub fn run_quietly(url: &str, args: &[&str]) -> std::process::Child {
    cm_scheduler()
        .args(["--database-url", url, "run"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting cm-scheduler run")
}

/// Drops the database `name`, best effort, on a thread of its own: a `Drop` cannot await, and
/// the test's runtime may be the one running it.
pub fn drop_database(name: &str) {
    let name = name.to_owned();
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async {
            let mut conn = PgConnection::connect(&format!("{SERVER}/postgres"))
                .await
                .ok()?;
            // The name is the test's own `cm_test_<uuid>`, never input.
            sqlx::query(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await
            .ok()
        })
    })
    .join();
}

/// A fresh database with the schema, dropped when the test ends (also when it panics). Each test
/// module adds the helpers it needs in an `impl TestDb` block of its own.
pub struct TestDb {
    /// The database's name, `cm_test_<uuid>`.
    pub name: String,
    /// Its URL, for the binary's `--database-url`.
    pub url: String,
    /// A small pool on it, for the test's own checks.
    pub pool: PgPool,
}

impl TestDb {
    /// Creates the database and its schema with the binary's own `migrate`, which creates a
    /// missing database: that is part of the contract too.
    pub async fn new() -> TestDb {
        let name = format!("cm_test_{}", Uuid::new_v4().simple());
        let url = format!("{SERVER}/{name}");
        let out = cm_scheduler()
            .args(["--database-url", &url, "migrate"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("running cm-scheduler migrate");
        assert!(
            out.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("connecting to the test database");
        TestDb { name, url, pool }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        drop_database(&self.name);
    }
}

/// How often a blocking wait looks again (`poll` looks every 50 ms too).
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// [`poll`] for a test that waits on its own thread, not on a runtime.
pub fn poll_blocking<T>(
    patience: Duration,
    mut look: impl FnMut() -> T,
    holds: impl Fn(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + patience;
    loop {
        let seen = look();
        if holds(&seen) {
            return Ok(seen);
        }
        if Instant::now() >= deadline {
            return Err(seen);
        }
        std::thread::sleep(LOOK_EVERY);
    }
}

/// [`wait_until`] for a test that waits on its own thread, not on a runtime.
pub fn wait_until_blocking<T: Debug>(
    what: &str,
    patience: Duration,
    look: impl FnMut() -> T,
    holds: impl Fn(&T) -> bool,
) -> T {
    poll_blocking(patience, look, holds)
        .unwrap_or_else(|last| panic!("{}", gave_up(what, patience, last)))
}

/// Polls `probe` every 50 ms until it answers, for at most `patience`.
pub async fn eventually_within<T>(
    patience: Duration,
    probe: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    poll(patience, probe, Option::is_some).await.ok().flatten()
}

/// A routine to create: `name`, on `cron` in `zone`, of `kind` with `payload`; misfires fire
/// once, the default overlap, not paused, no run limit. A test that needs another setting says
/// only that one (`new_routine(..).into_builder().paused(true).build().unwrap()`).
pub fn new_routine(
    name: impl Into<String>,
    cron: &str,
    zone: &str,
    kind: RoutineKind,
    payload: serde_json::Value,
) -> NewRoutine {
    NewRoutine::builder(name, Schedule::parse(cron, zone).unwrap(), kind, payload)
        .build()
        .unwrap()
}

/// Starts `command` (a `cm-scheduler run`) with `env` added and `RUST_LOG=info,sqlx=warn`, its
/// output going to the file `log`: a pipe nobody drains would block the process once full.
pub fn spawn_logged(
    command: &mut std::process::Command,
    env: &[(&str, &str)],
    log: &std::path::Path,
) -> std::process::Child {
    let file = std::fs::File::create(log).expect("creating the scheduler's log file");
    command
        .envs(env.iter().copied())
        .env("RUST_LOG", "info,sqlx=warn")
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().expect("sharing the log file"))
        .stderr(file)
        .spawn()
        .expect("starting cm-scheduler run")
}

/// Ends a scheduler process the test started, if it still runs, and removes its log file unless
/// the test is failing: a failing test keeps the log for whoever reads its output.
pub fn end_scheduler(child: &mut std::process::Child, log: &std::path::Path) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
        let _ = child.wait();
    }
    if !std::thread::panicking() {
        let _ = std::fs::remove_file(log);
    }
}

/// An HTTP/1.1 answer read to its end: the status code (0 when there is none) and the body.
pub fn status_and_body(response: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(response);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// No test starts the binary but through [`cm_scheduler`]: a command built another way would
/// inherit the test's `DATABASE_URL`, or fall back to the binary's default database.
#[test]
fn every_test_starts_the_binary_through_cm_scheduler() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scheduler");
    let mut elsewhere = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "support.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for needle in ["CARGO_BIN_EXE", "Command::new(BIN"] {
            if text.contains(needle) {
                elsewhere.push(format!("{}: {needle}", path.display()));
            }
        }
    }
    assert!(elsewhere.is_empty(), "{elsewhere:#?}");
}
