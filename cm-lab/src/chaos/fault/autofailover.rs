//! `--auto-failover MONITOR_URL`: the chaos database lives on a pg_auto_failover formation
//! (`.ci/pg-auto-failover`: a monitor and two nodes replicating synchronously), the schedulers
//! are given the nodes' multi-host URL with `target_session_attrs=read-write`, and twice
//! during the run `pg_autoctl perform failover` moves the primary to the other node. No
//! forwarder: the schedulers find the new primary by themselves.
//!
//! For each failover the fault records when the other node was promoted (first answered
//! read-write), how long after that the first occurrence was claimed on it (required within
//! [`FIRST_FIRE_WITHIN`]), and what the schedulers' `/readyz` said in between (a 503 with a
//! reason is required: no host was usable for a while).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;

use super::{Chaos, Fault, spread};
use crate::chaos::fleet::{Prober, Readiness, probe_digest};
use crate::chaos::report::Findings;

/// The longest from a node's promotion to the first occurrence claimed on it.
pub(in crate::chaos) const FIRST_FIRE_WITHIN: Duration = Duration::from_secs(10);

/// How long a failover (and the old primary's return as a standby) may take.
const SETTLE_WAIT: Duration = Duration::from_secs(90);

/// The nodes of the multi-host URL `url`, each as a single-host server URL.
pub(in crate::chaos) fn node_urls(url: &str) -> anyhow::Result<Vec<String>> {
    let parsed = cm_store::DatabaseUrl::parse(url).map_err(|e| anyhow::anyhow!("{e}"))?;
    if parsed.hosts.len() < 2 {
        bail!("--auto-failover needs a --database-url naming the formation's nodes, h1:p1,h2:p2");
    }
    Ok(parsed
        .hosts
        .iter()
        .map(|h| h.to_url_lossy().to_string())
        .collect())
}

/// `url` (one or several hosts) with its database replaced by `database`.
pub(in crate::chaos) fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url.split_once("://").context("a URL with a scheme")?;
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (rest, String::new()),
    };
    let authority = before_query.split('/').next().unwrap_or(before_query);
    Ok(format!("{scheme}://{authority}/{database}{query}"))
}

/// Whether the node at `url` is a writable primary now, and its clock.
async fn writable(url: &str) -> anyhow::Result<Option<DateTime<Utc>>> {
    let options: PgConnectOptions = url.parse()?;
    let mut conn = tokio::time::timeout(Duration::from_secs(1), options.connect())
        .await
        .context("no answer")??;
    let (recovery, read_only, now): (bool, String, DateTime<Utc>) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only'), now()",
    )
    .fetch_one(&mut conn)
    .await?;
    use sqlx::Connection as _;
    let _ = conn.close().await;
    Ok((!recovery && read_only == "off").then_some(now))
}

/// Whether the monitor at `monitor` reports one primary and one secondary, each in the state it
/// was told to reach and healthy by the monitor's own checks since it started (its table keeps
/// the states of before a restart). A failover asked of a formation
/// whose standby the monitor has not yet seen healthy (a formation just started) is no quick
/// switch: the monitor leaves the old primary writable until its demote timeout (30 s).
async fn formation_healthy(monitor: &str) -> anyhow::Result<bool> {
    let options: PgConnectOptions = monitor.parse()?;
    let mut conn = tokio::time::timeout(Duration::from_secs(1), options.connect())
        .await
        .context("no answer")??;
    let healthy: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pgautofailover.node
         WHERE health = 1 AND reportedstate = goalstate
           AND reportedstate::text IN ('primary', 'secondary')
           AND healthchecktime > pg_postmaster_start_time()
           AND reporttime > pg_postmaster_start_time()",
    )
    .fetch_one(&mut conn)
    .await?;
    use sqlx::Connection as _;
    let _ = conn.close().await;
    Ok(healthy == 2)
}

