//! Missions through the binary: mission files refused field by field, mission backend settings
//! refused at start, and whole schedulers launching containers on the fake Docker engine and
//! Jobs on the fake Kubernetes API, killed with SIGKILL mid-launch, with the fake's call log
//! showing one container started, or one Job created, per occurrence.

use cm_dispatch::fakes::docker::{FakeDocker, StartFault};
use cm_dispatch::fakes::kubernetes::{CreateFault, FakeKubernetes};
use cm_domain::{IdempotencyKey, Occurrence};
use uuid::Uuid;

use crate::cli::{MissionFiles, NOWHERE, check_fails, create_args, created_id, ok};
use crate::crash::{FireRow, SchedulerProcess, eventually, retried_by, taken_over_by_b};
use crate::support::{TestDb, cm_scheduler};

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
    let named_user = files.write("named-user.json", r#"{"user": "mission"}"#);
    // What the API server would refuse in every Job: refused at start, naming the key.
    let k8s =
        |name: &str, settings: &str| files.write(name, &format!(r#"{{"kubernetes": {settings}}}"#));
    let backoff = k8s("backoff.json", r#"{"backoff_limit": -1}"#);
    let ttl = k8s("ttl.json", r#"{"ttl_seconds_after_finished": -5}"#);
    let cpu = k8s("cpu.json", r#"{"cpu": "1.5cores"}"#);
    let memory = k8s("memory.json", r#"{"memory": "lots"}"#);
    let namespace = k8s("namespace.json", r#"{"namespace": "Not_A_Namespace"}"#);
    let not_json = files.write("not-json.json", "image: busybox\n");
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
        (run(&["--mission-backend", "kubernetes"]), "--mission-image"),
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &unknown]), "netwrk"),
        // Kubernetes runs a container as a number, never as a name from the image's passwd.
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &named_user]), "numeric user"),
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &backoff]), "\"kubernetes\".backoff_limit"),
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &ttl]), "\"kubernetes\".ttl_seconds_after_finished"),
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &cpu]), "\"kubernetes\".cpu"),
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &memory]), "\"kubernetes\".memory"),
        (run(&["--mission-backend", "kubernetes", "--mission-image", IMAGE, "--mission-config", &namespace]), "\"kubernetes\".namespace"),
        (run(&["--mission-backend", "process"]), "--mission-command"),
        (run(&["--mission-image", IMAGE]), "--mission-backend"),
        (run(&["--mission-backend", "docker", "--mission-image", IMAGE, "--mission-command", "/bin/true"]), "--mission-command"),
        (run(&["--mission-backend", "podman"]), "podman"),
        // With no backend, a file given is still read and checked: missing, a directory, not
        // JSON.
        (run(&["--mission-config", &missing]), "--mission-config"),
        (run(&["--mission-config", &files.path("")]), "--mission-config"),
        (run(&["--mission-config", &not_json]), "--mission-config"),
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
    let mut child = cm_scheduler()
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

/// A mission routine `m` firing every 5 seconds.
fn mission_routine(db: &TestDb, files: &MissionFiles) -> Uuid {
    let mission = files.write(
        "mission.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "report"}"#,
    );
    created_id(&ok(&db.url, &create("*/5 * * * * *", &mission)))
}

/// Kills scheduler A as soon as `stalled` says the fake withholds its answer to A's `step`
/// (well inside A's 3 s dispatch timeout: A dies mid-launch, before any settle), pauses the
/// routine so nothing else fires, and returns the one fire, still claimed by A.
async fn kill_when_stalled(
    db: &TestDb,
    a: &mut SchedulerProcess,
    routine: Uuid,
    step: &str,
    stalled: impl Fn() -> bool,
) -> FireRow {
    let reached = eventually(async || stalled().then_some(())).await;
    assert!(
        reached.is_some(),
        "A never reached the {step}; its log:\n{}",
        a.log()
    );
    a.kill();
    ok(&db.url, &["routine", "pause", &routine.to_string()]);
    let fires = db.fires().await;
    assert_eq!(fires.len(), 1, "{fires:?}");
    assert_eq!(
        (fires[0].status.as_str(), fires[0].claimant.as_str()),
        ("claimed", "A")
    );
    fires.into_iter().next().unwrap()
}

