//! The Docker backend against a real engine: the private dockerd `.ci/dockerd` starts (no
//! network of its own, a Unix socket), at the address in `CM_TEST_DOCKER_HOST`, running the
//! busybox image that script imports. The tests are ignored unless asked for (`cargo xtask test` runs
//! them where `CM_TEST_DOCKER_HOST` is set); asked for without an engine, they fail.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use cm_dispatch::conformance::EffectProbe;
use cm_dispatch::fakes::wait::{PATIENCE, wait_until};
use cm_dispatch::mission::MissionConfig;
use cm_dispatch::mission_conformance::{check_mission_backend, payload_of_task};
use cm_dispatch::{
    DispatchError, Dispatcher, DockerDispatcher, MAX_RUN_OUTPUT, MissionRuntime, RunRef, RunReport,
};
use cm_domain::{IdempotencyKey, RunState};
use serde_json::Value;

use crate::missions::{mission, mission_dispatch, run_ended};

/// The image `.ci/dockerd` imports.
pub const IMAGE: &str = "cm-test-busybox:1";

/// Where `.ci/dockerd` puts its socket when `CM_DOCKERD_DIR` is not set.
const DEFAULT_HOST: &str = "unix:///tmp/cm-dockerd/docker.sock";

/// The engine's address, once it answers. These tests are ignored unless asked for (`cargo
/// xtask test` asks where `CM_TEST_DOCKER_HOST` is set), so one that runs without an engine
/// fails, saying what to start.
pub async fn engine() -> String {
    let host = std::env::var("CM_TEST_DOCKER_HOST").unwrap_or_else(|_| DEFAULT_HOST.into());
    let answer = match Docker::connect_with_host(&host) {
        Ok(docker) => docker.ping().await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = answer {
        panic!(
            "no Docker engine answers at {host} (start it with .ci/dockerd and set \
             CM_TEST_DOCKER_HOST): {e}"
        );
    }
    host
}

fn backend(host: &str, config: &str) -> DockerDispatcher {
    DockerDispatcher::connect(
        host,
        IMAGE.to_owned(),
        MissionConfig::from_json(config).unwrap(),
    )
    .unwrap()
}

fn client(host: &str) -> Docker {
    Docker::connect_with_host(host).unwrap()
}

/// Removes the containers a test made (by their names), whatever state they are in.
async fn remove(host: &str, names: &[&str]) {
    let docker = client(host);
    for name in names {
        let options = bollard::query_parameters::RemoveContainerOptions {
            force: true,
            ..Default::default()
        };
        let _ = docker.remove_container(name, Some(options)).await;
    }
}

/// Whether a container of `name` exists, and how often it was started (0 or 1: an engine
/// restarts a container only when asked, and `StartedAt` then moves).
async fn started(host: &str, name: &str) -> Option<(bool, String)> {
    let found = client(host).inspect_container(name, None).await.ok()?;
    let started_at = found.state.and_then(|s| s.started_at).unwrap_or_default();
    Some((!started_at.starts_with("0001-"), started_at))
}

/// Counts started containers of a key on the real engine.
struct EngineProbe(String);

#[async_trait]
impl EffectProbe for EngineProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        Ok(usize::from(
            started(&self.0, key.as_str()).await.is_some_and(|(s, _)| s),
        ))
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        let found = client(&self.0)
            .inspect_container(key.as_str(), None)
            .await
            .map_err(|e| e.to_string())?;
        let env = found.config.and_then(|c| c.env).unwrap_or_default();
        Ok(env
            .iter()
            .find_map(|kv| kv.strip_prefix("CM_TASK="))
            .and_then(payload_of_task))
    }
    // A real engine cannot be made to stall or refuse one call on demand: the fake engine's
    // tests cover those cases.
    fn injects_faults(&self) -> bool {
        false
    }
    async fn stall(&self) -> Result<(), String> {
        Err("a real engine cannot be stalled on demand".into())
    }
    async fn fail(&self, _reason: &str) -> Result<(), String> {
        Err("a real engine cannot be made to refuse on demand".into())
    }
    async fn heal(&self) -> Result<(), String> {
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        None
    }
}

