//! The mission backends: the process runner for real (a small script as the program), Docker
//! against the fake Engine API; each through the mission conformance suite, then case by case.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use cm_dispatch::conformance::EffectProbe;
use cm_dispatch::fakes::docker::{FakeDocker, LogStream, StartFault};
use cm_dispatch::fakes::wait::{PATIENCE, poll};
use cm_dispatch::mission::MissionConfig;
use cm_dispatch::mission_conformance::{LaunchFaults, check_mission_backend, payload_of_task};
use cm_dispatch::{
    Dispatch, DispatchError, Dispatcher, DockerDispatcher, MAX_RUN_OUTPUT, MissionRuntime,
    ProcessDispatcher, RunRef, RunReport,
};
use cm_domain::RoutineKind;
use cm_domain::{IdempotencyKey, Occurrence, RunState};
use serde_json::{Value, json};
use uuid::Uuid;

const IMAGE: &str = "registry.example.com/cm/mission-runner:1.4";

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("cm_missions_{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The program the process runner starts: it records its launch, its task and its whole
/// environment in the work directory (its current directory).
const SCRIPT: &str = r#"
echo "$CM_IDEMPOTENCY_KEY" >> launches
printf '%s' "$CM_TASK" > "$CM_IDEMPOTENCY_KEY.task"
env > "$CM_IDEMPOTENCY_KEY.env"
"#;

fn process_runner(dir: &Path) -> ProcessDispatcher {
    let script = dir.join("mission.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    ProcessDispatcher::new("/bin/sh", vec![script.into()], dir.join("work")).unwrap()
}

/// Reads the script's records; waits for each started child to finish first (its `.exit`).
struct ProcessProbe(PathBuf);

impl ProcessProbe {
    async fn settle(&self, key: &IdempotencyKey) {
        let marker = self.0.join(format!("{key}.launched"));
        let exit = self.0.join(format!("{key}.exit"));
        // Only a marker with a pid stands for a started child. A child that never ends is
        // for the effects read next to show. (Each look owns its paths: the future stays
        // `Send` for any lifetime, as the probe's `async_trait` methods need.)
        let look = move || {
            let (marker, exit) = (marker.clone(), exit.clone());
            async move {
                let started = std::fs::read_to_string(&marker).is_ok_and(|m| m.starts_with("pid "));
                (started, exit.exists())
            }
        };
        let _ = poll(PATIENCE, look, |(started, exited)| !started || *exited).await;
    }
}

#[async_trait]
impl EffectProbe for ProcessProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        self.settle(key).await;
        let launches = std::fs::read_to_string(self.0.join("launches")).unwrap_or_default();
        Ok(launches.lines().filter(|l| *l == key.as_str()).count())
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        self.settle(key).await;
        Ok(std::fs::read_to_string(self.0.join(format!("{key}.task")))
            .ok()
            .and_then(|task| payload_of_task(&task)))
    }
    // A launched child is the whole effect: there is no target to stall or refuse, and the
    // runner's own failures (a program that cannot start) have tests of their own here.
    fn injects_faults(&self) -> bool {
        false
    }
    async fn stall(&self) -> Result<(), String> {
        Err("the process runner has no target to stall".into())
    }
    async fn fail(&self, _reason: &str) -> Result<(), String> {
        Err("the process runner has no target to refuse".into())
    }
    async fn heal(&self) -> Result<(), String> {
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        None
    }
}

pub(crate) fn mission_dispatch(payload: Value, attempt: u32) -> Dispatch {
    Dispatch::new(
        Occurrence::new(
            Uuid::new_v4(),
            Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap(),
        ),
        "nightly report",
        RoutineKind::Mission,
        payload,
        attempt,
        Instant::now() + Duration::from_secs(10),
    )
}

pub(crate) fn mission() -> Value {
    json!({ "repository": "git@git.example.com:team/repo.git", "ref": "main", "task": "report",
            "env": { "LANG": "C.UTF-8" }, "labels": { "routine/team": "platform" } })
}

