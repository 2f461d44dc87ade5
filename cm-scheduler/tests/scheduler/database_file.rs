//! The database URL from a file (issue 27): `--database-url-file` and `DATABASE_URL_FILE` read
//! it bounded and trimmed, refuse to be given beside `--database-url` or `DATABASE_URL`, and
//! keep its password out of what is printed. With it the password is nowhere in the scheduler's
//! environment or command line, so a process-backend mission (a child of the scheduler, as its
//! user, started with a cleared environment under a wrapper shell) that prints its own
//! environment and reads the scheduler's `/proc/PID/environ` and `/proc/PID/cmdline` (its
//! parent's parent) finds no password; given through
//! `DATABASE_URL` instead, the same mission reads it from the scheduler's environment.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cli::{MissionFiles, NOWHERE, create_args, created_id, ok, run};
use crate::support::{SERVER, TestDb, cm_scheduler, eventually_within};

/// A distinctive password: finding it in a mission's output can only mean it leaked.
const FILE_PASSWORD: &str = "DbFilePassCanary7";
/// The password given through `DATABASE_URL`, to show the probe finds one when it is there.
const ENV_PASSWORD: &str = "DbEnvPassCanary7";

/// The binary with no database URL in its environment, for the tests of the other ways to give
/// one: each use names its database through a file, the flag or the environment.
fn bare() -> Command {
    let mut command = cm_scheduler();
    command.env_remove("DATABASE_URL");
    command
}

#[tokio::test]
async fn the_url_is_read_from_a_file_and_given_once() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let file = files.write("database-url", &format!("{}\n", db.url));
    ok(
        &db.url,
        &create_args("n", "0 3 * * *", &["--message", "hi"]),
    );

    // From the flag and from the environment, the trailing newline dropped.
    let mut flag = bare();
    flag.args(["--database-url-file", &file, "routine", "list"]);
    let mut env = bare();
    env.env("DATABASE_URL_FILE", &file)
        .args(["routine", "list"]);
    for command in [flag, env] {
        let out = run(command);
        assert_eq!(out.code, Some(0), "{out:?}");
        assert!(out.stdout.contains(" n "), "{out:?}");
    }

    // Given twice, whichever way: refused, saying so, before anything is tried.
    let mut both_flags = bare();
    both_flags.args([
        "--database-url",
        &db.url,
        "--database-url-file",
        &file,
        "routine",
        "list",
    ]);
    let mut env_and_flag = bare();
    env_and_flag.env("DATABASE_URL", &db.url).args([
        "--database-url-file",
        &file,
        "routine",
        "list",
    ]);
    let mut flag_and_env = bare();
    flag_and_env.env("DATABASE_URL_FILE", &file).args([
        "--database-url",
        &db.url,
        "routine",
        "list",
    ]);
    let empty = files.write("empty", "\n");
    let mut empty_file = bare();
    empty_file.args(["--database-url-file", &empty, "routine", "list"]);
    // A file far larger than the limit (sparse): read no further than the limit.
    let huge = files.path("huge");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(1 << 30))
        .expect("writing a sparse file");
    let mut endless = bare();
    endless.args(["--database-url-file", &huge, "routine", "list"]);
    let mut missing = bare();
    missing.args([
        "--database-url-file",
        &files.path("missing"),
        "routine",
        "list",
    ]);
    for (command, fragment) in [
        (both_flags, "given twice"),
        (env_and_flag, "given twice"),
        (flag_and_env, "given twice"),
        (empty_file, "is empty"),
        (endless, "64 KiB"),
        (missing, "cannot read --database-url-file"),
    ] {
        let out = run(command);
        assert_eq!(out.code, Some(2), "{fragment}: {out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert!(out.stderr.contains(fragment), "{fragment}: {out:?}");
    }

    // The file's password is a secret like the flag's: never printed.
    let failing = files.write(
        "failing-url",
        &format!(
            "{}\n",
            NOWHERE.replace("postgres@", &format!("postgres:{FILE_PASSWORD}@"))
        ),
    );
    let mut command = bare();
    command.args(["--database-url-file", &failing, "routine", "list"]);
    let out = run(command);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(!out.stderr.contains(FILE_PASSWORD), "{out:?}");
    assert!(out.stderr.contains("***"), "{out:?}");
}

/// A `cm-scheduler run` process, killed when dropped.
struct Scheduler(Child, PathBuf);

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

