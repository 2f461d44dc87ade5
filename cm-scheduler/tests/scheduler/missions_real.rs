//! Missions through the binary against a real Docker engine: `cm-scheduler run
//! --mission-backend docker` on the engine `CM_TEST_DOCKER_HOST` names (the private dockerd
//! `.ci/dockerd` starts), running the busybox image that script imports with network `none`.
//! What the engine did is read back from it (`docker ps` and `docker inspect` by the
//! `cm.routine-id` label), what cm settled from `fires --json`.
//!
//! The tests are ignored unless asked for (`cargo xtask test` runs them where
//! `CM_TEST_DOCKER_HOST` is set); asked for, an engine that does not answer fails them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::cli::{MissionFiles, create_args, created_id, ok};
use crate::support::{TestDb, cm_scheduler, eventually_within, wait_until_blocking};

/// The image `.ci/dockerd` imports.
const IMAGE: &str = "cm-test-busybox:1";

/// What every mission runs under `sh -c`: two lines of output (one on stderr, one carrying a
/// password in a URL), a sleep of `$NAP` seconds, then exit `$CODE`.
pub(crate) const SCRIPT: &str = r#"echo "checking out with https://bot:hunter2secret@git.example.com/r.git"; echo "the report will exit ${CODE:-0}" >&2; sleep "${NAP:-0}"; exit "${CODE:-0}""#;

/// The operator's settings: [`SCRIPT`]; a stop waits one second before it kills (`sh` as PID 1
/// ignores SIGTERM).
fn config() -> String {
    serde_json::json!({
        "command": ["sh", "-c", SCRIPT],
        "env_allow": ["NAP", "CODE"],
        "docker": {"network": "none", "stop_grace_seconds": 1},
    })
    .to_string()
}

/// The engine's address. These tests are ignored unless asked for (`cargo xtask test` asks
/// where `CM_TEST_DOCKER_HOST` is set), so one that runs without an engine fails, saying what to
/// start.
fn engine() -> String {
    let host = std::env::var("CM_TEST_DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///tmp/cm-dockerd/docker.sock".into());
    let answer = docker(&host)
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .expect("running the docker client");
    assert!(
        answer.status.success(),
        "the Docker engine at {host} does not answer (start it with .ci/dockerd and set \
         CM_TEST_DOCKER_HOST): {}",
        String::from_utf8_lossy(&answer.stderr)
    );
    host
}

/// The Debian client, matching its engine, on `host`.
fn docker(host: &str) -> Command {
    let debian = Path::new("/usr/bin/docker");
    let mut c = Command::new(if debian.exists() {
        debian
    } else {
        Path::new("docker")
    });
    c.arg("-H").arg(host);
    c
}

/// One container cm launched, as the engine reports it.
#[derive(Debug, Clone)]
struct Container {
    name: String,
    started: DateTime<Utc>,
    /// `None` while it runs.
    finished: Option<DateTime<Utc>>,
    exit_code: i64,
}

impl Container {
    fn end(&self) -> DateTime<Utc> {
        self.finished.unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// The containers of `routine`, in the order they started.
fn containers(host: &str, routine: Uuid) -> Vec<Container> {
    let ids = docker(host)
        .args(["ps", "-a", "-q", "--filter"])
        .arg(format!("label=cm.routine-id={routine}"))
        .output()
        .expect("docker ps");
    let ids = String::from_utf8_lossy(&ids.stdout).into_owned();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let out = docker(host)
        .args([
            "inspect",
            "--format",
            "{{.Name}}\t{{.State.StartedAt}}\t{{.State.FinishedAt}}\t{{.State.ExitCode}}",
        ])
        .args(&ids)
        .output()
        .expect("docker inspect");
    let time = |t: &str| {
        t.parse::<DateTime<Utc>>()
            .ok()
            .filter(|t| t.timestamp() > 0)
    };
    let mut list: Vec<Container> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            Some(Container {
                name: f.first()?.trim_start_matches('/').to_owned(),
                started: time(f.get(1)?)?,
                finished: time(f.get(2)?),
                exit_code: f.get(3)?.parse().ok()?,
            })
        })
        .collect();
    list.sort_by_key(|c| c.started);
    list
}

