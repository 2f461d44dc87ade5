//! `--citus-url`: the bench's databases on a Citus cluster. Each is made a Citus database on every
//! node by `.ci/citus --database NAME` (created on the coordinator and the workers, the extension
//! in each, the workers registered in it); the engine's is then migrated and distributed by
//! `cm-scheduler migrate --citus`. At the end each is dropped on every node.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::{Connection, PgConnection};

use crate::chaos::scheduler_output;

/// The `.ci/citus` of this checkout.
fn script() -> std::path::PathBuf {
    crate::workspace_root().join(".ci/citus")
}

/// The host and port a URL names.
fn address(url: &str) -> anyhow::Result<(String, u16)> {
    let parsed = url::Url::parse(url).with_context(|| format!("invalid URL {url:?}"))?;
    Ok((
        parsed.host_str().unwrap_or("localhost").to_string(),
        parsed.port().unwrap_or(5432),
    ))
}

/// Makes `name` a Citus database on every node of the cluster `.ci/citus` runs, which must be the
/// one whose coordinator `coordinator` names, and returns its URL.
pub(super) fn create_database(coordinator: &str, name: &str) -> anyhow::Result<String> {
    let out = Command::new(script())
        .args(["--database", name])
        .stdin(Stdio::null())
        .env_remove("DATABASE_URL")
        .output()
        .with_context(|| format!("running {}", script().display()))?;
    if !out.status.success() {
        bail!(
            ".ci/citus --database {name} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if address(&url)? != address(coordinator)? {
        bail!(
            ".ci/citus made {name} on the coordinator {url}, not on --citus-url {coordinator}: \
             the bench makes its Citus databases with .ci/citus, so --citus-url must name the \
             coordinator it runs"
        );
    }
    Ok(url)
}

/// Migrates the Citus database `url` and distributes its schema by group (`migrate --citus`).
pub(super) fn distribute(binary: &Path, url: &str) -> anyhow::Result<()> {
    scheduler_output(binary, url, &["migrate", "--citus"])?;
    Ok(())
}

/// The Citus version and the nodes of the cluster, for the report.
pub(super) async fn describe(url: &str) -> anyhow::Result<String> {
    let mut conn = PgConnection::connect(url).await?;
    let (version, citus, workers): (String, String, i64) = sqlx::query_as(
        "SELECT current_setting('server_version'),
                (SELECT extversion FROM pg_extension WHERE extname = 'citus'),
                (SELECT count(*) FROM pg_dist_node WHERE isactive AND groupid <> 0)",
    )
    .fetch_one(&mut conn)
    .await?;
    let shards: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'cm.routines'::regclass",
    )
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(format!(
        "PostgreSQL {version}, Citus {citus}: a coordinator and {workers} workers, each a \
         cluster of its own on this same machine; `routines` and the tables co-located with it \
         in {shards} shards"
    ))
}

/// The workers registered in the Citus database `url` (host and port each).
pub(super) async fn workers(url: &str) -> anyhow::Result<Vec<(String, i32)>> {
    let mut conn = PgConnection::connect(url).await?;
    let nodes = sqlx::query_as(
        "SELECT nodename::text, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport",
    )
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    Ok(nodes)
}

/// Drops the database `name` on every node: from the coordinator with Citus propagating the drop,
/// then on each of `workers` whatever is left (`.ci/citus` creates it on each node itself). The
/// coordinator's connections to the workers close a moment after the bench's own, so a refused
/// drop is tried again.
pub(super) async fn drop_database(
    coordinator: &str,
    name: &str,
    workers: &[(String, i32)],
) -> anyhow::Result<()> {
    let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    let mut admin = PgConnection::connect(coordinator)
        .await
        .with_context(|| format!("connecting to the Citus coordinator {coordinator}"))?;
    sqlx::query("SET citus.enable_create_database_propagation = on")
        .execute(&mut admin)
        .await?;
    retried(&mut admin, &drop).await?;
    admin.close().await?;
    for (host, port) in workers {
        let mut url = url::Url::parse(coordinator)?;
        url.set_host(Some(host))?;
        url.set_port(Some(u16::try_from(*port)?))
            .map_err(|()| anyhow::anyhow!("no port in {coordinator}"))?;
        let mut conn = PgConnection::connect(url.as_str())
            .await
            .with_context(|| format!("connecting to the Citus worker {host}:{port}"))?;
        retried(&mut conn, &drop).await?;
        conn.close().await?;
    }
    Ok(())
}

/// Runs `statement`, trying again for a few seconds while it is refused.
async fn retried(conn: &mut PgConnection, statement: &str) -> anyhow::Result<()> {
    let mut tries = 0;
    loop {
        match sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if tries >= 20 => return Err(e).context(statement.to_string()),
            Err(_) => tries += 1,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_compare_host_and_port_only() {
        assert_eq!(
            address("postgres://postgres@127.0.0.1:5471/cm_bench_x").unwrap(),
            ("127.0.0.1".to_string(), 5471)
        );
        assert_eq!(
            address("postgres://postgres@127.0.0.1:5471/postgres").unwrap(),
            address("postgres://other@127.0.0.1:5471/cm_bench_x").unwrap()
        );
        assert_eq!(address("postgres://h/x").unwrap().1, 5432);
        assert!(address("not a url").is_err());
    }
}
