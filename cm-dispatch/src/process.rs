//! The process mission backend: runs the operator's program as a local child process. For
//! development only; never the default.
//!
//! Each occurrence owns a marker file in the work directory, named by its idempotency key and
//! created with `O_EXCL` before the program starts, so a second dispatch of the occurrence (a
//! retry after a crash, a second scheduler) finds the marker and launches nothing. The marker
//! holds `pid N` once the child started; one without a pid means a scheduler died between
//! creating it and starting the child, and the occurrence fails rather than risk a second run.
//!
//! The program runs under a small `/bin/sh` wrapper ([`WRAPPER`]) in a process group of its own,
//! so a Ctrl-C or a SIGTERM meant for the scheduler reaches neither, and the wrapper, not the
//! scheduler, writes the program's exit status to `<key>.exit` when it ends: a run outlives the
//! scheduler that started it, and a scheduler started later (the same one restarted, or another
//! with the same work directory) re-adopts it from the marker's pid and start time (so a pid the
//! system reused for another process is not taken for the run) and the exit file. The program
//! itself is started without a shell, with a cleared environment: the scheduler's own `PATH`,
//! then the mission's `CM_*` variables and its `env` (which can name no variable that steers a
//! runner: `cm_domain::mission::DENIED_ENV`). The program is resolved once, when the backend is
//! built, with the scheduler's own `PATH`: a lookup at spawn would search the child's. Its
//! stdout and stderr go to `<key>.log` in the work directory. The marker's second line records
//! when the child started (`started_at <RFC 3339>`); the exit file's time is when it ended. A
//! run's report is those times and the log's last [`MAX_RUN_OUTPUT`](crate::MAX_RUN_OUTPUT)
//! bytes, read from its end.
//!
//! The work directory is made absolute (and its symbolic links resolved) when the backend is
//! built, and the runner's place ([`MissionRuntime::place`](crate::MissionRuntime::place)) is
//! `HOST:DIR`, this host's name and that directory, recorded on every run's fire. A scheduler
//! judges a run only from the files at its recorded place: a run whose place is on this host,
//! in a directory this scheduler can read, is watched and stopped from there whatever its own
//! work directory; a run on another host, or in a directory it cannot see, is left to a
//! scheduler that can ([`MissionRuntime::sees`](crate::MissionRuntime::sees)), and never judged
//! lost for the absence of files in this scheduler's own directory.
//!
//! A stop sends SIGTERM to the run's process group and waits until no process of the group is
//! left (zombies not counted); after [`STOP_GRACE`] it sends SIGKILL and waits [`KILL_WAIT`]
//! more. Only a group gone confirms the stop; one still there at the stop's deadline is an
//! error, and the run may still be running.

use std::ffi::OsString;
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;

use cm_domain::MissionPolicy;

use crate::mission::{HostResolver, Launch, SystemResolver};
use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// Runs one local process per occurrence.
#[derive(Debug, Clone)]
pub struct ProcessDispatcher {
    program: PathBuf,
    args: Vec<OsString>,
    workdir: PathBuf,
    /// This host's name, the first half of the runner's place.
    host: String,
    path: Option<OsString>,
    policy: MissionPolicy,
    resolver: std::sync::Arc<dyn HostResolver>,
}

impl ProcessDispatcher {
    /// Runs `program` with `args` for every mission, keeping markers and logs in `workdir`
    /// (created if missing, then made absolute against the current directory with its symbolic
    /// links resolved: the runner's place names it whole). A `program` without a `/` is looked
    /// up now in this process's `PATH` (an error if it is not there); one with a `/` is made
    /// absolute against the current directory, since the child starts in `workdir`.
    pub fn new(
        program: impl Into<OsString>,
        args: Vec<OsString>,
        workdir: impl Into<PathBuf>,
    ) -> std::io::Result<ProcessDispatcher> {
        let path = std::env::var_os("PATH");
        let program = resolve_program(&program.into(), path.as_deref())?;
        let workdir = workdir.into();
        std::fs::create_dir_all(&workdir)?;
        let workdir = std::fs::canonicalize(&workdir)?;
        Ok(ProcessDispatcher {
            program,
            args,
            workdir,
            host: this_host(),
            path,
            policy: MissionPolicy::default(),
            resolver: std::sync::Arc::new(SystemResolver),
        })
    }