/// The single-host URL of the node of `nodes` that is the writable primary now.
pub(in crate::chaos) fn current_primary(
    rt: &tokio::runtime::Runtime,
    nodes: &[String],
) -> anyhow::Result<String> {
    for node in nodes {
        if let Ok(Some(_)) = rt.block_on(writable(node)) {
            return Ok(node.clone());
        }
    }
    bail!("no node of {nodes:?} is a writable primary")
}

/// `host:port` of a node's URL, for the summary.
fn node(url: &str) -> String {
    url.parse::<PgConnectOptions>()
        .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
        .unwrap_or_else(|_| url.to_string())
}

/// One failover as it went.
struct Switch {
    from: String,
    to: String,
    /// From `pg_autoctl perform failover` to the other node answering read-write.
    promoted_after: Duration,
    /// From the promotion to the first occurrence claimed on the new primary (its clock).
    first_fire: Option<Duration>,
    /// Whether some scheduler's `/readyz` answered 503 with a reason during the switch.
    unready_seen: bool,
    readyz: String,
}

pub(in crate::chaos) struct AutoFailover {
    monitor: String,
    nodes: Vec<String>,
    plan: Vec<Instant>,
    done: Vec<Switch>,
}

impl AutoFailover {
    pub fn new(
        monitor: String,
        nodes: Vec<String>,
        start: Instant,
        duration: Duration,
        count: u32,
    ) -> Self {
        AutoFailover {
            monitor,
            nodes,
            plan: spread(start, duration, count),
            done: Vec::new(),
        }
    }