/// Kills scheduler A while the fake withholds its answer to the first start (`fault` says
/// whether the container started), lets B take the claim over after the lease, and checks the
/// engine's log: one container created, started exactly once.
async fn killed_mid_launch(fault: StartFault) {
    let fake = FakeDocker::start(&[IMAGE]);
    fake.fault_next_start(fault.clone());
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let routine = mission_routine(&db, &files);

    let mut a = scheduler(&db, &fake, "A");
    let claimed = kill_when_stalled(&db, &mut a, routine, "start", || {
        fake.calls()
            .iter()
            .any(|c| c.path.ends_with("/start") && c.status == 0)
    })
    .await;

    let b = scheduler(&db, &fake, "B");
    taken_over_by_b(&db, &claimed, &b, "finish launching").await;

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
    assert_launched_with(&calls, &expected);
}

/// The launch made exactly the `expected` calls; after them come only the reads of the run
/// watch (the mission's run asked about until it ends).
fn assert_launched_with(calls: &[(String, u16)], expected: &[(String, u16)]) {
    // Each scheduler's start-up permission check (SelfSubjectAccessReviews) is no launch.
    let calls: Vec<(String, u16)> = calls
        .iter()
        .filter(|(call, _)| !call.contains("selfsubjectaccessreviews"))
        .cloned()
        .collect();
    let calls = calls.as_slice();
    let launch = &calls[..expected.len().min(calls.len())];
    assert_eq!(launch, expected, "{calls:?}");
    let watch = &calls[launch.len()..];
    assert!(
        watch.iter().all(|(call, _)| call.starts_with("GET ")),
        "{calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_between_create_and_start_launches_one_container() {
    killed_mid_launch(StartFault::StallBeforeStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_after_start_before_settle_launches_one_container() {
    killed_mid_launch(StartFault::StallAfterStart).await;
}

/// An engine that takes a container's create and never answers its start (it is restarting),
/// with the scheduler alive throughout: the dispatch ends at its deadline with the outcome open,
/// so the occurrence is not settled `failed` over its created container. After the lease the
/// same scheduler's next attempt finds the container by name and starts it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_engine_never_answers_is_finished_by_the_next_attempt_not_failed() {
    let fake = FakeDocker::start(&[IMAGE]);
    fake.fault_next_start(StartFault::StallBeforeStart);
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let routine = mission_routine(&db, &files);

    let a = scheduler(&db, &fake, "A");
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
    ok(&db.url, &["routine", "pause", &routine.to_string()]);
    let fires = db.fires().await;
    assert_eq!(fires.len(), 1, "{fires:?}");
    let claimed = fires.into_iter().next().unwrap();
    assert_eq!(
        (claimed.status.as_str(), claimed.claimant.as_str()),
        ("claimed", "A")
    );

    retried_by(&db, &claimed, &a, "A", "start").await;
    assert!(
        a.log().contains("the target did not confirm the dispatch"),
        "{}",
        a.log()
    );
    let containers = fake.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0].starts, 1, "{containers:?}");
}

const KUBE_TOKEN: &str = "kube-token-0b5e7d2a91c4";

/// A `cm-scheduler run` with the Kubernetes mission backend, finding the cluster as an operator
/// points it at one: a kubeconfig file named by `KUBECONFIG`.
fn kube_scheduler(
    db: &TestDb,
    kubeconfig: &str,
    settings: &str,
    instance_id: &str,
) -> SchedulerProcess {
    SchedulerProcess::start_with(
        db,
        instance_id,
        &[
            "--mission-backend",
            "kubernetes",
            "--mission-image",
            IMAGE,
            "--mission-config",
            settings,
        ],
        &[("KUBECONFIG", kubeconfig)],
    )
}