#[tokio::test]
async fn process_runner_conforms() {
    let dir = TempDir::new();
    let runner = process_runner(&dir.0);
    check_mission_backend(&runner, &ProcessProbe(dir.0.join("work")), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn process_runner_gives_the_mission_its_environment_and_nothing_else() {
    let dir = TempDir::new();
    let runner = process_runner(&dir.0);
    let dispatch = mission_dispatch(mission(), 1);
    let receipt = runner.dispatch(&dispatch).await.unwrap();
    assert!(receipt.detail.starts_with("pid "), "{receipt:?}");
    let probe = ProcessProbe(dir.0.join("work"));
    assert_eq!(probe.effects(&dispatch.idempotency_key).await, Ok(1));
    let env = std::fs::read_to_string(dir.0.join(format!("work/{}.env", dispatch.idempotency_key)))
        .unwrap();
    let names: Vec<&str> = env
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    for expected in [
        "CM_ROUTINE_ID",
        "CM_ROUTINE_NAME",
        "CM_SCHEDULED_AT",
        "CM_ATTEMPT",
        "CM_IDEMPOTENCY_KEY",
        "CM_REPOSITORY",
        "CM_REF",
        "CM_TASK",
        "LANG",
        "PATH",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(env.contains("CM_ROUTINE_NAME=nightly report\n"), "{env}");
    assert!(
        env.contains("CM_REPOSITORY=git@git.example.com:team/repo.git\n"),
        "{env}"
    );
    // The scheduler's own environment (cargo sets dozens of variables for a test) stays out:
    // it may hold the database's URL and credentials.
    assert!(
        !names.iter().any(|n| n.starts_with("CARGO")),
        "the scheduler's environment leaked: {names:?}"
    );
}

#[tokio::test]
async fn process_runner_refuses_to_guess_after_a_crash_before_the_pid_was_written() {
    let dir = TempDir::new();
    let runner = process_runner(&dir.0);
    let dispatch = mission_dispatch(mission(), 2);
    // A scheduler died between creating the marker and recording the child's pid.
    std::fs::write(runner.marker_path(dispatch.idempotency_key.as_str()), "").unwrap();
    let err = runner.dispatch(&dispatch).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Rejected(text) if text.contains("not launched again")),
        "{err}"
    );
    let probe = ProcessProbe(dir.0.join("work"));
    assert_eq!(probe.effects(&dispatch.idempotency_key).await, Ok(0));
}

#[tokio::test]
async fn process_runner_that_cannot_start_its_program_leaves_no_marker() {
    let dir = TempDir::new();
    let runner =
        ProcessDispatcher::new(dir.0.join("no-such-program"), vec![], dir.0.join("work")).unwrap();
    let dispatch = mission_dispatch(mission(), 1);
    let err = runner.dispatch(&dispatch).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unavailable(text) if text.contains("no-such-program")),
        "{err}"
    );
    assert!(
        !runner
            .marker_path(dispatch.idempotency_key.as_str())
            .exists()
    );
}

/// Waits until `runtime` sees the run of `name` ended, and returns what it last saw (the
/// caller's check shows a run that never ended).
pub(crate) async fn run_ended(runtime: &dyn MissionRuntime, name: &str) -> RunState {
    let run = RunRef::named(name);
    poll(
        PATIENCE,
        async || {
            runtime
                .observe(&run, Instant::now() + Duration::from_secs(5))
                .await
                .unwrap()
        },
        RunState::is_finished,
    )
    .await
    .unwrap_or_else(|last| last)
}

/// A child's stdout and stderr both reach its report, scrubbed; a long output is its last
/// 16 KiB from a line start; the times are the spawn's and the exit's; a run with no records
/// reports nothing.
#[tokio::test]
async fn process_runner_reports_the_runs_output_tail_and_times() {
    let dir = TempDir::new();
    let script = dir.0.join("noisy.sh");
    std::fs::write(
        &script,
        r#"echo one
echo "two password=hunter2" >&2
if [ "$CM_TASK" = long ]; then
  i=0
  while [ $i -lt 30000 ]; do echo "line $i of a long mission's output"; i=$((i+1)); done
  echo last
fi
exit 3
"#,
    )
    .unwrap();
    let runner =
        ProcessDispatcher::new("/bin/sh", vec![script.into()], dir.0.join("work")).unwrap();
    let task =
        |task: &str| json!({ "repository": "https://git.example.com/team/repo.git", "task": task });
    let deadline = || Instant::now() + Duration::from_secs(5);

    let before = Utc::now();
    let short = mission_dispatch(task("short"), 1);
    runner.dispatch(&short).await.unwrap();
    let name = short.idempotency_key.to_string();
    assert_eq!(run_ended(&runner, &name).await.exit_code(), Some(3));
    let report = runner
        .report(&RunRef::named(name.clone()), deadline())
        .await
        .unwrap();
    assert_eq!(report.output.as_deref(), Some("one\ntwo password=***\n"));
    let (started, finished) = (report.started_at.unwrap(), report.finished_at.unwrap());
    assert!(
        before <= started && started <= finished && finished <= Utc::now(),
        "{report:?}"
    );

    let long = mission_dispatch(task("long"), 1);
    runner.dispatch(&long).await.unwrap();
    let name = long.idempotency_key.to_string();
    assert_eq!(run_ended(&runner, &name).await.exit_code(), Some(3));
    let log = std::fs::read_to_string(dir.0.join(format!("work/{name}.log"))).unwrap();
    assert!(log.len() > 20 * MAX_RUN_OUTPUT, "{}", log.len());
    let output = runner
        .report(&RunRef::named(name), deadline())
        .await
        .unwrap()
        .output
        .unwrap();
    assert!(output.len() <= MAX_RUN_OUTPUT, "{}", output.len());
    assert!(output.len() > MAX_RUN_OUTPUT - 100, "{}", output.len());
    assert!(output.starts_with("line "), "{}", &output[..40]);
    assert!(output.ends_with("line 29999 of a long mission's output\nlast\n"));
    assert!(log.ends_with(&output));

    // A run this work directory has no record of.
    let unknown = runner
        .report(&RunRef::named("cm-never-launched"), deadline())
        .await
        .unwrap();
    assert_eq!(unknown, RunReport::default());
}

