//! The process mission backend: runs the operator's program as a local child process. For
//! development only; never the default.
//!
//! Each occurrence owns a marker file in the work directory, named by its idempotency key and
//! created with `O_EXCL` before the program starts, so a second dispatch of the occurrence (a
//! retry after a crash, a second scheduler) finds the marker and launches nothing. The marker
//! holds `pid N` once the child started; one without a pid means a scheduler died between
//! creating it and starting the child, and the occurrence fails rather than risk a second run.
//!
//! The child runs without a shell, with a cleared environment: `PATH`, then the mission's `CM_*`
//! variables and its `env`. Its stdout and stderr go to `<key>.log` in the work directory, and
//! its exit status, once it ends, to `<key>.exit` (while this scheduler lives).

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;

use crate::mission::Launch;
use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// Runs one local process per occurrence.
#[derive(Debug, Clone)]
pub struct ProcessDispatcher {
    program: OsString,
    args: Vec<OsString>,
    workdir: PathBuf,
}

impl ProcessDispatcher {
    /// Runs `program` with `args` for every mission, keeping markers and logs in `workdir`
    /// (created if missing).
    pub fn new(
        program: impl Into<OsString>,
        args: Vec<OsString>,
        workdir: impl Into<PathBuf>,
    ) -> std::io::Result<ProcessDispatcher> {
        let workdir = workdir.into();
        std::fs::create_dir_all(&workdir)?;
        Ok(ProcessDispatcher {
            program: program.into(),
            args,
            workdir,
        })
    }

    /// The marker of the occurrence named `name`.
    pub fn marker_path(&self, name: &str) -> PathBuf {
        self.workdir.join(format!("{name}.launched"))
    }

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
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(std::env::var_os("PATH").map(|path| ("PATH", path)))
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
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                // The program did not start: nothing ran, so the marker goes and a retry may
                // launch; the failure is the operator's configuration.
                let _ = std::fs::remove_file(&marker_path);
                return Err(DispatchError::Unavailable(format!(
                    "cannot start {}: {e}",
                    Path::new(&self.program).display()
                )));
            }
        };
        let pid = child.id().unwrap_or_default();
        // The pid is written after the start; a crash in between leaves a marker without one,
        // which a retry reports instead of launching again.
        if let Err(e) = writeln!(marker, "pid {pid}").and_then(|()| marker.sync_all()) {
            return Err(DispatchError::Unavailable(format!(
                "started pid {pid} but cannot write the marker {}: {e}",
                marker_path.display()
            )));
        }
        let exit_path = self.workdir.join(format!("{}.exit", launch.name));
        // Reaps the child so it does not linger as a zombie, and records how it ended.
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => format!("unknown: {e}"),
            };
            let _ = tokio::fs::write(exit_path, format!("{status}\n")).await;
        });
        Ok(Receipt {
            duplicate: false,
            detail: format!("pid {pid}"),
        })
    }
}

/// The receipt for an occurrence whose marker exists.
fn already_launched(marker_path: &Path) -> Result<Receipt, DispatchError> {
    let text = std::fs::read_to_string(marker_path).unwrap_or_default();
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

#[async_trait]
impl Dispatcher for ProcessDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let launch = Launch::of(dispatch)?;
        self.launch(&launch)
    }
}
