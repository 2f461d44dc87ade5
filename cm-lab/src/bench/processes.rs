//! Throughput of the real binary: two `cm-scheduler run` processes on the bench database, a
//! backlog put on every-second routines at one instant once both are ready, and the rate read back
//! from the ledger, which is then checked so a fast number cannot come from lost fires.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Options;
use super::ledger::{self, LedgerCheck};
use crate::chaos::{log_tail, scheduler_command};

/// How long a process may take to answer `/readyz` with 200 (migrations, first tick).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the processes may take to divide the groups between them on Citus: each rebalances
/// its group leases every third of a lease (`--lease`, 60 s in the bench), and a share moves from
/// one to the other over two rebalances.
const SHARE_TIMEOUT: Duration = Duration::from_secs(150);

/// How long a process may take to exit after SIGTERM: it settles what it has in flight, each
/// dispatch bounded by the 30 s dispatch timeout.
const SIGTERM_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds the release `cm-scheduler` and returns its path (under `CARGO_TARGET_DIR` when set).
pub(crate) fn build_binary() -> anyhow::Result<PathBuf> {
    crate::run({
        let mut c = crate::cargo();
        c.args(["build", "--quiet", "--release", "--package", "cm-scheduler"]);
        c
    })?;
    let binary = crate::target_dir().join("release/cm-scheduler");
    if !binary.is_file() {
        bail!("the build left no binary at {}", binary.display());
    }
    Ok(binary)
}

/// The two kinds of throughput run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// A backlog the engine can finish: the rate until no occurrence older than a second is owed.
    Drain,
    /// More routines than any engine drains: the rate over a fixed window.
    Window,
}

impl Shape {
    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Drain => "engine, 2 processes, drain",
            Shape::Window => "engine, 2 processes, window",
        }
    }
}

/// What one throughput run of the processes measured.
#[derive(Debug, Clone)]
pub(super) struct EngineRun {
    /// Every-second routines.
    pub routines: u32,
    /// Seconds their clocks were put back.
    pub backlog: u32,
    /// Fires settled `fired` between the backlog's instant and the end of the measurement.
    pub fired: i64,
    /// The claims those fires came in (their distinct claim tokens).
    pub claims: i64,
    /// That span, on the database's clock, from the moment the clocks' update was done.
    pub elapsed: Duration,
    /// How long the update putting the clocks back took (not in `elapsed`: no scheduler could
    /// see the backlog while it ran).
    pub clocks_update: Duration,
    /// For a drain: whether it finished within its limit (if not, `fired` and `elapsed` cover
    /// the limit, and the rate is still a rate).
    pub drained: Option<bool>,
    /// Fires per process, for the whole run (after the measurement too, until SIGTERM).
    pub by_process: Vec<i64>,
    /// The ledger afterwards (already checked sound).
    pub ledger: LedgerCheck,
}

impl EngineRun {
    /// Fires per second.
    pub fn rate(&self) -> f64 {
        self.fired as f64 / self.elapsed.as_secs_f64()
    }

    /// Fires per claim.
    pub fn per_claim(&self) -> f64 {
        self.fired as f64 / self.claims as f64
    }
}

/// One scheduler process and its log.
struct Process {
    child: Child,
    log: PathBuf,
    port: u16,
}

