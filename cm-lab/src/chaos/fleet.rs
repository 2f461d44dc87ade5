//! The scheduler processes of a run: started, killed with SIGKILL, replaced, probed on
//! `/readyz`, stopped with SIGTERM.
//!
//! Each slot keeps its own loopback HTTP port across restarts, so a probe always knows where
//! slot N answers; each process logs to its own file, numbered in the order they started.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The schedulers' settings. A short tick and lease make crashes visible within seconds; the
/// ten-minute grace and the large backlog make sure an outage skips no occurrence by policy, so
/// every second of every routine is owed and a gap in the ledger can only be a loss.
pub(super) const RUN_FLAGS: &[&str] = &[
    "--tick-interval",
    "200ms",
    "--lease",
    "3s",
    "--dispatch-timeout",
    "2s",
    "--max-attempts",
    "10",
    "--misfire-grace",
    "10m",
    "--max-backlog",
    "10000",
];

/// The pairs of [`RUN_FLAGS`] that `overrides` does not give again.
fn run_flags(overrides: &[String]) -> Vec<&'static str> {
    RUN_FLAGS
        .chunks(2)
        .filter(|pair| !overrides.iter().any(|o| o == pair[0]))
        .flatten()
        .copied()
        .collect()
}

/// How long a scheduler may take to exit after SIGTERM: it settles in-flight dispatches, each
/// bounded by the 2 s dispatch timeout.
pub(super) const SIGTERM_TIMEOUT: Duration = Duration::from_secs(20);

/// One scheduler process.
pub(super) struct Scheduler {
    pub instance_id: String,
    child: Child,
    pub log: PathBuf,
}

/// The scheduler processes. Dropping it kills whatever still runs, so an error anywhere in the
/// run leaves no scheduler behind.
pub(super) struct Fleet {
    binary: PathBuf,
    /// The database URL the schedulers get (the forwarder's, when there is one).
    url: String,
    log_dir: PathBuf,
    slots: Vec<Scheduler>,
    /// Each slot's `/readyz` port on 127.0.0.1.
    ports: Vec<u16>,
    /// Flags every scheduler gets after [`RUN_FLAGS`]: the backend's, which replace those of
    /// [`RUN_FLAGS`] they name.
    backend_args: Vec<String>,
    /// Environment every scheduler gets: the backend's.
    backend_env: Vec<(String, String)>,
    /// Processes started so far, for unique log names and instance ids.
    started: u32,
    pub last_spawn: Option<Instant>,
}

impl Fleet {
    /// Starts `processes` schedulers on `url`.
    pub fn start(
        binary: &Path,
        url: &str,
        log_dir: &Path,
        processes: usize,
        backend_args: Vec<String>,
        backend_env: Vec<(String, String)>,
    ) -> anyhow::Result<Fleet> {
        let ports = (0..processes)
            .map(|_| free_port())
            .collect::<anyhow::Result<Vec<u16>>>()?;
        let mut fleet = Fleet {
            binary: binary.to_path_buf(),
            url: url.to_string(),
            log_dir: log_dir.to_path_buf(),
            slots: Vec::new(),
            ports,
            backend_args,
            backend_env,
            started: 0,
            last_spawn: None,
        };
        for slot in 0..processes {
            let s = fleet.spawn(slot, None)?;
            fleet.slots.push(s);
        }
        Ok(fleet)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Every slot's `/readyz` port.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    fn spawn(&mut self, slot: usize, instance_id: Option<String>) -> anyhow::Result<Scheduler> {
        self.started += 1;
        let instance_id = instance_id.unwrap_or_else(|| format!("chaos-{slot}-g{}", self.started));
        let log = self
            .log_dir
            .join(format!("{:03}-{instance_id}.log", self.started));
        let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = scheduler_command(&self.binary, &self.url)
            .arg("run")
            .arg("--instance-id")
            .arg(&instance_id)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.ports[slot]))
            .args(run_flags(&self.backend_args))
            .args(&self.backend_args)
            .envs(self.backend_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.last_spawn = Some(Instant::now());
        Ok(Scheduler {
            instance_id,
            child,
            log,
        })
    }

    /// The slot whose process holds the socket `inode` (as `/proc/PID/fd` names it), if any.
    pub fn slot_holding_socket(&self, inode: u64) -> Option<usize> {
        let target = format!("socket:[{inode}]");
        self.slots.iter().position(|s| {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", s.child.id())) else {
                return false;
            };
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == target.as_str())
            })
        })
    }

    /// Kills slot `slot` with SIGKILL and starts it again; returns the old and new instance ids.
    pub fn kill_and_restart(
        &mut self,
        slot: usize,
        same_id: bool,
    ) -> anyhow::Result<(String, String)> {
        let old = &mut self.slots[slot];
        old.child.kill().context("SIGKILL")?;
        old.child.wait()?;
        let old_id = old.instance_id.clone();
        let new = self.spawn(slot, same_id.then(|| old_id.clone()))?;
        let new_id = new.instance_id.clone();
        self.slots[slot] = new;
        Ok((old_id, new_id))
    }

    /// Finds schedulers that exited on their own (none should), and starts them again.
    pub fn restart_dead(&mut self) -> anyhow::Result<Vec<String>> {
        let mut dead = Vec::new();
        for slot in 0..self.slots.len() {
            if let Some(status) = self.slots[slot].child.try_wait()? {
                let s = &self.slots[slot];
                dead.push(format!(
                    "{} exited on its own with {status}; its log ({}) ends:\n{}",
                    s.instance_id,
                    s.log.display(),
                    log_tail(&s.log, 8)
                ));
                self.slots[slot] = self.spawn(slot, None)?;
            }
        }
        Ok(dead)
    }

    /// Sends SIGTERM to every scheduler and waits for each to exit.
    pub fn terminate_all(&mut self) -> Vec<Termination> {
        for s in &self.slots {
            let sent = Command::new("kill")
                .args(["-TERM", &s.child.id().to_string()])
                .status();
            if !matches!(sent, Ok(status) if status.success()) {
                eprintln!("chaos: could not send SIGTERM to {}", s.instance_id);
            }
        }
        let signalled = Instant::now();
        let mut out = Vec::new();
        for s in &mut self.slots {
            let status = loop {
                match s.child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if signalled.elapsed() < SIGTERM_TIMEOUT => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break None;
                    }
                }
            };
            out.push(Termination {
                instance_id: s.instance_id.clone(),
                status,
                after: signalled.elapsed(),
                log: s.log.clone(),
            });
        }
        out
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if matches!(s.child.try_wait(), Ok(None)) {
                let _ = s.child.kill();
                let _ = s.child.wait();
            }
        }
    }
}

