//! The command line's definitions (clap), as ripgrep keeps its flags apart from what they
//! build: the binary parses them, [`crate::service::ServiceConfig`] and the operations take
//! them, and `docs/guide/cli.md` is generated from them ([`reference`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use cm_domain::SchedulerConfig;
use cm_store::FireCursor;

use crate::service::messages::MessageArgs;
use crate::service::missions::MissionArgs;

pub mod calendar;
pub mod completions;
pub mod limit;
pub mod routine;
pub mod schedule;

pub use calendar::CalendarCommand;
pub use limit::LimitCommand;
pub use routine::RoutineCommand;
use schedule::ScheduleFlags;

/// The database URL when none is given.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/cm";

/// A durable cron scheduler on PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "cm-scheduler", version, about)]
pub struct Cli {
    /// The PostgreSQL database [default: postgres://postgres@127.0.0.1:5432/cm].
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// A file holding the database URL (at most 64 KiB; surrounding whitespace and the trailing
    /// newline are dropped), so that its password is never in the environment or on the command
    /// line; not with --database-url or DATABASE_URL.
    #[arg(long, env = "DATABASE_URL_FILE", global = true, value_name = "PATH")]
    pub database_url_file: Option<PathBuf>,
    /// The database URL goes through a connection pooler (PgBouncer 1.21 or later, in
    /// transaction or session mode): cm sends no settings when it connects and sets its
    /// timeouts in every transaction instead, and does not create the database.
    /// docs/guide/deploying.md, "Behind PgBouncer", says what to configure.
    #[arg(long, env = "CM_DATABASE_POOLED", global = true)]
    pub pooled: bool,
    /// The schema cm's tables, functions and migrations table live in (`migrate` creates it):
    /// a lowercase identifier. Nothing of cm's is in `public`, so a service's own tables and
    /// migrations share the database. docs/guide/deploying.md, "Sharing a database".
    #[arg(
        long,
        env = "CM_SCHEMA",
        global = true,
        default_value = cm_store::schema::DEFAULT_SCHEMA,
        value_name = "NAME"
    )]
    pub schema: String,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
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
    /// Creates and manages holiday calendars, which routines share (routine create --calendar).
    #[command(subcommand)]
    Calendar(CalendarCommand),
    /// Sets, lists and deletes concurrency limits: at most N runs at once of the routines
    /// sharing a key (routine create --concurrency-key), across all schedulers.
    #[command(subcommand)]
    Limit(LimitCommand),
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
    Schedule(Box<ScheduleCommand>),
    /// Prints a shell completion script (for example `cm-scheduler completions bash >
    /// /etc/bash_completion.d/cm-scheduler`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Shows the message outbox: what consumers have not acknowledged yet.
    Outbox(OutboxArgs),
    /// Lists events (failures, pauses, resumes, recoveries, missed deadlines, …), newest
    /// first.
    Events(EventsArgs),
    /// Asks a running scheduler's /readyz (for a container's HEALTHCHECK): exits 0 when it is
    /// ready, 1 with the reason otherwise.
    Health(HealthArgs),
    /// The names of routines starting with a prefix, one a line, for the completion scripts.
    #[command(name = "__complete-routine", hide = true)]
    CompleteRoutine {
        /// What the name starts with.
        #[arg(default_value = "")]
        prefix: String,
    },
}

