//! Missions through the binary: mission files refused field by field, mission backend settings
//! refused at start, and whole schedulers launching containers on the fake Docker engine,
//! killed with SIGKILL mid-launch, with the fake's call log showing one container started per
//! occurrence.

use cm_dispatch::fakes::docker::{FakeDocker, StartFault};

use crate::cli::{MissionFiles, NOWHERE, check_fails, created_id, ok};
use crate::crash::{SchedulerProcess, eventually, taken_over_by_b};
use crate::support::TestDb;

const IMAGE: &str = "registry.example.com/cm/mission-runner:1.4";

#[tokio::test]
async fn mission_files_are_refused_field_by_field_and_write_nothing() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let ok_fields = r#""repository": "https://git.example.com/team/repo.git", "task": "lint""#;
    // One case a line: the mission file, and what the one line on stderr must name.
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        (r#"{"task": "lint"}"#, "\"repository\""),
        (r#"{"repository": "https://git.example.com/r.git"}"#, "\"task\""),
        (r#"{"repository": "/srv/git/repo.git", "task": "lint"}"#, "\"repository\""),
        (r#"{"repository": "file:///srv/git/repo.git", "task": "lint"}"#, "\"repository\""),
        (r#"{"repository": "https://u:p@git.example.com/r.git", "task": "lint"}"#, "\"repository\""),
        (&format!(r#"{{{ok_fields}, "ref": "--upload-pack=x"}}"#), "\"ref\""),
        (&format!(r#"{{{ok_fields}, "ref": "a..b"}}"#), "\"ref\""),
        (&format!(r#"{{{ok_fields}, "env": {{"CM_TASK": "x"}}}}"#), "\"env.CM_TASK\""),
        (&format!(r#"{{{ok_fields}, "env": {{"lower": "x"}}}}"#), "\"env.lower\""),
        (&format!(r#"{{{ok_fields}, "env": {{"A": 1}}}}"#), "\"env.A\""),
        (&format!(r#"{{{ok_fields}, "labels": {{"cm.attempt": "9"}}}}"#), "\"labels.cm.attempt\""),
        (&format!(r#"{{{ok_fields}, "image": "alpine"}}"#), "\"image\""),
        (&format!(r#"{{{ok_fields}, "env": {{"A": "a\u0000b"}}}}"#), "\"env.A\""),
        (&format!(r#"{{"repository": "https://h.example/r", "task": "{}"}}"#, "x".repeat(65 * 1024)), "\"task\""),
    ];
    for (i, (mission, field)) in cases.iter().enumerate() {
        let path = files.write(&format!("m{i}.json"), mission);
        check_fails(&db.url, &create("0 9 * * *", &path), 2, field);
    }
    assert_eq!(
        db.count("routines").await,
        0,
        "bad input must write nothing"
    );
}

#[tokio::test]
async fn mission_backend_settings_are_refused_at_start() {
    let files = MissionFiles::new();
    let unknown = files.write("unknown.json", r#"{"docker": {"netwrk": "x"}}"#);
    let no_image = files.write("no-image.json", r#"{"command": ["run"]}"#);
    let missing = files.write("dir-marker", "");
    let missing = format!("{missing}.absent");
    let run = |rest: &[&str]| -> Vec<String> {
        ["run"].iter().chain(rest).map(|s| s.to_string()).collect()
    };
    // The database URL is one nothing answers on: a refusal must come before any connection.
    #[rustfmt::skip]
    let cases: Vec<(Vec<String>, &str)> = vec![
        (run(&["--mission-backend", "docker"]), "--mission-image"),
        (run(&["--mission-backend", "docker", "--mission-config", &no_image]), "--mission-image"),
        (run(&["--mission-backend", "docker", "--mission-image", IMAGE, "--mission-config", &unknown]), "netwrk"),
        (run(&["--mission-backend", "docker", "--mission-image", IMAGE, "--mission-config", &missing]), "--mission-config"),
        (run(&["--mission-backend", "process"]), "--mission-command"),
        (run(&["--mission-image", IMAGE]), "--mission-backend"),
        (run(&["--mission-backend", "docker", "--mission-image", IMAGE, "--mission-command", "/bin/true"]), "--mission-command"),
        (run(&["--mission-backend", "podman"]), "podman"),
    ];
    for (args, fragment) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check_fails(NOWHERE, &args, 2, fragment);
    }

    // Good settings pass the mission checks, and the scheduler then waits for the database
    // (which never answers here) instead of exiting: `--mission-command` takes the rest of the
    // line, hyphens included. (Docker's good settings are run by the whole-process tests below,
    // which give it an engine.)
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let log = files.write("good-settings.log", "");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cm-scheduler"))
        .env_remove("RUST_LOG")
        .args([
            "--database-url",
            NOWHERE,
            "run",
            "--mission-backend",
            "process",
        ])
        .args([
            "--mission-workdir",
            &workdir,
            "--mission-command",
            "/bin/sh",
            "-c",
            "exit 0",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let waited =
        crate::support::eventually_within(std::time::Duration::from_secs(20), async || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("does not answer yet").then_some(text)
        })
        .await;
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(waited.is_some() && still_running, "{stderr}");
    assert!(stderr.contains("development only"), "{stderr}");
}

/// A `cm-scheduler run` with the Docker mission backend on `fake`.
fn scheduler(db: &TestDb, fake: &FakeDocker, instance_id: &str) -> SchedulerProcess {
    SchedulerProcess::start_with(
        db,
        instance_id,
        &["--mission-backend", "docker", "--mission-image", IMAGE],
        &[("DOCKER_HOST", &fake.host())],
    )
}

/// `routine create` of a mission routine named `m` on `schedule` from the file at `path`.
fn create<'a>(schedule: &'a str, path: &'a str) -> [&'a str; 8] {
    [
        "routine",
        "create",
        "--name",
        "m",
        "--schedule",
        schedule,
        "--mission",
        path,
    ]
}

/// Kills scheduler A while the fake withholds its answer to the first start (`fault` says
/// whether the container started), lets B take the claim over after the lease, and checks the
/// engine's log: one container created, started exactly once.
async fn killed_mid_launch(fault: StartFault) {
    let fake = FakeDocker::start(&[IMAGE]);
    fake.fault_next_start(fault.clone());
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let mission = files.write(
        "mission.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "report"}"#,
    );
    let routine = created_id(&ok(&db.url, &create("*/5 * * * * *", &mission)));

    let mut a = scheduler(&db, &fake, "A");
    let stalled = eventually(async || {
        fake.calls()
            .iter()
            .any(|c| c.path.ends_with("/start") && c.status == 0)
            .then_some(())
    })
    .await;
    assert!(
        stalled.is_some(),
        "A never reached the start; its log:\n{}",
        a.log()
    );
    // Well inside A's 3 s dispatch timeout: A dies mid-launch, before any settle.
    a.kill();
    ok(&db.url, &["routine", "pause", &routine.to_string()]);
    let fires = db.fires().await;
    assert_eq!(fires.len(), 1, "{fires:?}");
    assert_eq!(
        (fires[0].status.as_str(), fires[0].claimant.as_str()),
        ("claimed", "A")
    );

    let b = scheduler(&db, &fake, "B");
    taken_over_by_b(&db, &fires[0], &b, "finish launching").await;

    let containers = fake.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0].starts, 1, "{containers:?}");
    let calls: Vec<(String, u16)> = fake
        .calls()
        .into_iter()
        .filter(|c| c.path.starts_with("/containers/"))
        .map(|c| {
            (
                format!("{} {}", c.method, c.path.replace(&containers[0].id, "ID")),
                c.status,
            )
        })
        .collect();
    let mut expected = vec![
        ("POST /containers/create".to_owned(), 201),
        ("POST /containers/ID/start".to_owned(), 0),
        ("POST /containers/create".to_owned(), 409),
        (format!("GET /containers/{}/json", containers[0].name), 200),
    ];
    if fault == StartFault::StallBeforeStart {
        // B found it created, never started, and started it: the one start.
        expected.push(("POST /containers/ID/start".to_owned(), 204));
    }
    assert_eq!(calls, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_between_create_and_start_launches_one_container() {
    killed_mid_launch(StartFault::StallBeforeStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_after_start_before_settle_launches_one_container() {
    killed_mid_launch(StartFault::StallAfterStart).await;
}
