//! Helpers the whole-process tests share: the server their databases live on, and dropping a
//! test's database when it ends.

use sqlx::{AssertSqlSafe, Connection as _, PgConnection};

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
