//! Parsing and running the command line (the contract in DESIGN.md).
//!
//! The routine commands are in `cli/routine.rs` (with `cli/import.rs` for the files `routine
//! import` reads), the tables in `cli/listing.rs`, and connecting with secrets kept out of
//! messages in `cli/database.rs`.

/// `println!` that ends the command quietly when its reader has gone (see `cli/out.rs`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::out::line(format_args!($($arg)*))
    };
}

mod completions;
mod database;
mod health;
mod listing;
mod out;
mod routine;
mod secrets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use cm_dispatch::RoutedDispatcher;
use cm_domain::{FireCap, FireOutcome, Lease, Occurrence, Schedule, SchedulerConfig};
use cm_scheduler::Scheduler;
use cm_scheduler::health::{Health, Readiness};
use cm_scheduler::hosts::AllowedHosts;
use cm_scheduler::state::{BearerToken, HttpState, StatusPage};
use cm_store::{FireCursor, FireFilter, FireLedger, PgStore, StoreError, StoreOptions};

use database::connect;
use routine::RoutineCommand;

mod backends;
mod outbox;

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/cm";

/// A durable cron scheduler on PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "cm-scheduler", version, about)]
struct Cli {
    /// The PostgreSQL database [default: postgres://postgres@127.0.0.1:5432/cm].
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// A file holding the database URL (at most 64 KiB; surrounding whitespace and the trailing
    /// newline are dropped), so that its password is never in the environment or on the command
    /// line; not with --database-url or DATABASE_URL.
    #[arg(long, env = "DATABASE_URL_FILE", global = true, value_name = "PATH")]
    database_url_file: Option<PathBuf>,
    /// The database URL goes through a connection pooler (PgBouncer 1.21 or later, in
    /// transaction or session mode): cm sends no settings when it connects and sets its
    /// timeouts in every transaction instead, and does not create the database. The README's
    /// "Deploying behind PgBouncer" says what to configure.
    #[arg(long, env = "CM_DATABASE_POOLED", global = true)]
    pooled: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Applies the schema's migrations (creating the database if it does not exist).
    Migrate {
        /// Then distributes the schema on Citus (the `citus` extension must be installed in the
        /// database, its workers added): the per-routine tables by `group_id`, co-located, and
        /// the global ones as reference tables. Running it again changes nothing.
        #[arg(long)]
        citus: bool,
    },
    /// Runs a scheduler until SIGINT or SIGTERM.
    Run(Box<RunArgs>),
    /// Creates and manages routines.
    #[command(subcommand)]
    Routine(Box<RoutineCommand>),
    /// Lists fires (the occurrence ledger), newest first, as a table (or JSON lines); `fires
    /// show FIRE` shows one, with what its run said.
    #[command(args_conflicts_with_subcommands = true)]
    Fires {
        /// One fire.
        #[command(subcommand)]
        show: Option<FiresCommand>,
        /// Only this routine's (its id or name).
        #[arg(long, value_name = "ID|NAME")]
        routine: Option<String>,
        /// Only with this outcome: a mission's is its run's (`failed` lists every failure: failed
        /// dispatches, runs that failed or were lost).
        #[arg(long, value_name = "OUTCOME", value_parser = [
            "claimed", "fired", "failed", "skipped", "running", "succeeded", "lost",
        ])]
        status: Option<String>,
        /// At most this many (at least 1).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Resume after this cursor: the one a full page prints on its last line.
        #[arg(long)]
        cursor: Option<FireCursor>,
        /// As JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Schedule arithmetic, without a database.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Prints a shell completion script (for example `cm-scheduler completions bash >
    /// /etc/bash_completion.d/cm-scheduler`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Shows the message outbox: what consumers have not acknowledged yet.
    Outbox(outbox::OutboxArgs),
    /// Asks a running scheduler's /readyz (for a container's HEALTHCHECK): exits 0 when it is
    /// ready, 1 with the reason otherwise.
    Health(health::HealthArgs),
    /// The names of routines starting with a prefix, one a line, for the completion scripts.
    #[command(name = "__complete-routine", hide = true)]
    CompleteRoutine {
        /// What the name starts with.
        #[arg(default_value = "")]
        prefix: String,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The id written on this scheduler's claims (default: unique per process).
    #[arg(long)]
    instance_id: Option<String>,
    /// How often a tick runs.
    #[arg(long, default_value = "1s", value_parser = duration)]
    tick_interval: Duration,
    /// The most occurrences one tick dispatches; the rest are deferred.
    #[arg(long, default_value_t = 25)]
    max_fires_per_tick: usize,
    /// How long a claim belongs to its claimant.
    #[arg(long, default_value = "60s", value_parser = duration)]
    lease: Duration,
    /// The longest one dispatch may run; must be shorter than the lease.
    #[arg(long, default_value = "30s", value_parser = duration)]
    dispatch_timeout: Duration,
    /// The most dispatches running at once; a tick claims no more than it can start [default:
    /// 100, or the cap if larger, so a tick can always claim a whole cap].
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// How many claims an occurrence may have before it is settled failed.
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// How late an occurrence may be and still count as on time.
    #[arg(long, default_value = "60s", value_parser = duration)]
    misfire_grace: Duration,
    /// Under catch-up, the most missed occurrences that fire (at most 10,000).
    #[arg(long, default_value_t = 100)]
    max_backlog: usize,
    /// How long settled fires are kept before they are pruned (at least a day).
    #[arg(long, default_value = "30days", value_parser = duration)]
    retention: Duration,
    /// The most missions this scheduler launches in any second; the rest wait, unclaimed, late
    /// but not lost (0: no bound).
    #[arg(long, default_value_t = SchedulerConfig::DEFAULT_MISSION_LAUNCHES_PER_SECOND)]
    max_mission_launches_per_second: u32,
    /// Serve the status page, /metrics, /livez and /readyz on this address.
    #[arg(long, env = "CM_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// A name (or address) the status page is served at, as `NAME` (any port) or `NAME:PORT`;
    /// repeatable. The page and its actions answer only requests sent to the listen address,
    /// to `localhost`, `127.0.0.1` and `[::1]` on its port when it listens on loopback (or on
    /// every address), and to these: any other `Host` is refused (421, against DNS
    /// rebinding). /metrics, /livez and /readyz answer whatever `Host` names them.
    #[arg(long, value_name = "NAME")]
    allowed_host: Vec<String>,
    /// A file holding the bearer token the status page requires (needed when --listen is not
    /// a loopback address; /metrics, /livez and /readyz stay open).
    #[arg(long)]
    http_token_file: Option<PathBuf>,
    /// Pause a routine whose last N fires all failed, keeping the reason (0: never).
    #[arg(long, default_value_t = 5)]
    pause_after_failures: u32,
    /// Claim one routine group at a time, in the groups this scheduler leases, also on plain
    /// PostgreSQL (on Citus it always does: there a claim must stay on one shard). On plain
    /// PostgreSQL a claim across every group is cheaper per occurrence (docs/BENCHMARKS.md).
    #[arg(long)]
    claim_per_group: bool,
    /// How long this scheduler's lease on a routine group lasts, renewed every third of it
    /// (at least three tick intervals). A scheduler that stops renewing (killed, or cut off
    /// from the database) has its groups claimed in by the others as soon as its leases run
    /// out; one that stops cleanly gives them up at once.
    #[arg(long, default_value = "15s", value_parser = duration)]
    group_lease: Duration,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    /// Send each attempt's claim, dispatch and settle as OpenTelemetry spans to this OTLP/HTTP
    /// receiver (`http://collector:4318`; `/v1/traces` is added). Off without it.
    #[arg(long, env = "CM_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    #[command(flatten)]
    messages: backends::MessageArgs,
    #[command(flatten)]
    mission: crate::mission_args::MissionArgs,
    /// Do not apply migrations on start.
    #[arg(long)]
    no_migrate: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Prints the next occurrences of an expression, one UTC instant a line.
    Next {
        /// The cron expression, with any clauses (`except …`, `from …`, `until …`); or give
        /// the flags `routine create` takes instead.
        expr: Option<String>,
        #[command(flatten)]
        when: cm_scheduler::flags::schedule::ScheduleFlags,
        /// The IANA zone it is read in.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Start after this instant (RFC 3339; default now).
        #[arg(long)]
        after: Option<String>,
        /// How many to print (at least 1).
        #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        count: usize,
        /// With a jitter: the routine (its id) whose runs to print, each as the instant it
        /// comes due, then its occurrence. Without one, a jittered schedule's occurrences are
        /// printed (each routine's runs come up to the jitter later).
        #[arg(long, value_name = "UUID")]
        routine_id: Option<uuid::Uuid>,
    },
}