/// Removes the containers of the routines a test made, whatever happened.
struct Cleanup {
    host: String,
    routines: Vec<Uuid>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for routine in &self.routines {
            let ids = docker(&self.host)
                .args(["ps", "-a", "-q", "--filter"])
                .arg(format!("label=cm.routine-id={routine}"))
                .output();
            if let Ok(ids) = ids {
                let ids = String::from_utf8_lossy(&ids.stdout).into_owned();
                if !ids.trim().is_empty() {
                    let _ = docker(&self.host)
                        .args(["rm", "-f"])
                        .args(ids.split_whitespace())
                        .stdout(Stdio::null())
                        .status();
                }
            }
        }
    }
}

/// A `cm-scheduler run` on the real engine, killed when dropped.
struct Run {
    child: Child,
    log: PathBuf,
}

impl Run {
    fn start(db: &TestDb, host: &str, files: &MissionFiles, extra: &[&str]) -> Run {
        let config = files.write("config.json", &config());
        let log =
            std::env::temp_dir().join(format!("{}-real-{}.log", db.name, Uuid::new_v4().simple()));
        let file = std::fs::File::create(&log).unwrap();
        let child = cm_scheduler()
            .args(["--database-url", &db.url, "run", "--tick-interval", "200ms"])
            .args(["--mission-backend", "docker", "--mission-image", IMAGE])
            .args(["--mission-config", &config])
            .args(extra)
            .env("DOCKER_HOST", host)
            .env("RUST_LOG", "info,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting cm-scheduler run");
        Run { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A mission routine `name` on `schedule` whose missions sleep `nap` s and exit `code`.
pub(crate) fn routine(
    db: &TestDb,
    files: &MissionFiles,
    name: &str,
    schedule: &str,
    nap: u32,
    code: u32,
    overlap: &str,
) -> Uuid {
    let mission = files.write(
        &format!("{name}.json"),
        &format!(
            r#"{{"repository": "https://git.example.com/team/repo.git", "task": "report",
                "env": {{"NAP": "{nap}", "CODE": "{code}"}}}}"#
        ),
    );
    created_id(&ok(
        &db.url,
        &create_args(
            name,
            schedule,
            &[
                "--mission",
                &mission,
                "--overlap",
                overlap,
                "--mission-env-allow",
                "NAP,CODE",
            ],
        ),
    ))
}

/// `fires --json` of `routine`, oldest first.
pub(crate) fn fires(db: &TestDb, routine: Uuid) -> Vec<serde_json::Value> {
    let mut list: Vec<serde_json::Value> = ok(
        &db.url,
        &["fires", "--routine", &routine.to_string(), "--json"],
    )
    .lines()
    .filter_map(|line| serde_json::from_str(line).ok())
    .filter(|v: &serde_json::Value| v.get("scheduled_at").is_some())
    .collect();
    list.sort_by_key(|f| f["scheduled_at"].as_str().unwrap_or_default().to_owned());
    list
}

/// How many of `routine`'s fires are `fired`.
fn fired_count(db: &TestDb, routine: Uuid) -> usize {
    fires(db, routine)
        .iter()
        .filter(|f| f["status"] == "fired")
        .count()
}

fn at(fire: &serde_json::Value) -> DateTime<Utc> {
    fire["scheduled_at"].as_str().unwrap().parse().unwrap()
}

/// The container name (the idempotency key) of `routine`'s fire.
fn key(routine: Uuid, fire: &serde_json::Value) -> String {
    cm_domain::Occurrence::new(routine, at(fire))
        .idempotency_key()
        .to_string()
}

/// Every 5 s, each mission sleeping 12 s: `forbid` launches one container per 15 s and skips
/// the two occurrences between, naming the running fire; `replace` stops the running container
/// before it launches the next, so no two ever run at once; `allow` runs them side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn overlap_policies_on_the_real_engine() {
    let host = engine();
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let every5 = "*/5 * * * * *";
    let forbid = routine(&db, &files, "forbid", every5, 12, 0, "forbid");
    let replace = routine(&db, &files, "replace", every5, 12, 0, "replace");
    let allow = routine(&db, &files, "allow", every5, 12, 0, "allow");
    let _cleanup = Cleanup {
        host: host.clone(),
        routines: vec![forbid, replace, allow],
    };
    let run = Run::start(
        &db,
        &host,
        &files,
        &["--lease", "30s", "--dispatch-timeout", "10s"],
    );

