//! The raw-SQL baselines: the outbox path's statements run by `pgbench`, with no scheduler around
//! them, against a throwaway database whose schema is recreated before each script: on plain
//! PostgreSQL `schema.sql`, on Citus `schema_citus.sql` (the same tables distributed by group),
//! where only `lean_group.sql` runs.
//!
//! The scripts and the schema live in `cm-lab/bench/` and are compiled into the bench, so it needs
//! no file beside the binary. One pgbench transaction is one batch of `batch` occurrences
//! (`pgbench -D batch=N`), so occurrences per second are `tps × batch`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, bail, ensure};

use super::Database;
use super::options::{CITUS_SQL_GROUPS, CITUS_SQL_ROUTINES_PER_GROUP, SQL_ROUTINES_PER_CLIENT};

/// The schema the scripts run against: simplified copies of the product's tables, 20,000 routines.
const SCHEMA: &str = include_str!("../../bench/schema.sql");

/// The same tables on Citus, with a group, distributed by it and co-located.
const CITUS_SCHEMA: &str = include_str!("../../bench/schema_citus.sql");

/// One shape of the outbox path's SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Script {
    /// Claim + advance in one transaction, then outbox rows + fenced settle in a second.
    TwoTx,
    /// Claim, outbox rows, settle and advance in one transaction.
    OneTx,
    /// One transaction: ledger rows inserted settled, outbox rows for the fresh ones, routines
    /// advanced. The baseline the engine's ratio is taken against on plain PostgreSQL.
    Lean,
    /// [`Script::Lean`] kept in one group a transaction, as three router statements naming the
    /// group (on Citus, one shard's, committed without two-phase commit). The baseline on Citus.
    LeanGroup,
}

impl Script {
    /// Every script of the plain schema, in the order a round starts from.
    pub const ALL: [Script; 3] = [Script::TwoTx, Script::OneTx, Script::Lean];

    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Script::TwoTx => "raw SQL, two transactions (`two_tx.sql`)",
            Script::OneTx => "raw SQL, one transaction (`one_tx.sql`)",
            Script::Lean => "raw SQL, lean (`lean.sql`)",
            Script::LeanGroup => "raw SQL, lean, one group a transaction (`lean_group.sql`)",
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            Script::TwoTx => "two_tx.sql",
            Script::OneTx => "one_tx.sql",
            Script::Lean => "lean.sql",
            Script::LeanGroup => "lean_group.sql",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Script::TwoTx => include_str!("../../bench/two_tx.sql"),
            Script::OneTx => include_str!("../../bench/one_tx.sql"),
            Script::Lean => include_str!("../../bench/lean.sql"),
            Script::LeanGroup => include_str!("../../bench/lean_group.sql"),
        }
    }
}

/// What one pgbench run measured.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SqlRun {
    /// Transactions (batches) committed.
    pub transactions: u64,
    /// pgbench's `tps`, without the initial connection time.
    pub tps: f64,
    /// Occurrences per transaction.
    pub batch: usize,
}

impl SqlRun {
    /// Occurrences per second.
    pub fn rate(&self) -> f64 {
        self.tps * self.batch as f64
    }
}

/// How long pgbench runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Length {
    /// `-T`: for this many seconds.
    Seconds(u32),
    /// `-t`: this many transactions per client (the tests' single batches).
    #[cfg(test)]
    Transactions(u32),
}

/// The scripts written out for pgbench, and the database they run against.
#[derive(Debug)]
pub(super) struct RawSql {
    dir: PathBuf,
    url: String,
    database: Database,
}

/// The versions of `pgbench` and `psql`, or a clear error saying they are missing.
pub(super) fn tool_versions() -> anyhow::Result<String> {
    let mut versions = Vec::new();
    for tool in ["pgbench", "psql"] {
        let output = Command::new(tool).arg("--version").output();
        match output {
            Ok(o) if o.status.success() => {
                versions.push(String::from_utf8_lossy(&o.stdout).trim().to_string());
            }
            _ => bail!(
                "`{tool}` is missing: the raw-SQL baselines need pgbench and psql, which come \
                 with PostgreSQL's client tools (on Debian: apt-get install postgresql-client)"
            ),
        }
    }
    Ok(versions.join(", "))
}

