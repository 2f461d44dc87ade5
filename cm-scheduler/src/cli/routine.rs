//! The `routine` commands: create, update, import, list, show, pause, resume, delete, trigger and
//! backfill. Every command that names a routine takes its id or its name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chrono::SecondsFormat;
use clap::{Args, Subcommand};
use cm_domain::{MisfirePolicy, Schedule, Zone};
use cm_store::{
    FireFilter, FireLedger, NewRoutine, PgStore, Routine, RoutineAction, RoutineCursor,
    RoutineKind, RoutineStore, RoutineUpdate, StoreError,
};
use uuid::Uuid;

use super::database::connect_migrated;
use super::import::{self, RoutineFields};
use super::listing::{self, Table, printable};
use super::{Failure, input, mission_payload, mission_policy, parse_time};
use cm_domain::MissionPolicy;

/// How many upcoming runs, fires and pending requests `routine show` prints.
const SHOWN_RUNS: usize = 5;
const SHOWN_FIRES: u32 = 10;
const SHOWN_REQUESTS: u32 = 10;

#[derive(Debug, Subcommand)]
pub(super) enum RoutineCommand {
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

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["message", "mission"])))]
pub(super) struct CreateArgs {
    /// A name for people: unique, no control characters, not a UUID.
    #[arg(long)]
    name: String,
    #[command(flatten)]
    when: super::schedule_flags::ScheduleFlags,
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
    /// What a mission's occurrence does while an earlier run is still running: allow (launch
    /// anyway), forbid (settle it skipped; the default), replace (stop the running one),
    /// buffer-one (wait; when the run ends launch the newest, the older ones skipped) or
    /// buffer-all (wait; launch each in turn, one run at a time).
    #[arg(long, value_parser = ["allow", "forbid", "replace", "buffer-one", "buffer-all"])]
    overlap: Option<String>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
    /// Fire at most N scheduled occurrences (counted as they are claimed, so several
    /// schedulers never fire N+1), then the routine is finished. Triggers and backfills are
    /// not counted.
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=i32::MAX as u64))]
    limit_runs: Option<u32>,
    /// The operator's mission settings (the file `run --mission-config` takes): a mission is
    /// refused unless its env names, label keys and repository host are among the
    /// `env_allow`, `label_allow` and `repository_hosts` it gives (or the defaults).
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    mission_config: Option<PathBuf>,
    #[command(flatten)]
    policy: crate::mission_args::PolicyFlags,
    /// Print the routine as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("action").args(["message", "mission"])))]