    // Six occurrences of forbid settled: launch, skip, skip, launch, skip, skip.
    let settled = eventually_within(Duration::from_secs(60), async || {
        let list = fires(&db, forbid);
        (list.iter().filter(|f| f["status"] != "claimed").count() >= 6).then_some(())
    })
    .await;
    for id in [forbid, replace, allow] {
        ok(&db.url, &["routine", "pause", &id.to_string()]);
    }
    assert!(
        settled.is_some(),
        "forbid: {:?}\n{}",
        fires(&db, forbid),
        run.log()
    );
    // A launch under way when its routine was paused has its container before its row is
    // settled: count containers only once no row of the three is left claimed.
    let quiet = eventually_within(Duration::from_secs(30), async || {
        [forbid, replace, allow]
            .iter()
            .all(|&id| fires(&db, id).iter().all(|f| f["status"] != "claimed"))
            .then_some(())
    })
    .await;
    assert!(
        quiet.is_some(),
        "rows left claimed after the pause\n{}",
        run.log()
    );

    let list = fires(&db, forbid);
    let launched: Vec<&serde_json::Value> =
        list.iter().filter(|f| f["status"] == "fired").collect();
    let on_engine = containers(&host, forbid);
    assert_eq!(launched.len(), on_engine.len(), "{list:?} {on_engine:?}");
    assert!(launched.len() >= 2, "{list:?}");
    // A run takes 12 s from its start: the next launch is three occurrences later, or more
    // when the engine was slow to start the container (the run still running at 15 s).
    for pair in launched.windows(2) {
        let gap = (at(pair[1]) - at(pair[0])).num_seconds();
        assert!(
            gap >= 15 && gap % 5 == 0,
            "one launch per window of 15 s or more: {list:?}"
        );
    }
    for fire in list.iter().filter(|f| f["status"] == "skipped") {
        let before = launched
            .iter()
            .rev()
            .find(|l| at(l) < at(fire))
            .unwrap_or_else(|| panic!("skipped before any launch: {list:?}"));
        let key = key(forbid, before);
        let reason = fire["error"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&key) && reason.contains("still running"),
            "{fire:?} should name {before:?}"
        );
        // Inside the 12 s run, and whatever the engine took to start it (well under 10 s).
        assert!((at(fire) - at(before)).num_seconds() < 25, "{list:?}");
    }
    assert_eq!(
        list.iter().filter(|f| f["status"] == "skipped").count() + launched.len(),
        list.len(),
        "{list:?}"
    );

    // replace: every occurrence launched, each container ended before the next began.
    let replaced = containers(&host, replace);
    let fired = fired_count(&db, replace);
    assert!(replaced.len() >= 4, "{replaced:?}\n{}", run.log());
    assert_eq!(replaced.len(), fired, "{replaced:?}");
    for pair in replaced.windows(2) {
        assert!(
            pair[0].end() <= pair[1].started,
            "two replace containers ran at once: {pair:?}"
        );
        assert_ne!(
            pair[0].exit_code, 0,
            "the replaced run was stopped: {pair:?}"
        );
    }

    // allow: every occurrence launched, and some ran side by side.
    let allowed = containers(&host, allow);
    let fired = fired_count(&db, allow);
    assert_eq!(allowed.len(), fired, "{allowed:?}");
    assert!(
        allowed.windows(2).any(|p| p[1].started < p[0].end()),
        "allow ran nothing at once: {allowed:?}"
    );
}

/// Waits until a run of `zero` (missions exiting 0) has `succeeded` and one of `three` (exiting 3)
/// has `failed`, pauses both, checks what `fires` shows of them (`failed (exit 3)`, no code but
/// 0 for the success) and returns the two fires.
pub(crate) async fn ended_zero_and_three(
    db: &TestDb,
    zero: Uuid,
    three: Uuid,
    log: impl Fn() -> String,
) -> (serde_json::Value, serde_json::Value) {
    let ended = async |routine: Uuid, state: &str| {
        eventually_within(Duration::from_secs(30), async || {
            fires(db, routine)
                .into_iter()
                .find(|f| f["run_state"] == state)
        })
        .await
    };
    let succeeded = ended(zero, "succeeded").await;
    let failed = ended(three, "failed").await;
    for id in [zero, three] {
        ok(&db.url, &["routine", "pause", &id.to_string()]);
    }
    let succeeded = succeeded.unwrap_or_else(|| panic!("{:?}\n{}", fires(db, zero), log()));
    let failed = failed.unwrap_or_else(|| panic!("{:?}\n{}", fires(db, three), log()));
    assert!(
        succeeded["run_exit_code"].as_i64() == Some(0),
        "{succeeded:?}"
    );
    assert_eq!(failed["run_exit_code"], 3, "{failed:?}");
    assert_eq!(failed["run_reason"], "exit code 3", "{failed:?}");
    let table = ok(&db.url, &["fires", "--routine", &three.to_string()]);
    assert!(table.contains("failed (exit 3)"), "{table}");
    (succeeded, failed)
}

