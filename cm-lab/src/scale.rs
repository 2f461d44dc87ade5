//! `cargo xtask scale`: the store at a million routines and ten million ledger rows.
//!
//! Everything happens in a fresh database `cm_scale_<random>` on the given server, migrated like
//! any other and dropped at the end (kept with `--keep`); tables are bulk-loaded with
//! `generate_series` statements. What is measured (`measure`), in this order:
//!
//! - **Idle tick**: with 1k, 100k and 1M parked routines (nothing due for an hour), the latency
//!   of the store's claim (`claim_due`, the engine's parameters), median and p99, and the buffers
//!   `EXPLAIN (ANALYZE, BUFFERS)` reports for its due query; then the peak memory (`VmHWM`) and
//!   CPU of an idle `cm-scheduler run` on the million, with defaults and with a 10 ms tick.
//! - **Throughput**: two `cm-scheduler run` processes (release build, the bench's flags) draining
//!   the same number of occurrences owed by many routines once each, then by few routines many
//!   times each; fires a second from the ledger, and the processes' peak memory.
//! - **Mission rate**: 1k mission routines due on one second, launched by one `cm-scheduler run`
//!   on the process backend (`/bin/true`), at the default `--max-mission-launches-per-second`
//!   (10) and at 100: the launches' times from the backend's markers, the mean rate and the most
//!   launched in any one second, against the configured rate (`missions`).
//! - **`fires` first page** at 1M and 10M ledger rows (1% of them `failed`): the binary's
//!   `fires --limit 50` (plain, `--status failed`, `--routine`), process start included, and the
//!   store call alone.
//! - **Due at once**: two `cm-scheduler run` processes started with no flags but the database
//!   URL (and `--listen` for readiness), then 10k, 100k and 1M message routines whose one
//!   occurrence is the same second, committed before it: the time until all are fired,
//!   lateness p50/p99/max, peak memory and CPU per process; the same with the bench's tuned
//!   flags beside it (the ratio defaults/tuned); and 20k against 200k due at once with
//!   `--max-fires-per-tick 2000 --tick-interval 50ms`, one process and two (the per-fire cost
//!   must not grow with how many are due); last, 1,000 every-second routines fired by two
//!   processes with defaults for 20 s, their lateness p50/p99/max.
//! - **Jitter**: 1M message routines whose one occurrence is the same second, with `jitter 5m`,
//!   fired by two processes with defaults: the claims in each second of the five minutes (the
//!   busiest against the mean), a histogram, and the lateness from the planned instant
//!   (`CM_SCALE_JITTER_FLAGS` gives the processes other flags than the defaults).
//! - **Retention**: with millions of settled rows past the retention, the claim rate of the store's
//!   claim beside a continuous prune (`prune_settled`, the engine's batch) against the claim rate
//!   without, and the prune's own rate.
//! - **Create**: the same N routines (100k; `CM_SCALE_CREATE_ROUTINES`) written by a plain
//!   `COPY` into a copy of `routines`, by `routine import` and by `cm.create_routines`: the
//!   latter two as ratios to the `COPY` (`create.rs`).
//!
//! The report is Markdown on stdout; progress goes to stderr. `--quick` runs the same steps at a
//! tenth of the sizes (a smoke test).

mod create;
mod jitter;
mod load;
mod measure;
mod missions;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use cm_store::PgStore;

/// When the run started, for the progress lines.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Prints a progress line to stderr with the seconds since the run started.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!(
            "xtask scale [{:6.1} s]: {}",
            $crate::scale::STARTED.get_or_init(std::time::Instant::now).elapsed().as_secs_f64(),
            format_args!($($arg)*)
        )
    };
}
pub(crate) use progress;