/// `run`'s flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The id written on this scheduler's claims (default: unique per process).
    #[arg(long)]
    pub instance_id: Option<String>,
    /// How often a tick runs.
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub tick_interval: Duration,
    /// The most occurrences one tick dispatches; the rest are deferred.
    #[arg(long, default_value_t = 25)]
    pub max_fires_per_tick: usize,
    /// How long a claim belongs to its claimant.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub lease: Duration,
    /// The longest one dispatch may run; must be shorter than the lease.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub dispatch_timeout: Duration,
    /// The most dispatches running at once; a tick claims no more than it can start [default:
    /// 100, or the cap if larger, so a tick can always claim a whole cap].
    #[arg(long)]
    pub max_in_flight: Option<usize>,
    /// How many claims an occurrence may have before it is settled failed.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// How late an occurrence may be and still count as on time.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub misfire_grace: Duration,
    /// Under catch-up, the most missed occurrences that fire (at most 10,000).
    #[arg(long, default_value_t = 100)]
    pub max_backlog: usize,
    /// How long settled fires are kept before they are pruned (at least a day).
    #[arg(long, default_value = "30days", value_parser = duration)]
    pub retention: Duration,
    /// The most missions this scheduler launches in any second; the rest wait, unclaimed, late
    /// but not lost (0: no bound).
    #[arg(long, default_value_t = SchedulerConfig::DEFAULT_MISSION_LAUNCHES_PER_SECOND)]
    pub max_mission_launches_per_second: u32,
    /// Serve the status page, /metrics, /livez and /readyz on this address.
    #[arg(long, env = "CM_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// A name (or address) the status page is served at, as `NAME` (any port) or `NAME:PORT`;
    /// repeatable. The page and its actions answer only requests sent to the listen address,
    /// to `localhost`, `127.0.0.1` and `[::1]` on its port when it listens on loopback (or on
    /// every address), and to these: any other `Host` is refused (421, against DNS
    /// rebinding). /metrics, /livez and /readyz answer whatever `Host` names them.
    #[arg(long, value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// A file holding the bearer token the status page requires (needed when --listen is not
    /// a loopback address; /metrics, /livez and /readyz stay open).
    #[arg(long)]
    pub http_token_file: Option<PathBuf>,
    /// Pause a routine whose last N fires all failed, keeping the reason (0: never): in the
    /// transaction that records the Nth failure, so no further occurrence is claimed.
    #[arg(long, default_value_t = 5)]
    pub pause_after_failures: u32,
    /// How many claims a tick keeps in flight at once while a backlog lasts: the first claim is
    /// one, and when it comes back full the others start beside it (1: one claim at a time).
    #[arg(long, default_value_t = SchedulerConfig::DEFAULT_DRAIN_LANES)]
    pub drain_lanes: usize,
    /// Claim one routine group at a time, in the groups this scheduler leases, also on plain
    /// PostgreSQL (on Citus it always does: there a claim must stay on one shard). On plain
    /// PostgreSQL a claim across every group is cheaper per occurrence (docs/BENCHMARKS.md).
    #[arg(long)]
    pub claim_per_group: bool,
    /// How long this scheduler's lease on a routine group lasts, renewed every third of it
    /// (at least three tick intervals). A scheduler that stops renewing (killed, or cut off
    /// from the database) has its groups claimed in by the others as soon as its leases run
    /// out; one that stops cleanly gives them up at once.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub group_lease: Duration,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Send each attempt's claim, dispatch and settle as OpenTelemetry spans to this OTLP/HTTP
    /// receiver (`http://collector:4318`; `/v1/traces` is added). Off without it.
    #[arg(long, env = "CM_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Post every event (a failure, a pause, a recovery, a missed deadline, …) to this
    /// endpoint as a Standard Webhooks 1.0 request, `webhook-id` the event's id; retried with
    /// backoff until it is taken. Events are written and listed (`cm-scheduler events`) without
    /// it.
    #[arg(long, value_name = "URL", requires = "events_webhook_secret_file")]
    pub events_webhook: Option<String>,
    /// A file holding the events webhook's signing secret, `whsec_<base64 key>`.
    #[arg(long, value_name = "PATH", requires = "events_webhook")]
    pub events_webhook_secret_file: Option<PathBuf>,
    /// Where message routines go.
    #[command(flatten)]
    pub messages: MessageArgs,
    /// Where mission routines go.
    #[command(flatten)]
    pub mission: MissionArgs,
    /// Do not apply migrations on start.
    #[arg(long)]
    pub no_migrate: bool,
}

/// `run --log-format`. Its values have no doc comments: clap would list them as help.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// `schedule`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Prints the next occurrences of an expression, one UTC instant a line.
    Next {
        /// The cron expression, with any clauses (`except …`, `from …`, `until …`); or give
        /// the flags `routine create` takes instead.
        expr: Option<String>,
        /// The schedule as flags.
        #[command(flatten)]
        when: ScheduleFlags,
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
        /// On this holiday calendar (read from the database), printing the instants the
        /// occurrences are planned at.
        #[command(flatten)]
        calendar: calendar::CalendarFlags,
        /// A date off (YYYY-MM-DD), without the database: a calendar in the schedule's zone
        /// with these dates and --days-off; repeat it for more. Not with --calendar.
        #[arg(long, value_name = "YYYY-MM-DD", conflicts_with = "calendar")]
        holiday: Vec<String>,
        /// With --holiday: the weekly days off (day names, or none).
        #[arg(long, value_name = "DAYS", requires = "holiday")]
        days_off: Option<String>,
    },
}