impl RawSql {
    /// Writes the schemas and the scripts into `dir`, for runs against the database `url`, of
    /// the kind `database` (which schema is recreated before a script).
    pub fn new(dir: &Path, url: &str, database: Database) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        };
        write("schema.sql", SCHEMA)?;
        write("schema_citus.sql", CITUS_SCHEMA)?;
        for script in Script::ALL.into_iter().chain([Script::LeanGroup]) {
            write(script.file_name(), script.text())?;
        }
        Ok(RawSql {
            dir: dir.to_path_buf(),
            url: url.to_string(),
            database,
        })
    }

    /// Recreates the schema, then runs `script` with two clients on two threads.
    pub fn run(&self, script: Script, batch: usize, length: Length) -> anyhow::Result<SqlRun> {
        // Recreated every time: the tables grow during a run, and a grown table is slower.
        self.recreate()?;
        self.pgbench(script, batch, length)
    }

    /// Drops and creates the schema's tables, filled with their routines.
    fn recreate(&self) -> anyhow::Result<()> {
        let schema = self.dir.join(match self.database {
            Database::Plain => "schema.sql",
            Database::Citus => "schema_citus.sql",
        });
        checked(
            Command::new("psql")
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
                .arg("-v")
                .arg(format!("groups={CITUS_SQL_GROUPS}"))
                .arg("-v")
                .arg(format!("per_group={CITUS_SQL_ROUTINES_PER_GROUP}"))
                .arg("-f")
                .arg(&schema)
                .arg(&self.url)
                // The schema drops its tables first; the notices that they did not exist are noise.
                .env("PGOPTIONS", "-c client_min_messages=warning"),
            "psql (the raw-SQL schema)",
        )?;
        Ok(())
    }

    /// Runs `script` with two clients on two threads against the schema as it is.
    fn pgbench(&self, script: Script, batch: usize, length: Length) -> anyhow::Result<SqlRun> {
        let length = match length {
            Length::Seconds(s) => ["-T".to_string(), s.to_string()],
            #[cfg(test)]
            Length::Transactions(t) => ["-t".to_string(), t.to_string()],
        };
        let output = checked(
            Command::new("pgbench")
                .args(["-n", "-c", "2", "-j", "2"])
                .args(length)
                .arg("-D")
                .arg(format!("batch={batch}"))
                .arg("-D")
                .arg(format!("per_client={SQL_ROUTINES_PER_CLIENT}"))
                .arg("-D")
                .arg(format!("groups_per_client={}", CITUS_SQL_GROUPS / 2))
                .arg("-D")
                .arg(format!("per_group={CITUS_SQL_ROUTINES_PER_GROUP}"))
                .arg("-f")
                .arg(self.dir.join(script.file_name()))
                .arg(&self.url),
            "pgbench",
        )?;
        let (transactions, tps) = parse_pgbench(&String::from_utf8_lossy(&output.stdout))?;
        ensure!(transactions > 0, "pgbench committed no transaction");
        Ok(SqlRun {
            transactions,
            tps,
            batch,
        })
    }
}

