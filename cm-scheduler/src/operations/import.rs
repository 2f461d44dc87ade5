//! Importing routines from a file, all or none: JSON Lines or a crontab
//! ([`crate::import`]), every line checked as `routine create` checks its flags before anything
//! is written; then created (or updated with `--upsert`), or synced with the file's source
//! (`--sync`), or only planned (`--dry-run`). Every routine written records the source (the
//! file's name, or `--source`), so a later `--sync` deletes those the file no longer has.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cm_domain::mission::MissionPolicy;
use cm_store::{NewRoutine, PgStore, Routine, RoutineStore, StoreError, SyncAction};
use uuid::Uuid;

use super::{OperationError, new_routine, refused};
use crate::flags::routine::ImportArgs;
use crate::import::{
    CrontabKind, LineError, RoutineFields, crontab, json_lines, kept_as_system, machine_users,
};

/// An import's file, read and checked: nothing is written yet.
#[derive(Debug)]
pub struct Import {
    /// The file as messages name it (`-` for standard input).
    pub shown: String,
    /// The source the routines written record: `--source`, else the file's name (none for
    /// standard input without `--source`).
    pub source: Option<String>,
    /// `--sync`: the file replaces the routines of its source.
    sync: bool,
    routines: Vec<NewRoutine>,
    /// Each routine's line, by name.
    lines: HashMap<String, usize>,
}

/// A routine an import wrote, and what it did (`created`, `updated`, `adopted`, `unchanged`,
/// `deleted`).
#[derive(Debug, Clone)]
pub struct Written {
    /// What the import did to it.
    pub action: &'static str,
    /// The routine as written (as it was, when deleted).
    pub routine: Routine,
}

/// A routine a dry run would write: what it would do, in the words the import prints
/// ([`Written`]) in the present (`create`, `update`, `adopt`, `unchanged`, `delete`), its id
/// where it has one, its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// What the import would do.
    pub action: &'static str,
    /// The routine's id, if it exists.
    pub id: Option<Uuid>,
    /// The routine's name.
    pub name: String,
}

/// An import's file, read but not yet checked line by line: its lines' fields, and what
/// checking them needs (the mission root and policy).
pub struct Lines {
    /// The file as messages name it (`-` for standard input).
    pub shown: String,
    /// The source the routines written record (see [`Import::source`]).
    pub source: Option<String>,
    sync: bool,
    fields: Vec<RoutineFields>,
    root: PathBuf,
    policy: MissionPolicy,
}

/// Reads and checks the file `args` names (standard input for `-`). A crontab's assignments
/// that mean nothing to cm go to `notes`, each with its line.
pub fn read(args: &ImportArgs, notes: &mut Vec<LineError>) -> Result<Import, OperationError> {
    let Lines {
        shown,
        source,
        sync,
        fields,
        root,
        policy,
    } = read_lines(args, notes)?;
    let at_line = |line: usize, what: &str| refused(format!("{shown}:{line}: {what}"));
    let mut routines = Vec::with_capacity(fields.len());
    let mut lines: HashMap<String, usize> = HashMap::new();
    // Each line is checked as `routine create` checks its flags (its schedule parsed and
    // compiled: most of an import's own work) on every core, each a slice of the lines; the
    // first refusal in the file's order is the one reported.
    let checked = checked_in_parallel(&fields, |f| check_line(&shown, f, &root, &policy));
    for (f, routine) in fields.iter().zip(checked) {
        let routine = routine?;
        if let Some(first) = lines.insert(routine.name().to_owned(), f.line) {
            return Err(at_line(
                f.line,
                &format!("the name {:?} is also on line {first}", routine.name()),
            ));
        }
        routines.push(routine);
    }
    Ok(Import {
        shown,
        source,
        sync,
        routines,
        lines,
    })
}

/// One line checked as `routine create` checks its flags, a refusal naming the line. A
/// mission's overlap policy is written with it, in the import's one transaction: its line's,
/// `forbid` when it names none.
fn check_line(
    shown: &str,
    f: &RoutineFields,
    root: &Path,
    policy: &MissionPolicy,
) -> Result<NewRoutine, OperationError> {
    new_routine(f, Some(root), policy, "\"overlap\"").map_err(|e| match e {
        OperationError::Refused(what) => refused(format!("{shown}:{}: {what}", f.line)),
        other => other,
    })
}