pub(super) struct UpdateArgs {
    /// The routine's id or name.
    #[arg(value_name = "ID|NAME")]
    routine: String,
    /// A new name.
    #[arg(long)]
    name: Option<String>,
    /// A new rule (--schedule, --every, --at) replaces the rule; a clause given (--except,
    /// --start, --end) replaces that clause and keeps the rest.
    #[command(flatten)]
    when: super::schedule_flags::ScheduleFlags,
    /// A new IANA zone for the schedule.
    #[arg(long)]
    timezone: Option<String>,
    /// A new misfire policy.
    #[arg(long, value_parser = ["fire-once", "catch-up", "skip"])]
    misfire: Option<String>,
    /// Make it a message routine posting this text.
    #[arg(long)]
    message: Option<String>,
    /// Make it a mission routine described by this JSON file.
    #[arg(long)]
    mission: Option<PathBuf>,
    /// A new overlap policy (allow, forbid, replace, buffer-one, buffer-all) of a mission routine.
    #[arg(long, value_parser = ["allow", "forbid", "replace", "buffer-one", "buffer-all"])]
    overlap: Option<String>,
    /// Let it fire N more scheduled occurrences from now (reviving one whose limit was spent);
    /// `none` removes the limit.
    #[arg(long, value_name = "N|none", value_parser = limit_runs)]
    limit_runs: Option<LimitRuns>,
    /// The operator's mission settings (the file `run --mission-config` takes): a mission is
    /// refused unless its env names, label keys and repository host are among the
    /// `env_allow`, `label_allow` and `repository_hosts` it gives (or the defaults).
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    mission_config: Option<PathBuf>,
    #[command(flatten)]
    policy: crate::mission_args::PolicyFlags,
    /// Print the routine as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(super) struct ImportArgs {
    /// The file (`-` reads standard input).
    file: PathBuf,
    /// The file is a classic crontab, not JSON Lines.
    #[arg(long)]
    crontab: bool,
    /// A routine whose name exists already is updated instead of refused.
    #[arg(long, conflicts_with = "sync")]
    upsert: bool,
    /// Make the routines of the file's source match the file, as `crontab FILE` replaces a
    /// table: create what is new, update what changed, delete what the file no longer has.
    /// Routines of other sources and those made by hand are not touched (one of a name the
    /// file has, without a source, joins it).
    #[arg(long)]
    sync: bool,
    /// With --sync: the source's name, which also names unnamed crontab entries [default: the
    /// file's name; required for standard input].
    #[arg(long, requires = "sync")]
    source: Option<String>,
    /// Print what the import would create, update, adopt, leave and delete, and change
    /// nothing.
    #[arg(long)]
    dry_run: bool,
    /// With --crontab: the zone entries are read in until a CRON_TZ= line.
    #[arg(long, default_value = "UTC", requires = "crontab")]
    timezone: String,
    /// With --crontab: the misfire policy of every entry.
    #[arg(long, default_value = "fire-once", value_parser = ["fire-once", "catch-up", "skip"], requires = "crontab")]
    misfire: String,
    /// The operator's mission settings (the file `run --mission-config` takes): a mission is
    /// refused unless its env names, label keys and repository host are among the
    /// `env_allow`, `label_allow` and `repository_hosts` it gives (or the defaults).
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    mission_config: Option<PathBuf>,
    /// The directory a line's `mission` path is read in [default: the import file's directory;
    /// the current one for standard input]. A path is relative to it and never leaves it: an
    /// absolute path, a `..` above it or a symbolic link out of it is refused, and only a
    /// regular file is read.
    #[arg(long, value_name = "DIR", conflicts_with = "crontab")]
    mission_root: Option<PathBuf>,
    #[command(flatten)]
    policy: crate::mission_args::PolicyFlags,
}

impl TryFrom<&CreateArgs> for RoutineFields {
    type Error = Failure;

    fn try_from(args: &CreateArgs) -> Result<Self, Failure> {
        Ok(RoutineFields {
            line: 0,
            name: args.name.clone(),
            schedule: args.when.text(None).map_err(input)?.unwrap_or_default(),
            timezone: args.timezone.clone(),
            misfire: args.misfire.clone(),
            message: args.message.clone(),
            mission: args.mission.clone(),
            overlap: args.overlap.clone(),
            paused: args.paused,
            runs_left: args.limit_runs,
        })
    }
}

