//! Missions as an operator meets them without a container engine: the overlap policy in
//! `routine import`, `run --mission-backend docker` started before its engine, and the process
//! backend's runs watched to their end.

use std::time::Duration;

use cm_dispatch::fakes::docker::FakeDocker;

use crate::cli::{MissionFiles, ok};
use crate::missions_real::{SCRIPT, ended_zero_and_three, fires, routine};
use crate::operate::Running;
use crate::operator::{case, check_refused};
use crate::support::{TestDb, eventually_within};

/// JSON Lines give a mission routine its `overlap` (`forbid` when the line names none), checked
/// as `--overlap` is; a message routine's line may not have one. `--upsert` and `--sync` set it
/// again from the file.
#[tokio::test]
async fn import_reads_a_missions_overlap_and_refuses_a_bad_one() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    files.write(
        "m.json",
        r#"{"repository": "https://example.invalid/r.git", "task": "m"}"#,
    );
    let line = |name: &str, overlap: &str| {
        format!(r#"{{"name": "{name}", "schedule": "0 3 * * *", "mission": "m.json"{overlap}}}"#)
    };
    let file = files.write(
        "missions.jsonl",
        &[
            line("allowed", r#", "overlap": "allow""#),
            line("default", ""),
            line("replaced", r#", "overlap": "replace""#),
            r#"{"name": "note", "schedule": "0 3 * * *", "message": "hi"}"#.to_owned(),
        ]
        .join("\n"),
    );
    let out = ok(url, &["routine", "import", &file]);
    assert_eq!(out.lines().count(), 4, "{out}");
    let overlap = async |name: &str| db.stored(name).await["overlap"].clone();
    assert_eq!(overlap("allowed").await, "allow");
    assert_eq!(overlap("default").await, "forbid");
    assert_eq!(overlap("replaced").await, "replace");
    let shown = ok(url, &["routine", "show", "allowed"]);
    assert!(shown.contains("overlap     allow"), "{shown}");

    // Refused with the line, nothing written.
    let bad = |name: &str, text: String| files.write(name, &format!("{}\n{text}\n", line("x", "")));
    let cases = [
        (
            bad("value.jsonl", line("y", r#", "overlap": "sometimes""#)),
            ":2: \"overlap\": ",
        ),
        (
            bad(
                "message.jsonl",
                r#"{"name": "y", "schedule": "0 3 * * *", "message": "hi", "overlap": "allow"}"#
                    .to_owned(),
            ),
            ":2: \"overlap\" is for mission routines",
        ),
    ];
    let cases: Vec<_> = cases
        .iter()
        .map(|(file, fragment)| case(&["routine", "import", file], fragment))
        .collect();
    check_refused(&db, &cases).await;
    let value = crate::cli::cm(url, &["routine", "import", &cases[0].0[2]]);
    assert!(value.stderr.contains("sometimes"), "{value:?}");

    // --upsert sets it from the file again: a line without one goes back to forbid.
    let again = files.write(
        "again.jsonl",
        &[
            line("allowed", ""),
            line("default", r#", "overlap": "replace""#),
        ]
        .join("\n"),
    );
    ok(url, &["routine", "import", &again, "--upsert"]);
    assert_eq!(overlap("allowed").await, "forbid");
    assert_eq!(overlap("default").await, "replace");

    // --sync: a line that changes only the overlap updates the routine and says so.
    let synced = files.write("synced.jsonl", &line("s", r#", "overlap": "allow""#));
    let first = ok(url, &["routine", "import", &synced, "--sync"]);
    assert!(first.starts_with("created"), "{first}");
    assert_eq!(overlap("s").await, "allow");
    let same = ok(url, &["routine", "import", &synced, "--sync"]);
    assert!(same.starts_with("unchanged"), "{same}");
    std::fs::write(&synced, line("s", r#", "overlap": "replace""#)).unwrap();
    let changed = ok(url, &["routine", "import", &synced, "--sync"]);
    assert!(changed.starts_with("updated"), "{changed}");
    assert_eq!(overlap("s").await, "replace");
}

/// Starts forwarding connections on the Unix socket `path` to `to`, byte for byte, on threads
/// of its own: the engine's socket appearing where the scheduler was told to find it.
fn forward(path: &std::path::Path, to: std::net::SocketAddr) {
    let listener = std::os::unix::net::UnixListener::bind(path).expect("binding the socket");
    std::thread::spawn(move || {
        for inbound in listener.incoming().flatten() {
            let Ok(outbound) = std::net::TcpStream::connect(to) else {
                continue;
            };
            let (mut in_read, mut out_write) =
                (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut in_read, &mut out_write);
                let _ = out_write.shutdown(std::net::Shutdown::Write);
            });
            let (mut out_read, mut in_write) = (outbound, inbound);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut out_read, &mut in_write);
                let _ = in_write.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

/// `run --mission-backend docker` with no engine at its address waits for one: it does not
/// exit, `/readyz` answers 503 naming the engine's address and why, and it is ready once an
/// engine answers there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_docker_engine_that_is_not_there_yet() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    // A socket in a directory that exists, not there yet.
    let socket = std::path::PathBuf::from(format!("{}.sock", files.write("engine", "")));
    let host = format!("unix://{}", socket.display());
    let mut scheduler = Running::start_with(
        &db.url,
        &[
            "--mission-backend",
            "docker",
            "--mission-image",
            "registry.example.com/cm/runner:1",
        ],
        &[("DOCKER_HOST", &host)],
    );
    let body = scheduler
        .await_answer("/readyz", 503, "waiting for the mission runtime")
        .await;
    assert!(
        body.contains(&host) && body.contains("no socket at"),
        "{body}"
    );
    // Still waiting a few seconds on, not exited: time passes on purpose, to show it does not
    // give up.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    scheduler.assert_alive();
    scheduler.await_answer("/readyz", 503, &host).await;

    let fake = FakeDocker::start(&["registry.example.com/cm/runner:1"]);
    let fake_addr = fake
        .host()
        .trim_start_matches("tcp://")
        .parse()
        .expect("the fake's address");
    forward(&socket, fake_addr);
    scheduler.await_answer("/readyz", 200, "ready").await;
    scheduler.assert_alive();
    assert!(
        scheduler.log().contains("the mission runtime answers"),
        "{}",
        scheduler.log()
    );
}

/// `run`'s flags for the process backend in `workdir`, running [`SCRIPT`].
pub(crate) fn process_backend(workdir: &str) -> [&str; 10] {
    [
        "--mission-backend",
        "process",
        "--mission-workdir",
        workdir,
        "--mission-env-allow",
        "NAP,CODE",
        "--mission-command",
        "/bin/sh",
        "-c",
        SCRIPT,
    ]
}

/// The process backend's runs are watched to their end from its exit files: `succeeded` for
/// exit 0, `failed` with exit code 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_backend_runs_end_succeeded_and_failed_with_their_exit_code() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let zero = routine(&db, &files, "zero", "*/2 * * * * *", 0, 0, "forbid");
    let three = routine(&db, &files, "three", "*/2 * * * * *", 0, 3, "forbid");
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let scheduler = Running::start_with(&db.url, &process_backend(&workdir), &[]);
    ended_zero_and_three(&db, zero, three, || scheduler.log()).await;
    // No fire of either is left running once the last run ended.
    let settled = eventually_within(Duration::from_secs(20), async || {
        [zero, three]
            .iter()
            .all(|&r| fires(&db, r).iter().all(|f| f["run_state"] != "running"))
            .then_some(())
    })
    .await;
    assert!(settled.is_some(), "{:?}", fires(&db, zero));
    let _ = std::fs::remove_dir_all(&workdir);
}

/// The pids of the process wrappers the markers in `workdir` record, and whether each is still
/// a process.
fn marker_pids(workdir: &str) -> Vec<(u32, bool)> {
    std::fs::read_dir(workdir)
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".launched"))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|m| m.lines().next()?.strip_prefix("pid ")?.parse().ok())
                .map(|pid: u32| (pid, std::path::Path::new(&format!("/proc/{pid}")).exists()))
                .collect()
        })
        .unwrap_or_default()
}

/// SIGINT stops the scheduler and leaves its process missions running in their own group; the
/// scheduler started next re-adopts them from their markers and exit files: a run that ended
/// while no scheduler ran settles with its exit code (`failed (exit 3)`), one still going when
/// it starts is watched to its end (`succeeded`), and neither is `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_missions_outlive_a_restart_and_are_re_adopted() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let short = routine(&db, &files, "short", "*/2 * * * * *", 3, 3, "forbid");
    let long = routine(&db, &files, "long", "*/2 * * * * *", 9, 0, "forbid");
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    let args = process_backend(&workdir);
    let mut first = Running::start_with(&db.url, &args, &[]);
    let launched = eventually_within(Duration::from_secs(30), async || {
        [short, long]
            .iter()
            .all(|&r| fires(&db, r).iter().any(|f| f["run_state"] == "running"))
            .then_some(())
    })
    .await;
    for id in [short, long] {
        ok(&db.url, &["routine", "pause", &id.to_string()]);
    }
    assert!(launched.is_some(), "{}", first.log());
    let exit = first.signal("-INT").await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        first.log()
    );
    let pids = marker_pids(&workdir);
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(
        pids.iter().all(|&(_, alive)| alive),
        "a mission died with its scheduler: {pids:?}"
    );
    // The short run (3 s) ends while no scheduler runs.
    let short_ended = eventually_within(Duration::from_secs(20), async || {
        std::fs::read_dir(&workdir)
            .ok()?
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().ends_with(".exit"))
            .map(|_| ())
    })
    .await;
    assert!(short_ended.is_some(), "{:?}", marker_pids(&workdir));
    assert!(
        marker_pids(&workdir).iter().any(|&(_, alive)| alive),
        "the long run is still going when the next scheduler starts"
    );

    let second = Running::start_with(&db.url, &args, &[]);
    let launched_fire = |routine| {
        fires(&db, routine)
            .into_iter()
            .find(|f| f["status"] == "fired")
            .expect("a launched fire")
    };
    let settled = eventually_within(Duration::from_secs(30), async || {
        let (s, l) = (launched_fire(short), launched_fire(long));
        (s["run_state"] != "running" && l["run_state"] != "running").then_some((s, l))
    })
    .await;
    let (s, l) = settled.unwrap_or_else(|| {
        panic!(
            "{:?}\n{:?}\n{}",
            fires(&db, short),
            fires(&db, long),
            second.log()
        )
    });
    assert_eq!(
        (&s["run_state"], &s["run_exit_code"]),
        (&serde_json::json!("failed"), &serde_json::json!(3)),
        "{s:?}"
    );
    assert_eq!(
        (&l["run_state"], &l["run_exit_code"]),
        (&serde_json::json!("succeeded"), &serde_json::json!(0)),
        "{l:?}"
    );
    let _ = std::fs::remove_dir_all(&workdir);
}