/// Reads the file `args` names (standard input for `-`) into its lines' fields, each line's
/// syntax checked; the routines are checked by [`read`] or [`create_streamed`]. A crontab's
/// assignments that mean nothing to cm go to `notes`, each with its line.
pub fn read_lines(args: &ImportArgs, notes: &mut Vec<LineError>) -> Result<Lines, OperationError> {
    let stdin = args.file.as_os_str() == "-";
    let bad = |source: &str| source.trim().is_empty() || source.chars().any(char::is_control);
    let source = match (&args.source, args.file.file_name()) {
        (Some(source), _) if bad(source) => {
            return Err(refused(
                "--source must not be empty or hold control characters",
            ));
        }
        (Some(source), _) => Some(source.clone()),
        (None, Some(name)) if !stdin => {
            let name = name.to_string_lossy().into_owned();
            if bad(&name) {
                return Err(refused(
                    "the file's name holds control characters: name its source with --source NAME",
                ));
            }
            Some(name)
        }
        (None, _) if args.sync => {
            return Err(refused("--sync from standard input needs --source NAME"));
        }
        (None, _) => None,
    };
    let shown = args.file.display().to_string();
    let reader: Box<dyn std::io::BufRead> = if stdin {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(&args.file)
            .map_err(|e| refused(format!("cannot read {shown}: {e}")))?;
        Box::new(std::io::BufReader::new(file))
    };
    let at_line = |line: usize, what: &str| refused(format!("{shown}:{line}: {what}"));
    let fields = if args.crontab {
        // Unnamed entries are named after the source, so the same crontab read from standard
        // input with --source FILE names its entries as the file does.
        let label = source.as_deref().unwrap_or("stdin");
        let kind = if args.system {
            CrontabKind::System
        } else {
            CrontabKind::User {
                users: machine_users(),
                system_file: !stdin && kept_as_system(&args.file),
            }
        };
        crontab(reader, label, &args.timezone, &args.misfire, &kind, notes)
    } else {
        json_lines(reader)
    }
    .map_err(|(line, what)| at_line(line, &what))?;
    // Mission paths are read inside the root: --mission-root, else the import file's directory
    // (the current one for standard input).
    let root = match &args.mission_root {
        Some(root) => root.clone(),
        None if stdin => PathBuf::from("."),
        None => match args.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        },
    };

    let policy = args
        .policy
        .policy(args.mission_config.as_deref())
        .map_err(refused)?;
    if fields.is_empty() {
        return Err(refused(format!("{shown} holds no routine")));
    }
    Ok(Lines {
        shown,
        source,
        sync: args.sync,
        fields,
        root,
        policy,
    })
}

/// Creates the routines of `lines` (none of whose names exists), all or none, as [`import`]
/// does without `--upsert`, but a chunk at a time: each chunk of lines is checked on a thread
/// of its own while the store writes the one before, in one transaction, so the checks and the
/// writes overlap and only two chunks of checked routines are held at once, whatever the
/// file's size. With `progress`, a count of the lines written so far is kept on standard
/// error. The ids and names created, in the file's order.
pub async fn create_streamed(
    store: &PgStore,
    lines: Lines,
    progress: bool,
) -> Result<Vec<(Uuid, String)>, OperationError> {
    let Lines {
        shown,
        source,
        fields,
        root,
        policy,
        ..
    } = lines;
    let (sender, chunks) = tokio::sync::mpsc::channel(1);
    let checker_shown = shown.clone();
    let checker = tokio::task::spawn_blocking(move || {
        let shown = checker_shown;
        let total = fields.len();
        let mut names: HashMap<String, usize> = HashMap::with_capacity(total);
        for (done, chunk) in fields.chunks(cm_store::CREATE_CHUNK).enumerate() {
            let checked = checked_in_parallel(chunk, |f| check_line(&shown, f, &root, &policy));
            let mut routines = Vec::with_capacity(chunk.len());
            for (f, routine) in chunk.iter().zip(checked) {
                let routine = routine?;
                if let Some(first) = names.insert(routine.name().to_owned(), f.line) {
                    return Err(refused(format!(
                        "{shown}:{}: the name {:?} is also on line {first}",
                        f.line,
                        routine.name()
                    )));
                }
                routines.push(routine);
            }
            if sender
                .blocking_send(cm_store::Streamed::Chunk(routines))
                .is_err()
            {
                // The store stopped (its error is the one reported).
                return Ok(names);
            }
            if progress {
                let written = (done * cm_store::CREATE_CHUNK + chunk.len()).min(total);
                eprint!("\r{shown}: {written} of {total} routines checked");
            }
        }
        if progress {
            eprintln!();
        }
        let _ = sender.blocking_send(cm_store::Streamed::End);
        Ok(names)
    });
    let written = store
        .create_routines_streamed(source.as_deref(), chunks)
        .await;
    let names = checker
        .await
        .map_err(|e| refused(format!("checking {shown}: {e}")))??;
    match written {
        Err(StoreError::NameTaken(name)) => {
            let line = names.get(&name).copied().unwrap_or(0);
            Err(refused(format!(
                "{shown}:{line}: a routine named {name:?} already exists (--upsert updates it)"
            )))
        }
        other => Ok(other?),
    }
}

