//! `cargo xtask bench`: fires per second of the real binary beside raw-SQL baselines of the same
//! work measured in the same run, and lateness with and without a stalled dispatch.
//!
//! The machine this runs on is shared and noisy, so an absolute figure says little on its own;
//! the ratio of the engine to a baseline measured minutes apart survives the noise better:
//!
//! - **Raw-SQL baselines** (`raw_sql`): the outbox path's statements in three shapes, run by
//!   `pgbench` with two clients, `batch` occurrences a transaction, against a throwaway database
//!   whose schema is recreated before each script.
//! - **Engine throughput** (`processes`): two `cm-scheduler run` processes of the release binary
//!   on the bench database, outbox backend, `--max-fires-per-tick` = `batch`. Every-second
//!   routines are parked, the processes started and ready, then every clock is put back at one
//!   instant: a drain of a backlog the engine can finish, and a window over more routines than any
//!   engine drains. The ledger is checked after each run.
//! - The two kinds are interleaved over the rounds, each round starting elsewhere.
//! - **Lateness** (`lateness`): two in-process schedulers over every-second routines, with a
//!   backend double, at two tick intervals, with and without one routine's dispatches held.
//! - **Backfill** (`backfill`): one in-process scheduler, every-second message routines beside a
//!   mission backfill launched at `--backfill-rate`.
//! - **Fairness** (`fairness`): one in-process scheduler at its defaults, a big tenant's burst of
//!   `--fairness-big` routines of one concurrency key due at one instant beside a small tenant's
//!   every-second routines, with their own key and then with none.
//! - **On Citus** (`--citus-url`, `citus`): in the same rounds, the lean baseline kept in one
//!   group a transaction (`lean_group.sql`, every statement a router statement on one shard) and
//!   the processes' drain and window on a schema distributed by `migrate --citus`, where the
//!   schedulers claim group by group. The report sets each beside its plain PostgreSQL figure.
//!
//! Everything happens in fresh databases `cm_bench_<random>` and `cm_bench_<random>_sql` on the
//! given server (with Citus also `cm_bench_<random>_citus` and `cm_bench_<random>_citus_sql`,
//! made Citus on every node), dropped at the end. The report is Markdown on stdout (`report`);
//! progress goes to stderr. With `--quick`, the last line is `fires_per_sec=<n>
//! baseline_per_sec=<n> ratio=<r>`, followed on Citus by `citus_fires_per_sec=<n>
//! citus_baseline_per_sec=<n> citus_ratio=<r> citus_over_plain=<r>`. `--backfill-only` and
//! `--fairness-only` run those measurements alone, in one fresh database, without pgbench or the
//! release binary.

mod backfill;
mod citus;
mod fairness;
mod lateness;
mod ledger;
pub(crate) mod options;
pub(crate) mod processes;
mod raw_sql;
mod report;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use cm_store::PgStore;

use options::{Options, USAGE};
use processes::Shape;
use raw_sql::{Length, RawSql, Script};
use report::{Facts, Measured};

/// When the bench started, for the progress lines.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Prints a progress line to stderr with the seconds since the bench started, so a slow phase
/// on a busy machine shows where the time went.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!(
            "xtask bench [{:6.1} s]: {}",
            STARTED.get_or_init(Instant::now).elapsed().as_secs_f64(),
            format_args!($($arg)*)
        )
    };
}

/// One step of a throughput round.
#[derive(Debug, Clone, Copy)]
enum Step {
    Sql(Script),
    Engine(Shape),
}

/// The database a throughput run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Database {
    /// The server `--database-url` names.
    Plain,
    /// The Citus cluster `--citus-url` names, the schema distributed by group.
    Citus,
}

impl Database {
    /// The name in the report.
    fn name(self) -> &'static str {
        match self {
            Database::Plain => "PostgreSQL",
            Database::Citus => "Citus",
        }
    }

    /// The raw-SQL baseline the engine's ratio is taken against on this database.
    fn lean(self) -> Script {
        match self {
            Database::Plain => Script::Lean,
            Database::Citus => Script::LeanGroup,
        }
    }
}