pub(super) async fn routine(url: &str, command: RoutineCommand) -> Result<(), Failure> {
    match command {
        RoutineCommand::Create(args) => {
            // Everything about the input is checked before the database is touched, so bad
            // input writes nothing.
            let policy = mission_policy(args.mission_config.as_deref(), &args.policy)?;
            let mut new = new_routine(&RoutineFields::try_from(&args)?, None, &policy)?;
            let overlap = overlap_for("--overlap", new.kind, args.overlap.as_deref())?;
            new.overlap = overlap.unwrap_or_default();
            let store = connect_migrated(url).await?;
            let routine = store.create_routine(new).await?;
            print_created(&routine, args.json)
        }
        RoutineCommand::Update(args) => update(url, args).await,
        RoutineCommand::Import(args) => import(url, args).await,
        RoutineCommand::List { json } => list(url, json).await,
        RoutineCommand::Show { routine, json } => {
            let store = connect_migrated(url).await?;
            let routine = find(&store, &routine).await?;
            if json {
                print_json(&routine)
            } else {
                show(&store, &routine).await
            }
        }
        RoutineCommand::Pause { routine } => set_paused(url, &routine, true).await,
        RoutineCommand::Resume { routine } => set_paused(url, &routine, false).await,
        RoutineCommand::Delete { routine } => {
            let store = connect_migrated(url).await?;
            let id = find(&store, &routine).await?.id;
            store.delete_routine(id).await?;
            say!("deleted {id}");
            Ok(())
        }
        RoutineCommand::Trigger { routine } => {
            let store = connect_migrated(url).await?;
            let id = find(&store, &routine).await?.id;
            let at = store.trigger_routine(id).await?;
            say!("{}", at.to_rfc3339_opts(SecondsFormat::Micros, true));
            Ok(())
        }
        RoutineCommand::Backfill {
            routine,
            from,
            to,
            retention,
        } => {
            let (from, to) = (parse_time(&from)?, parse_time(&to)?);
            if retention < cm_domain::config::MIN_RETENTION {
                return Err(input("--retention must be at least a day, as for run"));
            }
            let store = connect_migrated(url).await?;
            let routine = find(&store, &routine).await?;
            let schedule = routine.parsed_schedule()?;
            // The window is judged against the database's clock, the one the ticks use.
            let now = store.ping().await?;
            let occurrences = cm_domain::backfill_occurrences(&schedule, from, to, now, retention)
                .map_err(|e| input(e.to_string()))?;
            let requested = store.request_occurrences(routine.id, &occurrences).await?;
            say!(
                "requested {requested} of {} occurrences ({} already in the ledger or requested)",
                occurrences.len(),
                occurrences.len() as u64 - requested
            );
            Ok(())
        }
    }
}

/// The routine a command names: by id when the text is a UUID, else by name (names are never
/// UUIDs). A routine that does not exist is bad input.
async fn find(store: &PgStore, reference: &str) -> Result<Routine, Failure> {
    let routine = match Uuid::try_parse(reference.trim()) {
        Ok(id) => store.get_routine(id).await?,
        Err(_) => store.get_routine_by_name(reference.trim()).await?,
    };
    Ok(routine)
}

/// The id of the routine `reference` names, for `fires --routine`.
pub(super) async fn find_id(store: &PgStore, reference: &str) -> Result<Uuid, Failure> {
    Ok(find(store, reference).await?.id)
}

async fn set_paused(url: &str, reference: &str, paused: bool) -> Result<(), Failure> {
    let store = connect_migrated(url).await?;
    let id = find(&store, reference).await?.id;
    let routine = store.set_routine_paused(id, paused).await?;
    let last = last_fires(&store, &[routine.id]).await?;
    let mut table = Table::new(listing::ROUTINE_COLUMNS);
    table.print_page(&[listing::routine_row(&routine, last.get(&routine.id))]);
    Ok(())
}

