//! Helpers the whole-process tests share: the server their databases live on, and a fresh
//! database per test, dropped when the test ends.

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool};
use uuid::Uuid;

/// The PostgreSQL server the tests create their own databases on.
pub const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

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
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cm-scheduler"))
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

/// Polls `probe` every 50 ms until it answers, for at most `patience`.
pub async fn eventually_within<T>(
    patience: std::time::Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        if let Some(found) = probe().await {
            return Some(found);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
