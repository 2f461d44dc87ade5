//! Parsing and running the command line (the contract in DESIGN.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use cm_dispatch::RoutedDispatcher;
use cm_domain::{FireCap, FireStatus, Lease, MisfirePolicy, Schedule, SchedulerConfig, Zone};
use cm_scheduler::Scheduler;
use cm_scheduler::http::{Health, Readiness};
use cm_store::{
    FireFilter, FireLedger, NewRoutine, PgStore, Routine, RoutineKind, RoutineStore, StoreError,
};
use uuid::Uuid;

mod backends;
mod outbox;

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/cm";

/// A durable cron scheduler on PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "cm-scheduler", version, about)]
struct Cli {
    /// The PostgreSQL database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true, hide_env_values = true)]
    database_url: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Applies the schema's migrations (creating the database if it does not exist).
    Migrate,
    /// Runs a scheduler until SIGINT or SIGTERM.
    Run(RunArgs),
    /// Creates and manages routines.
    #[command(subcommand)]
    Routine(RoutineCommand),
    /// Lists fires (the occurrence ledger), newest first.
    Fires {
        /// Only this routine's.
        #[arg(long)]
        routine: Option<Uuid>,
        /// Only with this status.
        #[arg(long, value_parser = ["claimed", "fired", "failed"])]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// As JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Schedule arithmetic, without a database.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Shows the message outbox: what consumers have not acknowledged yet.
    Outbox(outbox::OutboxArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The id written on this scheduler's claims (default: unique per process).
    #[arg(long)]
    instance_id: Option<String>,
    /// How often a tick runs.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    tick_interval: Duration,
    /// The most occurrences one tick dispatches; the rest are deferred.
    #[arg(long, default_value_t = 25)]
    max_fires_per_tick: usize,
    /// How long a claim belongs to its claimant.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// The longest one dispatch may run; must be shorter than the lease.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    dispatch_timeout: Duration,
    /// How many claims an occurrence may have before it is settled failed.
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// How late an occurrence may be and still count as on time.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    misfire_grace: Duration,
    /// Under catch-up, the most missed occurrences that fire.
    #[arg(long, default_value_t = 100)]
    max_backlog: usize,
    /// How long settled fires are kept before they are pruned (at least a day).
    #[arg(long, default_value = "30days", value_parser = humantime::parse_duration)]
    retention: Duration,
    /// Serve /metrics, /livez and /readyz on this address.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    #[command(flatten)]
    messages: backends::MessageArgs,
    /// Where mission routines go (none: their occurrences settle failed with that reason).
    #[arg(long, value_enum, default_value_t = MissionBackend::None)]
    mission_backend: MissionBackend,
    /// Do not apply migrations on start.
    #[arg(long)]
    no_migrate: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MissionBackend {
    /// No mission backend.
    None,
}

#[derive(Debug, Subcommand)]
enum RoutineCommand {
    /// Creates a routine and prints its id.
    Create(CreateArgs),
    /// Lists routines.
    List {
        /// As JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Shows one routine.
    Show {
        /// The routine's id.
        id: Uuid,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pauses a routine: it is never due until resumed.
    Pause {
        /// The routine's id.
        id: Uuid,
    },
    /// Resumes a routine; its next run is computed from now.
    Resume {
        /// The routine's id.
        id: Uuid,
    },
    /// Deletes a routine and its fires.
    Delete {
        /// The routine's id.
        id: Uuid,
    },
    /// Fires a routine now, through the ledger (the next tick claims it; paused or not).
    Trigger {
        /// The routine's id.
        id: Uuid,
    },
    /// Fires a routine's occurrences in a past window that the ledger does not hold yet.
    Backfill {
        /// The routine's id.
        id: Uuid,
        /// The window's start (RFC 3339), included.
        #[arg(long)]
        from: String,
        /// The window's end (RFC 3339), included; not in the future.
        #[arg(long)]
        to: String,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["message", "mission"])))]
struct CreateArgs {
    /// A name for people.
    #[arg(long)]
    name: String,
    /// A cron expression: 5 fields, or 6 with seconds first.
    #[arg(long)]
    schedule: String,
    /// The IANA zone the schedule is read in.
    #[arg(long, default_value = "UTC")]
    timezone: String,
    /// What to do with occurrences found late.
    #[arg(long, default_value = "fire-once", value_parser = ["fire-once", "catch-up", "skip"])]
    misfire: String,
    /// A message routine posting this text.
    #[arg(long)]
    message: Option<String>,
    /// A mission routine described by this JSON file (an object with a "repository").
    #[arg(long)]
    mission: Option<PathBuf>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
    /// Print the routine as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Prints the next occurrences of an expression, one UTC instant a line.
    Next {
        /// The cron expression.
        expr: String,
        /// The IANA zone it is read in.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Start after this instant (RFC 3339; default now).
        #[arg(long)]
        after: Option<String>,
        /// How many to print.
        #[arg(long, default_value_t = 5)]
        count: usize,
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
            StoreError::RoutineNotFound(_) => Failure::Input(e.to_string()),
            other => Failure::Other(other.into()),
        }
    }
}

fn input(message: impl Into<String>) -> Failure {
    Failure::Input(message.into())
}

/// Parses the command line, runs it, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
    match runtime.block_on(execute(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(message)) => {
            eprintln!("cm-scheduler: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("cm-scheduler: {}", one_line(&e));
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

async fn execute(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Schedule(ScheduleCommand::Next {
            expr,
            timezone,
            after,
            count,
        }) => schedule_next(&expr, &timezone, after.as_deref(), count),
        Command::Migrate => {
            let store = connect(&cli.database_url, true).await?;
            store.migrate().await.context("applying migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Run(args) => run(&cli.database_url, args).await,
        Command::Outbox(args) => outbox::show(&cli.database_url, args).await,
        Command::Routine(command) => routine(&cli.database_url, command).await,
        Command::Fires {
            routine,
            status,
            limit,
            json,
        } => {
            let status = status
                .map(|s| s.parse::<FireStatus>())
                .transpose()
                .map_err(|e| input(e.to_string()))?;
            let store = connect(&cli.database_url, false).await?;
            let fires = store
                .list_fires(&FireFilter {
                    routine_id: routine,
                    status,
                    limit,
                })
                .await?;
            for fire in fires {
                if json {
                    println!(
                        "{}",
                        serde_json::to_string(&fire).map_err(anyhow::Error::from)?
                    );
                } else {
                    println!(
                        "{}  {}  {:<7}  attempt {}  {}{}",
                        fire.scheduled_at
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                        fire.routine_id,
                        fire.status,
                        fire.attempt,
                        fire.claimant,
                        fire.error
                            .map(|e| format!("  error: {e}"))
                            .unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
    }
}

fn schedule_next(
    expr: &str,
    timezone: &str,
    after: Option<&str>,
    count: usize,
) -> Result<(), Failure> {
    let schedule = Schedule::parse(expr, timezone).map_err(|e| input(e.to_string()))?;
    let mut at = match after {
        Some(text) => parse_time(text)?,
        None => Utc::now(),
    };
    for _ in 0..count {
        match schedule.next_after(at) {
            Some(next) => {
                println!(
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

/// Connects to the database; `create` creates it first if it does not exist.
async fn connect(url: &str, create: bool) -> Result<PgStore, Failure> {
    let shown = redact(url);
    if create {
        PgStore::create_database_if_missing(url)
            .await
            .with_context(|| format!("cannot reach PostgreSQL at {shown}"))?;
    }
    Ok(PgStore::connect(url)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {shown}"))?)
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_string(),
    }
}

async fn routine(url: &str, command: RoutineCommand) -> Result<(), Failure> {
    match command {
        RoutineCommand::Create(args) => {
            // Everything about the input is checked before the database is touched, so bad
            // input writes nothing.
            let new = new_routine(&args)?;
            let store = connect(url, false).await?;
            let routine = store.create_routine(new).await?;
            if args.json {
                print_json(&routine)?;
            } else {
                println!("{}", routine.id);
            }
            Ok(())
        }
        RoutineCommand::List { json } => {
            let store = connect(url, false).await?;
            for routine in store.list_routines().await? {
                if json {
                    println!(
                        "{}",
                        serde_json::to_string(&routine).map_err(anyhow::Error::from)?
                    );
                } else {
                    print_routine_line(&routine);
                }
            }
            Ok(())
        }
        RoutineCommand::Show { id, json } => {
            let store = connect(url, false).await?;
            let routine = store.get_routine(id).await?;
            if json {
                print_json(&routine)
            } else {
                print_routine_line(&routine);
                Ok(())
            }
        }
        RoutineCommand::Pause { id } | RoutineCommand::Resume { id } => {
            let paused = matches!(command, RoutineCommand::Pause { .. });
            let store = connect(url, false).await?;
            let routine = store.set_routine_paused(id, paused).await?;
            print_routine_line(&routine);
            Ok(())
        }
        RoutineCommand::Delete { id } => {
            let store = connect(url, false).await?;
            store.delete_routine(id).await?;
            println!("deleted {id}");
            Ok(())
        }
        RoutineCommand::Trigger { id } => {
            let store = connect(url, false).await?;
            let at = store.trigger_routine(id).await?;
            println!(
                "{}",
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            );
            Ok(())
        }
        RoutineCommand::Backfill { id, from, to } => {
            let (from, to) = (parse_time(&from)?, parse_time(&to)?);
            let store = connect(url, false).await?;
            let routine = store.get_routine(id).await?;
            let schedule = routine.parsed_schedule()?;
            // The window is judged against the database's clock, the one the ticks use.
            let now = store.ping().await?;
            let occurrences = cm_domain::backfill_occurrences(&schedule, from, to, now)
                .map_err(|e| input(e.to_string()))?;
            let requested = store.request_occurrences(id, &occurrences).await?;
            println!(
                "requested {requested} of {} occurrences ({} already in the ledger or requested)",
                occurrences.len(),
                occurrences.len() as u64 - requested
            );
            Ok(())
        }
    }
}

fn print_json(routine: &Routine) -> Result<(), Failure> {
    println!(
        "{}",
        serde_json::to_string_pretty(routine).map_err(anyhow::Error::from)?
    );
    Ok(())
}

fn print_routine_line(r: &Routine) {
    let next = r
        .next_run_at
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| {
            if r.paused {
                "paused".into()
            } else {
                "never".into()
            }
        });
    println!(
        "{}  {:<8} {:<20} {:<24} {:<16} next {}",
        r.id, r.kind, r.name, r.schedule, r.timezone, next
    );
}

fn new_routine(args: &CreateArgs) -> Result<NewRoutine, Failure> {
    let name = args.name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(input("the name must be 1 to 200 characters"));
    }
    let zone = Zone::parse(&args.timezone).map_err(|e| input(e.to_string()))?;
    let schedule = Schedule::new(&args.schedule, zone).map_err(|e| input(e.to_string()))?;
    let misfire: MisfirePolicy = args
        .misfire
        .parse()
        .map_err(|e: cm_domain::ParseMisfirePolicyError| input(e.to_string()))?;
    let (kind, payload) = match (&args.message, &args.mission) {
        (Some(text), None) => {
            if text.is_empty() {
                return Err(input("the message must not be empty"));
            }
            (RoutineKind::Message, serde_json::json!({ "text": text }))
        }
        (None, Some(path)) => (RoutineKind::Mission, mission_payload(path)?),
        _ => return Err(input("give exactly one of --message and --mission")),
    };
    Ok(NewRoutine {
        name: name.to_string(),
        schedule,
        kind,
        payload,
        misfire,
        paused: args.paused,
    })
}

/// Reads a mission description: a JSON object naming at least the repository to check out.
/// Images, endpoints and credentials are operator configuration, never part of a routine.
fn mission_payload(path: &PathBuf) -> Result<serde_json::Value, Failure> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| input(format!("cannot read mission file {shown}: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| input(format!("mission file {shown} is not valid JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(input(format!(
            "mission file {shown} must hold a JSON object"
        )));
    };
    match object.get("repository") {
        Some(serde_json::Value::String(repo)) if !repo.trim().is_empty() => Ok(value),
        _ => Err(input(format!(
            "mission file {shown} must name a \"repository\" (a non-empty string)"
        ))),
    }
}

struct DatabaseReadiness(PgStore);

#[async_trait::async_trait]
impl Readiness for DatabaseReadiness {
    async fn database_answers(&self) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.0.ping()).await,
            Ok(Ok(_))
        )
    }
}

async fn run(url: &str, args: RunArgs) -> Result<(), Failure> {
    init_logging(args.log_format);
    let lease = Lease::new(args.lease).ok_or_else(|| input("--lease must be greater than zero"))?;
    let cap = FireCap::new(args.max_fires_per_tick)
        .ok_or_else(|| input("--max-fires-per-tick must be at least 1"))?;
    let config = SchedulerConfig {
        tick_interval: args.tick_interval,
        max_fires_per_tick: cap,
        lease,
        dispatch_timeout: args.dispatch_timeout,
        max_attempts: args.max_attempts,
        misfire_grace: args.misfire_grace,
        max_backlog: args.max_backlog,
        retention: args.retention,
    }
    .validate()
    .map_err(|e| input(e.to_string()))?;
    let messages = args.messages.plan(&config)?;
    let listener = match args.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| input(format!("cannot listen on {addr}: {e}")))?,
        ),
        None => None,
    };

    let store = connect(url, !args.no_migrate).await?;
    if !args.no_migrate {
        store.migrate().await.context("applying migrations")?;
    }
    let message = messages.build(&store).await?;
    let mission: Option<Arc<dyn cm_dispatch::Dispatcher>> = match args.mission_backend {
        MissionBackend::None => None,
    };
    let instance_id = args
        .instance_id
        .unwrap_or_else(cm_scheduler::default_instance_id);
    let scheduler = Arc::new(
        Scheduler::new(
            Arc::new(store.clone()),
            Arc::new(RoutedDispatcher::new(Some(message), mission)),
            config.clone(),
            instance_id,
        )
        .map_err(|e| input(e.to_string()))?
        .with_outbox_pruning(Arc::new(store.clone())),
    );

    if let Some(listener) = listener {
        let health = Arc::new(Health {
            stats: scheduler.stats(),
            readiness: DatabaseReadiness(store.clone()),
            fresh_within: config.tick_interval * 3
                + config.dispatch_timeout
                + Duration::from_secs(5),
        });
        tracing::info!(addr = %listener.local_addr().map_err(anyhow::Error::from)?, "serving /metrics, /livez and /readyz");
        tokio::spawn(cm_scheduler::http::serve(listener, health));
    }

    let summary = scheduler
        .clone()
        .spawn(shutdown_signal())
        .await
        .context("the scheduler task failed")?;
    tracing::info!(
        ticks = summary.ticks,
        fired = summary.fired,
        failed = summary.failed,
        tick_errors = summary.tick_errors,
        last_error = summary.last_error.as_deref().unwrap_or("none"),
        "scheduler exited"
    );
    Ok(())
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
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
