//! The PostgreSQL clusters a run stops, starts, restarts, replicates and promotes, always
//! through `pg_ctlcluster`, and only the one the run was pointed at.
//!
//! A cluster is named `VERSION/NAME` (`--pg-cluster`, `--standby-cluster`); its port is read
//! from `pg_lsclusters` and must be the port of the URL the run connects to, so a run aimed at
//! a scratch cluster can never restart another one by mistake (the machine's `main`, which
//! other work may be using).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::postgres::PgPoolOptions;

/// One local cluster, as `pg_lsclusters` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cluster {
    pub version: String,
    pub name: String,
    pub port: u16,
}

impl Cluster {
    /// The cluster `given` (`VERSION/NAME`), or the only version's `main`, checked to listen on
    /// the port of `url`.
    pub fn resolve(given: Option<&str>, url: &str) -> anyhow::Result<Cluster> {
        let cluster = match given {
            Some(given) => Cluster::named(given)?,
            None => {
                let version = only_version()?;
                let port = cluster_port(&version, "main")?;
                Cluster {
                    version,
                    name: "main".to_string(),
                    port,
                }
            }
        };
        let port = cluster.port;
        let url_port = url_port(url)?;
        if url_port != port {
            bail!(
                "cluster {cluster} listens on port {port}, but the run connects to port {url_port}: \
                 pass --database-url for that cluster, or --pg-cluster for this port"
            );
        }
        Ok(cluster)
    }

    /// The cluster `given` (`VERSION/NAME`), with the port `pg_lsclusters` gives it.
    pub fn named(given: &str) -> anyhow::Result<Cluster> {
        let (version, name) = given
            .split_once('/')
            .with_context(|| format!("a cluster is VERSION/NAME, not {given:?}"))?;
        Ok(Cluster {
            version: version.to_string(),
            name: name.to_string(),
            port: cluster_port(version, name)?,
        })
    }

    /// `url` with this cluster's port.
    pub fn url(&self, url: &str) -> anyhow::Result<String> {
        let mut url = url::Url::parse(url).with_context(|| format!("invalid URL {url:?}"))?;
        url.set_port(Some(self.port))
            .map_err(|()| anyhow::anyhow!("{url} cannot have a port"))?;
        Ok(url.to_string())
    }

    /// The data directory, from `pg_lsclusters`.
    pub fn data_directory(&self) -> anyhow::Result<String> {
        lsclusters_field(&self.version, &self.name, 5)
    }

    /// `pg_ctlcluster --skip-systemctl-redirect VERSION NAME action [args]`, with no
    /// descriptor but stdin, stdout and stderr. A server it starts runs on after the chaos run,
    /// and would keep whatever descriptor it inherited: the run's caller's `flock` on a shared
    /// lock file (flock(1) hands its descriptor to the command), held by PostgreSQL until its
    /// next restart.
    pub fn ctl(&self, action: &str, args: &[&str]) -> anyhow::Result<()> {
        crate::run({
            let mut c = Command::new("bash");
            c.args([
                "-c",
                PG_CTL_SCRIPT,
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                &self.version,
                &self.name,
                action,
            ])
            .args(args);
            c
        })
    }

    /// Starts the cluster, trying a few times: whatever happens, the server must be up again
    /// for everyone else.
    pub fn start(&self) -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..3 {
            match self.ctl("start", &[]) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    eprintln!("chaos: starting PostgreSQL {self} failed: {e:#}");
                    last = Some(e);
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        Err(last.expect("three tries were made"))
    }
}

impl std::fmt::Display for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.version, self.name)
    }
}

fn only_version() -> anyhow::Result<String> {
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .context("no /etc/postgresql: pass --pg-cluster VERSION/NAME, or --db-restarts 0")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    match versions.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "found PostgreSQL versions {versions:?} under /etc/postgresql: pass --pg-cluster VERSION/NAME"
        ),
    }
}

/// Field `index` (0: version, 1: name, 2: port, 5: data directory) of the cluster's line of
/// `pg_lsclusters -h`.
fn lsclusters_field(version: &str, name: &str, index: usize) -> anyhow::Result<String> {
    let out = Command::new("pg_lsclusters")
        .arg("-h")
        .output()
        .context("running pg_lsclusters")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > index && f[0] == version && f[1] == name)
        .map(|f| f[index].to_string())
        .with_context(|| format!("pg_lsclusters lists no cluster {version}/{name}"))
}

fn cluster_port(version: &str, name: &str) -> anyhow::Result<u16> {
    let port = lsclusters_field(version, name, 2)?;
    port.parse()
        .with_context(|| format!("pg_lsclusters gives port {port:?} for {version}/{name}"))
}

fn url_port(url: &str) -> anyhow::Result<u16> {
    let parsed = url::Url::parse(url).with_context(|| format!("invalid --database-url {url:?}"))?;
    Ok(parsed.port().unwrap_or(5432))
}

/// Closes every inherited descriptor above stderr, then runs `pg_ctlcluster` with the script's
/// arguments.
pub(super) const PG_CTL_SCRIPT: &str = r#"for fd in $(ls /proc/$$/fd); do
    [ "$fd" -gt 2 ] && [ -e "/proc/$$/fd/$fd" ] && eval "exec $fd>&-"
done
exec pg_ctlcluster "$@""#;

/// Waits until `url` answers a query, for at most `timeout`.
pub(super) fn wait_for(
    rt: &tokio::runtime::Runtime,
    url: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answered = rt.block_on(async {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect(url)
                .await?;
            let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
            pool.close().await;
            Ok::<_, sqlx::Error>(one)
        });
        match answered {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() > timeout => {
                bail!("PostgreSQL did not answer within {timeout:?}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script pg_ctlcluster runs under passes on its arguments and no descriptor above
    /// stderr, whatever this process holds open (a test's own files, a caller's lock).
    #[test]
    fn pg_ctlcluster_inherits_no_descriptor() {
        let held = std::fs::File::open("Cargo.toml").unwrap();
        let script = PG_CTL_SCRIPT.replace(
            r#"exec pg_ctlcluster "$@""#,
            r#"echo "$@"; exec ls /proc/self/fd"#,
        );
        // Rust opens its files close-on-exec; `exec 7<` in a parent shell leaves one open, as
        // flock(1) does.
        let output = Command::new("bash")
            .args([
                "-c",
                r#"exec 7<Cargo.toml; exec bash -c "$0" x a b"#,
                &script,
            ])
            .output()
            .unwrap();
        drop(held);
        let text = String::from_utf8(output.stdout).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("a b"));
        // ls's own directory descriptor is the only one above stderr.
        let fds: Vec<u32> = lines.map(|l| l.parse().unwrap()).collect();
        assert_eq!(fds.iter().filter(|&&fd| fd > 2).count(), 1, "{fds:?}");
        assert!(!fds.contains(&7), "{fds:?}");
    }

    #[test]
    fn a_urls_port_defaults_to_postgresqls_and_a_cluster_gives_its_own() {
        assert_eq!(url_port("postgres://u@h/db").unwrap(), 5432);
        assert_eq!(url_port("postgres://u@h:5440/db").unwrap(), 5440);
        let c = Cluster {
            version: "15".into(),
            name: "chaosstby".into(),
            port: 5441,
        };
        assert_eq!(
            c.url("postgres://postgres@127.0.0.1:5440/postgres")
                .unwrap(),
            "postgres://postgres@127.0.0.1:5441/postgres"
        );
        assert_eq!(c.to_string(), "15/chaosstby");
    }
}