/// The newest fire of each of `ids`, by routine.
async fn last_fires(
    store: &PgStore,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, cm_store::RecentFire>, Failure> {
    let mut last = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(cm_store::status::MAX_PAGE as usize) {
        last.extend(cm_store::StatusReader::last_fires(store, chunk).await?);
    }
    Ok(last)
}

fn print_created(routine: &Routine, json: bool) -> Result<(), Failure> {
    if json {
        print_json(routine)
    } else {
        say!("{}", routine.id);
        Ok(())
    }
}

/// One routine as one line of JSON, as `routine list --json` prints each.
fn print_json(routine: &Routine) -> Result<(), Failure> {
    listing::print_json_lines(std::slice::from_ref(routine))
}

fn name(text: &str) -> Result<String, Failure> {
    cm_scheduler::edit::name(text).map_err(input)
}

/// [`cm_scheduler::edit::overlap`], refused as bad input.
fn overlap_for(
    field: &str,
    kind: RoutineKind,
    given: Option<&str>,
) -> Result<Option<cm_domain::OverlapPolicy>, Failure> {
    cm_scheduler::edit::overlap(field, kind, given).map_err(input)
}

fn misfire(text: &str) -> Result<MisfirePolicy, Failure> {
    cm_scheduler::edit::misfire(text).map_err(input)
}

/// What a routine does, from `--message` or `--mission` (read inside `root` when an import's
/// line names it).
fn action(
    message: Option<&str>,
    mission: Option<&PathBuf>,
    root: Option<&Path>,
    policy: &MissionPolicy,
) -> Result<RoutineAction, Failure> {
    match (message, mission) {
        (Some(text), None) => cm_scheduler::edit::message(text).map_err(input),
        (None, Some(path)) => Ok(RoutineAction {
            kind: RoutineKind::Mission,
            payload: mission_payload(path, root, policy)?,
        }),
        _ => Err(input("give exactly one of --message and --mission")),
    }
}

/// A routine to create, checked as `routine create` checks it. An import's mission paths are
/// read inside its mission `root`; `routine create`'s (`None`) as the operator gave it.
fn new_routine(
    fields: &RoutineFields,
    root: Option<&Path>,
    policy: &MissionPolicy,
) -> Result<NewRoutine, Failure> {
    let name = name(&fields.name)?;
    let zone = Zone::parse(&fields.timezone).map_err(|e| input(e.to_string()))?;
    let schedule = Schedule::new(&fields.schedule, zone).map_err(|e| input(e.to_string()))?;
    let misfire = misfire(&fields.misfire)?;
    let action = action(
        fields.message.as_deref(),
        fields.mission.as_ref(),
        root,
        policy,
    )?;
    Ok(NewRoutine {
        name,
        schedule,
        kind: action.kind,
        payload: action.payload,
        misfire,
        overlap: cm_domain::OverlapPolicy::default(),
        paused: fields.paused,
        runs_left: fields.runs_left,
    })
}

/// `routine update --limit-runs`: a number of runs, or `none` (no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LimitRuns(Option<u32>);

fn limit_runs(text: &str) -> Result<LimitRuns, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(LimitRuns(None));
    }
    match text.parse::<u32>() {
        Ok(n) if (1..=i32::MAX as u32).contains(&n) => Ok(LimitRuns(Some(n))),
        _ => Err(format!(
            "{text:?} is not a run limit (a number from 1, or none)"
        )),
    }
}

async fn update(url: &str, args: UpdateArgs) -> Result<(), Failure> {
    // A rule given is checked before the database is touched; a clause alone (--end) is
    // written into the routine's present schedule once it is read.
    let given_rule = args.when.has_rule();
    let early_schedule = if given_rule {
        args.when.text(None).map_err(input)?
    } else {
        None
    };
    // Checked before the database is touched, as create checks them: the fields first (a
    // mission's kind stands in until the routine is read), then against the routine.
    let mission = match &args.mission {
        Some(path) => Some(action(
            None,
            Some(path),
            None,
            &mission_policy(args.mission_config.as_deref(), &args.policy)?,
        )?),
        None => None,
    };
    let given_kind = mission.as_ref().map_or(RoutineKind::Mission, |m| m.kind);
    let checked = |schedule: Option<&str>, kind, zone| {
        let edit = cm_scheduler::edit::Edit {
            name: args.name.as_deref(),
            schedule,
            timezone: args.timezone.as_deref(),
            misfire: args.misfire.as_deref(),
            message: args.message.as_deref(),
            overlap: args.overlap.as_deref(),
        };
        let mut update = edit.checked(kind, zone, "--overlap").or_else(|e| {
            // A mission file alone is a change too, and so are a clause and a run limit.
            if (mission.is_some() || args.when.any() || args.limit_runs.is_some())
                && e == cm_scheduler::edit::NOTHING_TO_CHANGE
            {
                Ok(RoutineUpdate::default())
            } else {
                Err(input(e))
            }
        })?;
        if mission.is_some() {
            update.action = mission.clone();
        }
        update.runs_left = args.limit_runs.map(|l| l.0);
        Ok::<_, Failure>(update)
    };
    checked(early_schedule.as_deref(), given_kind, None)?;
    let store = connect_migrated(url).await?;
    let found = find(&store, &args.routine).await?;
    let schedule = if args.when.any() {
        args.when.text(Some(&found.schedule)).map_err(input)?
    } else {
        None
    };
    let zone = Zone::parse(&found.timezone).ok();
    let kind = mission.as_ref().map_or(found.kind, |m| m.kind);
    let update = checked(schedule.as_deref(), kind, zone)?;
    let routine = store.update_routine(found.id, &update).await?;
    print_created(&routine, args.json)
}