/// `check` of every item, in order, computed on as many threads as there are cores, each
/// taking a contiguous slice.
fn checked_in_parallel<T: Sync, R: Send>(items: &[T], check: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let slice = items.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let check = &check;
        let handles: Vec<_> = items
            .chunks(slice)
            .map(|chunk| scope.spawn(move || chunk.iter().map(check).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

impl Import {
    /// With `--sync`: the source whose routines the file replaces.
    pub fn synced_source(&self) -> Option<&str> {
        self.source.as_deref().filter(|_| self.sync)
    }

    /// The refusal of a name that exists already, naming its line (`at` writes the line's
    /// prefix).
    fn name_taken(&self, name: &str, at: impl Fn(usize) -> String) -> OperationError {
        let line = self.lines.get(name).copied().unwrap_or(0);
        refused(format!(
            "{}a routine named {name:?} already exists (--upsert updates it)",
            at(line)
        ))
    }
}

/// Creates the file's routines, all or none, each recording the import's source; with
/// `upsert`, a routine whose name exists is updated (and joins the source) instead of refused.
pub async fn import(
    store: &PgStore,
    import: &Import,
    upsert: bool,
) -> Result<Vec<Written>, OperationError> {
    let source = import.source.as_deref();
    let imported = match store
        .import_routines(&import.routines, upsert, source)
        .await
    {
        Err(StoreError::NameTaken(name)) => {
            return Err(import.name_taken(&name, |line| format!("{}:{line}: ", import.shown)));
        }
        other => other?,
    };
    Ok(imported
        .into_iter()
        .map(|one| Written {
            action: if one.created { "created" } else { "updated" },
            routine: one.routine,
        })
        .collect())
}

/// Makes the routines of `source` match the file, as `crontab FILE` replaces a table: creates
/// what is new, updates what changed, deletes what the file no longer has.
pub async fn sync(
    store: &PgStore,
    import: &Import,
    source: &str,
) -> Result<Vec<Written>, OperationError> {
    Ok(store
        .sync_routines(source, &import.routines)
        .await?
        .into_iter()
        .map(|synced| Written {
            action: synced.action.as_str(),
            routine: synced.routine,
        })
        .collect())
}

/// What [`import`] (or [`sync`], with a source) would do, worked out by the store under the
/// write's own locks and rolled back: nothing is written.
pub async fn dry_run(
    store: &PgStore,
    import: &Import,
    upsert: bool,
) -> Result<Vec<Planned>, OperationError> {
    let planned = |action, id, name| Planned { action, id, name };
    Ok(match import.synced_source() {
        Some(source) => store
            .plan_sync(source, &import.routines)
            .await?
            .into_iter()
            .map(|synced| {
                let id = Some(synced.routine.id);
                let name = synced.routine.name;
                match synced.action {
                    SyncAction::Created => planned("create", None, name),
                    SyncAction::Updated => planned("update", id, name),
                    SyncAction::Adopted => planned("adopt", id, name),
                    SyncAction::Unchanged => planned("unchanged", id, name),
                    SyncAction::Deleted => planned("delete", id, name),
                }
            })
            .collect(),
        None => match store
            .plan_import(&import.routines, upsert, import.source.as_deref())
            .await
        {
            Err(StoreError::NameTaken(name)) => {
                return Err(import.name_taken(&name, |line| format!("line {line}: ")));
            }
            other => other?
                .into_iter()
                .map(|written| {
                    if written.created {
                        planned("create", None, written.routine.name)
                    } else {
                        planned("update", Some(written.routine.id), written.routine.name)
                    }
                })
                .collect(),
        },
    })
}