/// A stop sends SIGTERM to the run's group; the wrapper outlives it and records the end
/// (`128 + 15`, as Docker reports a signal's death). A marker whose pid is now another
/// process's (the start tick differs) is not taken for a running run: it is lost, and a stop
/// signals nothing.
#[tokio::test]
async fn process_runner_stops_a_run_and_never_mistakes_a_reused_pid_for_it() {
    let dir = TempDir::new();
    let script = dir.0.join("sleepy.sh");
    std::fs::write(&script, "sleep 30\n").unwrap();
    let runner =
        ProcessDispatcher::new("/bin/sh", vec![script.into()], dir.0.join("work")).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(5);
    let dispatch = mission_dispatch(mission(), 1);
    runner.dispatch(&dispatch).await.unwrap();
    let run = RunRef::named(dispatch.idempotency_key.to_string());
    assert_eq!(
        runner.observe(&run, deadline()).await.unwrap(),
        RunState::Running
    );
    runner.stop(&run, deadline()).await.unwrap();
    let ended = run_ended(&runner, &run.name).await;
    assert_eq!(ended.exit_code(), Some(143), "{ended:?}");

    // A marker naming a live process (this test's) with another start tick.
    let stale = mission_dispatch(mission(), 1);
    let marker = runner.marker_path(stale.idempotency_key.as_str());
    std::fs::write(
        &marker,
        format!(
            "pid {}\nstarted_at 2026-03-29T01:00:00.000000Z\nstart_tick 1\n",
            std::process::id()
        ),
    )
    .unwrap();
    let stale = RunRef::named(stale.idempotency_key.to_string());
    let state = runner.observe(&stale, deadline()).await.unwrap();
    assert!(matches!(state, RunState::Lost { .. }), "{state:?}");
    // Still here: the stop sent this process nothing.
    runner.stop(&stale, deadline()).await.unwrap();
}

