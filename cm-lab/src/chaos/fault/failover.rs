//! `--failover sync|async --standby-cluster VERSION/NAME`: the chaos database's cluster gets
//! a streaming replica on this machine, and half way into the run the primary is killed
//! (`stop -m immediate`), the standby promoted and the forwarder switched to it.
//!
//! Before the schedulers start, the standby cluster (created beforehand with
//! `pg_createcluster`, trust authentication for replication on 127.0.0.1) is rebuilt with
//! `pg_basebackup -R` from the primary, and the primary's `synchronous_standby_names` set to
//! `'*'` (sync) or reset (async). With synchronous replication nothing committed is lost, so
//! the check must find nothing sent again; with asynchronous replication the claims the
//! standby never received are lost with the clock moves they carried, and those occurrences
//! fire again on the new primary under the same idempotency key (the webhook check counts and
//! allows these refires, and only then).
//!
//! After the run, [`restore`] puts the machine back: the promoted standby stopped, the
//! primary started with its replication setting reset, the chaos database dropped there too.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use sqlx::postgres::PgPoolOptions;

use super::{Chaos, Fault};
use crate::chaos::options::Replication;
use crate::chaos::postgres::{self, Cluster};
use crate::chaos::report::Findings;

/// How long the standby may take to stream, and then to leave recovery.
const STANDBY_WAIT: Duration = Duration::from_secs(60);