    /// `pg_autoctl perform failover`, as the user postgres when run as root (pg_autoctl refuses
    /// root).
    fn perform(&self) -> anyhow::Result<Child> {
        let mut c = if nix_is_root() {
            let mut c = Command::new("runuser");
            c.args([
                "-u",
                "postgres",
                "--",
                "env",
                "HOME=/var/lib/postgresql",
                "pg_autoctl",
            ]);
            c
        } else {
            Command::new("pg_autoctl")
        };
        c.args([
            "perform",
            "failover",
            "--monitor",
            &self.monitor,
            "--wait",
            "60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        c.spawn().context("running pg_autoctl perform failover")
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    })
}

impl Fault for AutoFailover {
    fn next_at(&self) -> Option<Instant> {
        self.plan.get(self.done.len()).copied()
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let asked = Instant::now();
        while !matches!(
            chaos.rt.block_on(formation_healthy(&self.monitor)),
            Ok(true)
        ) {
            if asked.elapsed() > SETTLE_WAIT {
                bail!("the monitor did not report the formation healthy within {SETTLE_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        if asked.elapsed() > Duration::from_secs(1) {
            chaos.say(format!(
                "the monitor reported the formation healthy after {:.1} s",
                asked.elapsed().as_secs_f64()
            ));
        }
        let from = current_primary(chaos.rt, &self.nodes)?;
        let prober = Prober::start(chaos.fleet.ports());
        let begun = Instant::now();
        chaos.say(format!(
            "pg_autoctl perform failover (primary {})",
            node(&from)
        ));
        let mut child = self.perform()?;
        // The other node answering read-write is its promotion.
        let (to, promoted_at, promoted_db) = loop {
            let found = self.nodes.iter().filter(|n| **n != from).find_map(|n| {
                match chaos.rt.block_on(writable(n)) {
                    Ok(Some(now)) => Some((n.clone(), now)),
                    _ => None,
                }
            });
            if let Some((node, now)) = found {
                break (node, Instant::now(), now);
            }
            if begun.elapsed() > SETTLE_WAIT {
                let _ = child.kill();
                bail!("no other node was promoted within {SETTLE_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let promoted_after = promoted_at - begun;
        chaos.failover_at = Some(promoted_db);
        chaos.say(format!(
            "{} is promoted {:.1} s after the failover began",
            node(&to),
            promoted_after.as_secs_f64()
        ));
        let pool = crate::chaos::own_pool(chaos.rt, &with_database(&to, &chaos.database)?)?;
        // Dropped, not closed: the old primary's connections are gone with its restart.
        drop(std::mem::replace(&mut chaos.pool, pool));
        chaos.server_url = to.clone();
        let first_fire = loop {
            let first: Option<DateTime<Utc>> = chaos.rt.block_on(
                sqlx::query_scalar(
                    "SELECT min(claimed_at) FROM cm.routine_fires WHERE claimed_at > $1",
                )
                .bind(promoted_db)
                .fetch_one(&chaos.pool),
            )?;
            if let Some(first) = first {
                break Some((first - promoted_db).to_std().unwrap_or_default());
            }
            if promoted_at.elapsed() > FIRST_FIRE_WITHIN * 3 {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        chaos.say(match first_fire {
            Some(d) => format!(
                "first occurrence claimed on {to} {:.1} s after its promotion",
                d.as_secs_f64()
            ),
            None => format!("nothing claimed on {to} since its promotion"),
        });
        // The old primary rejoins as a standby before the next failover can run.
        let settled = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if begun.elapsed() > SETTLE_WAIT {
                let _ = child.kill();
                bail!("pg_autoctl perform failover did not end within {SETTLE_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if !settled.success() {
            chaos.say(format!("pg_autoctl perform failover exited {settled}"));
        }
        let probes = prober.finish();
        let window_end = (promoted_at - begun) + Duration::from_secs(2);
        let unready_seen = probes.iter().any(|p| {
            p.after <= window_end && matches!(&p.readiness, Readiness::Unready(r) if !r.is_empty())
        });
        let readyz = probe_digest(&probes, Duration::ZERO, window_end);
        chaos.say(format!("/readyz during the failover: {readyz}"));
        self.done.push(Switch {
            from,
            to,
            promoted_after,
            first_fire,
            unready_seen,
            readyz,
        });
        // No SIGKILL right after: the schedulers' first fires on the new primary are measured
        // above, and the formation settles.
        chaos.quiet_until = Instant::now() + Duration::from_secs(1);
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        for (i, s) in self.done.iter().enumerate() {
            f.line(
                &format!("auto failover {}", i + 1),
                format!(
                    "{} to {}: promoted {:.1} s after pg_autoctl perform failover, first claim on it {} after; /readyz: {}",
                    node(&s.from),
                    node(&s.to),
                    s.promoted_after.as_secs_f64(),
                    s.first_fire
                        .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                    s.readyz
                ),
            );
            f.require(s.first_fire.is_none_or(|d| d > FIRST_FIRE_WITHIN), || {
                format!(
                    "auto failover {}: the first claim on the new primary {} came {} after its promotion (at most {} s)",
                    i + 1,
                    node(&s.to),
                    s.first_fire
                        .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
                    FIRST_FIRE_WITHIN.as_secs()
                )
            });
            f.require(!s.unready_seen, || {
                format!(
                    "auto failover {}: no /readyz answered 503 with a reason during the switch",
                    i + 1
                )
            });
        }
        f.require(self.done.len() < self.plan.len(), || {
            format!(
                "only {} of {} failovers happened",
                self.done.len(),
                self.plan.len()
            )
        });
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_replaced_in_a_multi_host_url() {
        assert_eq!(
            with_database(
                "postgres://postgres@127.0.0.1:5482,127.0.0.1:5483/postgres?target_session_attrs=read-write",
                "cm_chaos_1"
            )
            .unwrap(),
            "postgres://postgres@127.0.0.1:5482,127.0.0.1:5483/cm_chaos_1?target_session_attrs=read-write"
        );
        assert_eq!(
            with_database("postgres://u@h:1", "c").unwrap(),
            "postgres://u@h:1/c"
        );
    }

    #[test]
    fn every_node_gets_a_url_of_its_own() {
        let nodes = node_urls(
            "postgres://postgres@127.0.0.1:5482,127.0.0.1:5483/postgres?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert!(nodes[0].contains("127.0.0.1:5482/postgres"), "{}", nodes[0]);
        assert!(nodes[1].contains("127.0.0.1:5483/postgres"), "{}", nodes[1]);
        assert!(node_urls("postgres://postgres@127.0.0.1:5482/postgres").is_err());
    }
}