/// A routine stored around the mission rules (written before them, or straight into the table)
/// whose `env` would steer the runner: `BASH_ENV` makes a bash program run a command first,
/// `PATH` would pick another program. The process runner refuses it with the reason and starts
/// nothing; a program named without a path is the one on the scheduler's own `PATH`.
#[tokio::test]
async fn process_runner_refuses_an_env_that_would_steer_it() {
    let dir = TempDir::new();
    let script = dir.0.join("mission.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let evil = dir.0.join("evil");
    std::fs::create_dir_all(&evil).unwrap();
    let pwned = dir.0.join("pwned");
    let evil_bash = evil.join("bash");
    std::fs::write(
        &evil_bash,
        format!("#!/bin/sh\ntouch {}\n", pwned.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&evil_bash, std::fs::Permissions::from_mode(0o755)).unwrap();
    // `bash` by name: resolved now, on this process's PATH.
    let runner = ProcessDispatcher::new("bash", vec![script.into()], dir.0.join("work")).unwrap();
    assert!(runner.program().is_absolute(), "{:?}", runner.program());
    assert!(!runner.program().starts_with(&evil));
    for (name, value) in [
        ("BASH_ENV", format!("$(touch {})", pwned.display())),
        ("PATH", evil.display().to_string()),
        ("LD_PRELOAD", dir.0.join("evil.so").display().to_string()),
        ("GIT_SSH_COMMAND", format!("touch {}", pwned.display())),
    ] {
        let payload = json!({"repository": "https://git.example.com/team/repo.git",
                             "task": "lint", "env": {name: value}});
        let dispatch = mission_dispatch(payload, 1);
        let err = runner.dispatch(&dispatch).await.unwrap_err();
        assert!(
            matches!(&err, DispatchError::Rejected(text) if text.contains(&format!("env.{name}"))),
            "{name}: {err}"
        );
        assert!(
            !runner
                .marker_path(dispatch.idempotency_key.as_str())
                .exists(),
            "{name}: a marker means a launch was attempted"
        );
    }
    // A mission the rules allow runs the resolved program, with the scheduler's PATH.
    let dispatch = mission_dispatch(mission(), 1);
    runner.dispatch(&dispatch).await.unwrap();
    let probe = ProcessProbe(dir.0.join("work"));
    assert_eq!(probe.effects(&dispatch.idempotency_key).await, Ok(1));
    let env = std::fs::read_to_string(
        dir.0
            .join("work")
            .join(format!("{}.env", dispatch.idempotency_key)),
    )
    .unwrap();
    let path_line = format!("PATH={}", std::env::var("PATH").unwrap());
    assert!(env.lines().any(|l| l == path_line), "{env}");
    assert!(!pwned.exists(), "a steered runner ran a command");
}

#[tokio::test]
async fn mission_backends_reject_an_invalid_mission_without_launching() {
    let dir = TempDir::new();
    let runner = process_runner(&dir.0);
    let docker_fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&docker_fake, MissionConfig::default());
    for payload in [
        json!({ "repository": "file:///etc/passwd", "task": "x" }),
        json!({ "repository": "https://h.example/r", "task": "x", "env": { "CM_TASK": "y" } }),
        json!({ "text": "a message payload" }),
    ] {
        let dispatch = mission_dispatch(payload, 1);
        for backend in [&runner as &dyn Dispatcher, &docker] {
            let err = backend.dispatch(&dispatch).await.unwrap_err();
            assert!(matches!(err, DispatchError::Rejected(_)), "{err}");
        }
        assert!(
            !runner
                .marker_path(dispatch.idempotency_key.as_str())
                .exists()
        );
    }
    assert_eq!(docker_fake.calls(), vec![], "nothing reached the engine");
}

/// Resolves every name to the scheduler's own host, as `localtest.me` or `*.nip.io` do.
#[derive(Debug)]
struct EverythingIsLoopback;

#[async_trait]
impl cm_dispatch::mission::HostResolver for EverythingIsLoopback {
    async fn resolve(&self, _: &str) -> std::io::Result<Vec<std::net::IpAddr>> {
        Ok(vec![std::net::Ipv4Addr::LOCALHOST.into()])
    }
}

/// A repository whose name resolves to the scheduler's host passes the file's check and is
/// refused by every mission backend at dispatch: nothing launched, nothing sent to the
/// engine; a host the operator's `repository_hosts` names launches.
#[tokio::test]
async fn a_repository_name_resolving_to_loopback_launches_nothing() {
    let dir = TempDir::new();
    let resolver: Arc<dyn cm_dispatch::mission::HostResolver> = Arc::new(EverythingIsLoopback);
    let runner = process_runner(&dir.0).with_resolver(resolver.clone());
    let docker_fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&docker_fake, MissionConfig::default()).with_resolver(resolver);
    let dispatch = mission_dispatch(
        json!({ "repository": "ssh://git@localtest.me:5432/r.git", "task": "x" }),
        1,
    );
    for backend in [&runner as &dyn Dispatcher, &docker] {
        let err = backend.dispatch(&dispatch).await.unwrap_err();
        assert!(
            matches!(&err, DispatchError::Rejected(text)
                if text.contains("localtest.me resolves to 127.0.0.1, a loopback address")),
            "{err}"
        );
    }
    assert!(
        !runner
            .marker_path(dispatch.idempotency_key.as_str())
            .exists()
    );
    assert_eq!(docker_fake.calls(), vec![], "nothing reached the engine");

    let named =
        cm_domain::MissionPolicy::new(None, None, Some(vec!["localtest.me".into()])).unwrap();
    let runner = runner.with_policy(named);
    runner.dispatch(&dispatch).await.unwrap();
    let probe = ProcessProbe(dir.0.join("work"));
    assert_eq!(probe.effects(&dispatch.idempotency_key).await, Ok(1));
}

fn docker_backend(fake: &FakeDocker, config: MissionConfig) -> DockerDispatcher {
    DockerDispatcher::connect(&fake.host(), IMAGE.to_owned(), config).unwrap()
}

/// Counts started containers of a key in the fake engine.
struct DockerProbe(Arc<FakeDocker>);