/// A round's steps: the lean baseline beside the drain it is compared with, the others between.
/// Round `n` starts `n` steps further on, so no step always runs first or last.
const ROUND: [(Database, Step); 5] = [
    (Database::Plain, Step::Sql(Script::Lean)),
    (Database::Plain, Step::Engine(Shape::Drain)),
    (Database::Plain, Step::Sql(Script::TwoTx)),
    (Database::Plain, Step::Engine(Shape::Window)),
    (Database::Plain, Step::Sql(Script::OneTx)),
];

/// A round's steps with `--citus-url`: each Citus step beside its plain PostgreSQL one.
const ROUND_WITH_CITUS: [(Database, Step); 8] = [
    (Database::Plain, Step::Sql(Script::Lean)),
    (Database::Plain, Step::Engine(Shape::Drain)),
    (Database::Citus, Step::Sql(Script::LeanGroup)),
    (Database::Citus, Step::Engine(Shape::Drain)),
    (Database::Plain, Step::Sql(Script::TwoTx)),
    (Database::Plain, Step::Engine(Shape::Window)),
    (Database::Citus, Step::Engine(Shape::Window)),
    (Database::Plain, Step::Sql(Script::OneTx)),
];

/// The bench's databases on one server: the engine's and the raw SQL's.
#[derive(Debug, Clone)]
struct Databases {
    engine_url: String,
    sql_url: String,
}