const USAGE: &str = "usage: cargo xtask scale [--quick] [--keep] \
[--only STEP] [--database-url URL]\n\
  --quick             a tenth of the sizes (a smoke test of every step)\n\
  --only STEP         only this step: idle, throughput, due-at-once, every-second, mission-rate,
                      jitter, fires, retention or create\n\
  --keep              keep the database cm_scale_<random> afterwards\n\
  --database-url URL  the server to create it on (default postgres://postgres@127.0.0.1:5432/postgres)";

/// The sizes of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sizes {
    /// Parked routines the idle tick is measured at, ascending.
    pub idle: Vec<u32>,
    /// Claims timed at each idle size.
    pub samples: u32,
    /// Seconds an idle scheduler process runs on the largest idle size.
    pub idle_run_seconds: u64,
    /// Routines owing one occurrence each in the "many" throughput run.
    pub many: u32,
    /// Routines owing `FEW_OCCURRENCES` each in the "few" run (`many` occurrences in all).
    pub few: u32,
    /// Ledger rows the `fires` first page is timed at, ascending.
    pub ledger: Vec<u64>,
    /// Routines those rows belong to.
    pub ledger_routines: u32,
    /// Routines added to those for the retention step's claims, each owing one occurrence.
    pub claim_routines: u32,
    /// Seconds each phase of the retention measurement lasts.
    pub phase_seconds: u64,
    /// Routines due on one second in the "due at once" step, ascending.
    pub burst: Vec<u32>,
    /// The smaller and larger burst the per-fire cost is compared at.
    pub burst_pair: (u32, u32),
    /// Mission routines due on one second in the "mission rate" step.
    pub missions: u32,
    /// Every-second routines, and for how many seconds, whose lateness is measured at defaults.
    pub every_second: (u32, u64),
    /// Routines whose one occurrence is the same second, with `jitter 5m`, in the "jitter" step.
    pub jittered: u32,
    /// Routines created three ways in the "create" step (`CM_SCALE_CREATE_ROUTINES` sets it).
    pub create: u32,
}

/// Occurrences each routine of the "few" throughput run owes: seconds 0 to 49 of two minutes.
pub(crate) const FEW_OCCURRENCES: u32 = 100;

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            idle: vec![1_000, 100_000, 1_000_000],
            samples: 200,
            idle_run_seconds: 30,
            many: 200_000,
            few: 2_000,
            ledger: vec![1_000_000, 10_000_000],
            ledger_routines: 10_000,
            claim_routines: 790_000,
            phase_seconds: 15,
            burst: vec![10_000, 100_000, 1_000_000],
            burst_pair: (20_000, 200_000),
            missions: 1_000,
            every_second: (1_000, 20),
            jittered: 1_000_000,
            create: create_routines(100_000),
        }
    }

    fn quick() -> Sizes {
        Sizes {
            idle: vec![1_000, 10_000, 100_000],
            samples: 50,
            idle_run_seconds: 5,
            many: 20_000,
            few: 200,
            ledger: vec![100_000, 1_000_000],
            ledger_routines: 1_000,
            claim_routines: 149_000,
            phase_seconds: 4,
            burst: vec![1_000, 10_000, 100_000],
            burst_pair: (2_000, 20_000),
            missions: 100,
            every_second: (1_000, 6),
            jittered: 100_000,
            create: create_routines(10_000),
        }
    }
}

/// The "create" step's size: `CM_SCALE_CREATE_ROUTINES` if set to a number, else `default`.
fn create_routines(default: u32) -> u32 {
    std::env::var("CM_SCALE_CREATE_ROUTINES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    pub quick: bool,
    pub keep: bool,
    pub database_url: String,
    pub sizes: Sizes,
    /// Only this step, if given.
    pub only: Option<String>,
}

/// The steps `--only` names, in the order they run.
const STEPS: [&str; 9] = [
    "idle",
    "throughput",
    "due-at-once",
    "mission-rate",
    "every-second",
    "jitter",
    "fires",
    "retention",
    "create",
];

impl Options {
    /// Whether `step` runs.
    pub(crate) fn runs(&self, step: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == step)
    }
}