/// The processes of one run. Dropping it kills what still runs, so an error anywhere leaves no
/// scheduler behind.
pub(crate) struct Fleet(Vec<Process>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.0 {
            if matches!(p.child.try_wait(), Ok(None)) {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

impl Fleet {
    /// Starts `cm-scheduler run` as `bench-a` and `bench-b`, each serving health on a free port.
    fn start(
        binary: &Path,
        url: &str,
        flags: &[String],
        log_dir: &Path,
        label: &str,
    ) -> anyhow::Result<Fleet> {
        Fleet::start_named(binary, url, flags, log_dir, label, &["bench-a", "bench-b"])
    }

    /// Starts one `cm-scheduler run` per name (its instance id), each serving health on a free
    /// port, logging to `<label>-<name>.log` in `log_dir`.
    pub(crate) fn start_named(
        binary: &Path,
        url: &str,
        flags: &[String],
        log_dir: &Path,
        label: &str,
        names: &[&str],
    ) -> anyhow::Result<Fleet> {
        let mut fleet = Fleet(Vec::new());
        for &name in names {
            let port = free_port()?;
            let log = log_dir.join(format!("{label}-{name}.log"));
            let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
            // The binary's own default logging, as a user running it gets: `scheduler_command`
            // turns on each fire's line (`RUST_LOG=info`) for chaos's log digest, a write of
            // about 200 bytes a fire that `run` at its defaults does not make.
            let child = scheduler_command(binary, url)
                .env_remove("RUST_LOG")
                .args(["run", "--instance-id", name])
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .args(flags)
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            fleet.0.push(Process { child, log, port });
        }
        Ok(fleet)
    }

    /// Waits until every process answers `/readyz` with 200 (it has ticked successfully).
    pub(crate) fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        for p in &mut self.0 {
            loop {
                p.alive()?;
                if readyz(p.port) {
                    break;
                }
                if started.elapsed() > READY_TIMEOUT {
                    bail!(
                        "a scheduler was not ready after {READY_TIMEOUT:?}; its log ({}) ends:\n{}",
                        p.log.display(),
                        log_tail(&p.log, 8)
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The processes' ids, in the order they were started.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.0.iter().map(|p| p.child.id()).collect()
    }

    /// Fails if a process has exited.
    pub(crate) fn alive(&mut self) -> anyhow::Result<()> {
        self.0.iter_mut().try_for_each(Process::alive)
    }

    /// Sends SIGTERM to every process and fails unless each exits 0 in time.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        for p in &self.0 {
            crate::run({
                let mut c = Command::new("kill");
                c.args(["-TERM", &p.child.id().to_string()]);
                c
            })?;
        }
        let signalled = Instant::now();
        for p in &mut self.0 {
            let status = loop {
                if let Some(status) = p.child.try_wait()? {
                    break status;
                }
                if signalled.elapsed() > SIGTERM_TIMEOUT {
                    bail!(
                        "a scheduler did not exit within {SIGTERM_TIMEOUT:?} of SIGTERM; its log \
                         ({}) ends:\n{}",
                        p.log.display(),
                        log_tail(&p.log, 8)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if !status.success() {
                bail!(
                    "a scheduler exited with {status} on SIGTERM; its log ({}) ends:\n{}",
                    p.log.display(),
                    log_tail(&p.log, 8)
                );
            }
        }
        self.0.clear();
        Ok(())
    }
}

impl Process {
    fn alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "a scheduler exited on its own with {status}; its log ({}) ends:\n{}",
                self.log.display(),
                log_tail(&self.log, 8)
            );
        }
        Ok(())
    }
}

/// A port nothing listens on now (the process binds it a moment later).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Whether `GET /readyz` on the port answers 200.
fn readyz(port: u16) -> bool {
    let answer = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    answer().is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
}

/// One throughput run: `routines` every-second routines parked, two processes started and ready,
/// every clock put back `backlog` seconds in one statement, the rate measured from the moment
/// that statement was done (until drained, or over the window), the processes stopped with
/// SIGTERM, the ledger checked.
pub(super) async fn run(
    pool: &PgPool,
    binary: &Path,
    url: &str,
    options: &Options,
    shape: Shape,
    log_dir: &Path,
    label: &str,
) -> anyhow::Result<EngineRun> {
    let (routines, backlog) = match shape {
        Shape::Drain => (options.drain_routines, options.drain_backlog),
        Shape::Window => (options.window_routines, options.window_backlog),
    };
    ledger::reset(pool).await?;
    // Parked a day ahead: nothing is due while the processes start.
    ledger::create_routines(pool, routines, 24 * 3600).await?;
    let mut fleet = Fleet::start(binary, url, &options.run_flags(), log_dir, label)?;
    tokio::task::block_in_place(|| fleet.wait_ready())?;
    wait_for_shared_groups(pool, &mut fleet).await?;

    let clocks = ledger::put_clocks_back(pool, backlog).await?;
    let (start, from) = (clocks.start, clocks.done);
    let (to, drained) = match shape {
        Shape::Drain => {
            let (to, drained) = drain(pool, &mut fleet, options.drain_limit, from).await?;
            (to, Some(drained))
        }
        Shape::Window => {
            let window = Duration::from_secs(options.window_seconds.into());
            let until = tokio::time::Instant::now() + window;
            while tokio::time::Instant::now() < until {
                fleet.alive()?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (from + window, None)
        }
    };
    let (fired, claims) = ledger::fired_between(pool, from, to).await?;
    tokio::task::block_in_place(|| fleet.stop())?;

    let check = ledger::check(pool, start, true).await?;
    check.ensure_sound(label)?;
    Ok(EngineRun {
        routines,
        backlog,
        fired,
        claims,
        elapsed: (to - from)
            .to_std()
            .context("the run ended before it began")?,
        drained,
        clocks_update: (clocks.done - clocks.began).to_std().unwrap_or_default(),
        by_process: ledger::fires_by_claimant(pool).await?,
        ledger: check,
    })
}

/// On Citus, where the schedulers claim only in the groups they lease (and in free ones), waits
/// until every process holds its share of the groups, as in a deployment that has run a while: a
/// process that has just started holds none until the others release theirs. On plain
/// PostgreSQL, where a claim walks every group whoever leases it, returns at once.
async fn wait_for_shared_groups(pool: &PgPool, fleet: &mut Fleet) -> anyhow::Result<()> {
    let citus: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(pool)
            .await?;
    if !citus {
        return Ok(());
    }
    let processes = i64::try_from(fleet.pids().len())?;
    let started = tokio::time::Instant::now();
    loop {
        fleet.alive()?;
        let (holders, fewest, groups): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), coalesce(min(n), 0), (SELECT group_count::bigint FROM cm.cm_settings)
             FROM (SELECT count(*) AS n FROM cm.group_leases WHERE expires_at > now()
                   GROUP BY holder) held",
        )
        .fetch_one(pool)
        .await?;
        if holders == processes && fewest >= groups / processes {
            return Ok(());
        }
        if started.elapsed() > SHARE_TIMEOUT {
            bail!(
                "the schedulers did not divide the {groups} groups within {SHARE_TIMEOUT:?}: \
                 {holders} hold leases, the fewest {fewest}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Polls until no occurrence older than a second is owed (no routine's clock and no `claimed`
/// row that old), or until `limit` seconds have passed. Returns the end of the drain and whether
/// the backlog drained. A drain ends when the last fire it waited for settled (the latest
/// `completed_at` of an occurrence more than a second older than the poll that saw it done), not
/// at that poll: the poll comes every 100 ms, which would add up to a fifth to a drain of half a
/// second.
async fn drain(
    pool: &PgPool,
    fleet: &mut Fleet,
    limit: u32,
    from: DateTime<Utc>,
) -> anyhow::Result<(DateTime<Utc>, bool)> {
    let limit_at = from + chrono::TimeDelta::seconds(limit.into());
    loop {
        fleet.alive()?;
        let began = tokio::time::Instant::now();
        // Whether anything is owed, not how much: a count walked every routine behind (all of
        // them, through a table the drain bloats) at each poll, about 230 ms of server time a
        // poll taken from the schedulers it measures, where EXISTS stops at the first. Each
        // subquery selects a column: Citus refuses one with none on a distributed table ("a
        // column definition list is required for functions returning record").
        let (now, owed): (DateTime<Utc>, bool) = sqlx::query_as(
            "SELECT now(),
                    EXISTS (SELECT 1 FROM cm.routines WHERE next_run_at < now() - interval '1 s')
                 OR EXISTS (SELECT 1 FROM cm.routine_fires
                            WHERE status = 'claimed' AND scheduled_at < now() - interval '1 s')",
        )
        .fetch_one(pool)
        .await?;
        if !owed {
            let last: Option<DateTime<Utc>> = sqlx::query_scalar(
                "SELECT max(completed_at) FROM cm.routine_fires
                 WHERE status = 'fired' AND completed_at > $1
                   AND scheduled_at < $2 - interval '1 s'",
            )
            .bind(from)
            .bind(now)
            .fetch_one(pool)
            .await?;
            return Ok((last.unwrap_or(now), true));
        }
        if now >= limit_at {
            return Ok((limit_at, false));
        }
        tokio::time::sleep(poll_pause(began.elapsed())).await;
    }
}

/// How long the drain's poll waits after a poll that took `took`: 100 ms, or nine times the
/// poll, whichever is longer, so the poll has at most a tenth of one connection's time. On plain
/// PostgreSQL a poll takes about a millisecond. On Citus each `EXISTS` asks every shard: about
/// 180 ms a poll during a drain; every 100 ms, a poll was running for about two thirds of the
/// drain (docs/BENCHMARKS.md, "The drain's poll on Citus", where the longer pause changed no
/// rate beyond the runs' spread). The drain's end is its last fire's `completed_at`, not the
/// poll's time, so a longer pause changes when the end is seen, not the rate.
fn poll_pause(took: Duration) -> Duration {
    Duration::from_millis(100).max(took.saturating_mul(9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_poll_pauses_100_ms_after_a_quick_poll_and_nine_times_a_slow_one() {
        assert_eq!(
            poll_pause(Duration::from_millis(1)),
            Duration::from_millis(100)
        );
        assert_eq!(
            poll_pause(Duration::from_millis(180)),
            Duration::from_millis(1620)
        );
    }
}
