//! A stop counts only when the runtime confirms the run gone, and a run is judged only where its
//! files are, on the process backend through whole scheduler processes: `replace` launches the
//! next run only once the old one's process group has exited (a run that cleans up for 8 s on
//! SIGTERM), a stop that outlasts the dispatch's deadline leaves the old run the routine's and
//! the new occurrence `skipped`, and two schedulers started in different directories on one
//! database never call each other's runs `lost` nor run two of a `forbid` routine at once.
//!
//! Each run writes `start NANOS` when it starts and `end NANOS` when it ends to a file of its
//! own, named by its idempotency key, so the test reads when every run was alive.

use std::path::{Path, PathBuf};
use std::time::Duration;

use uuid::Uuid;

use crate::cli::{MissionFiles, create_args, created_id, ok};
use crate::crash::SchedulerProcess;
use crate::missions_real::fires;
use crate::support::{TestDb, cm_scheduler, eventually_within};

/// The program every mission runs: records its start, sleeps, and on SIGTERM cleans up for
/// `cleanup` seconds before it records its end (once, however many SIGTERMs come).
fn script(runs: &Path, nap: u32, cleanup: u32) -> String {
    format!(
        r#"log="{runs}/$CM_IDEMPOTENCY_KEY"
echo "start $(date +%s%N)" >> "$log"
trap 'if [ -z "$stopping" ]; then stopping=1; sleep {cleanup}; echo "end $(date +%s%N)" >> "$log"; exit 143; fi' TERM
sleep {nap} & wait $!
echo "end $(date +%s%N)" >> "$log""#,
        runs = runs.display()
    )
}