/// A failure, split by whose it is: bad input exits 2, anything else 1.
#[derive(Debug)]
enum Failure {
    /// The input is wrong; nothing was written.
    Input(String),
    /// Something else failed.
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::RoutineNotFound(_)
            | StoreError::RoutineNameNotFound(_)
            | StoreError::NameTaken(_)
            | StoreError::InvalidRoutine(_) => Failure::Input(e.to_string()),
            other => Failure::Other(anyhow::anyhow!(other.explain())),
        }
    }
}

fn input(message: impl Into<String>) -> Failure {
    Failure::Input(message.into())
}

/// Reads a duration flag (`30s`, `5m`, `1h30m`, `30days`).
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|_| {
        "not a duration (a number and a unit, such as 30s, 5m, 1h30m or 30days)".into()
    })
}

/// The commands that never touch the database: `--database-url` and `--database-url-file`,
/// global for the others, are left out of their help and completions.
const WITHOUT_DATABASE: &[&str] = &["schedule", "completions", "__complete-routine"];

/// The command line's definition, as parsed and as completed.
fn command() -> clap::Command {
    use clap::CommandFactory as _;
    // The flags the root makes global are copied into a subcommand only if the subcommand does
    // not have them already: these get their own, hidden, which their subcommands copy in turn.
    let hidden = [
        clap::Arg::new("database_url")
            .long("database-url")
            .env("DATABASE_URL"),
        clap::Arg::new("database_url_file")
            .long("database-url-file")
            .env("DATABASE_URL_FILE")
            .value_parser(clap::value_parser!(PathBuf)),
    ]
    .map(|arg| arg.global(true).hide(true));
    WITHOUT_DATABASE.iter().fold(Cli::command(), |c, name| {
        c.mut_subcommand(name, |sub| sub.args(hidden.clone()))
    })
}