/// What the mission prints: its own environment, then the scheduler's (the parent of its
/// wrapper shell) environment and command line, each after a marker, then an end marker.
const PROBE: &str = r#"read -r _ _ _ scheduler _ < "/proc/$PPID/stat"; echo '== env'; env; echo '== parent environ'; tr '\0' '\n' < "/proc/$scheduler/environ"; echo '== parent cmdline'; tr '\0' ' ' < "/proc/$scheduler/cmdline"; echo; echo '== end'"#;

/// Starts a process-backend scheduler (`database` are its database arguments, `env` its extra
/// environment) whose missions run [`PROBE`], and returns the first complete output a mission
/// wrote.
async fn probe_output(database: &[&str], env: &[(&str, &str)], workdir: &Path) -> String {
    let log = workdir.with_extension("log");
    let file = std::fs::File::create(&log).unwrap();
    let child = bare()
        .args(database)
        .args([
            "run",
            "--tick-interval",
            "200ms",
            "--mission-backend",
            "process",
        ])
        .arg("--mission-workdir")
        .arg(workdir)
        .args(["--mission-command", "/bin/sh", "-c", PROBE])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("starting cm-scheduler run");
    let scheduler = Scheduler(child, log.clone());
    let found = eventually_within(Duration::from_secs(30), async || {
        std::fs::read_dir(workdir)
            .ok()?
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .find(|text| text.contains("== end"))
    })
    .await;
    let scheduler_log = std::fs::read_to_string(&log).unwrap_or_default();
    drop(scheduler);
    found.unwrap_or_else(|| panic!("no mission ran; the scheduler's log:\n{scheduler_log}"))
}

/// The lines between `start` and the next `==` marker.
fn section<'a>(text: &'a str, start: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != start)
        .skip(1)
        .take_while(|l| !l.starts_with("== "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_mission_finds_no_password_when_the_url_comes_from_a_file() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let mission = files.write(
        "m.json",
        r#"{"repository": "https://git.example.com/team/repo.git", "task": "probe",
            "env": {"LANG": "C.UTF-8"}}"#,
    );
    created_id(&ok(
        &db.url,
        &[
            "routine",
            "create",
            "--name",
            "probe",
            "--schedule",
            "* * * * * *",
            "--mission",
            &mission,
            // The first scheduler is killed, maybe mid-launch: under `forbid` that launch would
            // hold the routine's run until its lease ran out, past the second probe's patience.
            "--overlap",
            "allow",
        ],
    ));
    // The server trusts local connections, so any password reaches it as well as none.
    let with_password = |password: &str| {
        db.url.replacen(
            SERVER,
            &SERVER.replace("postgres@", &format!("postgres:{password}@")),
            1,
        )
    };
    let url_file = files.write(
        "database-url",
        &format!("{}\n", with_password(FILE_PASSWORD)),
    );

    let from_file = probe_output(
        &["--database-url-file", &url_file],
        &[],
        Path::new(&files.path("from-file")),
    )
    .await;
    assert!(
        !from_file.contains(FILE_PASSWORD),
        "the mission saw the password:\n{from_file}"
    );
    assert!(!from_file.contains("DATABASE_URL="), "{from_file}");
    // The probe did read what it looked at: its own environment (cleared: PATH, the CM_*
    // variables and the mission's env), and the scheduler's environment and command line.
    let own = section(&from_file, "== env");
    assert!(own.iter().any(|l| l.starts_with("PATH=")), "{from_file}");
    assert!(own.contains(&"LANG=C.UTF-8"), "{from_file}");
    assert!(
        own.iter().any(|l| l.starts_with("CM_ROUTINE_NAME=probe")),
        "{from_file}"
    );
    assert!(
        !section(&from_file, "== parent environ").is_empty(),
        "{from_file}"
    );
    assert!(
        section(&from_file, "== parent cmdline")
            .concat()
            .contains("--database-url-file"),
        "{from_file}"
    );

    // Through DATABASE_URL, the child's own environment still holds none of it, but the
    // scheduler's environment, which a child of the same user reads, does: what the file is for.
    let from_env = probe_output(
        &[],
        &[("DATABASE_URL", &with_password(ENV_PASSWORD))],
        Path::new(&files.path("from-env")),
    )
    .await;
    assert!(
        !section(&from_env, "== env").concat().contains(ENV_PASSWORD),
        "{from_env}"
    );
    assert!(
        section(&from_env, "== parent environ")
            .concat()
            .contains(ENV_PASSWORD),
        "{from_env}"
    );
}
