//! `--citus-workers`: the run on a Citus cluster. The chaos database is created on the
//! coordinator and on every worker, with the `citus` extension in each, and the workers are
//! registered with the coordinator in it (as `.ci/citus --database` does); the schedulers then
//! migrate it with `migrate --citus`, which distributes the schema by `group_id`. At the end the
//! database is dropped on every node.

use anyhow::Context;
use sqlx::migrate::MigrateDatabase;
use sqlx::{Connection, PgConnection};

use crate::chaos::postgres::Cluster;
use crate::database_url;

/// The worker clusters `names` give (`VERSION/NAME` each).
pub(super) fn workers(names: &[String]) -> anyhow::Result<Vec<Cluster>> {
    names.iter().map(|name| Cluster::named(name)).collect()
}

/// The database `db_name` on the worker `worker` of the coordinator `server_url`.
fn worker_url(server_url: &str, worker: &Cluster, db_name: &str) -> anyhow::Result<String> {
    database_url(&worker.url(server_url)?, db_name)
}

async fn execute(url: &str, statements: &[String]) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    for statement in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut conn)
            .await
            .with_context(|| format!("{statement} on {url}"))?;
    }
    conn.close().await?;
    Ok(())
}

/// Makes `db_name`, already created on the coordinator `server_url`, a Citus database on every
/// node: created on each worker, the extension in each, the workers registered.
pub(super) fn prepare(
    rt: &tokio::runtime::Runtime,
    server_url: &str,
    db_name: &str,
    workers: &[Cluster],
) -> anyhow::Result<()> {
    let host = url::Url::parse(server_url)?
        .host_str()
        .unwrap_or("127.0.0.1")
        .to_string();
    let coordinator_port = url::Url::parse(server_url)?.port().unwrap_or(5432);
    rt.block_on(async {
        let extension = ["CREATE EXTENSION IF NOT EXISTS citus".to_string()];
        for worker in workers {
            let url = worker_url(server_url, worker, db_name)?;
            sqlx::Postgres::create_database(&url)
                .await
                .with_context(|| format!("creating {db_name} on worker {worker}"))?;
            execute(&url, &extension).await?;
        }
        let mut statements = extension.to_vec();
        statements.push(format!(
            "SELECT citus_set_coordinator_host('{host}', {coordinator_port})"
        ));
        for worker in workers {
            statements.push(format!("SELECT citus_add_node('{host}', {})", worker.port));
        }
        execute(&database_url(server_url, db_name)?, &statements).await
    })
}

/// Resolves the two-phase commits left prepared on the workers of the Citus database at `url`
/// (the coordinator's): each is committed when the coordinator recorded its commit, rolled back
/// when it did not. Returns how many there were. Retried for a few seconds while the coordinator
/// cannot reach a worker yet.
pub(super) fn recover(rt: &tokio::runtime::Runtime, url: &str) -> anyhow::Result<i64> {
    rt.block_on(async {
        let mut last = None;
        for _ in 0..20 {
            let attempt = async {
                let mut conn = PgConnection::connect(url).await?;
                let n: i32 = sqlx::query_scalar("SELECT recover_prepared_transactions()")
                    .fetch_one(&mut conn)
                    .await?;
                conn.close().await?;
                Ok::<_, sqlx::Error>(i64::from(n))
            };
            match attempt.await {
                Ok(n) => return Ok(n),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        Err(anyhow::Error::from(last.expect("an attempt was made")))
            .with_context(|| format!("recover_prepared_transactions() on {url}"))
    })
}

/// Drops `db_name` on every worker (the coordinator's copy is dropped as on plain PostgreSQL).
pub(super) fn drop_on_workers(
    rt: &tokio::runtime::Runtime,
    server_url: &str,
    db_name: &str,
    workers: &[Cluster],
) -> anyhow::Result<()> {
    for worker in workers {
        let url = worker_url(server_url, worker, db_name)?;
        rt.block_on(async {
            // A transaction still prepared there (its coordinator's database is gone, so no
            // recovery will resolve it) would keep the database from being dropped.
            let mut conn = PgConnection::connect(&url).await?;
            let prepared: Vec<String> = sqlx::query_scalar(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
            )
            .fetch_all(&mut conn)
            .await?;
            for gid in prepared {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "ROLLBACK PREPARED '{}'",
                    gid.replace('\'', "''")
                )))
                .execute(&mut conn)
                .await?;
            }
            conn.close().await?;
            sqlx::Postgres::force_drop_database(&url).await
        })
        .with_context(|| format!("dropping {db_name} on worker {worker}"))?;
    }
    Ok(())
}

/// The tables the checks read, copied once the schedulers are stopped.
const CHECKED_TABLES: [&str; 4] = [
    "routines",
    "routine_fires",
    "outbox_messages",
    "routine_events",
];

/// A pool on the chaos database at `url` that reads coordinator-local copies of the ledger
/// tables, made now that nothing writes them: the checks join the ledger with arrays and with
/// itself on keys without `group_id`, which Citus refuses on distributed tables, and they are
/// about what was written, not about how. The checks name cm's tables with their schema
/// (`cm.routine_fires`), so the copies are made in `chaos_check` and the schemas then swap
/// names: `cm` holds the copies, `cm_distributed` the distributed tables. The database is
/// dropped after the run.
pub(super) fn checking_pool(
    rt: &tokio::runtime::Runtime,
    url: &str,
) -> anyhow::Result<sqlx::PgPool> {
    let mut statements = vec!["CREATE SCHEMA IF NOT EXISTS chaos_check".to_string()];
    for table in CHECKED_TABLES {
        statements.push(format!(
            "CREATE TABLE chaos_check.{table} AS SELECT * FROM cm.{table}"
        ));
    }
    statements.push("ALTER SCHEMA cm RENAME TO cm_distributed".to_string());
    statements.push("ALTER SCHEMA chaos_check RENAME TO cm".to_string());
    rt.block_on(execute(url, &statements))?;
    let options = url
        .parse::<sqlx::postgres::PgConnectOptions>()?
        .application_name(crate::chaos::fault::OWN_APPLICATION);
    Ok(rt.block_on(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options),
    )?)
}