/// The database URL, from `--database-url` (or `DATABASE_URL`), from the file
/// `--database-url-file` (or `DATABASE_URL_FILE`) names, or the default. Both given is an
/// error: which one was meant cannot be told.
fn database_url(cli: &Cli) -> Result<String, String> {
    match (&cli.database_url, &cli.database_url_file) {
        (Some(_), Some(_)) => Err(
            "the database URL is given twice: --database-url (or DATABASE_URL) and \
             --database-url-file (or DATABASE_URL_FILE); give one of them"
                .into(),
        ),
        (Some(url), None) => Ok(url.clone()),
        (None, Some(path)) => {
            let shown = path.display();
            let text = cm_scheduler::bounded::read_file(path, cm_scheduler::bounded::SECRET_FILE)
                .map_err(|e| format!("cannot read --database-url-file {shown}: {e}"))?;
            secrets::register_file(&text);
            let url = text.trim();
            if url.is_empty() {
                return Err(format!("--database-url-file {shown} is empty"));
            }
            Ok(url.to_string())
        }
        (None, None) => Ok(DEFAULT_DATABASE_URL.into()),
    }
}

/// Parses the command line, runs it, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    use clap::FromArgMatches as _;
    let cli = match command()
        .try_get_matches()
        .and_then(|matches| Cli::from_arg_matches(&matches))
    {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version print to stdout and succeed.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line: clap's first paragraph names the problem (for a missing argument, on
            // the lines after its first), and its tips and usage block after a blank line are
            // noise here.
            let rendered = e.to_string();
            let problem = rendered
                .lines()
                .map(str::trim)
                .take_while(|line| !line.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            let problem = problem.trim_start_matches("error: ");
            if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // Without any command clap renders the whole help, whose first paragraph is
                // the description, not the problem.
                eprintln!("cm-scheduler: a command is required (see cm-scheduler --help)");
            } else if problem.is_empty() {
                eprintln!("cm-scheduler: invalid arguments");
            } else {
                eprintln!("cm-scheduler: {problem}");
            }
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cm-scheduler: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // Whatever a message quotes, no configured secret reaches the terminal: the database URL's
    // are registered now, the others as their flags and files are read.
    if let Some(url) = &cli.database_url {
        for secret in database::secrets(url) {
            secrets::register(&secret);
        }
    }
    let url = match database_url(&cli) {
        Ok(url) => url,
        Err(message) => {
            eprintln!("cm-scheduler: {}", secrets::scrub(&message));
            return ExitCode::from(2);
        }
    };
    for secret in database::secrets(&url) {
        secrets::register(&secret);
    }
    database::set_pooled(cli.pooled);
    match runtime.block_on(execute(cli, &url)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(message)) => {
            eprintln!("cm-scheduler: {}", secrets::scrub(&message));
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("cm-scheduler: {}", secrets::scrub(&one_line(&e)));
            ExitCode::from(1)
        }
    }
}

/// An error and its causes on one line.
///
/// A cause whose text its parent's message already includes is left out: `StoreError::Database`
/// prints its sqlx error and also returns it as its source, so `{:#}` would say it twice.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.lines().map(str::trim).collect::<Vec<_>>().join(" ");
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

async fn execute(cli: Cli, url: &str) -> Result<(), Failure> {
    match cli.command {
        Command::Schedule(ScheduleCommand::Next {
            expr,
            mut when,
            timezone,
            after,
            count,
            routine_id,
        }) => {
            if let Some(expr) = expr {
                if when.has_rule() {
                    return Err(input(
                        "give the schedule once: as EXPR, or as --schedule, --every or --at",
                    ));
                }
                when.schedule = Some(expr);
            }
            let expr = when.text(None).map_err(input)?.unwrap_or_default();
            schedule_next(&expr, &timezone, after.as_deref(), count, routine_id)
        }
        Command::Migrate { citus } => {
            let store = connect(url, true).await?;
            store
                .migrate()
                .await
                .map_err(|e| anyhow::anyhow!("applying migrations: {}", e.explain()))?;
            say!("migrations applied");
            if citus {
                let distributed = store
                    .distribute_on_citus()
                    .await
                    .map_err(|e| anyhow::anyhow!("distributing on Citus: {}", e.explain()))?;
                say!("distributed on Citus ({distributed} tables newly distributed)");
            }
            Ok(())
        }
        Command::Run(args) => run(url, *args).await,
        Command::Outbox(args) => outbox::show(url, args).await,
        Command::Routine(command) => routine::routine(url, *command).await,
        Command::Fires {
            show: Some(FiresCommand::Show { fire, json }),
            ..
        } => fire_show(url, &fire, json).await,
        Command::Fires {
            show: None,
            routine,
            status,
            limit,
            cursor,
            json,
        } => {
            let page = FirePage {
                routine: routine.as_deref(),
                status,
                limit,
                cursor,
                json,
            };
            fires(url, page).await
        }
        Command::Health(args) => health::check(args)
            .await
            .map_err(|reason| Failure::Other(anyhow::anyhow!(reason))),
        Command::Completions { shell } => {
            out::bytes(&completions::script(shell, &mut command()));
            Ok(())
        }
        Command::CompleteRoutine { prefix } => {
            completions::routine_names(url, &prefix).await;
            Ok(())
        }
    }
}

