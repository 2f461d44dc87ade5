//! The `routine` commands' flags: create, update, import, list, show, pause, resume, delete,
//! trigger and backfill. Every command that names a routine takes its id or its name.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use cm_domain::ConcurrencyKey;

use super::schedule::ScheduleFlags;
use crate::edit::{backoff, concurrency_key, retries};
use crate::import::RoutineFields;
use crate::service::missions::PolicyFlags;

/// `routine`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum RoutineCommand {
    /// Creates a routine and prints its id.
    Create(CreateArgs),
    /// Changes a routine's settings (checked as create checks them) and prints its id. A new
    /// schedule or zone moves its next run to the first occurrence after now; claims already
    /// taken and its fire history are kept.
    Update(UpdateArgs),
    /// Creates routines from a file, all or none: JSON Lines with the fields of create, or a
    /// crontab with --crontab. Prints one line per routine written.
    Import(ImportArgs),
    /// Lists routines in creation order, as a table (or JSON lines).
    List {
        /// As JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Shows one routine: its settings, next runs, pending requests and last fires.
    Show {
        /// The routine's id or name.
        #[arg(value_name = "ID|NAME")]
        routine: String,
        /// As JSON (the stored routine).
        #[arg(long)]
        json: bool,
    },
    /// Pauses a routine: it is never due until resumed.
    Pause {
        /// The routine's id or name.
        #[arg(value_name = "ID|NAME")]
        routine: String,
    },
    /// Resumes a routine; its next run is computed from now.
    Resume {
        /// The routine's id or name.
        #[arg(value_name = "ID|NAME")]
        routine: String,
    },
    /// Deletes a routine and its fires.
    Delete {
        /// The routine's id or name.
        #[arg(value_name = "ID|NAME")]
        routine: String,
    },
    /// Fires a routine now, through the ledger (the next tick claims it; paused or not).
    Trigger {
        /// The routine's id or name.
        #[arg(value_name = "ID|NAME")]
        routine: String,
    },
    /// Fires a routine's occurrences in a past window that the ledger does not hold yet.
    Backfill {
        /// The routine's id or name.
        #[arg(value_name = "ID|NAME")]
        routine: String,
        /// The window's start (RFC 3339), included.
        #[arg(long)]
        from: String,
        /// The window's end (RFC 3339), included; not in the future.
        #[arg(long)]
        to: String,
        /// How long the schedulers keep settled fires (their `run --retention`): a window
        /// starting earlier than this (less an hour) is refused, since a pruned slot would fire
        /// again.
        #[arg(long, default_value = "30days", value_parser = super::duration)]
        retention: std::time::Duration,
    },
}

/// `routine create`'s flags.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["message", "mission"])))]
pub struct CreateArgs {
    /// A name for people: unique, no control characters, not a UUID.
    #[arg(long)]
    pub name: String,
    /// When it runs.
    #[command(flatten)]
    pub when: ScheduleFlags,
    /// The IANA zone the schedule is read in.
    #[arg(long, default_value = "UTC")]
    pub timezone: String,
    /// What to do with occurrences found late.
    #[arg(long, default_value = "fire-once", value_parser = ["fire-once", "catch-up", "skip"])]
    pub misfire: String,
    /// A message routine posting this text.
    #[arg(long)]
    pub message: Option<String>,
    /// A mission routine described by this JSON file (an object with a "repository").
    #[arg(long)]
    pub mission: Option<PathBuf>,
    /// What a mission's occurrence does while an earlier run is still running: allow (launch
    /// anyway), forbid (settle it skipped; the default), replace (stop the running one),
    /// buffer-one (wait; when the run ends launch the newest, the older ones skipped) or
    /// buffer-all (wait; launch each in turn, one run at a time).
    #[arg(long, value_parser = ["allow", "forbid", "replace", "buffer-one", "buffer-all"])]
    pub overlap: Option<String>,
    /// Its holiday calendar.
    #[command(flatten)]
    pub calendar: super::calendar::CalendarFlags,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// Fire at most N scheduled occurrences (counted as they are claimed, so several
    /// schedulers never fire N+1), then the routine is finished. Triggers and backfills are
    /// not counted.
    #[arg(long, value_name = "N", value_parser = run_count, allow_negative_numbers = true)]
    pub limit_runs: Option<u32>,
    /// An occurrence that has not succeeded (a message fired, a mission's run succeeded) this
    /// long after its planned instant raises `routine.deadline_missed`, once: still running,
    /// failed, waiting, or never claimed. Whole seconds, up to 366 days.
    #[arg(long, value_name = "DURATION", value_parser = super::duration, allow_negative_numbers = true)]
    pub deadline: Option<std::time::Duration>,
    /// Try a failed outcome (a message's failed dispatch, a mission's failed or lost run) again
    /// up to N times, each a new attempt of the same occurrence after --retry-backoff; never at
    /// or past the routine's next occurrence nor the occurrence's deadline (then the failure
    /// stands). 0 to 100; 0 is no retry.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = retries, allow_negative_numbers = true)]
    pub retries: u32,
    /// The wait before the first retry, doubling before each one after, up to MAX (`30s` alone
    /// waits the same each time). Whole seconds, 1s to 1d.
    #[arg(long, value_name = "DURATION[..MAX]", default_value = "10s..10m", value_parser = backoff)]
    pub retry_backoff: cm_domain::Backoff,
    /// Share the limit of this concurrency key (`limit set KEY N`) with the other routines of
    /// the key: at most N of their runs at once across all schedulers, the others waiting,
    /// owed. 1 to 100 letters, digits and . _ : / -, starting with a letter or digit
    /// (`tenant:acme`, `gpu-pool`). Without one, or while the key has no limit, unlimited.
    #[arg(long, value_name = "KEY", value_parser = concurrency_key)]
    pub concurrency_key: Option<ConcurrencyKey>,
    /// The operator's mission settings (the file `run --mission-config` takes): a mission is
    /// refused unless its env names, label keys and repository host are among the
    /// `env_allow`, `label_allow` and `repository_hosts` it gives (or the defaults).
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    pub mission_config: Option<PathBuf>,
    /// What its mission may ask for.
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Print the routine as JSON instead of its id.
    #[arg(long)]
    pub json: bool,
}