/// A directory for the runs' records, removed with `files`.
fn runs_dir(files: &MissionFiles) -> PathBuf {
    let dir = PathBuf::from(files.path("runs"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A mission routine on `schedule` under `overlap`.
fn mission_routine(db: &TestDb, files: &MissionFiles, schedule: &str, overlap: &str) -> Uuid {
    let mission = files.write(
        "mission.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "report"}"#,
    );
    created_id(&ok(
        &db.url,
        &create_args(
            "stopped",
            schedule,
            &["--mission", &mission, "--overlap", overlap],
        ),
    ))
}

/// When each run was alive, in nanoseconds since the epoch: `(start, end)`, the end `None` while
/// it runs, ordered by start.
fn lifetimes(runs: &Path) -> Vec<(String, u128, Option<u128>)> {
    let mut lives: Vec<_> = std::fs::read_dir(runs)
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|entry| {
                    let text = std::fs::read_to_string(entry.path()).ok()?;
                    let at = |what: &str| {
                        text.lines()
                            .find_map(|l| l.strip_prefix(what)?.trim().parse::<u128>().ok())
                    };
                    Some((
                        entry.file_name().to_string_lossy().into_owned(),
                        at("start ")?,
                        at("end "),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    lives.sort_by_key(|(_, start, _)| *start);
    lives
}

/// Asserts that no two runs were alive at once.
fn assert_never_two_at_once(runs: &Path, log: &str) {
    let lives = lifetimes(runs);
    for pair in lives.windows(2) {
        let ((before, _, ended), (after, started, _)) = (&pair[0], &pair[1]);
        assert!(
            ended.is_some_and(|ended| ended <= *started),
            "{after} started while {before} was alive: {lives:?}\n{log}"
        );
    }
}

/// `run`'s settings for these tests: a quick tick, and the dispatch's deadline (which bounds a
/// stop) with a lease longer than it.
fn settings<'a>(dispatch_timeout: &'a str, lease: &'a str) -> [&'a str; 8] {
    [
        "--tick-interval",
        "200ms",
        "--lease",
        lease,
        "--dispatch-timeout",
        dispatch_timeout,
        "--outbox-mode",
        "dispatched",
    ]
}

/// A `replace` mission routine every 10 s whose runs clean up for 8 s on SIGTERM, and one
/// process scheduler running it with the dispatch's deadline `dispatch_timeout`. Fields drop in
/// order: the scheduler ends before its files and its database go.
struct Replacing {
    scheduler: SchedulerProcess,
    routine: Uuid,
    runs: PathBuf,
    _files: MissionFiles,
    db: TestDb,
}

impl Replacing {
    async fn start(dispatch_timeout: &str, lease: &str) -> Replacing {
        let db = TestDb::new().await;
        let files = MissionFiles::new();
        let runs = runs_dir(&files);
        let script = script(&runs, 60, 8);
        let workdir = files.path("workdir");
        let routine = mission_routine(&db, &files, "*/10 * * * * *", "replace");
        let scheduler = SchedulerProcess::start_with_settings(
            &db,
            "A",
            &settings(dispatch_timeout, lease),
            &[
                "--mission-backend",
                "process",
                "--mission-workdir",
                &workdir,
                "--mission-command",
                "/bin/sh",
                "-c",
                &script,
            ],
            &[],
        );
        Replacing {
            scheduler,
            routine,
            runs,
            _files: files,
            db,
        }
    }

    /// The routine's fire rows.
    fn fires(&self) -> Vec<serde_json::Value> {
        fires(&self.db, self.routine)
    }

    /// What went wrong, for a failed assertion: the runs' lives, the fires and the log.
    fn state(&self) -> String {
        format!(
            "{:?}\n{:?}\n{}",
            lifetimes(&self.runs),
            self.fires(),
            self.scheduler.log()
        )
    }
}

/// Under `replace`, the next run is launched only once the old run's process group has exited:
/// a run that cleans up for 8 s after SIGTERM (within the stop's grace) is never alive beside
/// its successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_launches_the_next_process_run_only_once_the_old_one_exited() {
    let case = Replacing::start("30s", "40s").await;
    // Two runs replaced (each stopped, cleaned up and ended) and a third started.
    let replaced = eventually_within(Duration::from_secs(75), async || {
        let lives = lifetimes(&case.runs);
        (lives.len() >= 3 && lives.iter().filter(|(_, _, end)| end.is_some()).count() >= 2)
            .then_some(lives)
    })
    .await;
    assert!(replaced.is_some(), "{}", case.state());
    assert_never_two_at_once(&case.runs, &case.scheduler.log());
    // The stopped runs ended by their SIGTERM (143), after their cleanup: failed, not lost.
    let fires = case.fires();
    assert!(fires.iter().all(|f| f["run_state"] != "lost"), "{fires:?}");
}

/// A stop not confirmed by the dispatch's deadline (3 s, while the run cleans up for 8 s) leaves
/// the old run the routine's and the new occurrence `skipped` with the reason; the run after
/// launches once the old one ended. Never two runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_whose_stop_outlasts_its_deadline_skips_the_new_occurrence() {
    let case = Replacing::start("3s", "6s").await;
    // The first run, a skipped occurrence, and a second run launched after the first ended.
    let settled = eventually_within(Duration::from_secs(75), async || {
        let fires = case.fires();
        let skipped = fires.iter().any(|f| f["status"] == "skipped");
        (skipped && lifetimes(&case.runs).len() >= 2).then_some(fires)
    })
    .await;
    let fires = settled.unwrap_or_else(|| panic!("{}", case.state()));
    let skipped: Vec<_> = fires.iter().filter(|f| f["status"] == "skipped").collect();
    for fire in &skipped {
        let error = fire["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("could not stop") && error.contains("after SIGTERM"),
            "{fire:?}"
        );
    }
    assert_never_two_at_once(&case.runs, &case.scheduler.log());
    assert!(fires.iter().all(|f| f["run_state"] != "lost"), "{fires:?}");
}

/// A `cm-scheduler run` started in the directory `cwd`, its log in a file; killed when dropped.
struct StartedIn {
    child: std::process::Child,
    log: PathBuf,
}

impl StartedIn {
    fn start(db: &TestDb, cwd: &Path, instance: &str, script: &str) -> StartedIn {
        let log = std::env::temp_dir().join(format!("{}-{instance}.log", db.name));
        let mut command = cm_scheduler();
        command
            .current_dir(cwd)
            .args(["--database-url", &db.url, "run", "--instance-id", instance])
            .args(settings("3s", "6s"))
            // No --mission-workdir: each scheduler's is `cm-missions` where it started.
            .args(["--mission-backend", "process", "--mission-command"])
            .args(["/bin/sh", "-c", script]);
        let child = crate::support::spawn_logged(&mut command, &[], &log);
        StartedIn { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for StartedIn {
    fn drop(&mut self) {
        crate::support::end_scheduler(&mut self.child, &self.log);
    }
}

/// Two process schedulers on one database, started in different directories (so each keeps
/// its runs in a `cm-missions` of its own): each watches the other's runs where they are, so
/// no run of a `forbid` routine is called `lost`, and never are two alive at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_schedulers_in_different_directories_judge_each_others_runs_where_they_are() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let runs = runs_dir(&files);
    let script = script(&runs, 3, 0);
    let routine = mission_routine(&db, &files, "*/2 * * * * *", "forbid");
    let (here, there) = (
        PathBuf::from(files.path("a")),
        PathBuf::from(files.path("b")),
    );
    std::fs::create_dir_all(&here).unwrap();
    std::fs::create_dir_all(&there).unwrap();
    let a = StartedIn::start(&db, &here, "A", &script);
    let b = StartedIn::start(&db, &there, "B", &script);
    let logs = || format!("A:\n{}\nB:\n{}", a.log(), b.log());
    // Three runs ended, each watched by both schedulers.
    let ended = eventually_within(Duration::from_secs(60), async || {
        let lives = lifetimes(&runs);
        (lives.iter().filter(|(_, _, end)| end.is_some()).count() >= 3).then_some(())
    })
    .await;
    assert!(
        ended.is_some(),
        "{:?}\n{:?}\n{}",
        lifetimes(&runs),
        fires(&db, routine),
        logs()
    );
    // The runs' files are where each was launched, never in the directory `run` was given
    // relative to another scheduler's.
    let fires = fires(&db, routine);
    assert!(
        fires.iter().all(|f| f["run_state"] != "lost"),
        "a run was called lost: {fires:?}\n{}",
        logs()
    );
    assert_never_two_at_once(&runs, &logs());
    assert!(
        here.join("cm-missions").is_dir() && there.join("cm-missions").is_dir(),
        "each scheduler's default work directory is where it started"
    );
}