/// `fires show`.
#[derive(Debug, clap::Subcommand)]
enum FiresCommand {
    /// Shows one fire: its outcome, its run's start, end, duration and exit code, and the last
    /// of its output (16 KiB at most, secrets scrubbed).
    Show {
        /// The fire: its key (`cm-<routine id>-<microseconds>`, the container's name and the
        /// messages' idempotency key), or ROUTINE@INSTANT: the routine's name or id and the
        /// occurrence's instant in RFC 3339, to the second as `fires` prints it.
        #[arg(value_name = "FIRE")]
        fire: String,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// `fires show FIRE`.
async fn fire_show(url: &str, handle: &str, json: bool) -> Result<(), Failure> {
    let handle = handle.trim();
    let store = database::connect_migrated(url).await?;
    let occurrence = match cm_domain::IdempotencyKey::parse_occurrence(handle) {
        Some(occurrence) => occurrence,
        None => {
            let Some((routine, at)) = handle.rsplit_once('@') else {
                return Err(input(format!(
                    "{handle:?} names no fire: give its key (cm-<routine id>-<microseconds>) or \
                     ROUTINE@INSTANT (2026-12-02T15:00:00Z)"
                )));
            };
            let at = parse_time(at)?;
            let routine_id = routine::find_id(&store, routine).await?;
            // An instant to the second, as `fires` prints it, names the fire in that second.
            let next = at + chrono::Duration::seconds(1);
            let found = store
                .list_fires(&FireFilter {
                    routine_id: Some(routine_id),
                    limit: 1,
                    after: Some(FireCursor {
                        scheduled_at: next,
                        routine_id,
                    }),
                    ..FireFilter::default()
                })
                .await?;
            match found.first() {
                Some(f) if f.scheduled_at >= at => Occurrence::new(routine_id, f.scheduled_at),
                _ => Occurrence::new(routine_id, at),
            }
        }
    };
    let Some(detail) = cm_store::StatusReader::fire(&store, occurrence).await? else {
        return Err(input(format!(
            "no fire of routine {} at {} in the ledger",
            occurrence.routine_id,
            listing::instant(occurrence.scheduled_at)
        )));
    };
    let names = store.names_of(&[occurrence.routine_id]).await?;
    if json {
        let line = serde_json::json!({
            "fire": listing::FireLine::new(&detail.fire, &names),
            "key": occurrence.idempotency_key().to_string(),
            "run_duration_seconds": detail.fire.run_duration().map(|d| d.as_seconds_f64()),
            "run_output": detail.run_output,
        });
        say!("{line}");
    } else {
        let name = names.get(&occurrence.routine_id).map(String::as_str);
        listing::print_fire(&detail, occurrence, name);
    }
    Ok(())
}

/// What one `fires` command asks for.
struct FirePage<'a> {
    routine: Option<&'a str>,
    status: Option<String>,
    limit: u32,
    cursor: Option<FireCursor>,
    json: bool,
}

async fn fires(url: &str, page: FirePage<'_>) -> Result<(), Failure> {
    let outcome = page
        .status
        .map(|s| s.parse::<FireOutcome>())
        .transpose()
        .map_err(|e| input(e.to_string()))?;
    let store = database::connect_migrated(url).await?;
    let routine_id = match page.routine {
        Some(reference) => Some(routine::find_id(&store, reference).await?),
        None => None,
    };
    let fires = store
        .list_fires(&FireFilter {
            routine_id,
            outcome,
            limit: page.limit,
            after: page.cursor,
        })
        .await?;
    // A full page may have a next one: its last line says where it starts.
    let next = (fires.len() == page.limit as usize)
        .then(|| fires.last().map(FireCursor::after))
        .flatten();
    // The page's routines by name: one lookup for the page, at most `limit` ids.
    let mut ids: Vec<uuid::Uuid> = fires.iter().map(|f| f.routine_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let names = store.names_of(&ids).await?;
    if page.json {
        let lines: Vec<listing::FireLine<'_>> = fires
            .iter()
            .map(|f| listing::FireLine::new(f, &names))
            .collect();
        listing::print_json_lines(&lines)?;
    } else {
        let rows: Vec<Vec<String>> = fires.iter().map(|f| listing::fire_row(f, &names)).collect();
        // An empty page still has its header: the listing ran and found nothing.
        listing::Table::new(listing::FIRE_COLUMNS).print_page(&rows);
    }
    match next {
        Some(next) if page.json => {
            say!("{}", serde_json::json!({ "next_cursor": next.to_string() }))
        }
        Some(next) => say!("next page: --cursor {next}"),
        None => {}
    }
    Ok(())
}

fn schedule_next(
    expr: &str,
    timezone: &str,
    after: Option<&str>,
    count: usize,
    routine: Option<uuid::Uuid>,
) -> Result<(), Failure> {
    let schedule = Schedule::parse(expr, timezone).map_err(|e| input(e.to_string()))?;
    let mut at = match after {
        Some(text) => parse_time(text)?,
        None => Utc::now(),
    };
    if let (Some(routine), Some(_)) = (routine, schedule.jitter()) {
        // The routine's runs as its clock would be set now: the first occurrence after `at`.
        for _ in 0..count {
            let Some((occurrence, planned)) = schedule.next_planned_after(routine, at) else {
                break;
            };
            say!(
                "{}  occurrence {}",
                planned.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                occurrence.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            at = occurrence;
        }
        return Ok(());
    }
    if let Some(jitter) = schedule.jitter() {
        eprintln!(
            "the occurrences; each routine's run comes up to {} after its occurrence \
             (--routine-id UUID prints one routine's)",
            cm_domain::duration_text(chrono::TimeDelta::from_std(jitter).unwrap_or_default())
        );
    }
    for _ in 0..count {
        match schedule.next_after(at) {
            Some(next) => {
                say!(
                    "{}",
                    next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
                at = next;
            }
            None => break,
        }
    }
    Ok(())
}

fn parse_time(text: &str) -> Result<DateTime<Utc>, Failure> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            input(format!(
                "invalid time {text:?} (expected RFC 3339, like 2025-03-09T07:00:00Z): {e}"
            ))
        })
}

/// Reads and validates a mission file (`cm_domain::Mission`): every field is checked, and a
/// refusal names the field; then the operator's `policy`. Images, endpoints and credentials are
/// operator configuration, never part of a routine. The file is read no further than its limit,
/// and only if it is a regular file. With a `root` (an import's mission root) `path` is
/// relative to it and may not leave it ([`cm_scheduler::bounded::open_inside`]); without one it is the
/// operator's own (`--mission`), absolute or relative to the current directory.
fn mission_payload(
    path: &std::path::Path,
    root: Option<&std::path::Path>,
    policy: &cm_domain::MissionPolicy,
) -> Result<serde_json::Value, Failure> {
    let shown = path.display();
    let opened = match root {
        Some(root) => cm_scheduler::bounded::open_inside(root, path).map(|(file, _)| file),
        None => cm_scheduler::bounded::open_regular(path),
    };
    let text = opened
        .and_then(|file| cm_scheduler::bounded::read_to(file, cm_scheduler::bounded::MISSION_FILE))
        .map_err(|e| input(format!("cannot read mission file {shown}: {e}")))?;
    let mission = cm_domain::Mission::from_json(&text)
        .map_err(|e| input(format!("mission file {shown}: {e}")))?;
    policy
        .check(&mission)
        .map_err(|e| input(format!("mission file {shown}: {e}")))?;
    // Validation passed, so the text is a JSON object; it is stored as written.
    serde_json::from_str(&text).map_err(|e| input(format!("mission file {shown}: {e}")))
}

/// The operator's mission policy from `--mission-config FILE` (or `CM_MISSION_CONFIG`) and the
/// policy flags that replace its lists; the defaults without either.
fn mission_policy(
    path: Option<&std::path::Path>,
    flags: &crate::mission_args::PolicyFlags,
) -> Result<cm_domain::MissionPolicy, Failure> {
    flags.policy(path).map_err(input)
}

/// `/readyz`'s view of the database: waiting while the start-up has not reached it, then
/// whether it answers a ping. It pings on a pool of its own (one connection), so health checks
/// never take a connection from the claims; [`Health`] runs it once per interval and caches the
/// answer. On a multi-host URL it is also not ready while the claims' pool has no host that
/// qualifies for the URL's `target_session_attrs` (between a primary's demotion and the
/// promotion of another), with each host and why it was refused as the reason.
struct DatabaseReadiness {
    store: PgStore,
    /// The claims' store, whose host is the one that matters.
    claims: PgStore,
    waiting: Arc<std::sync::Mutex<Option<String>>>,
}

#[async_trait::async_trait]
impl Readiness for DatabaseReadiness {
    async fn check(&self) -> Result<(), String> {
        if let Some(reason) = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Err(reason);
        }
        if let Some(reason) = self
            .claims
            .failover_problem()
            .or_else(|| self.store.failover_problem())
        {
            return Err(reason);
        }
        self.store
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| format!("the database does not answer: {e}"))
    }

    /// No host qualifies for the claims (a primary demoted, the other not yet promoted): seen
    /// by `/readyz` as soon as the store's 500 ms check finds it, not at the next cached check.
    fn known_now(&self) -> Option<String> {
        self.claims.failover_problem()
    }
}