    /// Refuses, at dispatch, missions that `policy` does not allow (the operator's
    /// `env_allow`, `label_allow` and `repository_hosts`).
    pub fn with_policy(mut self, policy: MissionPolicy) -> ProcessDispatcher {
        self.policy = policy;
        self
    }

    /// Resolves repository hosts with `resolver` at dispatch
    /// ([`crate::mission::check_resolved`]) instead of the system's.
    pub fn with_resolver(
        mut self,
        resolver: std::sync::Arc<dyn HostResolver>,
    ) -> ProcessDispatcher {
        self.resolver = resolver;
        self
    }

    /// The program every mission runs, as resolved when the backend was built.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The work directory, absolute, as the runner's place names it.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// The marker of the occurrence named `name`.
    pub fn marker_path(&self, name: &str) -> PathBuf {
        self.workdir.join(format!("{name}.launched"))
    }

    /// The file the wrapper writes the exit status of the occurrence named `name` to.
    fn exit_path(&self, name: &str) -> PathBuf {
        exit_in(&self.workdir, name)
    }

    /// The directory holding the files of `run`: the one its recorded place names, when it is
    /// on this host and this process can see it (this runner's own directory for a run with no
    /// place recorded); `None` when this scheduler cannot see the run's files.
    fn folder_of(&self, run: &crate::RunRef) -> Option<PathBuf> {
        let Some(place) = &run.place else {
            return Some(self.workdir.clone());
        };
        let (host, dir) = place.split_once(':')?;
        let dir = Path::new(dir);
        if host != self.host || !dir.is_absolute() {
            return None;
        }
        if dir == self.workdir || dir.is_dir() {
            return Some(dir.to_path_buf());
        }
        None
    }

    /// Why `run` is not this scheduler's to judge or stop.
    fn unseen(&self, run: &crate::RunRef) -> DispatchError {
        DispatchError::Unavailable(format!(
            "the files of run {} are at {}, which this scheduler (at {}:{}) cannot see; \
             a scheduler there judges and stops it",
            run.name,
            run.place.as_deref().unwrap_or_default(),
            self.host,
            self.workdir.display()
        ))
    }
}

/// The marker of the occurrence named `name` in `folder`.
fn marker_in(folder: &Path, name: &str) -> PathBuf {
    folder.join(format!("{name}.launched"))
}

/// The exit file of the occurrence named `name` in `folder`.
fn exit_in(folder: &Path, name: &str) -> PathBuf {
    folder.join(format!("{name}.exit"))
}

/// When a run ended and how, as its exit file records them.
type Ended = (cm_domain::RunState, Option<chrono::DateTime<chrono::Utc>>);

/// How the run of `name` in `folder` ended, if its exit file says so yet, with the file's time.
fn ended_in(folder: &Path, name: &str) -> Option<Ended> {
    let path = exit_in(folder, name);
    let text = read_record(&path).ok()?;
    // Written whole, through a rename; a file without its line is still being written.
    if !text.contains('\n') {
        return None;
    }
    let at = recorded_time(&text, FINISHED_AT).or_else(|| {
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        Some(chrono::DateTime::<chrono::Utc>::from(modified))
    });
    Some((exit_run_state(&text), at))
}