async fn import(url: &str, args: ImportArgs) -> Result<(), Failure> {
    let source = if args.sync {
        let source = match (&args.source, args.file.file_name()) {
            (Some(source), _) => source.clone(),
            (None, Some(name)) if args.file.as_os_str() != "-" => name.to_string_lossy().into(),
            (None, _) => return Err(input("--sync from standard input needs --source NAME")),
        };
        if source.trim().is_empty() || source.chars().any(char::is_control) {
            return Err(input(
                "--source must not be empty or hold control characters",
            ));
        }
        Some(source)
    } else {
        None
    };
    let shown = args.file.display().to_string();
    let reader: Box<dyn std::io::BufRead> = if args.file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(&args.file)
            .map_err(|e| input(format!("cannot read {shown}: {e}")))?;
        Box::new(std::io::BufReader::new(file))
    };
    let at_line = |line: usize, what: &str| input(format!("{shown}:{line}: {what}"));
    let fields = if args.crontab {
        // Unnamed entries are named after the source, so the same crontab read from standard
        // input with --source FILE names its entries as the file does.
        let label = match &source {
            Some(source) => source.clone(),
            None => args
                .file
                .file_name()
                .map_or_else(|| "stdin".into(), |n| n.to_string_lossy().into_owned()),
        };
        let mut notes = Vec::new();
        let read = import::crontab(reader, &label, &args.timezone, &args.misfire, &mut notes);
        for (line, note) in notes {
            eprintln!("{shown}:{line}: {note}");
        }
        read
    } else {
        import::json_lines(reader)
    }
    .map_err(|(line, what)| at_line(line, &what))?;
    // Mission paths are read inside the root: --mission-root, else the import file's directory
    // (the current one for standard input).
    let root = match &args.mission_root {
        Some(root) => root.clone(),
        None if args.file.as_os_str() == "-" => PathBuf::from("."),
        None => match args.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        },
    };

    let policy = mission_policy(args.mission_config.as_deref(), &args.policy)?;
    let mut routines = Vec::with_capacity(fields.len());
    let mut lines: HashMap<String, usize> = HashMap::new();
    for f in &fields {
        let mut routine = new_routine(f, Some(&root), &policy).map_err(|e| match e {
            Failure::Input(what) => at_line(f.line, &what),
            other => other,
        })?;
        let chosen = overlap_for("\"overlap\"", routine.kind, f.overlap.as_deref()).map_err(
            |e| match e {
                Failure::Input(what) => at_line(f.line, &what),
                other => other,
            },
        )?;
        // A mission's overlap policy is `forbid` unless the line says.
        routine.overlap = chosen.unwrap_or_default();
        if let Some(first) = lines.insert(routine.name.clone(), f.line) {
            return Err(at_line(
                f.line,
                &format!("the name {:?} is also on line {first}", routine.name),
            ));
        }
        routines.push(routine);
    }
    if routines.is_empty() {
        return Err(input(format!("{shown} holds no routine")));
    }

    if args.dry_run {
        return dry_run(url, source.as_deref(), &routines, args.upsert, &lines).await;
    }
    if let Some(source) = source {
        let store = connect_migrated(url).await?;
        for synced in store.sync_routines(&source, &routines).await? {
            say!(
                "{}  {}  {}",
                synced.action.as_str(),
                synced.routine.id,
                printable(&synced.routine.name)
            );
        }
        return Ok(());
    }
    let store = connect_migrated(url).await?;
    let imported = match store.import_routines(&routines, args.upsert).await {
        Err(StoreError::NameTaken(name)) => {
            let line = lines.get(&name).copied().unwrap_or(0);
            return Err(at_line(
                line,
                &format!("a routine named {name:?} already exists (--upsert updates it)"),
            ));
        }
        other => other?,
    };
    for written in imported {
        say!(
            "{}  {}  {}",
            if written.created {
                "created"
            } else {
                "updated"
            },
            written.routine.id,
            printable(&written.routine.name)
        );
    }
    Ok(())
}

