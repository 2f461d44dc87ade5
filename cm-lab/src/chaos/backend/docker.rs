//! The Docker mission backend (`--mission-backend docker`): the routines are mission routines
//! (overlap `allow`, so every second of every routine is owed a container), launched by the
//! schedulers on a `dockerd` of the run's own: started under the run's directory on a Unix
//! socket, with no network of its own (no iptables rules, no bridge; containers run with network
//! `none`), the image imported from busybox by `.ci/dockerd`. Never the machine's engine, nor
//! the tests' shared one.
//!
//! Routines `i` with `i % 3 != 0` run under overlap `replace` (their missions, a second long,
//! come due every second, so the next occurrence often finds the last still running and stops
//! it); with `--refuse-stops` the engine refuses the stop of every other container through an
//! authorization plugin of the run's own (`authz.rs`). Their containers are checked never to
//! run two at once: each starts after the one before it finished.
//!
//! The engine is shared with the dockerd fault (`--dockerd-restarts`), which stops it with
//! SIGTERM and starts it again on the same data.
//!
//! After the drain the containers are read back through the engine (`docker ps -a` and
//! `docker inspect`, filtered by the `cm.routine-id` label): exactly one container per fired
//! occurrence, named by its idempotency key and labelled with its routine and time; none for an
//! occurrence without a row or a failed one; none left created but never started. Containers
//! finished by a later attempt than the one that created them are counted: the kills that landed
//! between create and start, and after start.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::chaos::ledger::FireRow;
use crate::chaos::report::Findings;

/// The image `.ci/dockerd` imports, and the missions run.
const IMAGE: &str = "cm-test-busybox:1";

/// What every mission runs: long enough to be running when the engine is stopped, short enough
/// that a stop waits for no grace.
const MISSION_CONFIG: &str = r#"{"command": ["sleep", "1"], "docker": {"network": "none"}}"#;

/// A start that comes later than this after the create was finished by another attempt than the
/// one that created it: the creator was killed between the two.
const LATE_START: Duration = Duration::from_millis(500);

/// A `dockerd` of the run's own.
pub(in crate::chaos) struct Dockerd {
    dir: PathBuf,
    child: Option<Child>,
    pub starts: u32,
    /// The authorization plugin it asks about every request, if any.
    authz: Option<String>,
}

impl Dockerd {
    fn socket(&self) -> PathBuf {
        self.dir.join("docker.sock")
    }