/// A small pool of its own for what the HTTP side reads (health, the status page and its
/// actions), with short timeouts: a flood of requests or a hung network waits there, never on
/// the claims' pool.
fn http_pool(url: &str, connections: u32, timeout: Duration) -> Result<PgStore, StoreError> {
    PgStore::connect_lazy_with(
        url,
        &database::store_options(StoreOptions {
            max_connections: connections,
            acquire_timeout: timeout,
            statement_timeout: Some(timeout),
            lock_timeout: Some(timeout),
            idle_in_transaction_timeout: Some(timeout),
            pooled: false,
        }),
    )
}

/// Reads the status page's bearer token; one is required when the page is served on an
/// address other than loopback.
fn http_token(args: &RunArgs) -> Result<Option<BearerToken>, Failure> {
    let Some(path) = &args.http_token_file else {
        return match args.listen {
            Some(addr) if !addr.ip().is_loopback() => Err(input(format!(
                "--listen {addr} is not a loopback address: give --http-token-file with the \
                 status page's bearer token"
            ))),
            _ => Ok(None),
        };
    };
    let shown = path.display();
    let text = cm_scheduler::bounded::read_file(path, cm_scheduler::bounded::SECRET_FILE)
        .map_err(|e| input(format!("cannot read --http-token-file {shown}: {e}")))?;
    secrets::register_file(&text);
    BearerToken::new(&text)
        .map(Some)
        .ok_or_else(|| input(format!("--http-token-file {shown} is empty")))
}