/// Kills scheduler A while the fake API server withholds its answer to the first Job create
/// (`fault` says whether the Job was stored first), lets B take the claim over after the lease,
/// and checks the server's log: one Job created for the occurrence, named by its key, and the
/// fire settled `fired` with that Job's name and uid as its receipt.
async fn killed_mid_create(fault: CreateFault) {
    let fake = FakeKubernetes::start(&["missions"], KUBE_TOKEN);
    fake.fault_next_create(fault.clone());
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let kubeconfig = files.write("kubeconfig", &fake.kubeconfig("default"));
    let settings = files.write(
        "missions.json",
        r#"{"kubernetes": {"namespace": "missions", "service_account": "cm-missions"}}"#,
    );
    let routine = mission_routine(&db, &files);

    let mut a = kube_scheduler(&db, &kubeconfig, &settings, "A");
    let claimed = kill_when_stalled(&db, &mut a, routine, "create", || {
        fake.calls()
            .iter()
            .any(|c| c.method == "POST" && c.status == 0)
    })
    .await;
    let stored_by_a = fake.jobs().len();
    assert_eq!(
        stored_by_a,
        usize::from(fault == CreateFault::StallAfterCreate),
        "{:?}",
        fake.jobs()
    );

    let b = kube_scheduler(&db, &kubeconfig, &settings, "B");
    let fire = taken_over_by_b(&db, &claimed, &b, "finish launching").await;

    let jobs = fake.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let key = IdempotencyKey::for_occurrence(&Occurrence::new(fire.routine_id, fire.scheduled_at));
    assert_eq!(jobs[0].name, key.as_str());
    assert_eq!(jobs[0].namespace, "missions");
    assert_eq!(jobs[0].env_var("CM_IDEMPOTENCY_KEY"), Some(key.as_str()));
    let calls: Vec<(String, u16)> = fake
        .calls()
        .into_iter()
        // The readiness check at start lists Jobs; it launches nothing.
        .filter(|c| !(c.method == "GET" && c.path.ends_with("/jobs")))
        .map(|c| {
            (
                format!("{} {}", c.method, c.path.replace(key.as_str(), "NAME")),
                c.status,
            )
        })
        .collect();
    let create = "POST /apis/batch/v1/namespaces/missions/jobs".to_owned();
    let expected = match fault {
        // A's create never reached the store: B's is the one create.
        CreateFault::StallBeforeCreate => vec![(create.clone(), 0), (create, 201)],
        // A's create was stored: B's is refused as AlreadyExists, and B reads the Job.
        _ => vec![
            (create.clone(), 0),
            (create, 409),
            (
                "GET /apis/batch/v1/namespaces/missions/jobs/NAME".to_owned(),
                200,
            ),
        ],
    };
    assert_launched_with(&calls, &expected);
    // `fires` shows which Job carried the occurrence out.
    let receipt = format!("job missions/{} uid {}", jobs[0].name, jobs[0].uid);
    let listed = ok(&db.url, &["fires", "--routine", &routine.to_string()]);
    assert!(listed.contains(&receipt), "{receipt} not in:\n{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_before_its_job_was_stored_launches_one_job() {
    killed_mid_create(CreateFault::StallBeforeCreate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_after_its_job_was_stored_launches_one_job() {
    killed_mid_create(CreateFault::StallAfterCreate).await;
}

/// `fires --json` of `routine`, one JSON object a fire.
fn fires_json(db: &TestDb, routine: Uuid) -> Vec<serde_json::Value> {
    ok(
        &db.url,
        &["fires", "--routine", &routine.to_string(), "--json"],
    )
    .lines()
    .filter_map(|line| serde_json::from_str(line).ok())
    .filter(|v: &serde_json::Value| v.get("scheduled_at").is_some())
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_runs_are_watched_to_their_exit_code_through_the_binary() {
    runs_are_watched_to_their_exit_code(&TestDb::new().await).await;
}

/// A mission routine's first run launched by a scheduler on `db` (a fake engine), watched while
/// it runs, then recorded with the exit code it ends with, in the listings and the log.
pub(crate) async fn runs_are_watched_to_their_exit_code(db: &TestDb) {
    let fake = FakeDocker::start(&[IMAGE]);
    let files = MissionFiles::new();
    let routine = mission_routine(db, &files);
    let a = scheduler(db, &fake, "A");
    // The first launch runs; it then exits 3.
    let launched = eventually(async || fake.containers().into_iter().find(|c| c.starts == 1)).await;
    let Some(container) = launched else {
        panic!("nothing launched; log:\n{}", a.log())
    };
    ok(&db.url, &["routine", "pause", &routine.to_string()]);
    let running = eventually(async || {
        fires_json(db, routine)
            .into_iter()
            .find(|f| f["run_state"] == "running" && f["status"] == "fired")
    })
    .await;
    assert!(
        running.is_some(),
        "{:?}\n{}",
        fires_json(db, routine),
        a.log()
    );
    fake.exit(&container.name, 3);
    let failed = eventually(async || {
        fires_json(db, routine)
            .into_iter()
            .find(|f| f["run_state"] == "failed")
    })
    .await
    .unwrap_or_else(|| panic!("{:?}\n{}", fires_json(db, routine), a.log()));
    assert_eq!(failed["run_exit_code"], 3);
    assert_eq!(failed["run_reason"], "exit code 3");
    let table = ok(&db.url, &["fires", "--routine", &routine.to_string()]);
    assert!(table.contains("failed (exit 3)"), "{table}");
    let shown = ok(&db.url, &["routine", "show", &routine.to_string()]);
    assert!(shown.contains("failed (exit 3)"), "{shown}");
    assert!(
        a.log().contains("mission run ended"),
        "the end is logged: {}",
        a.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_forbid_an_occurrence_due_while_a_run_is_running_is_skipped_naming_it() {
    let fake = FakeDocker::start(&[IMAGE]);
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    // Every 5 s; the fake's containers run until told to exit.
    let routine = mission_routine(&db, &files);
    let shown = ok(&db.url, &["routine", "show", &routine.to_string()]);
    assert!(shown.contains("overlap     forbid"), "{shown}");
    let a = scheduler(&db, &fake, "A");
    let skipped = eventually(async || {
        let listed = ok(
            &db.url,
            &[
                "fires",
                "--routine",
                &routine.to_string(),
                "--status",
                "skipped",
                "--json",
            ],
        );
        listed
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|f| f["status"] == "skipped")
    })
    .await
    .unwrap_or_else(|| panic!("nothing skipped; log:\n{}", a.log()));
    ok(&db.url, &["routine", "pause", &routine.to_string()]);
    let containers = fake.containers();
    assert_eq!(containers.len(), 1, "one run at a time: {containers:?}");
    let reason = skipped["error"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&containers[0].name) && reason.contains("still running"),
        "{reason}"
    );

    // Under allow, the next occurrence launches beside the running one.
    ok(
        &db.url,
        &[
            "routine",
            "update",
            &routine.to_string(),
            "--overlap",
            "allow",
        ],
    );
    ok(&db.url, &["routine", "resume", &routine.to_string()]);
    let second = eventually(async || (fake.containers().len() >= 2).then_some(())).await;
    assert!(
        second.is_some(),
        "allow launched no second run; log:\n{}",
        a.log()
    );
    // --overlap is refused for a message routine, and writes nothing.
    let message = created_id(&ok(
        &db.url,
        &create_args("msg", "0 9 * * *", &["--message", "hi"]),
    ));
    check_fails(
        &db.url,
        &[
            "routine",
            "update",
            &message.to_string(),
            "--overlap",
            "allow",
        ],
        2,
        "mission routines",
    );
}