#[async_trait]
impl EffectProbe for DockerProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        Ok(self.0.container(key.as_str()).map_or(0, |c| c.starts))
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        Ok(self
            .0
            .container(key.as_str())
            .and_then(|c| c.env_var("CM_TASK").and_then(payload_of_task)))
    }
    /// The next start never answers (the container stays created, never started).
    async fn stall(&self) -> Result<(), String> {
        self.0.fault_next_start(StartFault::StallBeforeStart);
        Ok(())
    }
    /// The next start is refused with `reason`.
    async fn fail(&self, reason: &str) -> Result<(), String> {
        self.0
            .fault_next_start(StartFault::Refuse(reason.to_owned()));
        Ok(())
    }
    /// Faults are spent by the start they hit; nothing is left to clear.
    async fn heal(&self) -> Result<(), String> {
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        None
    }
}

impl LaunchFaults for DockerProbe {
    /// The start never answers: the dispatch ends at its deadline with the container created,
    /// as a scheduler killed between create and start leaves it. (A start the engine answers
    /// with an error is tried again, or, refused, removes the container.)
    fn crash_after_create(&self) {
        self.0.fault_next_start(StartFault::StallBeforeStart);
    }
}

#[tokio::test]
async fn docker_backend_conforms() {
    let fake = Arc::new(FakeDocker::start(&[IMAGE]));
    let docker = docker_backend(&fake, MissionConfig::default());
    let probe = DockerProbe(fake.clone());
    check_mission_backend(&docker, &probe, Some(&probe))
        .await
        .unwrap();
    // Every container of the suite was created once.
    let containers = fake.containers();
    assert!(containers.len() >= 4, "{containers:?}");
    // None was started twice; the stalled and the refused one were never started.
    assert!(containers.iter().all(|c| c.starts <= 1), "{containers:?}");
}

#[tokio::test]
async fn docker_containers_are_the_operators_and_carry_the_missions_environment() {
    let fake = FakeDocker::start(&[IMAGE]);
    let config = MissionConfig::from_json(
        r#"{"command": ["/usr/local/bin/run-mission", "--verbose"], "user": "1000:1000",
            "docker": {"network": "missions", "memory_bytes": 2147483648, "nano_cpus": 1500000000}}"#,
    )
    .unwrap();
    let docker = docker_backend(&fake, config);
    let dispatch = mission_dispatch(mission(), 1);
    let receipt = docker.dispatch(&dispatch).await.unwrap();
    let c = fake
        .container(dispatch.idempotency_key.as_str())
        .expect("a container named by the key");
    assert_eq!(
        receipt.detail,
        format!("container {} {}", &c.id[..12], c.name)
    );
    assert!(!receipt.duplicate);
    assert_eq!(c.image, IMAGE);
    assert_eq!(c.cmd, ["/usr/local/bin/run-mission", "--verbose"]);
    assert_eq!(c.user.as_deref(), Some("1000:1000"));
    assert_eq!(c.host_config["NetworkMode"], "missions");
    assert_eq!(c.host_config["Memory"], 2147483648_i64);
    assert_eq!(c.host_config["NanoCpus"], 1500000000_i64);
    assert_eq!(c.env_var("CM_TASK"), Some("report"));
    assert_eq!(c.env_var("CM_REF"), Some("main"));
    assert_eq!(c.env_var("CM_ATTEMPT"), Some("1"));
    assert_eq!(c.env_var("LANG"), Some("C.UTF-8"));
    assert_eq!(c.env_var("CM_SCHEDULED_AT"), Some("2026-03-29T01:00:00Z"));
    assert_eq!(
        c.labels["cm.routine-id"],
        dispatch.occurrence.routine_id.to_string()
    );
    assert_eq!(c.labels["cm.scheduled-at"], "2026-03-29T01:00:00Z");
    assert_eq!(c.labels["cm.attempt"], "1");
    assert_eq!(c.labels["routine/team"], "platform");
    assert_eq!(c.starts, 1);
}

#[tokio::test]
async fn docker_pulls_an_absent_image_then_launches() {
    let fake = FakeDocker::start(&[]);
    let docker = docker_backend(&fake, MissionConfig::default());
    let dispatch = mission_dispatch(mission(), 1);
    docker.dispatch(&dispatch).await.unwrap();
    assert_eq!(fake.pulls(), 1);
    assert!(fake.has_image(IMAGE));
    let statuses: Vec<(String, u16)> = fake
        .calls()
        .into_iter()
        .map(|c| (format!("{} {}", c.method, c.path), c.status))
        .filter(|(call, _)| call != "GET /version")
        .collect();
    let name = dispatch.idempotency_key.to_string();
    let start = format!(
        "POST /containers/{}/start",
        &fake.container(&name).unwrap().id
    );
    assert_eq!(
        statuses,
        [
            ("POST /containers/create".to_owned(), 404),
            ("POST /images/create".to_owned(), 200),
            ("POST /containers/create".to_owned(), 201),
            (start, 204),
        ]
    );
}

