//! Running the command line (the contract in docs/guide/design.md, "The command line"): parsing with the library's
//! definitions ([`cm_scheduler::flags`]), then each command through the library's service and
//! operations, printing what they return.
//!
//! The routine commands are in `cli/routine.rs`, the tables in `cli/listing.rs`.

/// `println!` that ends the command quietly when its reader has gone (see `cli/out.rs`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::out::line(format_args!($($arg)*))
    };
}

mod completions;
mod events;
mod listing;
mod out;
mod outbox;
mod routine;

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use cm_domain::{FireOutcome, Occurrence};
use cm_scheduler::Failure;
use cm_scheduler::flags::{
    Cli, Command, FiresCommand, LogFormat, RunArgs, ScheduleCommand, command,
};
use cm_scheduler::service::database::{self, connect};
use cm_scheduler::service::{Service, ServiceConfig, secrets};
use cm_store::{FireCursor, FireFilter, FireLedger};

fn input(message: impl Into<String>) -> Failure {
    Failure::Input(message.into())
}

/// The database URL, from `--database-url` (or `DATABASE_URL`), from the file
/// `--database-url-file` (or `DATABASE_URL_FILE`) names, or the default.
fn database_url(cli: &Cli) -> Result<String, String> {
    database::url(
        cli.database_url.as_deref(),
        cli.database_url_file.as_deref(),
    )
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
    // Before any statement: every statement and migration names this schema.
    if let Err(e) = cm_store::Schema::set(&cli.schema) {
        eprintln!("cm-scheduler: {e}");
        return ExitCode::from(2);
    }
    match runtime.block_on(execute(cli, &url)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(message)) => {
            eprintln!("cm-scheduler: {}", secrets::scrub(&message));
            ExitCode::from(2)
        }
        Err(Failure::Other(message)) => {
            eprintln!("cm-scheduler: {}", secrets::scrub(&one_line(&message)));
            ExitCode::from(1)
        }
    }
}

/// A message on one line: a cause written over several lines is joined.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

async fn execute(cli: Cli, url: &str) -> Result<(), Failure> {
    match cli.command {
        Command::Schedule(schedule) => {
            let ScheduleCommand::Next {
                expr,
                mut when,
                timezone,
                after,
                count,
                routine_id,
                calendar,
                holiday,
                days_off,
            } = *schedule;
            if let Some(expr) = expr {
                if when.has_rule() {
                    return Err(input(
                        "give the schedule once: as EXPR, or as --schedule, --every, --at or \
                         --rrule",
                    ));
                }
                when.schedule = Some(expr);
            }
            let at = after
                .as_deref()
                .map_or_else(|| Ok(Utc::now()), parse_time)?;
            // A rule that counts from its start starts at --after when it has none.
            let expr = when.text_from(None, at).map_err(input)?.unwrap_or_default();
            let on = cm_scheduler::calendars::NextOnCalendar {
                calendar: &calendar,
                holidays: &holiday,
                days_off: days_off.as_deref(),
            };
            let next = cm_scheduler::calendars::schedule_next(url, &expr, &timezone, on, at);
            let next = next.count(count).routine(routine_id).await?;
            if let Some(note) = next.note {
                eprintln!("{note}");
            }
            for line in next.lines {
                say!("{line}");
            }
            Ok(())
        }
        Command::Calendar(command) => {
            for line in cm_scheduler::calendars::command(url, command).await? {
                say!("{line}");
            }
            Ok(())
        }
        Command::Limit(command) => {
            for line in cm_scheduler::limits::command(url, command).await? {
                say!("{line}");
            }
            Ok(())
        }
        Command::Migrate { citus } => {
            let store = connect(url, true).await?;
            store
                .migrate()
                .await
                .map_err(|e| Failure::Other(format!("applying migrations: {}", e.explain())))?;
            say!("migrations applied");
            if citus {
                let distributed = store.distribute_on_citus().await.map_err(|e| {
                    Failure::Other(format!("distributing on Citus: {}", e.explain()))
                })?;
                say!("distributed on Citus ({distributed} tables newly distributed)");
            }
            Ok(())
        }
        Command::Run(args) => run(url, *args).await,
        Command::Outbox(args) => outbox::show(url, args).await,
        Command::Events(args) => events::list(url, args).await,
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
        Command::Health(args) => cm_scheduler::health::probe(args)
            .await
            .map_err(Failure::Other),
        Command::Completions { shell } => {
            out::bytes(&cm_scheduler::flags::completions::script(
                shell,
                &mut command(),
            ));
            Ok(())
        }
        Command::CompleteRoutine { prefix } => {
            completions::routine_names(url, &prefix).await;
            Ok(())
        }
    }
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
            let routine_id = cm_scheduler::operations::find(&store, routine).await?.id;
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
        Some(reference) => Some(cm_scheduler::operations::find(&store, reference).await?.id),
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

fn parse_time(text: &str) -> Result<DateTime<Utc>, Failure> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            input(format!(
                "invalid time {text:?} (expected RFC 3339, like 2025-03-09T07:00:00Z): {e}"
            ))
        })
}

/// `run`: the service, from its flags, until SIGINT or SIGTERM.
async fn run(url: &str, args: RunArgs) -> Result<(), Failure> {
    init_logging(args.log_format);
    let config = ServiceConfig {
        database_url: url.to_owned(),
        run: args,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let Some(service) = Service::start(config, stopped.clone()).await? else {
        return Ok(());
    };
    let summary = service.run(stopped).await?;
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