/// `routine import --dry-run`: what the import (or sync) would do, one line a routine
/// (`create`, `update`, `adopt`, `leave`, `delete`, its id where it has one, its name), worked
/// out by the store under the write's own locks and rolled back: nothing is written.
async fn dry_run(
    url: &str,
    source: Option<&str>,
    routines: &[NewRoutine],
    upsert: bool,
    lines: &HashMap<String, usize>,
) -> Result<(), Failure> {
    let store = connect_migrated(url).await?;
    let planned: Vec<(&str, Option<Uuid>, String)> = match source {
        Some(source) => store
            .plan_sync(source, routines)
            .await?
            .into_iter()
            .map(|synced| {
                let (word, id) = match synced.action {
                    cm_store::SyncAction::Created => ("create", None),
                    cm_store::SyncAction::Updated => ("update", Some(synced.routine.id)),
                    cm_store::SyncAction::Adopted => ("adopt", Some(synced.routine.id)),
                    cm_store::SyncAction::Unchanged => ("leave", Some(synced.routine.id)),
                    cm_store::SyncAction::Deleted => ("delete", Some(synced.routine.id)),
                };
                (word, id, synced.routine.name)
            })
            .collect(),
        None => match store.plan_import(routines, upsert).await {
            Err(StoreError::NameTaken(name)) => {
                let line = lines.get(&name).copied().unwrap_or(0);
                return Err(input(format!(
                    "line {line}: a routine named {name:?} already exists (--upsert updates it)"
                )));
            }
            other => other?
                .into_iter()
                .map(|written| {
                    if written.created {
                        ("create", None, written.routine.name)
                    } else {
                        ("update", Some(written.routine.id), written.routine.name)
                    }
                })
                .collect(),
        },
    };
    for (word, id, name) in planned {
        let id = id.map_or_else(|| "-".to_string(), |id| id.to_string());
        say!("{word:<6}  {id}  {}", printable(&name));
    }
    eprintln!("dry run: nothing was written");
    Ok(())
}

async fn list(url: &str, json: bool) -> Result<(), Failure> {
    let store = connect_migrated(url).await?;
    let mut table = Table::new(listing::ROUTINE_COLUMNS);
    let mut after = None;
    loop {
        let page = store
            .list_routines_page(after, listing::ROUTINE_PAGE)
            .await?;
        let Some(last) = page.last() else {
            if !json {
                // No routine at all still prints the header: the listing ran and found none.
                table.print_page(&[]);
            }
            return Ok(());
        };
        after = Some(RoutineCursor::after(last));
        let ids: Vec<Uuid> = page.iter().map(|r| r.id).collect();
        let lasts = last_fires(&store, &ids).await?;
        if json {
            let lines: Vec<listing::RoutineLine<'_>> = page
                .iter()
                .map(|r| listing::RoutineLine::new(r, lasts.get(&r.id)))
                .collect();
            listing::print_json_lines(&lines)?;
        } else {
            let rows: Vec<Vec<String>> = page
                .iter()
                .map(|r| listing::routine_row(r, lasts.get(&r.id)))
                .collect();
            table.print_page(&rows);
        }
        if page.len() < listing::ROUTINE_PAGE as usize {
            return Ok(());
        }
    }
}