/// `fires` shows what the engine said: `succeeded` for exit 0, `failed (exit 3)` for exit 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn runs_on_the_real_engine_end_succeeded_and_failed_with_their_exit_codes() {
    let host = engine();
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let zero = routine(&db, &files, "zero", "*/2 * * * * *", 0, 0, "forbid");
    let three = routine(&db, &files, "three", "*/2 * * * * *", 0, 3, "forbid");
    let _cleanup = Cleanup {
        host: host.clone(),
        routines: vec![zero, three],
    };
    let run = Run::start(&db, &host, &files, &[]);
    let (succeeded, failed) = ended_zero_and_three(&db, zero, three, || run.log()).await;
    // `succeeded` with exit code 0, as the engine says.
    let zero_key = key(zero, &succeeded);
    let engine_side = containers(&host, zero);
    assert!(
        engine_side
            .iter()
            .any(|c| c.name == zero_key && c.exit_code == 0 && c.finished.is_some()),
        "{engine_side:?}"
    );
    let table = ok(&db.url, &["fires", "--routine", &zero.to_string()]);
    assert!(table.contains("succeeded (exit 0)"), "{table}");
    // The engine agrees.
    let key = key(three, &failed);
    let engine_side = containers(&host, three);
    assert!(
        engine_side
            .iter()
            .any(|c| c.name == key && c.exit_code == 3),
        "{engine_side:?}"
    );
}

/// A dockerd of the test's own (`.ci/dockerd` under a directory of its own), so it can be
/// restarted without disturbing the engine other tests share. Stopped and removed when dropped.
struct OwnEngine {
    dir: PathBuf,
    host: String,
}