/// `routine update`'s flags.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("action").args(["message", "mission"])))]
pub struct UpdateArgs {
    /// The routine's id or name.
    #[arg(value_name = "ID|NAME")]
    pub routine: String,
    /// A new name.
    #[arg(long)]
    pub name: Option<String>,
    /// A new rule (--schedule, --every, --at, --rrule) replaces the rule; a clause given (--except,
    /// --start, --end) replaces that clause and keeps the rest.
    #[command(flatten)]
    pub when: ScheduleFlags,
    /// A new IANA zone for the schedule.
    #[arg(long)]
    pub timezone: Option<String>,
    /// A new misfire policy.
    #[arg(long, value_parser = ["fire-once", "catch-up", "skip"])]
    pub misfire: Option<String>,
    /// Make it a message routine posting this text.
    #[arg(long)]
    pub message: Option<String>,
    /// Make it a mission routine described by this JSON file.
    #[arg(long)]
    pub mission: Option<PathBuf>,
    /// A new overlap policy (allow, forbid, replace, buffer-one, buffer-all) of a mission routine.
    #[arg(long, value_parser = ["allow", "forbid", "replace", "buffer-one", "buffer-all"])]
    pub overlap: Option<String>,
    /// Its holiday calendar.
    #[command(flatten)]
    pub calendar: super::calendar::CalendarFlags,
    /// Let it fire N more scheduled occurrences from now (reviving one whose limit was spent);
    /// `none` removes the limit.
    #[arg(long, value_name = "N|none", value_parser = limit_runs, allow_negative_numbers = true)]
    pub limit_runs: Option<LimitRuns>,
    /// A new deadline (see `routine create --deadline`); `none` removes it.
    #[arg(long, value_name = "DURATION|none", value_parser = deadline, allow_negative_numbers = true)]
    pub deadline: Option<Deadline>,
    /// A new number of retries (see `routine create --retries`); 0 is no retry. The backoff
    /// is kept unless --retry-backoff is given too.
    #[arg(long, value_name = "N", value_parser = retries, allow_negative_numbers = true)]
    pub retries: Option<u32>,
    /// A new backoff between retries (see `routine create --retry-backoff`); the number of
    /// retries is kept unless --retries is given too.
    #[arg(long, value_name = "DURATION[..MAX]", value_parser = backoff)]
    pub retry_backoff: Option<cm_domain::Backoff>,
    /// A new concurrency key (see `routine create --concurrency-key`): it shares that key's
    /// limit from its next claim on.
    #[arg(long, value_name = "KEY", value_parser = concurrency_key)]
    pub concurrency_key: Option<ConcurrencyKey>,
    /// Remove its concurrency key: its runs are limited by none.
    #[arg(long, conflicts_with = "concurrency_key")]
    pub no_concurrency_key: bool,
    /// The operator's mission settings (the file `run --mission-config` takes): a mission is
    /// refused unless its env names, label keys and repository host are among the
    /// `env_allow`, `label_allow` and `repository_hosts` it gives (or the defaults).
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    pub mission_config: Option<PathBuf>,
    /// What its mission may ask for.
    #[command(flatten)]
    pub policy: PolicyFlags,
    /// Print the routine as JSON instead of its id.
    #[arg(long)]
    pub json: bool,
}