/// How one scheduler ended after SIGTERM.
#[derive(Debug)]
pub(super) struct Termination {
    pub instance_id: String,
    /// `None`: it did not exit within [`SIGTERM_TIMEOUT`] and was killed.
    pub status: Option<ExitStatus>,
    pub after: Duration,
    pub log: PathBuf,
}

impl Termination {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// What one `/readyz` request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Readiness {
    /// 200.
    Ready,
    /// 503, with the reason the body gives.
    Unready(String),
    /// No whole answer within the probe's deadline.
    NoAnswer,
    /// Nothing listens (a scheduler starting, or just killed).
    Refused,
    /// The connection was closed or reset before any answer: the scheduler asked was killed
    /// while the probe waited (a SIGKILL resets its sockets). Not a silence: a silence is a
    /// live process that does not answer in time.
    Closed,
}

/// `GET /readyz` on 127.0.0.1:`port`, giving up after `deadline`, as an orchestrator's probe
/// does.
pub(super) fn probe_readyz(port: u16, deadline: Duration) -> Readiness {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, deadline) else {
        return Readiness::Refused;
    };
    let started = Instant::now();
    let _ = stream.set_write_timeout(Some(deadline));
    let silent_or_closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Readiness::NoAnswer,
        _ => Readiness::Closed,
    };
    if let Err(e) =
        stream.write_all(b"GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
    {
        return silent_or_closed(e);
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Readiness::NoAnswer;
        }
        match stream.read(&mut buf) {
            Ok(0) if answer.is_empty() => return Readiness::Closed,
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => return silent_or_closed(e),
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_string();
    if text.starts_with("HTTP/1.1 200") {
        Readiness::Ready
    } else if text.starts_with("HTTP/1.1 503") {
        Readiness::Unready(body)
    } else {
        Readiness::NoAnswer
    }
}

/// How long a probe waits for `/readyz`: an orchestrator's probe timeout is typically one
/// second.
pub(super) const PROBE_DEADLINE: Duration = Duration::from_secs(1);

/// One `/readyz` answer a [`Prober`] recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Probe {
    /// Since the prober started.
    pub after: Duration,
    pub slot: usize,
    pub readiness: Readiness,
}

/// Probes every slot's `/readyz` every 250 ms, each slot on a thread of its own, until
/// stopped: what an orchestrator sees during a fault.
pub(super) struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    probes: std::sync::Arc<std::sync::Mutex<Vec<Probe>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub started: Instant,
}