#[tokio::test]
async fn docker_start_that_stalls_past_the_deadline_is_unconfirmed_and_the_retry_starts_it_once() {
    let fake = Arc::new(FakeDocker::start(&[IMAGE]));
    let docker = docker_backend(&fake, MissionConfig::default());
    fake.fault_next_start(StartFault::StallBeforeStart);
    let mut first = mission_dispatch(mission(), 1);
    first.deadline = Instant::now() + Duration::from_millis(500);
    let err = docker.dispatch(&first).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unconfirmed(t) if t.contains("deadline")),
        "{err}"
    );
    let name = first.idempotency_key.to_string();
    assert_eq!(fake.container(&name).map(|c| c.starts), Some(0));

    let mut retry = first.clone();
    retry.attempt = 2;
    retry.deadline = Instant::now() + Duration::from_secs(10);
    let receipt = docker.dispatch(&retry).await.unwrap();
    assert!(receipt.duplicate, "{receipt:?}");
    assert_eq!(fake.containers().len(), 1);
    assert_eq!(fake.container(&name).map(|c| c.starts), Some(1));
}

#[tokio::test]
async fn docker_that_does_not_answer_is_unavailable_naming_the_engine_and_the_cause() {
    // A port nothing listens on, then a socket that is not there.
    for (host, cause) in [
        ("tcp://127.0.0.1:1", "Connection refused"),
        (
            "unix:///tmp/cm-no-such-engine.sock",
            "no socket at /tmp/cm-no-such-engine.sock",
        ),
    ] {
        let docker =
            DockerDispatcher::connect(host, IMAGE.to_owned(), MissionConfig::default()).unwrap();
        let mut dispatch = mission_dispatch(mission(), 1);
        dispatch.deadline = Instant::now() + Duration::from_secs(1);
        let err = docker.dispatch(&dispatch).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DispatchError::Unavailable(_)), "{text}");
        assert!(
            text.contains(&format!("cannot reach the Docker engine at {host}"))
                && text.contains(cause),
            "{text}"
        );
        let ready = cm_dispatch::MissionRuntime::ready(&docker)
            .await
            .unwrap_err();
        assert!(ready.contains(host) && ready.contains(cause), "{ready}");
    }
}

#[tokio::test]
async fn docker_faults_of_the_engine_are_retried_within_the_deadline() {
    let fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&fake, MissionConfig::default());
    // An engine restarting answers 503 to the version, the create and more; a start fails once.
    fake.unavailable_for(4);
    fake.fault_next_start(StartFault::Fail);
    let dispatch = mission_dispatch(mission(), 1);
    let receipt = docker.dispatch(&dispatch).await.unwrap();
    assert!(!receipt.duplicate, "{receipt:?}");
    let c = fake.container(dispatch.idempotency_key.as_str()).unwrap();
    assert_eq!(c.starts, 1);
    let answered: Vec<u16> = fake.calls().iter().map(|c| c.status).collect();
    assert_eq!(
        answered,
        [503, 503, 503, 503, 200, 201, 500, 204],
        "{:?}",
        fake.calls()
    );

    // Past the deadline the last answer is kept.
    fake.unavailable_for(1000);
    let mut late = mission_dispatch(mission(), 1);
    late.deadline = Instant::now() + Duration::from_millis(800);
    let err = docker.dispatch(&late).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unavailable(t) if t.contains("the engine is restarting (503)")),
        "{err}"
    );
}

#[tokio::test]
async fn docker_sends_the_negotiated_api_version_in_every_path() {
    let fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&fake, MissionConfig::default());
    docker
        .dispatch(&mission_dispatch(mission(), 1))
        .await
        .unwrap();
    let calls = fake.calls();
    assert_eq!(calls[0].path, "/version");
    assert!(calls.len() >= 3, "{calls:?}");
    for call in &calls[1..] {
        assert_eq!(call.version.as_deref(), Some("1.47"), "{call:?}");
    }
}

/// What the kernel's buffers and the client's may hold beyond what the client read when it
/// stopped: a flood's sender gets that far past the bound before its writes stop.
pub(crate) const BUFFERED_AT_MOST: u64 = 16 << 20;