#[tokio::test]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn real_engine_conforms() {
    let host = engine().await;
    let docker = backend(
        &host,
        r#"{"command": ["sh", "-c", "sleep 1"], "docker": {"network": "none"}}"#,
    );
    check_mission_backend(&docker, &EngineProbe(host.clone()), None)
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn real_engine_runs_are_watched_to_their_exit_code() {
    let host = engine().await;
    let exits = |code| {
        backend(
            &host,
            &format!(
                r#"{{"command": ["sh", "-c", "exit {code}"], "docker": {{"network": "none"}}}}"#
            ),
        )
    };
    let (ok, three) = (exits(0), exits(3));
    let (a, b) = (
        mission_dispatch(mission(), 1),
        mission_dispatch(mission(), 1),
    );
    ok.dispatch(&a).await.unwrap();
    three.dispatch(&b).await.unwrap();
    assert_eq!(
        run_ended(&ok, a.idempotency_key.as_str()).await,
        RunState::Succeeded
    );
    let failed = run_ended(&three, b.idempotency_key.as_str()).await;
    assert_eq!(failed.exit_code(), Some(3), "{failed:?}");
    assert_eq!(failed.reason(), Some("exit code 3"));

    // An exited container is never started again by a later attempt: it ran once.
    let before = started(&host, a.idempotency_key.as_str()).await.unwrap();
    let mut retry = a.clone();
    retry.attempt = 2;
    let receipt = ok.dispatch(&retry).await.unwrap();
    assert!(receipt.duplicate, "{receipt:?}");
    assert_eq!(
        started(&host, a.idempotency_key.as_str()).await.unwrap(),
        before
    );

    // A container removed by someone else is lost.
    remove(&host, &[a.idempotency_key.as_str()]).await;
    let lost = run_ended(&ok, a.idempotency_key.as_str()).await;
    assert!(matches!(lost, RunState::Lost { .. }), "{lost:?}");
    remove(&host, &[b.idempotency_key.as_str()]).await;
}

#[tokio::test]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn real_engine_refusals_are_rejected_and_leave_no_container() {
    let host = engine().await;
    for (config, words) in [
        (
            r#"{"command": ["sh"], "user": "nobody2", "docker": {"network": "none"}}"#,
            "nobody2",
        ),
        (
            r#"{"command": ["sh"], "docker": {"network": "cm-no-such-network"}}"#,
            "cm-no-such-network",
        ),
        (
            r#"{"command": ["/no/such/program"], "docker": {"network": "none"}}"#,
            "/no/such/program",
        ),
    ] {
        let docker = backend(&host, config);
        let dispatch = mission_dispatch(mission(), 1);
        let began = Instant::now();
        let err = docker.dispatch(&dispatch).await.unwrap_err();
        assert!(
            matches!(&err, DispatchError::Rejected(t) if t.contains(words) && t.contains("removed")),
            "{config}: {err}"
        );
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{config}: not retried"
        );
        assert_eq!(
            started(&host, dispatch.idempotency_key.as_str()).await,
            None,
            "{config}: the refused container is removed"
        );
    }
    let bad_image = DockerDispatcher::connect(
        &host,
        "Not A/Valid:Image:Name".into(),
        MissionConfig::default(),
    )
    .unwrap();
    let err = bad_image
        .dispatch(&mission_dispatch(mission(), 1))
        .await
        .unwrap_err();
    assert!(matches!(&err, DispatchError::Rejected(_)), "{err}");
}

#[tokio::test]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn real_engine_stop_ends_a_running_mission() {
    let host = engine().await;
    let docker = backend(
        &host,
        r#"{"command": ["sleep", "60"], "docker": {"network": "none", "stop_grace_seconds": 1}}"#,
    );
    let dispatch = mission_dispatch(mission(), 1);
    docker.dispatch(&dispatch).await.unwrap();
    let run = RunRef::named(dispatch.idempotency_key.to_string());
    let deadline = || Instant::now() + Duration::from_secs(10);
    assert_eq!(
        docker.observe(&run, deadline()).await.unwrap(),
        RunState::Running
    );
    docker.stop(&run, deadline()).await.unwrap();
    let stopped = docker.observe(&run, deadline()).await.unwrap();
    assert!(matches!(stopped, RunState::Failed { .. }), "{stopped:?}");
    // A second stop of a stopped run is no error.
    docker.stop(&run, deadline()).await.unwrap();
    assert_eq!(docker.ready().await, Ok(()));
    remove(&host, &[run.name.as_str()]).await;
}

