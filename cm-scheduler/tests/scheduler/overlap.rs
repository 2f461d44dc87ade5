//! Overlap `replace` when the runtime refuses the stop: the old run keeps the routine's run and
//! the new occurrence is `skipped` with the reason, so no two runs of one routine are ever up
//! at once, on the fake Docker engine (stops answered 403) and on the fake Kubernetes API (an
//! identity whose Role lost `delete` on Jobs); and a scheduler whose identity lacks a verb the
//! backend needs refuses to start, naming it.

use std::time::{Duration, Instant};

use cm_dispatch::fakes::docker::FakeDocker;
use cm_dispatch::fakes::kubernetes::FakeKubernetes;
use uuid::Uuid;

use crate::cli::{MissionFiles, create_args, created_id, ok};
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, cm_scheduler};

const IMAGE: &str = "registry.example.com/cm/mission-runner:1.4";
const KUBE_TOKEN: &str = "kube-token-overlap-5d1c";

/// A mission routine on `schedule` under `--overlap replace`.
fn replace_routine(db: &TestDb, files: &MissionFiles, schedule: &str) -> Uuid {
    let mission = files.write(
        "mission.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "report"}"#,
    );
    created_id(&ok(
        &db.url,
        &create_args(
            "replaced",
            schedule,
            &["--mission", &mission, "--overlap", "replace"],
        ),
    ))
}