/// Runs the bench and prints its Markdown report to stdout (progress goes to stderr).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = crate::measuring_options("bench", Options::parse(args), USAGE) else {
        return Ok(());
    };
    STARTED.get_or_init(Instant::now);
    let command = std::iter::once("cargo xtask bench".to_string())
        .chain(args.iter().map(|a| {
            if a.contains(' ') || a.is_empty() {
                format!("\"{a}\"")
            } else {
                a.clone()
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")
    };
    if !crate::postgres_answers(&options.database_url) {
        bail!("PostgreSQL does not answer at {}", options.database_url);
    }
    if options.backfill_only || options.fairness_only {
        return runtime()?.block_on(alone(options, command));
    }
    // Before anything is built or created: a missing tool is a one-line answer.
    let tools = raw_sql::tool_versions()?;
    if let Some(coordinator) = &options.citus_url
        && !crate::postgres_answers(coordinator)
    {
        bail!("the Citus coordinator does not answer at {coordinator} (start it with .ci/citus)");
    }
    progress!("building the release cm-scheduler");
    let binary = processes::build_binary()?;
    runtime()?.block_on(bench(options, binary, tools, command))
}

/// `--backfill-only` and `--fairness-only`: the runs they name alone, in a fresh database dropped
/// afterwards.
async fn alone(options: Options, command: String) -> anyhow::Result<()> {
    let name = format!(
        "cm_bench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = crate::database_url(&options.database_url, &name)?;
    PgStore::create_database_if_missing(&url)
        .await
        .with_context(|| format!("creating a bench database on {}", options.database_url))?;
    progress!("created database {name}");
    let result = async {
        let admin = PgStore::connect(&url).await?;
        admin.migrate().await?;
        let started_at = Utc::now();
        let backfill = if options.backfill_only {
            Some(run_backfill(admin.pool(), &url, &options).await?)
        } else {
            None
        };
        let fairness = if options.fairness_only {
            run_fairness(admin.pool(), &url, &options).await?
        } else {
            Vec::new()
        };
        let server: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(admin.pool())
            .await?;
        admin.pool().close().await;
        report::print_alone(
            &options,
            &command,
            started_at,
            &server,
            backfill.as_ref(),
            &fairness,
        );
        anyhow::Ok(())
    }
    .await;
    let dropped = <sqlx::Postgres as sqlx::migrate::MigrateDatabase>::force_drop_database(&url)
        .await
        .with_context(|| format!("dropping {name}"));
    result?;
    dropped?;
    progress!("dropped the bench's database");
    Ok(())
}

async fn bench(
    options: Options,
    binary: PathBuf,
    tools: String,
    command: String,
) -> anyhow::Result<()> {
    let name = format!(
        "cm_bench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let plain = Databases {
        engine_url: crate::database_url(&options.database_url, &name)?,
        sql_url: crate::database_url(&options.database_url, &format!("{name}_sql"))?,
    };
    for url in [&plain.engine_url, &plain.sql_url] {
        PgStore::create_database_if_missing(url)
            .await
            .with_context(|| format!("creating a bench database on {}", options.database_url))?;
    }
    let dir = std::env::temp_dir().join(format!("cm-bench-{name}"));
    progress!(
        "created databases {name} and {name}_sql; scripts and process logs in {}",
        dir.display()
    );
    let citus_names = [format!("{name}_citus"), format!("{name}_citus_sql")];
    let mut citus_workers = Vec::new();
    let result = async {
        let citus = match &options.citus_url {
            Some(coordinator) => {
                let made = on_citus(coordinator, &binary, &citus_names).await?;
                citus_workers = citus::workers(&made.engine_url).await?;
                Some(made)
            }
            None => None,
        };
        measure(
            &options,
            &binary,
            &plain,
            citus.as_ref(),
            &dir,
            tools,
            command,
        )
        .await
    }
    .await;
    // The databases go whether the bench succeeded or not; the bench's own error comes first.
    let mut dropped = Ok(());
    for url in [&plain.engine_url, &plain.sql_url] {
        let outcome =
            <sqlx::Postgres as sqlx::migrate::MigrateDatabase>::force_drop_database(url).await;
        dropped = dropped.and(outcome.map_err(anyhow::Error::from));
    }
    if let Some(coordinator) = &options.citus_url {
        for citus_name in &citus_names {
            let outcome = citus::drop_database(coordinator, citus_name, &citus_workers).await;
            dropped = dropped.and(outcome);
        }
    }
    if result.is_err() {
        progress!(
            "the bench failed; its process logs are kept in {}",
            dir.display()
        );
    }
    result?;
    dropped.with_context(|| format!("dropping {name} and the bench's other databases"))?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    progress!("dropped the bench's databases");
    Ok(())
}

/// Makes the engine's and the raw SQL's databases Citus databases on every node of the cluster
/// `coordinator` names, and distributes the engine's schema by group.
async fn on_citus(
    coordinator: &str,
    binary: &Path,
    [engine, sql]: &[String; 2],
) -> anyhow::Result<Databases> {
    let made = tokio::task::block_in_place(|| -> anyhow::Result<Databases> {
        let made = Databases {
            engine_url: citus::create_database(coordinator, engine)?,
            sql_url: citus::create_database(coordinator, sql)?,
        };
        citus::distribute(binary, &made.engine_url)?;
        Ok(made)
    })?;
    progress!("made {engine} and {sql} Citus databases on every node; {engine} distributed");
    Ok(made)
}

async fn measure(
    options: &Options,
    binary: &Path,
    plain: &Databases,
    citus: Option<&Databases>,
    dir: &Path,
    tools: String,
    command: String,
) -> anyhow::Result<()> {
    let admin = PgStore::connect(&plain.engine_url).await?;
    admin.migrate().await?;
    let pool = admin.pool();
    let started_at = Utc::now();
    let raw = RawSql::new(dir, &plain.sql_url, Database::Plain)?;
    // On Citus: migrated and distributed already (`migrate --citus`).
    let on_citus = match citus {
        Some(made) => Some((
            PgStore::connect(&made.engine_url).await?,
            RawSql::new(dir, &made.sql_url, Database::Citus)?,
            made.engine_url.as_str(),
        )),
        None => None,
    };
    let steps: &[(Database, Step)] = if on_citus.is_some() {
        &ROUND_WITH_CITUS
    } else {
        &ROUND
    };

    let mut runs = Vec::new();
    for round in 1..=options.rounds {
        for i in 0..steps.len() {
            let (database, step) = steps[(i + round as usize - 1) % steps.len()];
            let (pool, raw, engine_url) = match (database, &on_citus) {
                (Database::Citus, Some((store, raw, url))) => (store.pool(), raw, *url),
                _ => (pool, &raw, plain.engine_url.as_str()),
            };
            let measured = match step {
                Step::Sql(script) => {
                    let length = Length::Seconds(options.sql_seconds);
                    let run =
                        tokio::task::block_in_place(|| raw.run(script, options.batch, length))?;
                    Measured::Sql(script, run)
                }
                Step::Engine(shape) => {
                    let label = format!("round{round}-{database:?}-{shape:?}").to_lowercase();
                    let run = processes::run(pool, binary, engine_url, options, shape, dir, &label)
                        .await?;
                    Measured::Engine(shape, run)
                }
            };
            progress!(
                "round {round}: {}: {}: {:.0} a second",
                database.name(),
                measured.name(),
                measured.rate()
            );
            runs.push((round, database, measured));
        }
    }

    let mut lateness = Vec::new();
    for tick in [Duration::from_secs(1), Duration::from_millis(200)] {
        for stall in [false, true] {
            let run = lateness::run(pool, &plain.engine_url, options, tick, stall).await?;
            progress!(
                "lateness, {tick:?} tick, stall {stall}: claimed p99 {:.0} ms, settled p99 {:.0} ms",
                run.others.claimed[1],
                run.others.settled[1]
            );
            lateness.push(run);
        }
    }

    let backfill = run_backfill(pool, &plain.engine_url, options).await?;
    let fairness = run_fairness(pool, &plain.engine_url, options).await?;

    let show = |setting: &'static str| async move {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(pool)
            .await
    };
    let citus_server = match &on_citus {
        Some((store, _, url)) => {
            let described = citus::describe(url).await?;
            store.pool().close().await;
            Some(described)
        }
        None => None,
    };
    let facts = Facts {
        command,
        commit: commit(),
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        server: format!(
            "{} (`synchronous_commit` {}, `fsync` {}, `shared_buffers` {})",
            show("server_version").await?,
            show("synchronous_commit").await?,
            show("fsync").await?,
            show("shared_buffers").await?
        ),
        citus: citus_server,
        tools,
        started_at,
        wall: STARTED.get_or_init(Instant::now).elapsed(),
    };
    admin.pool().close().await;
    report::print(options, &facts, &runs, &lateness, &backfill, &fairness);
    if options.quick {
        println!("{}", report::last_line(&runs));
    }
    Ok(())
}

/// The backfill run, with its progress line.
async fn run_backfill(
    pool: &sqlx::PgPool,
    url: &str,
    options: &Options,
) -> anyhow::Result<backfill::BackfillRun> {
    let run = backfill::run(pool, url, options).await?;
    progress!(
        "backfill of {} missions: message lateness p99 {:.0} ms",
        options.backfill_missions,
        run.claimed[1]
    );
    Ok(run)
}

/// The two fairness runs, keyed then without a key, with a progress line each.
async fn run_fairness(
    pool: &sqlx::PgPool,
    url: &str,
    options: &Options,
) -> anyhow::Result<Vec<fairness::FairnessRun>> {
    let mut runs = Vec::new();
    for variant in fairness::Variant::ALL {
        let run = fairness::run(pool, url, options, variant).await?;
        progress!(
            "fairness, small tenant {}: {} big routines drained in {:.1} s; small tenant \
             claimed p99 {:.0} ms ({:.3} of the drain)",
            variant.short(),
            run.big,
            run.drain.as_secs_f64(),
            run.claimed[1],
            run.p99_over_drain()
        );
        runs.push(run);
    }
    Ok(runs)
}

/// The commit the bench runs from, marked when the tree has uncommitted changes.
pub(crate) fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(crate::workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match (
        git(&["rev-parse", "--short", "HEAD"]),
        git(&["status", "--porcelain"]),
    ) {
        (Some(head), Some(changes)) if !changes.is_empty() => {
            format!("`{head}` with uncommitted changes")
        }
        (Some(head), _) => format!("`{head}`"),
        _ => "unknown (not a git checkout)".into(),
    }
}