/// Reads a duration flag (`30s`, `5m`, `1h30m`, `30days`).
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|_| {
        "not a duration (a number and a unit, such as 30s, 5m, 1h30m or 30days)".into()
    })
}

/// The commands that never touch the database: `--database-url` and `--database-url-file`,
/// global for the others, are left out of their help and completions.
pub const WITHOUT_DATABASE: &[&str] = &["schedule", "completions", "__complete-routine"];

/// The command line's definition, as parsed and as completed.
pub fn command() -> clap::Command {
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

/// `fires show`.
#[derive(Debug, clap::Subcommand)]
pub enum FiresCommand {
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

/// Shows the outbox's backlog.
#[derive(Debug, Args)]
pub struct OutboxArgs {
    /// List at most this many pending messages, oldest first.
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// As one JSON object: {"pending", "leased", "oldest", "messages": [...]}.
    #[arg(long)]
    pub json: bool,
}

/// `events`' flags.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this routine's (its id or name).
    #[arg(long, value_name = "ID|NAME")]
    pub routine: Option<String>,
    /// Only this type (`routine.failed`, or `failed`).
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// At most this many (at least 1).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Continue after this cursor: the one a full page prints on its last line.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub cursor: Option<i64>,
    /// As JSON lines, one event each.
    #[arg(long)]
    pub json: bool,
}

/// The `health` subcommand's flags.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The address the scheduler's `run --listen` serves on (an unspecified address such as
    /// 0.0.0.0 is asked on loopback). Both read `CM_LISTEN`, so setting it once serves and
    /// asks the same address; with neither, `health` says so (`run` serves nothing by default).
    #[arg(long, env = "CM_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// How long the whole request may take.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub timeout: Duration,
}

/// The command line's reference, in Markdown: every command's and subcommand's long help (what
/// `--help` prints), in the order the definitions give them. `docs/guide/cli.md` is this text;
/// a test keeps it so.
pub fn reference() -> String {
    let mut root = command().mut_args(|arg| arg.hide_env_values(true));
    // The reference must not depend on the environment it is generated in: no variable's
    // value is shown, only its name.
    let names: Vec<String> = root
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    for name in names {
        root = root.mut_subcommand(name, hide_env_values);
    }
    root.build();
    let mut text = String::from(
        "# The command line\n\n\
         <!-- Generated from the clap definitions in cm-scheduler/src/flags/ by\n\
         `CM_BLESS_CLI=1 cargo test -p cm-scheduler --test tests cli_reference`; do not edit. -->\n\n\
         Every command's help, as `cm-scheduler COMMAND --help` prints it.\n",
    );
    section(&root, &mut text);
    text
}

/// `command` and each of its subcommands, environment values hidden.
fn hide_env_values(command: clap::Command) -> clap::Command {
    let mut command = command.mut_args(|arg| arg.hide_env_values(true));
    let names: Vec<String> = command
        .get_subcommands()
        .map(|sub| sub.get_name().to_owned())
        .collect();
    for name in names {
        command = command.mut_subcommand(name, hide_env_values);
    }
    command
}

/// One command's section, then its subcommands' (hidden ones and `help` left out).
fn section(command: &clap::Command, text: &mut String) {
    if command.is_hide_set() || command.get_name() == "help" {
        return;
    }
    let name = command.get_bin_name().unwrap_or(command.get_name());
    let help = command.clone().render_long_help().to_string();
    let help: Vec<&str> = help.trim_end().lines().map(str::trim_end).collect();
    text.push_str(&format!(
        "\n## `{name}`\n\n```text\n{}\n```\n",
        help.join("\n")
    ));
    for sub in command.get_subcommands() {
        section(sub, text);
    }
}