impl Options {
    /// Parses the arguments after `scale`; `None` for `--help`.
    pub(crate) fn parse(args: &[String]) -> anyhow::Result<Option<Options>> {
        let mut options = Options {
            quick: false,
            keep: false,
            database_url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            sizes: Sizes::full(),
            only: None,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => {
                    options.quick = true;
                    options.sizes = Sizes::quick();
                }
                "--keep" => options.keep = true,
                "--only" => {
                    let step = args.next().context("--only needs a step")?;
                    if !STEPS.contains(&step.as_str()) {
                        bail!(
                            "unknown step {step:?} (expected one of {})",
                            STEPS.join(", ")
                        );
                    }
                    options.only = Some(step.clone());
                }
                "--database-url" => {
                    options.database_url =
                        args.next().context("--database-url needs a URL")?.clone();
                    url::Url::parse(&options.database_url).with_context(|| {
                        format!("invalid --database-url {:?}", options.database_url)
                    })?;
                }
                "--help" | "-h" => return Ok(None),
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        Ok(Some(options))
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    /// What was measured.
    pub what: String,
    /// At what size.
    pub size: String,
    /// The figure.
    pub value: String,
    /// How to read it (the target, the plan's buffers, a check).
    pub note: String,
}

impl Row {
    pub(crate) fn new(
        what: impl Into<String>,
        size: impl Into<String>,
        value: impl Into<String>,
        note: impl Into<String>,
    ) -> Row {
        Row {
            what: what.into(),
            size: size.into(),
            value: value.into(),
            note: note.into(),
        }
    }
}

/// What the report says about the run itself.
#[derive(Debug, Clone)]
pub(crate) struct Facts {
    pub command: String,
    pub commit: String,
    pub server: String,
    pub started_at: DateTime<Utc>,
    pub wall_seconds: f64,
}

/// The Markdown report: the facts, then one table.
pub(crate) fn report(facts: &Facts, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Command: `{}`  ", facts.command);
    let _ = writeln!(
        out,
        "Run {} (UTC), commit {}, {:.0} s; server {}.\n",
        facts.started_at.format("%Y-%m-%d %H:%M"),
        facts.commit,
        facts.wall_seconds,
        facts.server
    );
    let _ = writeln!(out, "| Measure | Size | Figure | Note |");
    let _ = writeln!(out, "|---|---|---|---|");
    for row in rows {
        let cell = |s: &str| s.replace('|', "\\|");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            cell(&row.what),
            cell(&row.size),
            cell(&row.value),
            cell(&row.note)
        );
    }
    out
}

/// A count as the report writes it: `1k`, `200k`, `1M`, `10M`, or the number.
pub(crate) fn count(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// Runs the scale measurements and prints the report to stdout.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let Some(options) = crate::measuring_options("scale", Options::parse(args), USAGE) else {
        return Ok(());
    };
    STARTED.get_or_init(Instant::now);
    if !crate::postgres_answers(&options.database_url) {
        bail!("PostgreSQL does not answer at {}", options.database_url);
    }
    progress!("building the release cm-scheduler");
    let binary = crate::bench::processes::build_binary()?;
    let command = std::iter::once("cargo xtask scale".to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(scale(options, binary, command))
}

async fn scale(options: Options, binary: PathBuf, command: String) -> anyhow::Result<()> {
    let name = format!(
        "cm_scale_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = crate::database_url(&options.database_url, &name)?;
    PgStore::create_database_if_missing(&url)
        .await
        .with_context(|| format!("creating {name} on {}", options.database_url))?;
    let dir = std::env::temp_dir().join(format!("cm-scale-{name}"));
    std::fs::create_dir_all(&dir)?;
    progress!("created database {name}; process logs in {}", dir.display());
    let started_at = Utc::now();
    let result = measure::all(&options, &binary, &url, &dir).await;
    let server = match &result {
        Ok(_) => server_facts(&url).await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    if options.keep {
        progress!("kept database {name}");
    } else {
        let dropped =
            <sqlx::Postgres as sqlx::migrate::MigrateDatabase>::force_drop_database(&url).await;
        if result.is_ok() {
            dropped.with_context(|| format!("dropping {name}"))?;
        }
        progress!("dropped database {name}");
    }
    let rows = result?;
    std::fs::remove_dir_all(&dir).ok();
    let facts = Facts {
        command,
        commit: crate::bench::commit(),
        server,
        started_at,
        wall_seconds: STARTED.get_or_init(Instant::now).elapsed().as_secs_f64(),
    };
    print!("{}", report(&facts, &rows));
    Ok(())
}

async fn server_facts(url: &str) -> anyhow::Result<String> {
    let store = PgStore::connect(url).await?;
    let pool = store.pool();
    let show = |setting: &'static str| async move {
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(pool)
            .await
    };
    let facts = format!(
        "PostgreSQL {} (`shared_buffers` {}, `synchronous_commit` {}), {} cores",
        show("server_version").await?,
        show("shared_buffers").await?,
        show("synchronous_commit").await?,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    pool.close().await;
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_arguments_are_the_full_sizes_on_the_local_server() {
        let options = Options::parse(&[]).unwrap().unwrap();
        assert!(!options.quick && !options.keep);
        assert_eq!(options.sizes.idle, [1_000, 100_000, 1_000_000]);
        assert_eq!(options.sizes.ledger, [1_000_000, 10_000_000]);
        assert_eq!(
            (options.sizes.many, options.sizes.few * FEW_OCCURRENCES),
            (200_000, 200_000),
            "both throughput runs owe the same number of occurrences"
        );
        assert!(options.database_url.starts_with("postgres://"));
    }

    #[test]
    fn quick_keep_and_a_url_are_read() {
        let options = Options::parse(&args(&[
            "--quick",
            "--keep",
            "--database-url",
            "postgres://u@db:5433/x",
        ]))
        .unwrap()
        .unwrap();
        assert!(options.quick && options.keep);
        assert_eq!(options.database_url, "postgres://u@db:5433/x");
        assert_eq!(options.sizes, Sizes::quick());
        assert_eq!(
            options.sizes.many,
            options.sizes.few * FEW_OCCURRENCES,
            "quick runs compare equal work too"
        );
    }

    #[test]
    fn help_and_bad_arguments_are_told_apart() {
        assert_eq!(Options::parse(&args(&["--help"])).unwrap(), None);
        let unknown = Options::parse(&args(&["--fast"])).unwrap_err().to_string();
        assert!(
            unknown.contains("--fast") && unknown.contains("usage"),
            "{unknown}"
        );
        assert!(Options::parse(&args(&["--database-url"])).is_err());
        assert!(Options::parse(&args(&["--database-url", "not a url"])).is_err());
    }

    #[test]
    fn the_report_is_one_markdown_table_with_the_command_and_commit() {
        let facts = Facts {
            command: "cargo xtask scale --quick".into(),
            commit: "`abc1234`".into(),
            server: "PostgreSQL 15".into(),
            started_at: DateTime::parse_from_rfc3339("2026-11-30T20:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
            wall_seconds: 61.0,
        };
        let rows = [
            Row::new("idle claim, median", count(1_000_000), "1.20 ms", "a | b"),
            Row::new("fires", count(10_000_000), "40 ms", ""),
        ];
        let text = report(&facts, &rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("scale --quick") && lines[1].contains("`abc1234`"));
        assert!(lines[1].contains("2026-11-30 20:00"));
        let table: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with('|'))
            .collect();
        assert_eq!(table.len(), 4, "{text}");
        assert_eq!(table[2], "| idle claim, median | 1M | 1.20 ms | a \\| b |");
        assert_eq!(table[3], "| fires | 10M | 40 ms |  |");
    }

    #[test]
    fn counts_are_written_short_when_round() {
        assert_eq!(count(1_000), "1k");
        assert_eq!(count(200_000), "200k");
        assert_eq!(count(10_000_000), "10M");
        assert_eq!(count(1_500), "1500");
    }
}