/// `routine show`: settings (no payload beyond the message text or the mission's repository),
/// the next runs in the routine's zone and in UTC, pending requests and the last fires.
async fn show(store: &PgStore, routine: &Routine) -> Result<(), Failure> {
    let schedule = routine.parsed_schedule()?;
    let zone = schedule.zone().tz();
    say!("id          {}", routine.id);
    say!("name        {}", printable(&routine.name));
    say!("kind        {}", routine.kind);
    match routine.kind {
        RoutineKind::Message => say!(
            "message     {}",
            printable(routine.payload["text"].as_str().unwrap_or(""))
        ),
        RoutineKind::Mission => say!(
            "repository  {}",
            printable(routine.payload["repository"].as_str().unwrap_or(""))
        ),
    }
    say!("schedule    {}", printable(&routine.schedule));
    say!("timezone    {}", routine.timezone);
    say!("misfire     {}", routine.misfire_policy);
    if routine.kind == RoutineKind::Mission {
        say!("overlap     {}", routine.overlap);
    }
    say!("state       {}", listing::state(routine));
    if let Some(left) = routine.runs_left {
        say!("runs left   {left}");
    }
    if let Some(jitter) = schedule.jitter() {
        say!(
            "jitter      up to {} after each occurrence",
            cm_domain::duration_text(chrono::TimeDelta::from_std(jitter).unwrap_or_default())
        );
    }
    if let Some(start) = schedule.start() {
        say!("starts      {}", listing::instant(start));
    }
    if let Some(end) = schedule.end() {
        say!("ends        {}", listing::instant(end));
    }
    if let Some(source) = &routine.source {
        say!("source      {}", printable(source));
    }
    say!("created     {}", listing::instant(routine.created_at));
    say!("updated     {}", listing::instant(routine.updated_at));
    say!(
        "last run    {}",
        routine.last_run_at.map_or("never".into(), listing::instant)
    );
    let last = last_fires(store, &[routine.id]).await?;
    match last.get(&routine.id) {
        Some(fire) => say!(
            "last fire   {} at {}{}",
            listing::last_outcome(Some(fire)),
            listing::instant(fire.scheduled_at),
            fire.error
                .as_deref()
                .map(|e| format!(": {}", printable(e)))
                .unwrap_or_default()
        ),
        None => say!("last fire   never"),
    }

    say!("");
    match routine.next_run_at {
        None if routine.paused => say!("next runs: none while paused"),
        None if routine.is_finished(chrono::Utc::now()) => {
            say!("next runs: none (finished: the schedule has no more occurrences)")
        }
        None => say!("next runs: none yet (the routine is not planned yet)"),
        Some(first) => {
            // When each run comes due, a jitter applied; with one, its occurrence (the key
            // its fire is recorded under) beside it.
            let runs: Vec<_> = schedule
                .runs_from_clock(routine.id, first)
                .take(SHOWN_RUNS)
                .collect();
            let jittered = schedule.jitter().is_some();
            let (mut table, local) = if jittered {
                (
                    Table::new(&["NEXT RUNS (LOCAL)", "UTC", "OCCURRENCE (UTC)"]),
                    "%Y-%m-%d %H:%M:%S%.3f %Z",
                )
            } else {
                (
                    Table::new(&["NEXT RUNS (LOCAL)", "UTC"]),
                    "%Y-%m-%d %H:%M:%S %Z",
                )
            };
            let rows: Vec<Vec<String>> = runs
                .iter()
                .map(|(occurrence, planned)| {
                    let mut row = vec![
                        planned.with_timezone(&zone).format(local).to_string(),
                        planned.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                    ];
                    if jittered {
                        row.push(listing::instant(*occurrence));
                    }
                    row
                })
                .collect();
            table.print_page(&rows);
        }
    }

    let requests = store.pending_requests(routine.id, SHOWN_REQUESTS).await?;
    say!("");
    if requests.total == 0 {
        say!("pending requests: none");
    } else {
        let mut table = Table::new(&["PENDING REQUESTS", "OCCURRENCE (UTC)", "REQUESTED AT (UTC)"]);
        let rows: Vec<Vec<String>> = requests
            .oldest
            .iter()
            .map(|r| {
                vec![
                    if r.is_trigger() {
                        "trigger"
                    } else {
                        "backfill"
                    }
                    .into(),
                    listing::instant(r.scheduled_at),
                    listing::instant(r.requested_at),
                ]
            })
            .collect();
        table.print_page(&rows);
        let more = requests.total - requests.oldest.len() as u64;
        if more > 0 {
            say!("… and {more} more");
        }
    }

    let fires = store
        .list_fires(&FireFilter {
            routine_id: Some(routine.id),
            limit: SHOWN_FIRES,
            ..FireFilter::default()
        })
        .await?;
    say!("");
    if fires.is_empty() {
        say!("last fires: none");
    } else {
        let mut table = Table::new(listing::ROUTINE_FIRE_COLUMNS);
        let rows: Vec<Vec<String>> = fires.iter().map(listing::routine_fire_row).collect();
        table.print_page(&rows);
    }
    Ok(())
}
