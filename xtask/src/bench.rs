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
//!
//! Everything happens in fresh databases `cm_bench_<random>` and `cm_bench_<random>_sql` on the
//! given server, dropped at the end. The report is Markdown on stdout (`report`); progress goes to
//! stderr. With `--quick`, the last line is `fires_per_sec=<n> baseline_per_sec=<n> ratio=<r>`.

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

/// A round's steps: the lean baseline beside the drain it is compared with, the others between.
/// Round `n` starts `n` steps further on, so no step always runs first or last.
const ROUND: [Step; 5] = [
    Step::Sql(Script::Lean),
    Step::Engine(Shape::Drain),
    Step::Sql(Script::TwoTx),
    Step::Engine(Shape::Window),
    Step::Sql(Script::OneTx),
];

/// Runs the bench and prints its Markdown report to stdout (progress goes to stderr).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = crate::measuring_options("bench", Options::parse(args), USAGE) else {
        return Ok(());
    };
    STARTED.get_or_init(Instant::now);
    // Before anything is built or created: a missing tool is a one-line answer.
    let tools = raw_sql::tool_versions()?;
    if !crate::postgres_answers(&options.database_url) {
        bail!("PostgreSQL does not answer at {}", options.database_url);
    }
    progress!("building the release cm-scheduler");
    let binary = processes::build_binary()?;
    let command = std::iter::once("cargo run --release -p xtask -- bench".to_string())
        .chain(args.iter().map(|a| {
            if a.contains(' ') || a.is_empty() {
                format!("\"{a}\"")
            } else {
                a.clone()
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(bench(options, binary, tools, command))
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
    let engine_url = crate::database_url(&options.database_url, &name)?;
    let sql_url = crate::database_url(&options.database_url, &format!("{name}_sql"))?;
    for url in [&engine_url, &sql_url] {
        PgStore::create_database_if_missing(url)
            .await
            .with_context(|| format!("creating a bench database on {}", options.database_url))?;
    }
    let dir = std::env::temp_dir().join(format!("cm-bench-{name}"));
    progress!(
        "created databases {name} and {name}_sql; scripts and process logs in {}",
        dir.display()
    );
    let result = measure(
        &options,
        &binary,
        &engine_url,
        &sql_url,
        &dir,
        tools,
        command,
    )
    .await;
    // The databases go whether the bench succeeded or not; the bench's own error comes first.
    let mut dropped = Ok(());
    for url in [&engine_url, &sql_url] {
        let outcome =
            <sqlx::Postgres as sqlx::migrate::MigrateDatabase>::force_drop_database(url).await;
        dropped = dropped.and(outcome);
    }
    if result.is_err() {
        progress!(
            "the bench failed; its process logs are kept in {}",
            dir.display()
        );
    }
    result?;
    dropped.with_context(|| format!("dropping {name} and {name}_sql"))?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    progress!("dropped databases {name} and {name}_sql");
    Ok(())
}

async fn measure(
    options: &Options,
    binary: &Path,
    engine_url: &str,
    sql_url: &str,
    dir: &Path,
    tools: String,
    command: String,
) -> anyhow::Result<()> {
    let admin = PgStore::connect(engine_url).await?;
    admin.migrate().await?;
    let pool = admin.pool();
    let started_at = Utc::now();
    let raw = RawSql::new(dir, sql_url)?;

    let mut runs = Vec::new();
    for round in 1..=options.rounds {
        for i in 0..ROUND.len() {
            let step = ROUND[(i + round as usize - 1) % ROUND.len()];
            let measured = match step {
                Step::Sql(script) => {
                    let length = Length::Seconds(options.sql_seconds);
                    let run =
                        tokio::task::block_in_place(|| raw.run(script, options.batch, length))?;
                    Measured::Sql(script, run)
                }
                Step::Engine(shape) => {
                    let label = format!("round{round}-{shape:?}").to_lowercase();
                    let run = processes::run(pool, binary, engine_url, options, shape, dir, &label)
                        .await?;
                    Measured::Engine(shape, run)
                }
            };
            progress!(
                "round {round}: {}: {:.0} a second",
                measured.name(),
                measured.rate()
            );
            runs.push((round, measured));
        }
    }

    let mut lateness = Vec::new();
    for tick in [Duration::from_secs(1), Duration::from_millis(200)] {
        for stall in [false, true] {
            let run = lateness::run(pool, engine_url, options, tick, stall).await?;
            progress!(
                "lateness, {tick:?} tick, stall {stall}: claimed p99 {:.0} ms, settled p99 {:.0} ms",
                run.others.claimed[1],
                run.others.settled[1]
            );
            lateness.push(run);
        }
    }

    let show = |setting: &'static str| async move {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(pool)
            .await
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
        tools,
        started_at,
        wall: STARTED.get_or_init(Instant::now).elapsed(),
    };
    admin.pool().close().await;
    report::print(options, &facts, &runs, &lateness);
    if options.quick {
        println!("{}", report::last_line(&runs));
    }
    Ok(())
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