/// `--pause-after-failures 3` on a mission that exits 3, due every 2 s: the transaction that
/// records its third failed run pauses it, so it runs at most four times (the fourth only if
/// it was claimed while the third's end was being recorded), however long the maintenance
/// pass's period. Before, the pause came with that pass, every half lease: 15 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mission_failing_every_2_s_is_paused_at_its_third_failure() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let three = routine(&db, &files, "three", "*/2 * * * * *", 0, 3, "forbid");
    let workdir = format!("{}.d", files.write("workdir-marker", ""));
    // The maintenance pass (and its pause) every 30 s: later than this test waits. The
    // backend's flags come last: --mission-command takes the rest of the line.
    let mut flags = vec!["--pause-after-failures", "3", "--lease", "60s"];
    flags.extend(process_backend(&workdir));
    let scheduler = Running::start_with(&db.url, &flags, &[]);
    let paused = eventually_within(Duration::from_secs(25), async || {
        let shown = db.stored("three").await;
        (shown["paused"] == true).then_some(shown)
    })
    .await;
    let Some(paused) = paused else {
        panic!("not paused within 25 s:\n{}", scheduler.log());
    };
    assert!(
        paused["paused_reason"]
            .as_str()
            .is_some_and(|r| r.contains("its last 3 fires failed") && r.contains("exit code 3")),
        "{paused}"
    );
    // Nothing claimed after the pause: wait for two more occurrences' time and count.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let runs = fires(&db, three);
    let failed = runs.iter().filter(|f| f["run_state"] == "failed").count();
    assert!(failed >= 3, "{runs:?}");
    assert!(runs.len() <= 4, "{} runs: {runs:?}", runs.len());
    let _ = std::fs::remove_dir_all(&workdir);
}