/// The names the status page answers (`None` without `--listen`): the listen address's own,
/// and each `--allowed-host`.
fn allowed_hosts(
    listen: Option<std::net::SocketAddr>,
    names: &[String],
) -> Result<Option<AllowedHosts>, Failure> {
    let Some(listen) = listen else {
        if !names.is_empty() {
            return Err(input("--allowed-host needs --listen"));
        }
        return Ok(None);
    };
    let mut hosts = AllowedHosts::for_listen(listen);
    for name in names {
        hosts.admit(name).map_err(input)?;
    }
    Ok(Some(hosts))
}

/// Waits until the database answers (creating it and applying the migrations first unless
/// `migrate` is false), retrying with backoff and keeping the reason for `/readyz`. Fails only
/// when the database answers but refuses the migrations.
async fn prepare_database(
    url: &str,
    store: &PgStore,
    migrate: bool,
    waiting: &std::sync::Mutex<Option<String>>,
) -> Result<(), Failure> {
    let set_waiting = |reason: Option<String>| {
        *waiting.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    };
    let mut backoff = Duration::from_millis(500);
    loop {
        let reached = async {
            // Through a pooler the database is the pooler's to name; it is created beside it.
            if migrate && !database::pooled() {
                PgStore::create_database_if_missing(url).await?;
            }
            // A pooler that would fail every tick (losing prepared statements, or the
            // timeouts) is refused now, in one line; first, since through such a pooler the
            // ping itself may fail on a lost prepared statement.
            store.check_pooler().await?;
            store.ping().await.map(|_| ())
        }
        .await;
        match reached {
            Err(
                e @ (StoreError::PoolerLosesPreparedStatements(_)
                | StoreError::PoolerDropsSettings(_)),
            ) => return Err(anyhow::anyhow!(e.to_string()).into()),
            Err(e) if e.is_refused_startup_parameter() => {
                return Err(anyhow::anyhow!(e.explain()).into());
            }
            Ok(_) if !migrate => {
                // Without the schema every tick would fail: say so now, with what to do.
                store.check_schema().await?;
                break;
            }
            Ok(_) => match store.migrate().await {
                Ok(()) => break,
                // Refused by a database that answers: retrying will not help. A migration that
                // found no connection free (a server whose connections are all taken) was not
                // refused, and is retried like a database that does not answer.
                Err(e) if !e.is_transient() && store.ping().await.is_ok() => {
                    return Err(anyhow::anyhow!("applying migrations: {}", e.explain()).into());
                }
                Err(e) => {
                    set_waiting(Some(format!("waiting for the database: {e}")));
                    tracing::warn!(error = %e, retry_in = ?backoff, "applying migrations failed; retrying");
                }
            },
            Err(e) => {
                set_waiting(Some(format!("waiting for the database: {e}")));
                tracing::warn!(error = %e, retry_in = ?backoff, database = %database::redact(url),
                    "the database does not answer yet; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    set_waiting(None);
    tracing::info!(database = %database::redact(url), migrated = migrate, "the database answers");
    Ok(())
}

async fn run(url: &str, args: RunArgs) -> Result<(), Failure> {
    init_logging(args.log_format);
    let lease = Lease::new(args.lease).ok_or_else(|| input("--lease must be greater than zero"))?;
    let cap = FireCap::new(args.max_fires_per_tick)
        .ok_or_else(|| input("--max-fires-per-tick must be at least 1"))?;
    if args.group_lease < args.tick_interval * 3 {
        return Err(input(format!(
            "--group-lease {} must be at least three tick intervals ({}): it is renewed every \
             third of it, and at most once a tick",
            humantime::format_duration(args.group_lease),
            humantime::format_duration(args.tick_interval * 3)
        )));
    }
    let config = SchedulerConfig {
        tick_interval: args.tick_interval,
        max_fires_per_tick: cap,
        lease,
        dispatch_timeout: args.dispatch_timeout,
        max_in_flight: args
            .max_in_flight
            .unwrap_or(SchedulerConfig::DEFAULT_MAX_IN_FLIGHT.max(cap.get())),
        max_attempts: args.max_attempts,
        misfire_grace: args.misfire_grace,
        max_backlog: args.max_backlog,
        retention: args.retention,
        max_mission_launches_per_second: std::num::NonZeroU32::new(
            args.max_mission_launches_per_second,
        ),
    }
    .validate()
    .map_err(|e| input(e.to_string()))?;
    let mission = args.mission.dispatcher().await.map_err(|e| match e {
        crate::mission_args::MissionSetupError::Config(message) => input(message),
        crate::mission_args::MissionSetupError::Runtime(message) => {
            Failure::Other(anyhow::anyhow!(message))
        }
    })?;
    let runner = args.mission.describe();
    let token = http_token(&args)?;
    let messages = args.messages.plan(&config)?;
    let listener = match args.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| input(format!("cannot listen on {addr}: {e}")))?,
        ),
        None => None,
    };
    // Its names are the bound address's (a `--listen` port 0 is the one the system chose).
    let hosts = match &listener {
        Some(listener) => Some(listener.local_addr().map_err(anyhow::Error::from)?),
        None => None,
    };
    let hosts = allowed_hosts(hosts, &args.allowed_host)?;
    // The recorder goes in before the scheduler's counters are made, so they record into it.
    let metrics = match listener {
        Some(_) => Some(
            cm_scheduler::stats::install_prometheus().context("installing the metrics recorder")?,
        ),
        None => None,
    };

    // Both pools connect on first use: the process starts, and serves /livez, while the
    // database is down. Set-up (migrating, or checking the schema) runs without the
    // scheduler's timeouts, since building an index on a large ledger takes longer than any
    // claim statement may; the scheduler's own pool has statement, lock and
    // idle-in-transaction timeouts derived from the lease, so a claim never holds its
    // routines' locks past the leases it wrote.
    let invalid = |e: StoreError| {
        input(format!(
            "invalid --database-url {}: {e}",
            database::redact(url)
        ))
    };
    database::check_url(url)?;
    let setup = PgStore::connect_lazy_with(url, &database::store_options(StoreOptions::default()))
        .map_err(invalid)?;
    let store = PgStore::connect_lazy_with(
        url,
        &database::store_options(StoreOptions::for_lease(lease)),
    )
    .map_err(invalid)?;
    let message = messages.build(&store, &setup).await?;
    let instance_id = args
        .instance_id
        .unwrap_or_else(cm_scheduler::default_instance_id);
    let (mission, runtime) = mission.unzip();
    let traces = match &args.otlp_endpoint {
        Some(endpoint) => {
            let traces =
                cm_scheduler::traces::FireTracer::otlp(endpoint, &instance_id).map_err(input)?;
            tracing::info!(endpoint = %endpoint, "sending traces of fires over OTLP");
            Some(traces)
        }
        None => None,
    };
    let mut scheduler = Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(RoutedDispatcher::new(Some(message), mission)),
        config.clone(),
        instance_id.clone(),
    )
    .map_err(|e| input(e.to_string()))?
    .with_auto_pause(Arc::new(store.clone()), args.pause_after_failures)
    .with_outbox_pruning(Arc::new(store.clone()))
    .with_planning(Arc::new(store.clone()))
    .with_groups(
        Arc::new(store.clone()),
        args.claim_per_group,
        args.group_lease,
    );
    // A supervisor listening on NOTIFY_SOCKET (systemd, Type=notify) hears READY=1 after the
    // first good tick, WATCHDOG=1 from the tick loop, and STOPPING=1.
    let notifier = match cm_scheduler::notify::Notifier::from_env() {
        Ok(notifier) => notifier,
        Err(e) => {
            tracing::warn!(error = %e, "not notifying the supervisor");
            None
        }
    };
    if let Some(traces) = &traces {
        scheduler = scheduler.with_traces(traces.clone());
    }
    if let Some(notifier) = &notifier {
        tracing::info!(watchdog = ?notifier.watchdog(), "notifying the supervisor (NOTIFY_SOCKET)");
        notifier.status("waiting for the database");
        scheduler = scheduler.with_notifier(notifier.clone());
    }
    let stopping_early = || {
        if let Some(notifier) = &notifier {
            notifier.stopping();
        }
    };
    if let Some(runtime) = &runtime {
        scheduler = scheduler
            .with_secrets(secrets::registered())
            .with_run_watch(Arc::new(store.clone()), runtime.clone());
    }
    let scheduler = Arc::new(scheduler);

    let waiting = Arc::new(std::sync::Mutex::new(Some(
        "waiting for the database: not reached yet".to_string(),
    )));
    let mut started_health = None;
    if let (Some(listener), Some(metrics)) = (listener, metrics) {
        let health = Health::new(
            Arc::new(DatabaseReadiness {
                // The pool waits longer than the check's deadline, so a hung network reads
                // as "did not answer within 2s", not as the pool's own timeout.
                store: http_pool(url, 1, Duration::from_secs(3)).map_err(invalid)?,
                claims: store.clone(),
                waiting: waiting.clone(),
            }),
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        tokio::spawn(health.clone().run());
        started_health = Some(health.clone());
        let page = http_pool(url, 2, Duration::from_secs(3)).map_err(invalid)?;
        let state = Arc::new(HttpState {
            stats: scheduler.stats(),
            health,
            // Ticks never wait for dispatches, so a healthy scheduler ticks every interval
            // however slow its targets are.
            fresh_within: config.tick_interval * 3 + Duration::from_secs(5),
            metrics: metrics.clone(),
            status: Some(StatusPage {
                hosts: hosts.clone().unwrap_or_else(AllowedHosts::loopback),
                runner,
                ..StatusPage::new(Arc::new(page.clone()), Arc::new(page), instance_id.clone())
            }),
            token,
        });
        let addr = listener.local_addr().map_err(anyhow::Error::from)?;
        tracing::info!(%addr, "serving the status page, /metrics, /livez and /readyz");
        if let Some(hosts) = &hosts {
            tracing::info!(hosts = %hosts, "the status page answers only these hosts (--allowed-host adds one)");
        }
        let router = cm_scheduler::http::router(state);
        tokio::spawn(async move {
            if let Err(e) = cm_scheduler::http::serve(listener, router).await {
                tracing::error!(error = %e, "the HTTP server stopped");
            }
        });
        // Histograms are drained into their buckets here as well as on each scrape.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                metrics.run_upkeep();
            }
        });
    }

    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let shutdown = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    tokio::select! {
        prepared = prepare_database(url, &setup, !args.no_migrate, &waiting) => prepared?,
        () = shutdown(stopped.clone()) => {
            tracing::info!("stopped before the database answered");
            stopping_early();
            return Ok(());
        }
    }
    if let Some(runtime) = &runtime {
        if let Some(notifier) = &notifier {
            notifier.status("waiting for the mission runtime");
        }
        tokio::select! {
            () = wait_for_runtime(runtime.as_ref(), &waiting) => {}
            () = shutdown(stopped.clone()) => {
                tracing::info!("stopped before the mission runtime answered");
            stopping_early();
                return Ok(());
            }
        }
    }
    if let Some(runtime) = &runtime {
        // A permission the backend lacks would fail every stop or log read later, one fire at a
        // time: refused now, in one line naming what to grant.
        let missing = runtime.missing_permissions().await.map_err(|e| {
            Failure::Other(anyhow::anyhow!(
                "cannot check the mission runtime's permissions: {e}"
            ))
        })?;
        if !missing.is_empty() {
            return Err(input(format!(
                "the mission runtime refuses this scheduler's identity what the backend needs: {} \
                 (grant create, get and delete on jobs, list on pods and get on pods/log in its \
                 namespace)",
                missing.join(", ")
            )));
        }
    }

    // The start-up is over: health says so now, not at its next interval.
    if let Some(health) = &started_health {
        health.refresh().await;
    }
    let summary = scheduler
        .clone()
        .spawn(shutdown(stopped))
        .await
        .context("the scheduler task failed")?;
    if let Some(traces) = traces {
        // The last fires' spans are sent before the process exits.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    tracing::info!(
        ticks = summary.ticks,
        fired = summary.fired,
        succeeded = summary.succeeded,
        failed = summary.failed,
        lost = summary.lost,
        tick_errors = summary.tick_errors,
        last_error = summary.last_error.as_deref().unwrap_or("none"),
        "scheduler exited"
    );
    Ok(())
}

/// Waits until the mission runtime answers (a Docker engine restarting, a socket not there
/// yet), retrying with backoff and keeping the reason for `/readyz`, as for the database.
async fn wait_for_runtime(
    runtime: &dyn cm_dispatch::MissionRuntime,
    waiting: &std::sync::Mutex<Option<String>>,
) {
    let set_waiting = |reason: Option<String>| {
        *waiting.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    };
    let mut backoff = Duration::from_millis(500);
    while let Err(e) = runtime.ready().await {
        set_waiting(Some(format!("waiting for the mission runtime: {e}")));
        tracing::warn!(error = %e, retry_in = ?backoff, "the mission runtime does not answer yet; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    set_waiting(None);
    tracing::info!("the mission runtime answers");
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown requested: no new claims; finishing what is in flight");
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    // Without RUST_LOG: info, but not each fire's own line (`engine::FIRES`).
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("info,sqlx=warn,{}=warn", cm_scheduler::FIRES)));
    // Colours only for a person at a terminal: a file or a log collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(secrets::ScrubbingStderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