impl ProcessDispatcher {
    fn launch(&self, launch: &Launch) -> Result<Receipt, DispatchError> {
        let marker_path = self.marker_path(&launch.name);
        let mut marker = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&marker_path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return already_launched(&marker_path);
            }
            Err(e) => {
                return Err(DispatchError::Unavailable(format!(
                    "cannot create the marker {}: {e}",
                    marker_path.display()
                )));
            }
        };
        let log = self.workdir.join(format!("{}.log", launch.name));
        let open_log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
        };
        let (stdout, stderr) = match open_log().and_then(|a| Ok((a, open_log()?))) {
            Ok(files) => files,
            Err(e) => {
                // Nothing started: the marker goes, so a retry may launch.
                let _ = std::fs::remove_file(&marker_path);
                return Err(DispatchError::Unavailable(format!(
                    "cannot open {}: {e}",
                    log.display()
                )));
            }
        };
        if !is_executable(&self.program) {
            // Nothing can start: the marker goes, so a retry may launch once the operator
            // mends the configuration.
            let _ = std::fs::remove_file(&marker_path);
            return Err(DispatchError::Unavailable(format!(
                "cannot start {}: not an executable file",
                self.program.display()
            )));
        }
        let exit_path = self.exit_path(&launch.name);
        let mut command = tokio::process::Command::new(SHELL);
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("cm-mission")
            .arg(&exit_path)
            .arg(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.path.clone().map(|path| ("PATH", path)))
            .envs(
                launch
                    .env
                    .iter()
                    .map(|(k, v)| (OsString::from(k), OsString::from(v))),
            )
            .current_dir(&self.workdir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // Its own process group: a Ctrl-C meant for the scheduler does not stop missions.
            .process_group(0)
            .kill_on_drop(false);
        let started_at = chrono::Utc::now();
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                // The wrapper did not start: nothing ran, so the marker goes and a retry may
                // launch; the failure is the machine's.
                let _ = std::fs::remove_file(&marker_path);
                return Err(DispatchError::Unavailable(format!(
                    "cannot start {} for {}: {e}",
                    SHELL,
                    self.program.display()
                )));
            }
        };
        let pid = child.id().unwrap_or_default();
        // The pid is written after the start; a crash in between leaves a marker without one,
        // which a retry reports instead of launching again. The start tick tells this process
        // from a later one the system gives the same pid.
        let tick = start_tick(pid)
            .map(|tick| format!("{START_TICK} {tick}\n"))
            .unwrap_or_default();
        let record = format!("pid {pid}\n{STARTED_AT} {}\n{tick}", rfc3339(started_at));
        if let Err(e) = marker
            .write_all(record.as_bytes())
            .and_then(|()| marker.sync_all())
        {
            return Err(DispatchError::Unavailable(format!(
                "started pid {pid} but cannot write the marker {}: {e}",
                marker_path.display()
            )));
        }
        // Reaps the wrapper so it does not linger as a zombie; the wrapper records how the
        // program ended, and this only when the wrapper itself was killed before it could (a
        // stop's SIGTERM that came before the wrapper set its trap): a death by signal S is
        // recorded as the wrapper would have, `exit status: 128 + S`.
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt as _;
                    match status.signal() {
                        Some(signal) => format!("exit status: {}", 128 + signal),
                        None => status.to_string(),
                    }
                }
                Err(e) => format!("unknown: {e}"),
            };
            if !exit_path.exists() {
                let _ = tokio::fs::write(exit_path, format!("{status}\n")).await;
            }
        });
        Ok(Receipt {
            duplicate: false,
            detail: format!("pid {pid}"),
        })
    }
}

/// The marker's line recording when the child started.
const STARTED_AT: &str = "started_at";

/// The marker's line recording the wrapper's start time in clock ticks since boot
/// (`/proc/PID/stat`'s 22nd field), which tells it from a later process with the same pid.
const START_TICK: &str = "start_tick";

/// The exit file's line recording when the child ended, in files written before the file's
/// own modification time was taken for it.
const FINISHED_AT: &str = "finished_at";

/// The shell the wrapper runs in.
const SHELL: &str = "/bin/sh";

/// The wrapper each mission runs under, as `sh -c WRAPPER cm-mission EXIT_FILE PROGRAM ARGS…`:
/// it starts the program, passes a SIGTERM on to it (a stop sends one to the whole group, which
/// the wrapper outlives to record the end), waits for it and writes `exit status: N` (as Rust
/// prints an `ExitStatus`; a program killed by signal S exits `128 + S`, as Docker reports it) to
/// the exit file, through a temporary file so a reader never sees half of it. Its variables
/// are the shell's own, not exported, and it unsets the `PWD` a shell exports: the program's
/// environment is the mission's.
pub const WRAPPER: &str = r#"unset PWD OLDPWD
exit_file=$1; shift
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
while :; do
  wait "$child"; status=$?
  kill -0 "$child" 2>/dev/null || break
done
printf 'exit status: %s\n' "$status" > "$exit_file.part" && mv -f "$exit_file.part" "$exit_file" || printf 'exit status: %s\n' "$status" > "$exit_file"
exit "$status""#;