impl Prober {
    pub fn start(ports: &[u16]) -> Prober {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let started = Instant::now();
        let threads = ports
            .iter()
            .enumerate()
            .map(|(slot, &port)| {
                let (stop, probes) = (stop.clone(), probes.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let asked = Instant::now();
                        let readiness = probe_readyz(port, PROBE_DEADLINE);
                        probes
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(Probe {
                                after: asked - started,
                                slot,
                                readiness,
                            });
                        std::thread::sleep(
                            Duration::from_millis(250).saturating_sub(asked.elapsed()),
                        );
                    }
                })
            })
            .collect();
        Prober {
            stop,
            probes,
            threads,
            started,
        }
    }

    /// Stops probing and returns every answer, in the order they were asked.
    pub fn finish(mut self) -> Vec<Probe> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut probes =
            std::mem::take(&mut *self.probes.lock().unwrap_or_else(|e| e.into_inner()));
        probes.sort_by_key(|p| p.after);
        probes
    }
}

/// What probes in `window` (from the prober's start) saw, slot by slot: the first 503 and its
/// reason, and how many got no answer within the deadline.
pub(super) fn probe_digest(probes: &[Probe], from: Duration, to: Duration) -> String {
    let slots = probes.iter().map(|p| p.slot + 1).max().unwrap_or(0);
    (0..slots)
        .map(|slot| {
            let inside: Vec<&Probe> = probes
                .iter()
                .filter(|p| p.slot == slot && p.after >= from && p.after < to)
                .collect();
            let count = |r: &Readiness| inside.iter().filter(|p| &p.readiness == r).count();
            let first_503 = inside.iter().find_map(|p| match &p.readiness {
                Readiness::Unready(reason) => Some(format!(
                    "first 503 at {:.1} s ({reason:?})",
                    (p.after - from).as_secs_f64()
                )),
                _ => None,
            });
            format!(
                "slot {slot}: {}, {} no answer in {} s, {} ready, {} refused, {} closed unanswered of {}",
                first_503.unwrap_or_else(|| "no 503".to_string()),
                count(&Readiness::NoAnswer),
                PROBE_DEADLINE.as_secs(),
                count(&Readiness::Ready),
                count(&Readiness::Refused),
                count(&Readiness::Closed),
                inside.len()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A port on 127.0.0.1 nothing listens on right now.
pub(super) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A `cm-scheduler` command on the database `url`, with the product's default log settings.
pub(crate) fn scheduler_command(binary: &Path, url: &str) -> Command {
    let mut c = Command::new(binary);
    c.arg("--database-url").arg(url);
    // The URL is always passed; removing DATABASE_URL (set by `.cargo/config.toml` for cargo's
    // children) makes sure nothing falls back to the tests' server database. The log settings
    // are fixed so the log digest finds its markers: no colour codes, the default levels.
    c.env_remove("DATABASE_URL")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info,sqlx=warn");
    c
}

/// Runs a short `cm-scheduler` command and returns its stdout.
pub(crate) fn scheduler_output(binary: &Path, url: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = scheduler_command(binary, url)
        .args(args)
        .output()
        .with_context(|| format!("running cm-scheduler {args:?}"))?;
    if !output.status.success() {
        bail!(
            "cm-scheduler {args:?} failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Writes `text` to a new file only its owner may read (the webhook's signing secret).
pub(super) fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// The last `lines` lines of a log file, indented, for an error message.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_flag_replaces_the_run_flag_it_names() {
        assert_eq!(run_flags(&[]), RUN_FLAGS);
        let flags = run_flags(&["--lease".to_string(), "8s".to_string()]);
        assert!(!flags.contains(&"--lease") && !flags.contains(&"3s"));
        assert_eq!(flags.len(), RUN_FLAGS.len() - 2);
        assert!(flags.windows(2).any(|w| w == ["--tick-interval", "200ms"]));
    }

    /// The probe against a server of the test's own: an answer, a reason, a silence, a
    /// process that dies while asked.
    #[test]
    fn the_probe_tells_ready_unready_silent_closed_and_absent_apart() {
        let serve = |answer: &'static str| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            std::thread::spawn(move || {
                if let Ok((mut s, _)) = listener.accept() {
                    let mut buf = [0u8; 256];
                    let _ = s.read(&mut buf);
                    if answer == "close" {
                        drop(s);
                    } else if answer.is_empty() {
                        std::thread::sleep(Duration::from_secs(2));
                    } else {
                        let _ = s.write_all(answer.as_bytes());
                    }
                }
            });
            port
        };
        let short = Duration::from_millis(500);
        let ok = serve("HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nready\n");
        assert_eq!(probe_readyz(ok, short), Readiness::Ready);
        let down = serve("HTTP/1.1 503 Service Unavailable\r\n\r\ndatabase: timed out\n");
        assert_eq!(
            probe_readyz(down, short),
            Readiness::Unready("database: timed out".into())
        );
        let silent = serve("");
        let started = Instant::now();
        assert_eq!(probe_readyz(silent, short), Readiness::NoAnswer);
        assert!(started.elapsed() < Duration::from_millis(1500));
        assert_eq!(probe_readyz(serve("close"), short), Readiness::Closed);
        assert_eq!(
            probe_readyz(free_port().unwrap(), short),
            Readiness::Refused
        );
    }
}