/// Waits until the client closed every flood's connection, then asserts that the call was
/// tried again (at least two answers past `before`) and that no flood was read past the bound:
/// each sent less than `MAX_REPLY_BYTES + BUFFERED_AT_MOST`, and the most any sent is above
/// `more_than` when given (the client read up to the bound).
pub(crate) async fn floods_cut(
    floods: impl Fn() -> cm_dispatch::fakes::FloodRecord,
    before: usize,
    more_than: Option<u64>,
) {
    let record = cm_dispatch::fakes::wait::wait_until(
        "the client to close every flood's connection",
        cm_dispatch::fakes::wait::PATIENCE,
        async || floods(),
        |record| record.open == 0,
    )
    .await;
    assert!(record.answered >= before + 2, "not tried again: {record:?}");
    assert!(
        more_than.is_none_or(|least| record.most_sent > least)
            && record.most_sent < cm_dispatch::MAX_REPLY_BYTES + BUFFERED_AT_MOST,
        "{record:?}"
    );
}

/// A reply that never ends (or declares a terabyte) is read no further than MAX_REPLY_BYTES
/// on its connection: the call fails naming the bound, as any failed call, and is tried again
/// until the deadline; the connection is closed.
#[tokio::test]
async fn docker_reads_no_reply_past_its_bound() {
    use cm_dispatch::MAX_REPLY_BYTES;
    use cm_dispatch::fakes::{Flood, Framing};
    let fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&fake, MissionConfig::default());
    let launched = mission_dispatch(mission(), 1);
    docker.dispatch(&launched).await.unwrap();
    let name = launched.idempotency_key.to_string();

    // The watch inspects the container: an endless 200 is neither its state nor its absence.
    let endless = Flood {
        status: 200,
        framing: Framing::Chunked,
    };
    fake.flood("GET", &format!("/containers/{name}/json"), Some(endless));
    let err = docker
        .observe(
            &RunRef::named(name.clone()),
            Instant::now() + Duration::from_secs(3),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unavailable(t) | DispatchError::Unconfirmed(t)
            if t.contains("inspect container") && t.contains("longer than 16 MiB")),
        "{err}"
    );
    // Each flood was read up to the bound and no further.
    floods_cut(|| fake.floods(), 0, Some(MAX_REPLY_BYTES - (1 << 20))).await;

    // A create answered 500 with a terabyte's Content-Length, read to the bound: the launch is
    // unconfirmed (what the engine did is unknown).
    let huge = Flood {
        status: 500,
        framing: Framing::HugeLength,
    };
    fake.flood("POST", "/containers/create", Some(huge));
    let before = fake.floods().answered;
    let d = Dispatch {
        deadline: Instant::now() + Duration::from_secs(3),
        ..mission_dispatch(mission(), 1)
    };
    let err = docker.dispatch(&d).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Unconfirmed(t)
            if t.contains("create container") && t.contains("longer than 16 MiB")),
        "{err}"
    );
    floods_cut(|| fake.floods(), before, None).await;
}

#[tokio::test]
async fn docker_start_refused_removes_the_container() {
    let fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&fake, MissionConfig::default());
    fake.fault_next_start(StartFault::Refuse("no command specified".into()));
    let dispatch = mission_dispatch(mission(), 1);
    let err = docker.dispatch(&dispatch).await.unwrap_err();
    assert!(
        matches!(&err, DispatchError::Rejected(t) if t.contains("no command specified (400)")
            && t.contains("the container was removed")),
        "{err}"
    );
    assert_eq!(fake.containers(), vec![]);
}

#[tokio::test]
async fn docker_runs_are_observed_from_inspect() {
    use cm_dispatch::{MissionRuntime, RunRef};
    let fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&fake, MissionConfig::default());
    let deadline = || Instant::now() + Duration::from_secs(5);
    let mut states = Vec::new();
    for code in [0, 3] {
        let dispatch = mission_dispatch(mission(), 1);
        docker.dispatch(&dispatch).await.unwrap();
        let run = RunRef::named(dispatch.idempotency_key.to_string());
        states.push(docker.observe(&run, deadline()).await.unwrap());
        fake.exit(&run.name, code);
        states.push(docker.observe(&run, deadline()).await.unwrap());
        fake.forget(&run.name);
        states.push(docker.observe(&run, deadline()).await.unwrap());
    }
    let names: Vec<String> = states
        .iter()
        .map(|s| format!("{} {}", s.name(), s.reason().unwrap_or_default()))
        .collect();
    assert_eq!(names[0], "running ");
    assert_eq!(names[1], "succeeded ");
    assert!(
        names[2].starts_with("lost the Docker engine at tcp://"),
        "{names:?}"
    );
    assert_eq!(names[4], "failed exit code 3");
}