/// Rebuilds `standby` from `primary` and waits until it streams (in sync mode, as the
/// synchronous standby). `primary_url` is a URL of the primary's server.
pub(in crate::chaos) fn prepare(
    rt: &tokio::runtime::Runtime,
    primary: &Cluster,
    standby: &Cluster,
    mode: Replication,
    primary_url: &str,
) -> anyhow::Result<()> {
    if primary == standby {
        bail!("--standby-cluster must be another cluster than the primary {primary}");
    }
    let pool = rt.block_on(PgPoolOptions::new().max_connections(1).connect(primary_url))?;
    let setting = match mode {
        Replication::Sync => "ALTER SYSTEM SET synchronous_standby_names = '*'",
        Replication::Async => "ALTER SYSTEM RESET synchronous_standby_names",
    };
    rt.block_on(async {
        sqlx::query(setting).execute(&pool).await?;
        sqlx::query("SELECT pg_reload_conf()").execute(&pool).await
    })?;
    // It may be down already (left so by the last failover).
    let _ = standby.ctl("stop", &["-m", "immediate"]);
    let data = standby.data_directory()?;
    std::fs::remove_dir_all(&data).with_context(|| format!("emptying {data}"))?;
    crate::run({
        let mut c = Command::new("pg_basebackup");
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-D", &data, "-R", "-X", "stream", "-c", "fast"]);
        c
    })?;
    // The copy carries the primary's ALTER SYSTEM settings; a promoted standby that waited for
    // a synchronous standby of its own would never commit again.
    let auto = format!("{data}/postgresql.auto.conf");
    let text = std::fs::read_to_string(&auto).with_context(|| format!("reading {auto}"))?;
    let kept: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("synchronous_standby_names"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&auto, kept)?;
    crate::run({
        let mut c = Command::new("chown");
        c.args(["-R", "postgres:postgres", &data]);
        c
    })?;
    standby.ctl("start", &[])?;
    let wanted = match mode {
        Replication::Sync => "sync",
        Replication::Async => "async",
    };
    let began = Instant::now();
    loop {
        let state: Option<String> = rt.block_on(
            sqlx::query_scalar(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming' LIMIT 1",
            )
            .fetch_optional(&pool),
        )?;
        if state.as_deref() == Some(wanted) {
            break;
        }
        if began.elapsed() > STANDBY_WAIT {
            bail!(
                "the standby {standby} did not stream as {wanted} within {STANDBY_WAIT:?} (state {state:?})"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    rt.block_on(pool.close());
    eprintln!("chaos: standby {standby} streams from {primary} ({wanted})");
    Ok(())
}

/// Puts the clusters back after a failover run: the promoted standby stopped, the primary
/// running with its replication setting reset and without the chaos database `database`.
pub(in crate::chaos) fn restore(
    primary: &Cluster,
    standby: &Cluster,
    primary_url: &str,
    database: &str,
) -> anyhow::Result<()> {
    let _ = standby.ctl("stop", &["-m", "fast"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if postgres::wait_for(&rt, primary_url, Duration::from_secs(1)).is_err() {
        primary.start()?;
    }
    postgres::wait_for(&rt, primary_url, Duration::from_secs(30))?;
    let pool = rt.block_on(PgPoolOptions::new().max_connections(1).connect(primary_url))?;
    rt.block_on(async {
        sqlx::query("ALTER SYSTEM RESET synchronous_standby_names")
            .execute(&pool)
            .await?;
        sqlx::query("SELECT pg_reload_conf()").execute(&pool).await
    })?;
    rt.block_on(pool.close());
    use sqlx::migrate::MigrateDatabase as _;
    let stale = crate::database_url(primary_url, database)?;
    rt.block_on(sqlx::Postgres::force_drop_database(&stale))?;
    Ok(())
}

pub(in crate::chaos) struct Failover {
    primary: Cluster,
    standby: Cluster,
    mode: Replication,
    at: Instant,
    done: bool,
    /// Bytes the standby had not replayed when the primary was killed.
    replay_lag: Option<i64>,
    /// From the kill to the forwarder sending to the promoted standby.
    switch_took: Option<Duration>,
    killed_after: Option<Duration>,
}

impl Failover {
    pub fn new(
        primary: Cluster,
        standby: Cluster,
        mode: Replication,
        start: Instant,
        duration: Duration,
    ) -> Self {
        Failover {
            primary,
            standby,
            mode,
            at: start + duration / 2,
            done: false,
            replay_lag: None,
            switch_took: None,
            killed_after: None,
        }
    }
}

impl Fault for Failover {
    fn next_at(&self) -> Option<Instant> {
        (!self.done).then_some(self.at)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        self.done = true;
        self.replay_lag = chaos
            .rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))::bigint
                     FROM pg_stat_replication",
                )
                .fetch_one(&chaos.pool),
            )
            .ok()
            .flatten();
        let killed = Instant::now();
        self.killed_after = Some(killed - chaos.start);
        self.primary.ctl("stop", &["-m", "immediate"])?;
        chaos.say(format!("the primary {} is killed", self.primary));
        self.standby.ctl("promote", &[])?;
        let standby_url = self.standby.url(&chaos.server_url)?;
        let database_url = crate::database_url(&standby_url, &chaos.database)?;
        let pool = crate::chaos::own_pool(chaos.rt, &database_url)?;
        loop {
            let in_recovery: bool = chaos
                .rt
                .block_on(sqlx::query_scalar("SELECT pg_is_in_recovery()").fetch_one(&pool))?;
            if !in_recovery {
                break;
            }
            if killed.elapsed() > STANDBY_WAIT {
                bail!("the standby {} did not leave recovery", self.standby);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let target = SocketAddr::from(([127, 0, 0, 1], self.standby.port));
        chaos
            .forwarder
            .as_ref()
            .expect("a failover runs behind the forwarder")
            .switch(target);
        chaos.failover_at = Some(Utc::now());
        self.switch_took = Some(killed.elapsed());
        chaos.say(format!(
            "the standby {} is promoted; the forwarder sends to it ({:.1?} after the kill)",
            self.standby,
            killed.elapsed()
        ));
        // Dropped, not closed: closing waits on connections to a server that is gone.
        drop(std::mem::replace(&mut chaos.pool, pool));
        chaos.server_url = standby_url;
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::one(
            "failover",
            format!(
                "{} replication, {} to {}: primary killed at {}; new primary forwarded to {} after the kill; standby {} behind at the kill",
                match self.mode {
                    Replication::Sync => "synchronous",
                    Replication::Async => "asynchronous",
                },
                self.primary,
                self.standby,
                self.killed_after
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                self.switch_took
                    .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                self.replay_lag
                    .map_or("?".into(), |b| format!("{b} bytes of WAL"))
            ),
        );
        f.require(!self.done, || "the failover never happened".to_string());
        f
    }
}