/// `routine import`'s flags.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The file (`-` reads standard input).
    pub file: PathBuf,
    /// The file is a classic crontab, not JSON Lines.
    #[arg(long)]
    pub crontab: bool,
    /// With --crontab: the file is a system crontab (/etc/crontab, /etc/cron.d/*), whose sixth
    /// field is the user: each entry's user is kept in its routine's name, not in its message.
    /// Without it, an entry whose command starts with a user name of this machine is refused
    /// in a file kept as a system crontab is (in a cron.d directory, or etc/crontab), and noted
    /// elsewhere.
    #[arg(long, requires = "crontab")]
    pub system: bool,
    /// A routine whose name exists already is updated instead of refused.
    #[arg(long, conflicts_with = "sync")]
    pub upsert: bool,
    /// Make the routines of the file's source match the file, as `crontab FILE` replaces a
    /// table: create what is new, update what changed, delete what the file no longer has.
    /// Routines of other sources and those made by hand are not touched (one of a name the
    /// file has, without a source, joins it).
    #[arg(long)]
    pub sync: bool,
    /// The source every routine written records (what a later --sync of it keeps in step
    /// with the file), which also names unnamed crontab entries [default: the file's name;
    /// none for standard input, where --sync requires it].
    #[arg(long)]
    pub source: Option<String>,
    /// Print what the import would do, and change nothing: `create`, `update`, `adopt`,
    /// `unchanged` and `delete` for what it prints as `created`, `updated`, `adopted`,
    /// `unchanged` and `deleted`.
    #[arg(long)]
    pub dry_run: bool,
    /// With --crontab: the zone entries are read in until a CRON_TZ= line.
    #[arg(long, default_value = "UTC", requires = "crontab")]
    pub timezone: String,
    /// With --crontab: the misfire policy of every entry.
    #[arg(long, default_value = "fire-once", value_parser = ["fire-once", "catch-up", "skip"], requires = "crontab")]
    pub misfire: String,
    /// The operator's mission settings (the file `run --mission-config` takes): a mission is
    /// refused unless its env names, label keys and repository host are among the
    /// `env_allow`, `label_allow` and `repository_hosts` it gives (or the defaults).
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    pub mission_config: Option<PathBuf>,
    /// The directory a line's `mission` path is read in [default: the import file's directory;
    /// the current one for standard input]. A path is relative to it and never leaves it: an
    /// absolute path, a `..` above it or a symbolic link out of it is refused, and only a
    /// regular file is read.
    #[arg(long, value_name = "DIR", conflicts_with = "crontab")]
    pub mission_root: Option<PathBuf>,
    /// What its mission may ask for.
    #[command(flatten)]
    pub policy: PolicyFlags,
}

/// `routine create`'s flags as the fields an import line gives, checked alike.
impl TryFrom<&CreateArgs> for RoutineFields {
    type Error = String;

    fn try_from(args: &CreateArgs) -> Result<Self, String> {
        Ok(RoutineFields {
            line: 0,
            name: args.name.clone(),
            schedule: args.when.text(None)?.ok_or(
                "a schedule is needed: --schedule EXPR, --every DURATION, --at TIME or \
                     --rrule RULE",
            )?,
            timezone: args.timezone.clone(),
            misfire: args.misfire.clone(),
            message: args.message.clone(),
            mission: args.mission.clone(),
            overlap: args.overlap.clone(),
            paused: args.paused,
            runs_left: args.limit_runs,
            calendar: args.calendar.calendar.clone(),
            on_holiday: args.calendar.on_holiday.clone(),
            deadline: args.deadline,
            retry: cm_domain::RetryPolicy {
                retries: args.retries,
                backoff: args.retry_backoff,
            },
            concurrency_key: args.concurrency_key.clone(),
        })
    }
}

impl UpdateArgs {
    /// The change to its concurrency key: `Some(None)` with `--no-concurrency-key`.
    pub fn concurrency_key_change(&self) -> Option<Option<ConcurrencyKey>> {
        if self.no_concurrency_key {
            Some(None)
        } else {
            self.concurrency_key.clone().map(Some)
        }
    }
}

/// `routine update --deadline`: a duration, or `none` (no deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Option<std::time::Duration>);

fn deadline(text: &str) -> Result<Deadline, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Deadline(None));
    }
    super::duration(text).map(|d| Deadline(Some(d)))
}

/// `routine update --limit-runs`: a number of runs, or `none` (no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitRuns(pub Option<u32>);

fn limit_runs(text: &str) -> Result<LimitRuns, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(LimitRuns(None));
    }
    run_count(text)
        .map(|n| LimitRuns(Some(n)))
        .map_err(|e| format!("{e}, or none"))
}

/// A run limit's count: 1 to `i32::MAX` (a negative or zero one said as such).
fn run_count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if (1..=i64::from(i32::MAX)).contains(&n) => Ok(n as u32),
        Ok(n) if n < 1 => Err(format!(
            "{text:?} is not a run limit: it counts runs, from 1"
        )),
        _ => Err(format!("{text:?} is not a run limit (a number from 1)")),
    }
}