impl OwnEngine {
    fn start() -> OwnEngine {
        let dir = std::env::temp_dir().join(format!(
            "cm-dockerd-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ));
        let mut engine = OwnEngine {
            dir,
            host: String::new(),
        };
        engine.up();
        engine
    }

    /// Starts the engine (and imports the image the first time); `.ci/dockerd` waits until it
    /// answers.
    fn up(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/dockerd");
        let out = Command::new(&script)
            .env("CM_DOCKERD_DIR", &self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("running .ci/dockerd");
        assert!(
            out.status.success(),
            ".ci/dockerd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    }

    /// SIGTERM, as an operator's restart does, and waits until the process is gone.
    fn down(&self) {
        let pid = std::fs::read_to_string(self.dir.join("dockerd.pid")).unwrap_or_default();
        let pid = pid.trim();
        if pid.is_empty() {
            return;
        }
        let _ = Command::new("kill").args(["-TERM", pid]).status();
        let stat = Path::new("/proc").join(pid).join("stat");
        // Gone, or a zombie nobody reaps.
        wait_until_blocking(
            &format!("dockerd {pid} to exit after SIGTERM"),
            Duration::from_secs(30),
            || std::fs::read_to_string(&stat).ok(),
            |stat| {
                stat.as_ref()
                    .is_none_or(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
            },
        );
    }
}

impl Drop for OwnEngine {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A restart of the engine of about 2 s inside a 10 s dispatch timeout loses no occurrence and
/// fails none: the launches that meet it retry until it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn an_engine_restart_inside_the_dispatch_timeout_loses_and_fails_nothing() {
    engine();
    let mut own = OwnEngine::start();
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let every = routine(&db, &files, "every", "* * * * * *", 0, 0, "allow");
    let run = Run::start(
        &db,
        &own.host,
        &files,
        &["--lease", "30s", "--dispatch-timeout", "10s"],
    );
    let fired = |n: usize| {
        let db = &db;
        async move {
            eventually_within(Duration::from_secs(30), async || {
                (fired_count(db, every) >= n).then_some(())
            })
            .await
        }
    };
    assert!(fired(3).await.is_some(), "{}", run.log());
    let stopped = Instant::now();
    own.down();
    // The engine stays down about 2 s on purpose: the outage is what is under test.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(stopped.elapsed()));
    own.up();
    let down_for = stopped.elapsed();
    let before = fires(&db, every).len();
    assert!(fired(before + 3).await.is_some(), "{}", run.log());
    ok(&db.url, &["routine", "pause", &every.to_string()]);
    let settled = eventually_within(Duration::from_secs(30), async || {
        let list = fires(&db, every);
        list.iter()
            .all(|f| f["status"] != "claimed")
            .then_some(list)
    })
    .await
    .unwrap_or_else(|| panic!("claims left: {:?}\n{}", fires(&db, every), run.log()));

    assert!(
        down_for < Duration::from_secs(8),
        "the restart took {down_for:?}"
    );
    let failed: Vec<_> = settled.iter().filter(|f| f["status"] != "fired").collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", run.log());
    for pair in settled.windows(2) {
        assert_eq!(
            (at(&pair[1]) - at(&pair[0])).num_seconds(),
            1,
            "an occurrence is missing: {settled:?}"
        );
    }
    let on_engine = containers(&own.host, every);
    let mut names: Vec<String> = on_engine.iter().map(|c| c.name.clone()).collect();
    names.sort();
    let mut keys: Vec<String> = settled.iter().map(|f| key(every, f)).collect();
    keys.sort();
    assert_eq!(names, keys, "one container per occurrence");
    // Some launches met the engine down and waited for it, within their dispatch.
    let waited = settled.iter().any(|f| {
        let name = key(every, f);
        on_engine
            .iter()
            .any(|c| c.name == name && (c.started - at(f)).num_milliseconds() > 1000)
    });
    assert!(waited, "no launch met the restart: {on_engine:?}");
}

/// GET `path` from the scheduler's HTTP side at `addr`: the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut response = Vec::new();
    if stream.write_all(request.as_bytes()).is_err() || stream.read_to_end(&mut response).is_err() {
        return (0, String::new());
    }
    crate::support::status_and_body(&response)
}

/// The value of the counter sample `sample` (`name{labels}`) in a Prometheus text page.
fn counter(metrics: &str, sample: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == sample).then(|| value.parse().ok())?
    })
}

/// A mission whose container exits 3 on every run is failing, not healthy: auto-pause pauses it
/// after three failed runs and says the exit, `fires --status failed` lists its runs as
/// `failed (exit 3)`, `/metrics` counts them under `cm_fires_total{outcome="failed"}`, and the
/// status page shows them in its counters, its routine's last fire and its recent failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn a_mission_that_exits_3_every_run_is_failing_everywhere_and_paused() {
    let host = engine();
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let three = routine(&db, &files, "exits-three", "*/2 * * * * *", 1, 3, "forbid");
    let _cleanup = Cleanup {
        host: host.clone(),
        routines: vec![three],
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let run = Run::start(
        &db,
        &host,
        &files,
        &[
            "--listen",
            &addr,
            "--pause-after-failures",
            "3",
            "--lease",
            "10s",
            "--dispatch-timeout",
            "5s",
        ],
    );

    let reason = "paused by cm: its last 3 fires failed; the latest: exit code 3";
    let paused = eventually_within(Duration::from_secs(90), async || {
        let show = ok(&db.url, &["routine", "show", "exits-three"]);
        show.contains(reason).then_some(show)
    })
    .await;
    let paused =
        paused.unwrap_or_else(|| panic!("never paused: {:?}\n{}", fires(&db, three), run.log()));
    // The last fire is a failed run, or one launched (or skipped) as the pause came.
    let ended_or_not = ["failed (exit 3)", "running", "skipped"];
    let last = paused
        .lines()
        .find(|l| l.starts_with("last fire "))
        .unwrap_or_default();
    assert!(ended_or_not.iter().any(|w| last.contains(w)), "{paused}");
    assert!(paused.matches("failed (exit 3)").count() >= 3, "{paused}");
    let list = ok(&db.url, &["routine", "list"]);
    let row = list
        .lines()
        .find(|l| l.contains("exits-three"))
        .unwrap_or_default();
    assert!(
        ended_or_not
            .iter()
            .any(|w| row.contains(&format!("  {w}  "))),
        "{list}"
    );

    // Every run ended failed: none is listed as succeeded, at least three as failed.
    let table = ok(
        &db.url,
        &["fires", "--routine", "exits-three", "--status", "failed"],
    );
    let failed_rows = table
        .lines()
        .filter(|l| l.contains("failed (exit 3)"))
        .count();
    assert!(failed_rows >= 3, "{table}");
    let succeeded = ok(
        &db.url,
        &["fires", "--routine", "exits-three", "--status", "succeeded"],
    );
    assert_eq!(succeeded.lines().count(), 1, "only the header: {succeeded}");
    for fire in fires(&db, three) {
        if fire["run_state"] == "failed" {
            assert_eq!(fire["outcome"], "failed", "{fire:?}");
        }
    }

    let (code, metrics) = http_get(&addr, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    let counted = counter(&metrics, r#"cm_fires_total{outcome="failed"}"#).unwrap_or(0.0);
    assert!(
        counted >= 3.0,
        "cm_fires_total{{outcome=\"failed\"}} {counted}:\n{metrics}"
    );
    assert_eq!(
        counter(&metrics, r#"cm_fires_total{outcome="fired"}"#).unwrap_or(0.0),
        0.0,
        "a launched mission is counted by its run's outcome, not as fired:\n{metrics}"
    );

    let (code, page) = http_get(&addr, "/?live=off");
    assert_eq!(code, 200, "{page}");
    let figure = page
        .split("Failed here<b>")
        .nth(1)
        .and_then(|rest| rest.split("</b>").next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(
        figure.is_some_and(|n| n >= 3),
        "the Failed figure: {figure:?}"
    );
    let failures = page.split("Recent failures").nth(1).unwrap_or_default();
    assert!(
        failures.contains("exits-three") && failures.contains("failed (exit 3)"),
        "{failures}"
    );
    assert!(!failures.contains("None."), "{failures}");
    let (code, routine_page) = http_get(&addr, "/routines/exits-three?live=off");
    assert_eq!(code, 200, "{routine_page}");
    assert!(routine_page.contains("failed (exit 3)"), "{routine_page}");
    assert!(routine_page.contains(reason), "{routine_page}");

    // What the run said: its output's last lines, scrubbed, and its duration, kept with the run
    // and shown by `fires show` (by key and by ROUTINE@INSTANT) and on the routine's page.
    let failed_run = fires(&db, three)
        .into_iter()
        .rev()
        .find(|f| f["run_state"] == "failed")
        .expect("a failed run");
    let by_key = key(three, &failed_run);
    let shown = eventually_within(Duration::from_secs(20), async || {
        let out = ok(&db.url, &["fires", "show", &by_key]);
        out.contains("the report will exit 3").then_some(out)
    })
    .await
    .unwrap_or_else(|| panic!("{}", ok(&db.url, &["fires", "show", &by_key])));
    assert!(shown.contains("outcome     failed (exit 3)"), "{shown}");
    assert!(shown.contains("exit code   3"), "{shown}");
    assert!(
        shown.contains("https://bot:***@git.example.com/r.git") && !shown.contains("hunter2"),
        "the password is scrubbed: {shown}"
    );
    let duration = shown
        .lines()
        .find(|l| l.starts_with("duration "))
        .unwrap_or_default();
    assert!(duration.ends_with('s'), "{shown}");
    let instant = failed_run["scheduled_at"].as_str().unwrap().to_owned();
    let by_instant = ok(
        &db.url,
        &["fires", "show", &format!("exits-three@{instant}")],
    );
    assert!(by_instant.contains(&by_key), "{by_instant}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&db.url, &["fires", "show", &by_key, "--json"])).unwrap();
    assert!(json["run_duration_seconds"].as_f64().is_some(), "{json}");
    assert_eq!(json["fire"]["outcome"], "failed", "{json}");
    let (_, routine_page) = http_get(&addr, "/routines/exits-three?live=off");
    let last_run = routine_page.split("Last run").nth(1).unwrap_or_default();
    assert!(
        last_run.contains("the report will exit 3") && last_run.contains("Duration"),
        "{routine_page}"
    );
    assert!(!routine_page.contains("hunter2"), "{routine_page}");

    // The routine's page in a real browser, kept where CM_RUN_SCREENSHOT says (the docs'
    // picture is made so).
    if let Ok(path) = std::env::var("CM_RUN_SCREENSHOT") {
        let mut browser = crate::browser::Browser::launch(1280, 1400);
        browser.open(&format!("http://{addr}/routines/exits-three"));
        browser.wait_for("document.querySelector('#run-output')");
        std::fs::write(&path, browser.screenshot()).expect("writing the screenshot");
    }
    drop(run);
}

/// Overlap that waits, on the real engine: every 5 s, each mission sleeping 8 s. `buffer-one`
/// never runs two containers at once, and when a run ends launches the newest occurrence that
/// came due during it, the older ones recorded `skipped` naming it; the scheduler is SIGKILLed
/// while a run lasts and an occurrence waits, and the one started after it launches that
/// waiting occurrence (nothing owed was claimed, so nothing was lost). `buffer-all` launches
/// every occurrence in order, one container at a time, skipping none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn buffered_overlap_on_the_real_engine_never_overlaps_and_loses_nothing_across_a_sigkill() {
    let host = engine();
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let every5 = "*/5 * * * * *";
    let one = routine(&db, &files, "one", every5, 8, 0, "buffer-one");
    let all = routine(&db, &files, "all", every5, 8, 0, "buffer-all");
    let _cleanup = Cleanup {
        host: host.clone(),
        routines: vec![one, all],
    };
    let flags = ["--lease", "30s", "--dispatch-timeout", "10s"];
    let first = Run::start(&db, &host, &files, &flags);
    // The first container of `one` runs, and an occurrence has come due during it.
    let waiting = eventually_within(Duration::from_secs(40), async || {
        let running = containers(&host, one);
        let c = running.first().filter(|c| c.finished.is_none())?;
        (Utc::now() - c.started > chrono::TimeDelta::seconds(6)).then_some(c.clone())
    })
    .await
    .unwrap_or_else(|| panic!("no run of one: {:?}\n{}", fires(&db, one), first.log()));
    let first_log = first.log();
    drop(first); // SIGKILL
    let killed_at = Utc::now();
    let second = Run::start(&db, &host, &files, &flags);
    let enough = eventually_within(Duration::from_secs(90), async || {
        (containers(&host, one).len() >= 4 && containers(&host, all).len() >= 4).then_some(())
    })
    .await;
    for id in [one, all] {
        ok(&db.url, &["routine", "pause", &id.to_string()]);
    }
    assert!(
        enough.is_some(),
        "one {:?}\nall {:?}\n{first_log}\n{}",
        fires(&db, one),
        fires(&db, all),
        second.log()
    );
    let quiet = eventually_within(Duration::from_secs(30), async || {
        [one, all]
            .iter()
            .all(|&id| fires(&db, id).iter().all(|f| f["status"] != "claimed"))
            .then_some(())
    })
    .await;
    assert!(quiet.is_some(), "rows left claimed\n{}", second.log());

    for id in [one, all] {
        let on_engine = containers(&host, id);
        for pair in on_engine.windows(2) {
            assert!(
                pair[0].finished.is_some_and(|end| end <= pair[1].started),
                "two containers of one routine ran at once: {pair:?}"
            );
        }
        let list = fires(&db, id);
        let launched: Vec<_> = list.iter().filter(|f| f["status"] == "fired").collect();
        let mut names: Vec<String> = on_engine.iter().map(|c| c.name.clone()).collect();
        names.sort();
        let mut keys: Vec<String> = launched.iter().map(|f| key(id, f)).collect();
        keys.sort();
        assert_eq!(
            names, keys,
            "one container per launched occurrence: {list:?}"
        );
        // Every occurrence from the first to the last in the ledger is there, fired or
        // skipped: none lost.
        for pair in list.windows(2) {
            assert_eq!((at(&pair[1]) - at(&pair[0])).num_seconds(), 5, "{list:?}");
        }
    }

    // buffer-one: the occurrence waiting at the kill was launched by the second scheduler,
    // after the first run ended; the ones before it in its wait are skipped, naming it.
    let list = fires(&db, one);
    let first_launch = at(list.iter().find(|f| f["status"] == "fired").unwrap());
    let after_kill = containers(&host, one)
        .into_iter()
        .find(|c| c.started > waiting.started)
        .unwrap_or_else(|| panic!("nothing launched after the first run: {list:?}"));
    let launched = list
        .iter()
        .find(|f| key(one, f) == after_kill.name)
        .unwrap();
    assert!(after_kill.started >= killed_at);
    assert!(
        at(launched) > first_launch && at(launched) < waiting.finished.unwrap_or(Utc::now()),
        "the launch after the kill is an occurrence that came due during the first run: \
         {launched:?} {waiting:?}"
    );
    for fire in list.iter().filter(|f| f["status"] == "skipped") {
        let reason = fire["error"].as_str().unwrap_or_default();
        assert!(
            reason.contains("buffer-one launched the newest"),
            "{fire:?}"
        );
    }
    assert!(
        list.iter().any(|f| f["status"] == "skipped"),
        "a run of 8 s every 5 s leaves a skip now and then: {list:?}"
    );

    // buffer-all: nothing skipped, every occurrence launched in its turn.
    let list = fires(&db, all);
    assert!(list.iter().all(|f| f["status"] == "fired"), "{list:?}");
}

/// Three mission routines sharing a concurrency key of one place, on the real engine, under two
/// schedulers of which one is SIGKILLed once containers have started: by the engine's own
/// start and finish times no two containers of the three ever ran at once, and every
/// occurrence of the three (two each) was launched and succeeded, none skipped for the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn a_key_of_one_place_runs_one_container_at_a_time_across_a_sigkill() {
    let host = engine();
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let limited: bool = sqlx::query_scalar("SELECT cm.set_concurrency_limit('gpu', 1)")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(limited);
    let mut routines = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let mission = files.write(
            &format!("{name}.json"),
            r#"{"repository": "https://git.example.com/team/repo.git", "task": "report",
                "env": {"NAP": "1", "CODE": "0"}}"#,
        );
        let id = created_id(&ok(
            &db.url,
            &create_args(
                name,
                "*/2 * * * * *",
                &[
                    "--mission",
                    &mission,
                    "--overlap",
                    "allow",
                    "--misfire",
                    "catch-up",
                    "--limit-runs",
                    "2",
                    "--concurrency-key",
                    "gpu",
                    "--mission-env-allow",
                    "NAP,CODE",
                    "--paused",
                ],
            ),
        ));
        routines.push(id);
    }
    let _cleanup = Cleanup {
        host: host.clone(),
        routines: routines.clone(),
    };
    let flags = ["--lease", "30s", "--dispatch-timeout", "10s"];
    let first = Run::start(
        &db,
        &host,
        &files,
        &[&flags[..], &["--instance-id", "a"]].concat(),
    );
    let second = Run::start(
        &db,
        &host,
        &files,
        &[&flags[..], &["--instance-id", "b"]].concat(),
    );
    for id in &routines {
        ok(&db.url, &["routine", "resume", &id.to_string()]);
    }
    let started = eventually_within(Duration::from_secs(60), async || {
        let n: usize = routines.iter().map(|id| containers(&host, *id).len()).sum();
        (n >= 2).then_some(())
    })
    .await;
    assert!(started.is_some(), "no containers\n{}", first.log());
    let first_log = first.log();
    drop(first); // SIGKILL

    let done = eventually_within(Duration::from_secs(120), async || {
        routines
            .iter()
            .all(|&id| {
                let list = fires(&db, id);
                list.len() == 2 && list.iter().all(|f| f["run_state"] == "succeeded")
            })
            .then_some(())
    })
    .await;
    let all: Vec<_> = routines.iter().map(|&id| fires(&db, id)).collect();
    assert!(
        done.is_some(),
        "not every run succeeded: {all:?}\n{first_log}\n{}",
        second.log()
    );
    let mut on_engine: Vec<Container> = routines
        .iter()
        .flat_map(|&id| containers(&host, id))
        .collect();
    on_engine.sort_by_key(|c| c.started);
    assert_eq!(
        on_engine.len(),
        6,
        "one container per occurrence: {on_engine:?}"
    );
    for pair in on_engine.windows(2) {
        assert!(
            pair[0].finished.is_some_and(|end| end <= pair[1].started),
            "two containers of the key ran at once: {pair:?}"
        );
    }
    assert!(on_engine.iter().all(|c| c.exit_code == 0), "{on_engine:?}");
}