/// The fires of the routine as (status, error), oldest first.
async fn fires(db: &TestDb) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT status, error FROM cm.routine_fires ORDER BY scheduled_at")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// Samples `running` every 20 ms for `span`, returning the most seen at once: a measurement over
/// the whole span, not a wait for a state.
async fn most_at_once(span: Duration, running: impl Fn() -> usize) -> usize {
    let end = Instant::now() + span;
    let mut most = 0;
    while Instant::now() < end {
        most = most.max(running());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_whose_stop_the_engine_refuses_never_runs_two_containers() {
    let fake = FakeDocker::start(&[IMAGE]);
    fake.refuse_stops(Some((
        403,
        "authorization denied by plugin cm-guard: stop not allowed",
    )));
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    replace_routine(&db, &files, "*/2 * * * * *");
    let _s = SchedulerProcess::start_with(
        &db,
        "A",
        &["--mission-backend", "docker", "--mission-image", IMAGE],
        &[("DOCKER_HOST", &fake.host())],
    );
    // Four occurrences or more come due while the first run holds the routine.
    let most = most_at_once(Duration::from_secs(9), || fake.running().len()).await;
    assert_eq!(most, 1, "two containers of one routine ran at once");
    let fires = fires(&db).await;
    assert!(fires.len() >= 3, "{fires:?}");
    assert_eq!(fires[0].0, "fired", "{fires:?}");
    let refused: Vec<_> = fires
        .iter()
        .skip(1)
        .filter(|(status, _)| status != "claimed")
        .collect();
    assert!(!refused.is_empty(), "{fires:?}");
    for (status, error) in refused {
        let error = error.as_deref().unwrap_or_default();
        assert_eq!(status, "skipped", "{fires:?}");
        assert!(
            error.contains("could not stop") && error.contains("stop not allowed"),
            "{error}"
        );
    }
    // Once the engine stops containers again, the next occurrence replaces the run: still one.
    fake.refuse_stops(None);
    let most = most_at_once(Duration::from_secs(5), || fake.running().len()).await;
    assert_eq!(most, 1, "replace launched beside the run it stopped");
    let replaced = fake
        .containers()
        .into_iter()
        .filter(|c| c.exit_code == Some(137))
        .count();
    assert!(
        replaced >= 1,
        "nothing was replaced: {:?}",
        fake.containers()
    );
}

/// A `cm-scheduler run` on the fake API server with the Kubernetes backend.
fn kube_scheduler(db: &TestDb, files: &MissionFiles, fake: &FakeKubernetes) -> SchedulerProcess {
    let kubeconfig = files.write("kubeconfig", &fake.kubeconfig("missions"));
    let settings = files.write(
        "settings.json",
        r#"{"kubernetes": {"namespace": "missions"}}"#,
    );
    SchedulerProcess::start_with(
        db,
        "K",
        &[
            "--mission-backend",
            "kubernetes",
            "--mission-image",
            IMAGE,
            "--mission-config",
            &settings,
        ],
        &[("KUBECONFIG", &kubeconfig)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_whose_job_delete_is_forbidden_never_runs_two_jobs() {
    let fake = FakeKubernetes::start(&["missions"], KUBE_TOKEN);
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let s = kube_scheduler(&db, &files, &fake);
    replace_routine(&db, &files, "*/2 * * * * *");
    // The Role loses `delete` after the start-up check and the first launch: every stop is
    // refused 403 from then on.
    let launched = crate::crash::eventually(async || (!fake.jobs().is_empty()).then_some(())).await;
    assert!(launched.is_some(), "no Job launched: {}", s.log());
    fake.grant_only(Some(&[
        "create jobs",
        "get jobs",
        "list pods",
        "get pods/log",
    ]));
    // The fake's Jobs never finish: each stored Job is a run still going.
    let most = most_at_once(Duration::from_secs(9), || fake.jobs().len()).await;
    assert_eq!(
        most,
        1,
        "two Jobs of one routine at once: {:?}",
        fake.jobs()
    );
    let fires = fires(&db).await;
    let skipped: Vec<_> = fires.iter().filter(|(s, _)| s == "skipped").collect();
    assert!(!skipped.is_empty(), "{fires:?}");
    assert!(
        skipped
            .iter()
            .all(|(_, e)| e.as_deref().unwrap_or_default().contains("forbidden")),
        "{skipped:?}"
    );
    assert!(!fires.iter().any(|(s, _)| s == "failed"), "{fires:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_identity_without_delete_is_refused_at_start() {
    let fake = FakeKubernetes::start(&["missions"], KUBE_TOKEN);
    fake.grant_only(Some(&["create jobs", "get jobs"]));
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let kubeconfig = files.write("kubeconfig", &fake.kubeconfig("missions"));
    let settings = files.write(
        "settings.json",
        r#"{"kubernetes": {"namespace": "missions"}}"#,
    );
    let mut command = cm_scheduler();
    command
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "--database-url",
            &db.url,
            "run",
            "--mission-backend",
            "kubernetes",
        ])
        .args(["--mission-image", IMAGE, "--mission-config", &settings]);
    let run = crate::cli::run(command);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let last = run.stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("delete jobs, list pods, get pods/log"),
        "{}",
        run.stderr
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_run_that_ends_is_counted_once_however_many_schedulers_watch_it(pool: sqlx::PgPool) {
    use std::sync::Arc;

    use cm_dispatch::runtime::MockMissionRuntime;
    use cm_domain::{RunState, RunStateName};
    use cm_scheduler::Stats;
    use cm_scheduler::runs::RunWatch;
    use cm_store::{PgStore, RoutineKind, RoutineStore};

    use crate::support::new_routine;

    let store = PgStore::new(pool.clone());
    let routine = store
        .create_routine(new_routine(
            "watched",
            "* * * * *",
            "UTC",
            RoutineKind::Mission,
            serde_json::json!({"repository": "https://git.example.com/r.git", "task": "t"}),
        ))
        .await
        .unwrap();
    // A launched mission whose run is running.
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, status, completed_at, claimant, claim_token, attempt,
              claimed_at, lease_expires_at, run_state)
         VALUES ($1, '2026-09-21T12:00:00Z', 'fired', now(), 'A', gen_random_uuid(), 1,
                 now(), now(), 'running')",
    )
    .bind(routine.id)
    .execute(&pool)
    .await
    .unwrap();
    // Two schedulers watch every run, and both find it ended with exit code 3.
    let watch = || {
        let mut runtime = MockMissionRuntime::new();
        runtime
            .expect_observe()
            .returning(|_, _| Ok(RunState::exited(3, "")));
        runtime
            .expect_report()
            .returning(|_, _| Ok(cm_dispatch::RunReport::default()));
        RunWatch {
            store: Arc::new(store.clone()),
            runtime: Arc::new(runtime),
            secrets: Vec::new(),
            retries: Arc::default(),
        }
    };
    let (a, b) = (watch(), watch());
    let (stats_a, stats_b) = (Stats::default(), Stats::default());
    let (ended_a, ended_b) = tokio::join!(a.pass(&stats_a), b.pass(&stats_b));
    assert_eq!(ended_a.unwrap() + ended_b.unwrap(), 1, "one run ended");
    let failed = RunStateName::Failed as usize;
    assert_eq!(
        Stats::get(&stats_a.mission_runs[failed]) + Stats::get(&stats_b.mission_runs[failed]),
        1,
        "a run counted once per watching scheduler"
    );
}