/// Runs `command`, and fails with its stderr unless it succeeds.
fn checked(command: &mut Command, what: &str) -> anyhow::Result<Output> {
    let output = command
        .env_remove("DATABASE_URL")
        .output()
        .with_context(|| format!("starting {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output)
}

/// The transactions committed and the `tps` of a pgbench report; a report with failed
/// transactions is refused, since its rate would count work that was not done.
fn parse_pgbench(report: &str) -> anyhow::Result<(u64, f64)> {
    let field = |prefix: &str| {
        report
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .map(str::trim)
            .with_context(|| format!("no `{prefix}` line in pgbench's report:\n{report}"))
    };
    let transactions: u64 = field("number of transactions actually processed:")?
        .split(['/', ' '])
        .next()
        .unwrap_or("")
        .parse()
        .context("pgbench's transaction count")?;
    if let Ok(failed) = field("number of failed transactions:") {
        ensure!(
            failed.starts_with("0 "),
            "pgbench reports failed transactions: {failed}"
        );
    }
    let tps: f64 = field("tps =")?
        .split_whitespace()
        .next()
        .unwrap_or("")
        .parse()
        .context("pgbench's tps")?;
    Ok((transactions, tps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::PgPool;

    #[test]
    fn the_report_gives_transactions_and_tps() {
        let report = "pgbench (15.20 (Debian 15.20-0+deb12u1))\n\
            transaction type: lean.sql\n\
            number of clients: 2\n\
            number of transactions actually processed: 46\n\
            number of failed transactions: 0 (0.000%)\n\
            latency average = 129.1 ms\n\
            initial connection time = 3.6 ms\n\
            tps = 15.598619 (without initial connection time)\n";
        assert_eq!(parse_pgbench(report).unwrap(), (46, 15.598619));
        let with_total = report.replace("processed: 46", "processed: 46/46");
        assert_eq!(parse_pgbench(&with_total).unwrap(), (46, 15.598619));
        let failed = report.replace("transactions: 0 (0.000%)", "transactions: 3 (6.122%)");
        assert!(parse_pgbench(&failed).is_err());
        assert!(parse_pgbench("pgbench: error: connection refused").is_err());
        assert_eq!(
            SqlRun {
                transactions: 46,
                tps: 15.5,
                batch: 200
            }
            .rate(),
            3100.0
        );
    }

    /// Each script does one batch's work: one pgbench transaction per client fires `batch`
    /// occurrences, each `fired` with its outbox row. With a batch of a whole half, the two clients
    /// together fire every routine exactly once: they never take the same routines, so they never
    /// wait on each other's row locks (overlapping batches deadlocked now and then).
    #[sqlx::test]
    async fn each_script_fires_a_batch_with_its_outbox_rows(pool: PgPool) {
        let server = std::env::var("DATABASE_URL").unwrap();
        let name = pool.connect_options().get_database().unwrap().to_string();
        let url = crate::database_url(&server, &name).unwrap();
        let dir = std::env::temp_dir().join(format!("cm-bench-test-{name}"));
        let raw = RawSql::new(&dir, &url, Database::Plain).unwrap();
        for script in Script::ALL {
            // Blocking is fine here: the test has nothing else to run meanwhile.
            let run = raw
                .run(script, SQL_ROUTINES_PER_CLIENT, Length::Transactions(1))
                .unwrap();
            assert_eq!(run.transactions, 2, "{script:?}");
            let (routines, fired, other, outbox, missing): (i64, i64, i64, i64, i64) =
                sqlx::query_as(
                    "SELECT
                     (SELECT count(DISTINCT routine_id) FROM routine_fires),
                     (SELECT count(*) FROM routine_fires WHERE status = 'fired'),
                     (SELECT count(*) FROM routine_fires WHERE status <> 'fired'),
                     (SELECT count(*) FROM outbox_messages),
                     (SELECT count(*) FROM routine_fires f WHERE NOT EXISTS (
                          SELECT 1 FROM outbox_messages o
                          WHERE o.routine_id = f.routine_id AND o.scheduled_at = f.scheduled_at))",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
            let all = 2 * SQL_ROUTINES_PER_CLIENT as i64;
            assert_eq!(
                (routines, fired, other, outbox, missing),
                (all, all, 0, all, 0),
                "{script:?}"
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// `lean_group.sql` on Citus (`CM_TEST_CITUS_URL`, the coordinator `.ci/citus` prints):
    /// each client's transaction fires a batch of one group of its own half, every occurrence
    /// with its outbox row, and the coordinator records no two-phase commit for it (the cluster
    /// of `.ci/citus` never recovers them, so `pg_dist_transaction` keeps every one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs Citus: start it with .ci/citus and set CM_TEST_CITUS_URL to what it prints"]
    async fn the_group_script_fires_a_batch_on_one_shard_on_citus() {
        let coordinator = std::env::var("CM_TEST_CITUS_URL")
            .ok()
            .filter(|url| !url.is_empty())
            .expect("CM_TEST_CITUS_URL is not set: start the cluster with .ci/citus");
        let name = format!(
            "cm_bench_test_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let url = tokio::task::block_in_place(|| {
            super::super::citus::create_database(&coordinator, &name)
        })
        .unwrap();
        let workers = super::super::citus::workers(&url).await.unwrap();
        let dir = std::env::temp_dir().join(format!("cm-bench-test-{name}"));
        let raw = RawSql::new(&dir, &url, Database::Citus).unwrap();
        let pool = PgPool::connect(&url).await.unwrap();
        let two_phase = async || -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM pg_dist_transaction")
                .fetch_one(&pool)
                .await
                .unwrap()
        };
        tokio::task::block_in_place(|| raw.recreate()).unwrap();
        let before = two_phase().await;
        let run = tokio::task::block_in_place(|| {
            raw.pgbench(
                Script::LeanGroup,
                CITUS_SQL_ROUTINES_PER_GROUP,
                Length::Transactions(1),
            )
        })
        .unwrap();
        assert_eq!(run.transactions, 2);
        assert_eq!(
            two_phase().await,
            before,
            "a transaction committed in two phases"
        );
        let (fired, groups, low, outbox, missing): (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT
                 (SELECT count(*) FROM routine_fires WHERE status = 'fired'),
                 (SELECT count(DISTINCT group_id) FROM routine_fires),
                 (SELECT count(DISTINCT group_id) FROM routine_fires WHERE group_id < $1),
                 (SELECT count(*) FROM outbox_messages),
                 (SELECT count(*) FROM routine_fires f WHERE NOT EXISTS (
                      SELECT 1 FROM outbox_messages o
                      WHERE o.group_id = f.group_id AND o.routine_id = f.routine_id
                        AND o.scheduled_at = f.scheduled_at))",
        )
        .bind(i16::try_from(CITUS_SQL_GROUPS / 2).unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
        let all = 2 * CITUS_SQL_ROUTINES_PER_GROUP as i64;
        assert_eq!((fired, groups, low, outbox, missing), (all, 2, 1, all, 0));
        pool.close().await;
        super::super::citus::drop_database(&coordinator, &name, &workers)
            .await
            .unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