#[tokio::test]
#[ignore = "needs a Docker engine: start one with .ci/dockerd and set CM_TEST_DOCKER_HOST to what it prints"]
async fn real_engine_reports_a_runs_output_and_times() {
    let host = engine().await;
    let deadline = || Instant::now() + Duration::from_secs(10);
    let docker = backend(
        &host,
        r#"{"command": ["sh", "-c", "echo one; echo two >&2; exit 3"], "docker": {"network": "none"}}"#,
    );
    let dispatch = mission_dispatch(mission(), 1);
    docker.dispatch(&dispatch).await.unwrap();
    let run = RunRef::named(dispatch.idempotency_key.to_string());
    assert_eq!(run_ended(&docker, &run.name).await.exit_code(), Some(3));
    let report = docker.report(&run, deadline()).await.unwrap();
    let output = report.output.clone().unwrap();
    assert!(
        output.contains("one\n") && output.contains("two\n"),
        "{report:?}"
    );
    let (began, finished) = (report.started_at.unwrap(), report.finished_at.unwrap());
    assert!(began <= finished, "{report:?}");
    assert!(
        finished - began < chrono::TimeDelta::seconds(30),
        "{report:?}"
    );
    // Gone, its logs with it: nothing to report, and no error.
    remove(&host, &[run.name.as_str()]).await;
    assert_eq!(
        docker.report(&run, deadline()).await.unwrap(),
        RunReport::default()
    );

    // Lines of 300 bytes: the first tail asked for does not fit the read, a shorter one does,
    // and what is kept is the output's last 16 KiB from a line start.
    let long = backend(
        &host,
        r#"{"command": ["sh", "-c", "pad=$(printf '%0290d' 0); i=0; while [ $i -lt 2000 ]; do echo \"$pad $i\"; i=$((i+1)); done; echo password=hunter2; echo last"], "docker": {"network": "none"}}"#,
    );
    let dispatch = mission_dispatch(mission(), 1);
    long.dispatch(&dispatch).await.unwrap();
    let run = RunRef::named(dispatch.idempotency_key.to_string());
    assert_eq!(run_ended(&long, &run.name).await, RunState::Succeeded);
    let output = long.report(&run, deadline()).await.unwrap().output.unwrap();
    assert!(output.len() <= MAX_RUN_OUTPUT, "{}", output.len());
    assert!(output.len() > MAX_RUN_OUTPUT - 400, "{}", output.len());
    assert!(output.starts_with("0000"), "{}", &output[..40]);
    assert!(
        output.ends_with(" 1999\npassword=***\nlast\n"),
        "{}",
        &output[output.len() - 60..]
    );
    remove(&host, &[run.name.as_str()]).await;

    // With auto_remove the engine removes the container as it exits: by the time the watch
    // asks, there is nothing left to report.
    let removed = backend(
        &host,
        r#"{"command": ["sh", "-c", "echo bye"], "docker": {"network": "none", "auto_remove": true}}"#,
    );
    let dispatch = mission_dispatch(mission(), 1);
    removed.dispatch(&dispatch).await.unwrap();
    let run = RunRef::named(dispatch.idempotency_key.to_string());
    // The watch may see it exited, or already gone.
    let seen = run_ended(&removed, &run.name).await;
    assert!(
        matches!(seen, RunState::Succeeded | RunState::Lost { .. }),
        "{seen:?}"
    );
    wait_until(
        "the container removed",
        PATIENCE,
        async || started(&host, &run.name).await,
        Option::is_none,
    )
    .await;
    assert_eq!(
        removed.report(&run, deadline()).await.unwrap(),
        RunReport::default()
    );
}