/// Whether `path` is a file its owner, group or others may execute.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The start time of process `pid` in clock ticks since boot, from `/proc/PID/stat`; `None`
/// when there is no such process (or no `/proc`).
fn start_tick(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields after it start at the 3rd.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(22 - 3)?.parse().ok()
}

fn rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The time a record's `name` line holds (`started_at 2026-03-29T01:00:00.000000Z`), if any.
fn recorded_time(text: &str, name: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at.trim()).ok())
        .map(|at| at.with_timezone(&chrono::Utc))
}

/// Whether `pid` (as a marker records it) is still the process the marker's start tick names:
/// a process that exists (a zombie not yet reaped included) and, where the marker recorded a
/// start tick, started then.
fn is_the_run(pid: &str, marker: &str) -> bool {
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    let recorded = marker
        .lines()
        .find_map(|line| line.strip_prefix(START_TICK)?.trim().parse::<u64>().ok());
    match (start_tick(pid), recorded) {
        (None, _) => false,
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
    }
}

/// The pid a marker records on its first line, if any.
fn recorded_pid(marker: &str) -> Option<&str> {
    marker
        .lines()
        .next()?
        .trim()
        .strip_prefix("pid ")
        .filter(|pid| !pid.is_empty())
}

/// The last [`MAX_RUN_OUTPUT`](crate::MAX_RUN_OUTPUT) bytes of the log at `path` (and the byte
/// before them, to tell whether they start a line), read from its end: never the whole file.
/// `None` when there is no log.
fn log_tail(path: &Path) -> std::io::Result<Option<String>> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let from = len.saturating_sub(crate::MAX_RUN_OUTPUT as u64 + 1);
    file.seek(std::io::SeekFrom::Start(from))?;
    let mut end = Vec::with_capacity((len - from) as usize);
    file.take(len - from).read_to_end(&mut end)?;
    Ok(Some(crate::output::kept_output(&end, from == 0)))
}

/// The most bytes of a marker or an exit file read: each is a few short lines.
const MAX_RECORD: u64 = 4096;

/// The start of a marker or exit file, at most [`MAX_RECORD`] bytes, read lossily: the files
/// lie in a folder the run itself can write to, so one grown large (or made something else than
/// the few lines cm writes) costs no more than that to read.
fn read_record(path: &Path) -> std::io::Result<String> {
    let mut start = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_RECORD)
        .read_to_end(&mut start)?;
    Ok(String::from_utf8_lossy(&start).into_owned())
}

/// The receipt for an occurrence whose marker exists.
fn already_launched(marker_path: &Path) -> Result<Receipt, DispatchError> {
    let text = read_record(marker_path).unwrap_or_default();
    match text.lines().next().filter(|line| line.starts_with("pid ")) {
        Some(pid) => Ok(Receipt {
            duplicate: true,
            detail: pid.to_owned(),
        }),
        None => Err(DispatchError::Rejected(format!(
            "an earlier attempt created {} but recorded no process: it may have started one, \
             so this occurrence is not launched again",
            marker_path.display()
        ))),
    }
}

/// The run an exit file records (`exit status: 3`, `signal: 9 (SIGKILL)`, as Rust prints an
/// `ExitStatus`).
fn exit_run_state(text: &str) -> cm_domain::RunState {
    let text = text.lines().next().unwrap_or_default().trim();
    match text
        .strip_prefix("exit status: ")
        .and_then(|code| code.parse::<i32>().ok())
    {
        Some(code) => cm_domain::RunState::exited(code, ""),
        None => cm_domain::RunState::Failed {
            exit_code: None,
            reason: cm_domain::ErrorText::new(text),
        },
    }
}

#[async_trait]
impl crate::MissionRuntime for ProcessDispatcher {
    async fn ready(&self) -> Result<(), String> {
        Ok(())
    }