#[tokio::test]
async fn docker_runs_report_their_logs_tail_and_times() {
    let fake = FakeDocker::start(&[IMAGE]);
    let docker = docker_backend(&fake, MissionConfig::default());
    let dispatch = mission_dispatch(mission(), 1);
    docker.dispatch(&dispatch).await.unwrap();
    let run = RunRef::named(dispatch.idempotency_key.to_string());
    let deadline = || Instant::now() + Duration::from_secs(5);
    fake.print(&run.name, LogStream::Stdout, "one\n");
    fake.print(&run.name, LogStream::Stderr, "two token=abc123\n");
    // Lines of 200 bytes: a tail of 500 does not fit the read; one of 100 does.
    let lines: String = (0..3000)
        .map(|i| format!("{i:05} {}\n", "y".repeat(193)))
        .collect();
    fake.print(&run.name, LogStream::Stdout, &lines);
    fake.print(&run.name, LogStream::Stderr, "last\n");
    fake.exit(&run.name, 3);
    let before = fake.calls().len();
    let report = docker.report(&run, deadline()).await.unwrap();
    let (started, finished) = (report.started_at.unwrap(), report.finished_at.unwrap());
    assert!(started <= finished, "{report:?}");
    let output = report.output.unwrap();
    assert!(output.len() <= MAX_RUN_OUTPUT, "{}", output.len());
    assert!(output.len() > MAX_RUN_OUTPUT - 200, "{}", output.len());
    assert!(output.starts_with('0'), "{}", &output[..20]);
    assert!(output.ends_with(&format!("02999 {}\nlast\n", "y".repeat(193))));
    let tails: Vec<String> = fake.calls()[before..]
        .iter()
        .filter(|c| c.path.ends_with("/logs"))
        .map(|c| c.query.clone())
        .collect();
    assert_eq!(tails.len(), 2, "{tails:?}");
    assert!(
        tails[0].contains("tail=500") && tails[1].contains("tail=100"),
        "{tails:?}"
    );

    // A short output is whole, both streams, scrubbed.
    let short = mission_dispatch(mission(), 1);
    docker.dispatch(&short).await.unwrap();
    let name = short.idempotency_key.to_string();
    fake.print(&name, LogStream::Stdout, "one\n");
    fake.print(&name, LogStream::Stderr, "two token=abc123\n");
    fake.exit(&name, 0);
    let report = docker
        .report(&RunRef::named(name.clone()), deadline())
        .await
        .unwrap();
    assert_eq!(report.output.as_deref(), Some("one\ntwo token=***\n"));

    // A container removed (auto_remove, or someone else): nothing left, and no error.
    fake.forget(&name);
    assert_eq!(
        docker
            .report(&RunRef::named(name), deadline())
            .await
            .unwrap(),
        RunReport::default()
    );
}

/// The bytes this thread has read so far (`rchar` of `/proc/thread-self/io`).
fn bytes_read_by_this_thread() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("rchar in /proc/thread-self/io")
}

/// The run's folder is the run's to write in: a marker and an exit file grown to 1 GiB (sparse,
/// so no disk is spent) are read no further than their first lines.
#[tokio::test]
async fn process_runner_reads_a_huge_marker_and_exit_file_only_at_their_start() {
    let dir = TempDir::new();
    let runner = process_runner(&dir.0);
    std::fs::create_dir_all(dir.0.join("work")).unwrap();
    let name = "cm-huge-records";
    for (path, first) in [
        (runner.marker_path(name), "pid 1\n"),
        (
            dir.0.join("work").join(format!("{name}.exit")),
            "exit status: 3\n",
        ),
    ] {
        let file = std::fs::File::create(&path).unwrap();
        std::io::Write::write_all(&mut &file, first.as_bytes()).unwrap();
        file.set_len(1 << 30).unwrap();
    }
    let run = RunRef::named(name);
    let before = bytes_read_by_this_thread();
    let deadline = Instant::now() + Duration::from_secs(5);
    let state = runner.observe(&run, deadline).await.unwrap();
    runner.report(&run, deadline).await.unwrap();
    runner.stop(&run, deadline).await.unwrap();
    let read = bytes_read_by_this_thread() - before;
    assert_eq!(state, RunState::exited(3, ""));
    assert!(read < 1 << 20, "{read} bytes read");
}