    /// The engine's address, as `DOCKER_HOST` takes it.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// Starts it on its data and waits until `/_ping` answers.
    pub fn start(&mut self) -> anyhow::Result<Duration> {
        let began = Instant::now();
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("dockerd.log"))?;
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new("dockerd")
            .args([
                "--iptables=false",
                "--ip6tables=false",
                "--bridge=none",
                "--ip-forward=false",
                "--ip-masq=false",
            ])
            .arg("--data-root")
            .arg(self.dir.join("data"))
            // Short: containerd's sockets live under it, and a socket path is at most 107 bytes.
            .arg("--exec-root")
            .arg(self.dir.join("x"))
            .arg("--pidfile")
            .arg(self.dir.join("dockerd.pid"))
            .arg("--host")
            .arg(self.host())
            .args(
                self.authz
                    .iter()
                    .flat_map(|name| ["--authorization-plugin".to_string(), name.clone()]),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting dockerd (run .ci/dockerd once to install it)")?;
        self.child = Some(child);
        while !self.answers() {
            if began.elapsed() > Duration::from_secs(60) {
                bail!(
                    "dockerd did not answer at {} within 60 s (log in {})",
                    self.host(),
                    self.dir.join("dockerd.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(began.elapsed())
    }

    /// Stops it with SIGTERM (it stops its containers and containerd) and waits for it to exit.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let signalled = Instant::now();
        while sent.success() && signalled.elapsed() < Duration::from_secs(30) {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().context("SIGKILL to dockerd")?;
        child.wait()?;
        bail!("dockerd did not exit within 30 s of SIGTERM")
    }

    /// Whether `GET /_ping` on its socket answers 200.
    fn answers(&self) -> bool {
        let Ok(mut stream) = std::os::unix::net::UnixStream::connect(self.socket()) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream
            .write_all(b"GET /_ping HTTP/1.0\r\nHost: engine\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200")
    }

    /// The Debian client, matching the engine (another docker on PATH may be far newer), on
    /// this engine.
    fn cli(&self) -> Command {
        let client = Path::new("/usr/bin/docker");
        let mut c = Command::new(if client.exists() {
            client
        } else {
            Path::new("docker")
        });
        c.arg("-H").arg(self.host());
        c
    }

    /// Runs the client with `args` and returns its stdout.
    fn output(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .cli()
            .args(args)
            .output()
            .with_context(|| format!("running docker {args:?}"))?;
        if !out.status.success() {
            bail!(
                "docker {:?} failed with {}: {}",
                args.first(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        if self.stop().is_ok() {
            // The containers' layers; the log stays with the run's.
            let _ = std::fs::remove_dir_all(self.dir.join("data"));
        }
    }
}

/// The Docker backend of a run.
pub(in crate::chaos) struct DockerBackend {
    engine: Arc<Mutex<Dockerd>>,
    config: PathBuf,
    mission: PathBuf,
    /// The mission of the routines under overlap `replace`.
    replaced: PathBuf,
    /// The authorization plugin refusing stops (`--refuse-stops`).
    authz: Option<super::authz::AuthzPlugin>,
}

/// The task of the missions of routines under overlap `replace`: `docker inspect` finds their
/// containers by it (`CM_TASK`).
const REPLACED_TASK: &str = "chaos replace";

impl DockerBackend {
    /// Starts the run's engine under `dir/docker` and imports the missions' image.
    pub fn start(dir: &Path, refuse_stops: bool) -> anyhow::Result<Self> {
        let dir = dir.join("docker");
        std::fs::create_dir_all(&dir)?;
        let authz = match refuse_stops {
            true => Some(super::authz::AuthzPlugin::start()?),
            false => None,
        };
        let mut engine = Dockerd {
            dir: dir.clone(),
            child: None,
            starts: 0,
            authz: authz.as_ref().map(|_| super::authz::name()),
        };
        let took = engine.start()?;
        // The script finds the engine answering and only imports the image.
        let script = crate::workspace_root().join(".ci/dockerd");
        let imported = Command::new(&script)
            .env("CM_DOCKERD_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !imported.success() {
            bail!("{} could not import {IMAGE}", script.display());
        }
        eprintln!(
            "chaos: dockerd at {} answered in {took:.1?}, image {IMAGE}",
            engine.host()
        );
        let config = dir.join("mission-config.json");
        std::fs::write(&config, MISSION_CONFIG)?;
        let mission = dir.join("mission.json");
        std::fs::write(
            &mission,
            r#"{"repository": "https://git.example.com/chaos/repo.git", "task": "chaos"}"#,
        )?;
        let replaced = dir.join("replaced.json");
        std::fs::write(
            &replaced,
            format!(
                r#"{{"repository": "https://git.example.com/chaos/repo.git", "task": "{REPLACED_TASK}"}}"#
            ),
        )?;
        Ok(DockerBackend {
            engine: Arc::new(Mutex::new(engine)),
            config,
            mission,
            replaced,
            authz,
        })
    }

    /// The engine, for the dockerd fault.
    pub fn engine(&self) -> Arc<Mutex<Dockerd>> {
        self.engine.clone()
    }

    fn host(&self) -> String {
        self.engine.lock().unwrap_or_else(|e| e.into_inner()).host()
    }

    /// The mission backend's flags. A dispatch may last 6 s, so a dispatch that meets the
    /// engine's restart retries through it; the lease is longer than the dispatch, as `run`
    /// requires.
    pub fn scheduler_args(&self) -> Vec<String> {
        [
            "--mission-backend",
            "docker",
            "--mission-image",
            IMAGE,
            "--mission-config",
            &self.config.display().to_string(),
            "--lease",
            "8s",
            "--dispatch-timeout",
            "6s",
        ]
        .map(String::from)
        .to_vec()
    }

    /// `DOCKER_HOST` for every scheduler.
    pub fn scheduler_env(&self) -> Vec<(String, String)> {
        vec![("DOCKER_HOST".to_string(), self.host())]
    }

    /// What makes routine `i` a mission routine: under overlap `allow` (every occurrence of it
    /// owed a container) when `i % 3 == 0`, else under `replace`.
    pub fn routine_args(&self, i: usize) -> Vec<String> {
        let (mission, overlap) = match i % 3 {
            0 => (&self.mission, "allow"),
            _ => (&self.replaced, "replace"),
        };
        vec![
            "--mission".to_string(),
            mission.display().to_string(),
            "--overlap".to_string(),
            overlap.to_string(),
        ]
    }

    /// Reads every container of the engine back and checks them against the ledger's rows.
    pub fn check(&self, rows: &[FireRow]) -> anyhow::Result<Findings> {
        let engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        let containers = read_containers(&engine)?;
        let mut findings =
            check_containers(rows, &containers).findings(&engine.host(), engine.starts);
        let overlaps = overlapping_runs(&containers);
        let skipped = rows.iter().filter(|r| r.status == "skipped").count();
        let refused = self.authz.as_ref().map_or(0, |a| {
            a.verdicts
                .refused
                .load(std::sync::atomic::Ordering::Relaxed)
        });
        findings.line(
            "overlap replace",
            format!(
                "{} containers of replace routines, {} times two of one routine running at once; {skipped} occurrences skipped, {refused} stops refused by the engine",
                containers.iter().filter(|c| c.replaced).count(),
                overlaps.len()
            ),
        );
        findings.require(!overlaps.is_empty(), || {
            format!(
                "docker: two containers of one replace routine ran at once: {}",
                overlaps.join("; ")
            )
        });
        Ok(findings)
    }
}

/// One container cm launched, as the engine reports it.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::chaos) struct Container {
    pub name: String,
    pub routine_id: Option<Uuid>,
    pub scheduled_at: Option<DateTime<Utc>>,
    /// The attempt that created it (`cm.attempt`).
    pub attempt: Option<i32>,
    /// `created`, `running`, `exited`...
    pub state: String,
    pub created: Option<DateTime<Utc>>,
    /// `None` if it never started.
    pub started: Option<DateTime<Utc>>,
    /// `None` while it runs (or if it never started).
    pub finished: Option<DateTime<Utc>>,
    /// Whether it is a mission of a routine under overlap `replace`.
    pub replaced: bool,
}

/// The containers of routines under `replace` that started before the one before them (of the
/// same routine) finished, as `A overlaps B`.
pub(in crate::chaos) fn overlapping_runs(containers: &[Container]) -> Vec<String> {
    let mut by_routine: HashMap<Option<Uuid>, Vec<&Container>> = HashMap::new();
    for c in containers
        .iter()
        .filter(|c| c.replaced && c.started.is_some())
    {
        by_routine.entry(c.routine_id).or_default().push(c);
    }
    let mut overlaps = Vec::new();
    for runs in by_routine.values_mut() {
        runs.sort_by_key(|c| c.started);
        for pair in runs.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let ended_first = before.finished.is_some_and(|f| Some(f) <= after.started);
            if !ended_first {
                overlaps.push(format!("{} overlaps {}", after.name, before.name));
            }
        }
    }
    overlaps
}

/// Every container carrying a `cm.routine-id` label, inspected in batches.
fn read_containers(engine: &Dockerd) -> anyhow::Result<Vec<Container>> {
    let ids = engine.output(&[
        "ps",
        "-a",
        "-q",
        "--no-trunc",
        "--filter",
        "label=cm.routine-id",
    ])?;
    let ids: Vec<&str> = ids.split_whitespace().collect();
    let format = "{{.Name}}\t{{index .Config.Labels \"cm.routine-id\"}}\t{{index .Config.Labels \"cm.scheduled-at\"}}\t{{index .Config.Labels \"cm.attempt\"}}\t{{.State.Status}}\t{{.Created}}\t{{.State.StartedAt}}\t{{.State.FinishedAt}}\t{{range .Config.Env}}{{if eq . \"CM_TASK=chaos replace\"}}replace{{end}}{{end}}";
    let mut out = Vec::with_capacity(ids.len());
    for batch in ids.chunks(200) {
        let mut args = vec!["inspect", "--format", format];
        args.extend_from_slice(batch);
        for line in engine.output(&args)?.lines() {
            out.push(parse_inspected(line)?);
        }
    }
    Ok(out)
}

/// One line of [`read_containers`]' format.
fn parse_inspected(line: &str) -> anyhow::Result<Container> {
    let f: Vec<&str> = line.split('\t').collect();
    let [
        name,
        routine,
        at,
        attempt,
        state,
        created,
        started,
        finished,
        replaced,
    ] = f[..]
    else {
        bail!("docker inspect printed {line:?}");
    };
    let time = |t: &str| {
        t.parse::<DateTime<Utc>>()
            .ok()
            .filter(|t| t.timestamp() > 0)
    };
    Ok(Container {
        name: name.trim_start_matches('/').to_string(),
        routine_id: routine.parse().ok(),
        scheduled_at: time(at),
        attempt: attempt.parse().ok(),
        state: state.to_string(),
        created: time(created),
        started: time(started),
        finished: time(finished),
        replaced: replaced == "replace",
    })
}

/// What the engine holds, against the ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub(in crate::chaos) struct ContainerCheck {
    pub containers: usize,
    pub fired: usize,
    /// Fired rows with no container of their name.
    pub fired_without_container: usize,
    /// Containers whose name is no fired row's key: of a failed row, or of none.
    pub of_failed_rows: usize,
    pub without_row: usize,
    /// Containers past the first for one (routine, time) label pair.
    pub second_by_label: usize,
    /// Containers whose labels do not name the occurrence their name does.
    pub mislabelled: usize,
    /// Created, never started.
    pub never_started: usize,
    /// Finished by a later attempt than the creator's: started late (the creator killed between
    /// create and start), or at once (killed after the start, before the settle).
    pub finished_between_create_and_start: usize,
    pub finished_after_start: usize,
    pub failed: usize,
    pub examples: Vec<String>,
}

pub(in crate::chaos) fn check_containers(
    rows: &[FireRow],
    containers: &[Container],
) -> ContainerCheck {
    let mut check = ContainerCheck {
        containers: containers.len(),
        ..ContainerCheck::default()
    };
    let note = |check: &mut ContainerCheck, what: String| {
        if check.examples.len() < 10 {
            check.examples.push(what);
        }
    };
    let rows_by_key: HashMap<String, &FireRow> = rows.iter().map(|r| (r.key(), r)).collect();
    let by_name: HashMap<&str, &Container> =
        containers.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut by_label: HashMap<(Option<Uuid>, Option<DateTime<Utc>>), usize> = HashMap::new();
    for c in containers {
        *by_label.entry((c.routine_id, c.scheduled_at)).or_default() += 1;
        if c.started.is_none() || c.state == "created" {
            check.never_started += 1;
            note(
                &mut check,
                format!("{} was created but never started", c.name),
            );
        }
        let Some(row) = rows_by_key.get(&c.name) else {
            check.without_row += 1;
            note(&mut check, format!("{} has no ledger row", c.name));
            continue;
        };
        if c.routine_id != Some(row.routine_id) || c.scheduled_at != Some(row.scheduled_at) {
            check.mislabelled += 1;
            note(
                &mut check,
                format!(
                    "{} is labelled {:?} {:?}",
                    c.name, c.routine_id, c.scheduled_at
                ),
            );
        }
        if row.status != "fired" {
            check.of_failed_rows += 1;
            note(
                &mut check,
                format!("{} is {} but has a container", c.name, row.status),
            );
        }
        if c.attempt.is_some_and(|a| a < row.attempt) {
            let late = match (c.created, c.started) {
                (Some(created), Some(started)) => (started - created)
                    .to_std()
                    .is_ok_and(|gap| gap > LATE_START),
                _ => false,
            };
            if late {
                check.finished_between_create_and_start += 1;
            } else {
                check.finished_after_start += 1;
            }
        }
    }
    check.second_by_label = by_label.values().map(|n| n - 1).sum();
    for row in rows {
        match row.status.as_str() {
            "fired" => {
                check.fired += 1;
                if !by_name.contains_key(row.key().as_str()) {
                    check.fired_without_container += 1;
                    note(
                        &mut check,
                        format!("{} is fired but has no container", row.key()),
                    );
                }
            }
            "failed" => check.failed += 1,
            _ => {}
        }
    }
    check
}

impl ContainerCheck {
    fn findings(&self, host: &str, engine_starts: u32) -> Findings {
        let mut f = Findings::default();
        f.line(
            "missing",
            format!(
                "{} fired rows without a container of their name",
                self.fired_without_container
            ),
        );
        let doubled = self.second_by_label + self.without_row + self.of_failed_rows;
        f.line(
            "doubled",
            format!(
                "{doubled} ({} second containers for one routine and time, {} without a row, {} of failed rows)",
                self.second_by_label, self.without_row, self.of_failed_rows
            ),
        );
        f.line(
            "containers",
            format!(
                "{} on {host} (started {engine_starts} times), for {} fired rows; {} mislabelled, {} never started, {} failed rows",
                self.containers, self.fired, self.mislabelled, self.never_started, self.failed
            ),
        );
        f.line(
            "taken over",
            format!(
                "{} launches finished by a later attempt: {} started late (the creator killed between create and start), {} already started (killed after the start)",
                self.finished_between_create_and_start + self.finished_after_start,
                self.finished_between_create_and_start,
                self.finished_after_start
            ),
        );
        let examples = || self.examples.join("; ");
        f.require(self.fired_without_container > 0, || {
            format!(
                "docker: {} fired occurrences have no container ({})",
                self.fired_without_container,
                examples()
            )
        });
        f.require(doubled > 0, || {
            format!("docker: doubled: {doubled} containers ({})", examples())
        });
        f.require(self.mislabelled + self.never_started > 0, || {
            format!(
                "docker: {} mislabelled, {} never started ({})",
                self.mislabelled,
                self.never_started,
                examples()
            )
        });
        // The engine's restart fits inside one dispatch, which retries through it.
        f.require(self.failed > 0, || {
            format!("docker: {} occurrences failed", self.failed)
        });
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::ledger::tests::fire_row;

    fn row(routine: Uuid, s: i64, status: &str, attempt: i32) -> FireRow {
        FireRow {
            attempt,
            ..fire_row(routine, s, status)
        }
    }

    fn container(row: &FireRow, attempt: i32, start_after_ms: i64) -> Container {
        let created = row.scheduled_at + chrono::TimeDelta::milliseconds(30);
        Container {
            name: row.key(),
            routine_id: Some(row.routine_id),
            scheduled_at: Some(row.scheduled_at),
            attempt: Some(attempt),
            state: "exited".into(),
            created: Some(created),
            started: Some(created + chrono::TimeDelta::milliseconds(start_after_ms)),
            finished: None,
            replaced: false,
        }
    }

    #[test]
    fn runs_of_a_replace_routine_that_overlap_are_found() {
        let r = Uuid::new_v4();
        let rows: Vec<FireRow> = (0..3).map(|s| row(r, s, "fired", 1)).collect();
        let ms = chrono::TimeDelta::milliseconds;
        let mut runs: Vec<Container> = rows
            .iter()
            .map(|row| Container {
                replaced: true,
                finished: Some(row.scheduled_at + ms(900)),
                ..container(row, 1, 40)
            })
            .collect();
        assert!(overlapping_runs(&runs).is_empty());
        // The second still ran when the third started; the last may still run.
        runs[1].finished = Some(rows[2].scheduled_at + ms(500));
        runs[2].finished = None;
        assert_eq!(overlapping_runs(&runs).len(), 1);
        // Under allow, overlap is what was asked for.
        for c in &mut runs {
            c.replaced = false;
        }
        assert!(overlapping_runs(&runs).is_empty());
    }

    #[test]
    fn one_container_per_fire_passes_and_each_fault_is_found() {
        let r = Uuid::new_v4();
        let rows = vec![
            row(r, 0, "fired", 1),
            row(r, 1, "fired", 2),
            row(r, 2, "fired", 2),
        ];
        let clean = vec![
            container(&rows[0], 1, 40),
            // Created by attempt 1, started by attempt 2 after the lease.
            container(&rows[1], 1, 8000),
            // Started by attempt 1, settled by attempt 2.
            container(&rows[2], 1, 40),
        ];
        let check = check_containers(&rows, &clean);
        assert!(check.findings("h", 1).problems.is_empty(), "{check:?}");
        assert_eq!(
            (
                check.finished_between_create_and_start,
                check.finished_after_start
            ),
            (1, 1)
        );

        let mut doubled = clean.clone();
        let mut second = clean[0].clone();
        second.name = "cm-other".into();
        doubled.push(second);
        let check = check_containers(&rows, &doubled);
        assert_eq!((check.second_by_label, check.without_row), (1, 1));
        assert_eq!(check.findings("h", 1).problems.len(), 1);

        let check = check_containers(&rows, &clean[1..]);
        assert_eq!(check.fired_without_container, 1);
        assert!(check.findings("h", 1).problems[0].contains("no container"));

        let mut failed = rows.clone();
        failed[0].status = "failed".into();
        let check = check_containers(&failed, &clean);
        assert_eq!((check.of_failed_rows, check.failed), (1, 1));

        let mut created = clean.clone();
        created[0].state = "created".into();
        created[0].started = None;
        created[1].scheduled_at = None;
        let check = check_containers(&rows, &created);
        assert_eq!((check.never_started, check.mislabelled), (1, 1));
    }

    #[test]
    fn inspect_lines_are_read_back() {
        let c = parse_inspected(
            "/cm-1\t00000000-0000-0000-0000-000000000007\t2026-03-29T01:30:00Z\t2\texited\t2026-03-29T01:30:00.1234Z\t0001-01-01T00:00:00Z\t0001-01-01T00:00:00Z\treplace",
        )
        .unwrap();
        assert!(c.replaced && c.finished.is_none());
        assert_eq!(c.name, "cm-1");
        assert_eq!(c.attempt, Some(2));
        assert!(c.routine_id.is_some() && c.scheduled_at.is_some() && c.created.is_some());
        assert_eq!(c.started, None, "the zero time is never started");
        assert!(parse_inspected("cm-1\tonly").is_err());
    }
}