    /// The exit file once the program ended; while it has none, running if the marker's pid is
    /// still the wrapper it started (whether this scheduler started it or one before a
    /// restart, or another scheduler on this host with another work directory), else lost. All
    /// read in the folder the run's place names; a run whose files this scheduler cannot see
    /// is an error, never a verdict.
    async fn observe(
        &self,
        run: &crate::RunRef,
        _deadline: std::time::Instant,
    ) -> Result<cm_domain::RunState, DispatchError> {
        let Some(folder) = self.folder_of(run) else {
            return Err(self.unseen(run));
        };
        if let Some((state, _)) = ended_in(&folder, &run.name) {
            return Ok(state);
        }
        let marker = read_record(&marker_in(&folder, &run.name)).unwrap_or_default();
        let pid = recorded_pid(&marker).unwrap_or_default();
        if is_the_run(pid, &marker) {
            return Ok(cm_domain::RunState::Running);
        }
        // The wrapper may have written the exit and gone between the two reads.
        if let Some((state, _)) = ended_in(&folder, &run.name) {
            return Ok(state);
        }
        Ok(cm_domain::RunState::Lost {
            reason: cm_domain::ErrorText::new(format!(
                "no process {} and no exit status in {}",
                if pid.is_empty() { "recorded" } else { pid },
                exit_in(&folder, &run.name).display()
            )),
        })
    }

    /// Sends SIGTERM to the run's process group (it runs in a group of its own) and waits
    /// until no process of the group is left; after a grace of 10 s, SIGKILL, and 5 s more.
    /// `Ok` only once the group is gone; a run whose files this scheduler cannot see is not
    /// stopped.
    async fn stop(
        &self,
        run: &crate::RunRef,
        deadline: std::time::Instant,
    ) -> Result<(), DispatchError> {
        let Some(folder) = self.folder_of(run) else {
            return Err(self.unseen(run));
        };
        let marker = read_record(&marker_in(&folder, &run.name)).unwrap_or_default();
        let Some(pid) = recorded_pid(&marker) else {
            return Ok(());
        };
        // An ended run, or a pid now another process's, gets no signal.
        if ended_in(&folder, &run.name).is_some() || !is_the_run(pid, &marker) {
            return Ok(());
        }
        let Ok(group) = pid.parse::<u32>() else {
            return Ok(());
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let began = tokio::time::Instant::now();
        signal_group(group, "TERM").await;
        if group_gone_by(group, deadline.min(began + STOP_GRACE)).await {
            return Ok(());
        }
        let still = |what: &str| {
            DispatchError::Unconfirmed(format!(
                "process group {group} of run {} still runs {:.1} s after {what}",
                run.name,
                began.elapsed().as_secs_f64()
            ))
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(still("SIGTERM"));
        }
        signal_group(group, "KILL").await;
        if !group_gone_by(group, deadline.min(tokio::time::Instant::now() + KILL_WAIT)).await {
            return Err(still("SIGTERM, then SIGKILL"));
        }
        // The wrapper was killed with the rest and could not record the end: the stop does,
        // as Docker reports a kill (128 + 9), unless the wrapper's parent already did.
        record_killed(&exit_in(&folder, &run.name));
        Ok(())
    }

    fn place(&self) -> Option<String> {
        Some(format!("{}:{}", self.host, self.workdir.display()))
    }

    fn sees(&self, run: &crate::RunRef) -> bool {
        self.folder_of(run).is_some()
    }

    /// The last 16 KiB of `<key>.log` (`None` without one), the start the marker records and
    /// the end the exit file records (each `None` when not recorded: a marker written before
    /// times were, a run still going or whose scheduler died before it ended), in the folder
    /// the run's place names.
    async fn report(
        &self,
        run: &crate::RunRef,
        _deadline: std::time::Instant,
    ) -> Result<crate::RunReport, DispatchError> {
        let Some(folder) = self.folder_of(run) else {
            return Err(self.unseen(run));
        };
        let read = |path: PathBuf| read_record(&path).unwrap_or_default();
        let marker = read(marker_in(&folder, &run.name));
        let started_at = recorded_time(&marker, STARTED_AT);
        let log = folder.join(format!("{}.log", run.name));
        let output = log_tail(&log).map_err(|e| {
            DispatchError::Unavailable(format!("cannot read {}: {e}", log.display()))
        })?;
        Ok(crate::RunReport {
            output,
            started_at,
            // A file's time is coarser than the clock: never before the start.
            finished_at: ended_in(&folder, &run.name)
                .and_then(|(_, at)| at)
                .map(|at| started_at.map_or(at, |started| at.max(started))),
        })
    }
}

/// How long a stop waits after SIGTERM for the run's process group to exit before it sends
/// SIGKILL: 10 s, as `docker stop` and the Docker backend's default grace.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a stop waits after SIGKILL for the group to be gone before it reports the stop
/// unconfirmed (a process in uninterruptible sleep outlives a SIGKILL until its I/O returns).
pub const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often a stop looks whether the group is gone.
const GROUP_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Sends `SIG` to every process of the group `group`.
async fn signal_group(group: u32, signal: &str) {
    let _ = tokio::process::Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{group}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

/// Whether the process group `group` is gone by `until`, looking every [`GROUP_POLL`].
async fn group_gone_by(group: u32, until: tokio::time::Instant) -> bool {
    loop {
        let alive = tokio::task::spawn_blocking(move || group_alive(group))
            .await
            .unwrap_or(true);
        if !alive {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return false;
        }
        tokio::time::sleep(GROUP_POLL.min(until - now)).await;
    }
}

/// Whether a process of the group `group` is alive (a zombie, ended and not yet reaped, is
/// not), from `/proc/*/stat`; `true` when `/proc` cannot be read, since nothing confirms the
/// group gone then.
fn group_alive(group: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.filter_map(Result::ok).any(|entry| {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // The command name, in parentheses, may hold spaces: the state, the parent and the
        // group follow it.
        let Some(after) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
            return false;
        };
        let mut fields = after.split_whitespace();
        let state = fields.next().unwrap_or_default();
        let pgrp = fields.nth(1).and_then(|g| g.parse::<u32>().ok());
        pgrp == Some(group) && !matches!(state, "Z" | "X")
    })
}

/// Records the end of a run whose wrapper a stop killed (`exit status: 137`, as Docker reports
/// SIGKILL) at `exit_path`, unless something recorded it first: written beside it, then linked
/// in place, which never replaces a file already there.
fn record_killed(exit_path: &Path) {
    let part = exit_path.with_extension("exit.stopped");
    let text = format!(
        "exit status: 137\n{FINISHED_AT} {}\n",
        rfc3339(chrono::Utc::now())
    );
    if std::fs::write(&part, text).is_ok() {
        let _ = std::fs::hard_link(&part, exit_path);
    }
    let _ = std::fs::remove_file(&part);
}

/// This host's name (`/proc/sys/kernel/hostname`), or `localhost` when it cannot be read.
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty() && !name.contains(':'))
        .unwrap_or_else(|| "localhost".to_owned())
}

#[async_trait]
impl Dispatcher for ProcessDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let launch = Launch::checked(dispatch, &self.policy, &*self.resolver).await?;
        self.launch(&launch)
    }
}

/// `program` as the child will be started: a name without `/` found in `path` (the
/// scheduler's own), as an executable file; a path made absolute.
fn resolve_program(
    program: &std::ffi::OsStr,
    path: Option<&std::ffi::OsStr>,
) -> std::io::Result<PathBuf> {
    let as_path = Path::new(program);
    if program.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the mission command is empty",
        ));
    }
    if as_path.components().count() > 1 || program.as_encoded_bytes().contains(&b'/') {
        return std::path::absolute(as_path);
    }
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(as_path))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "{} is not an executable on the scheduler's PATH",
                    as_path.display()
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_program_is_found_on_the_given_path_only() {
        let dir = std::env::temp_dir().join(format!("cm-resolve-{}", std::process::id()));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let runner = bin.join("runner");
        std::fs::write(&runner, "#!/bin/sh\n").unwrap();
        let not_executable = bin.join("plain");
        std::fs::write(&not_executable, "").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path =
            std::env::join_paths(["relative/dir".into(), dir.join("empty"), bin.clone()]).unwrap();
        assert_eq!(
            resolve_program("runner".as_ref(), Some(&path)).unwrap(),
            runner
        );
        assert!(resolve_program("plain".as_ref(), Some(&path)).is_err());
        assert!(resolve_program("runner".as_ref(), None).is_err());
        assert!(resolve_program("".as_ref(), Some(&path)).is_err());
        // A path is kept, made absolute.
        assert_eq!(
            resolve_program("/bin/sh".as_ref(), None).unwrap(),
            PathBuf::from("/bin/sh")
        );
        assert!(resolve_program("./x".as_ref(), None).unwrap().is_absolute());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
