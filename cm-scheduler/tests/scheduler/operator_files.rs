//! The files an operator's command reads are the ones the operator meant (issue 27): an import
//! file may be a routine author's, so a line's `mission` path is read only inside the import's
//! mission root (the file's directory, or `--mission-root`), never as an absolute path, through
//! `..` or through a symbolic link out of it; and a mission file, an import's or `--mission`'s,
//! is read only when it is a regular file, so a FIFO, a socket or a device is refused at once
//! instead of hanging the command; so is every other file the command line names
//! (`--mission-config`, `--database-url-file`, `--http-token-file`, `--webhook-secret-file`,
//! `--nats-credentials-file`). And one rule for `--overlap`: a message routine has none,
//! whether `create`, `update` or `import` gives it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::cli::{MissionFiles, NOWHERE, cm, create_args, created_id, ok, run_within};
use crate::operator::{case, check_refused};
use crate::support::{TestDb, cm_scheduler};

/// A mission the checks accept.
const MISSION: &str = r#"{"repository": "https://git.example.com/team/repo.git", "task": "t"}"#;

/// Asserts `args` are refused (exit 2, one line naming `fragment`) within a few seconds.
#[track_caller]
fn refused_promptly(url: &str, args: &[&str], fragment: &str) {
    let mut command = cm_scheduler();
    command.arg("--database-url").arg(url).args(args);
    refused_at_once(command, &[fragment]);
}

/// Asserts `command` is refused (exit 2, one line naming each of `fragments`) within a few
/// seconds; it is killed after ten, as hanging.
#[track_caller]
fn refused_at_once(mut command: Command, fragments: &[&str]) {
    let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
    let started = Instant::now();
    let run = run_within(&mut command, Duration::from_secs(10));
    let took = started.elapsed();
    let run = run.unwrap_or_else(|| panic!("{args:?} still ran after {took:?}: it hung"));
    assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
    for fragment in fragments {
        assert!(
            run.stderr.contains(fragment),
            "{fragment}: {args:?}: {run:?}"
        );
    }
    assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {run:?}");
    assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
}

/// Makes a FIFO at `path`.
fn fifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
}

/// A one-line import naming `mission`.
fn import_line(name: &str, mission: &str) -> String {
    format!(r#"{{"name": "{name}", "schedule": "0 3 * * *", "mission": "{mission}"}}"#)
}

#[tokio::test]
async fn an_imports_mission_paths_stay_inside_its_root_and_only_regular_files_are_read() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    let base = Path::new(&files.path("")).to_path_buf();
    // The import's directory, and a valid mission file outside it that must stay out of reach.
    std::fs::create_dir_all(base.join("imports/sub")).unwrap();
    std::fs::create_dir_all(base.join("shared")).unwrap();
    files.write("outside.json", MISSION);
    files.write("imports/ok.json", MISSION);
    files.write("imports/sub/ok.json", MISSION);
    files.write("shared/m.json", MISSION);
    std::os::unix::fs::symlink(base.join("outside.json"), base.join("imports/out.json")).unwrap();
    std::os::unix::fs::symlink("/etc", base.join("imports/etc")).unwrap();
    std::os::unix::fs::symlink("sub/ok.json", base.join("imports/in.json")).unwrap();
    fifo(&base.join("imports/fifo.json"));
    let _socket = std::os::unix::net::UnixListener::bind(base.join("imports/socket.json")).unwrap();
    let import = |name: &str, mission: &str| {
        files.write(
            &format!("imports/{name}.jsonl"),
            &import_line(name, mission),
        )
    };

    // Refused, each naming why, without reading the file: /etc/passwd read as a mission would
    // say "not valid JSON" (what an import said before), and a valid file outside is refused too.
    let cases = [
        (import("absolute", "/etc/passwd"), "absolute path"),
        (
            import("climbs", "../../../../../../../etc/passwd"),
            "climbs out",
        ),
        (import("sibling", "../outside.json"), "climbs out"),
        (import("deeper", "sub/../../outside.json"), "climbs out"),
        (import("link", "out.json"), "outside the mission root"),
        (import("linkdir", "etc/passwd"), "outside the mission root"),
        (import("socket", "socket.json"), "a socket"),
        (import("dir", "sub"), "a directory"),
    ];
    let refusals: Vec<_> = cases
        .iter()
        .map(|(file, fragment)| case(&["routine", "import", file], fragment))
        .collect();
    check_refused(&db, &refusals).await;
    for (file, _) in &cases {
        let run = cm(url, &["routine", "import", file]);
        assert!(
            !run.stderr.contains("not valid JSON"),
            "{file} was read: {run:?}"
        );
    }
    // A FIFO is refused at once, not waited on (the import used to hang on it).
    refused_promptly(
        url,
        &["routine", "import", &import("fifo", "fifo.json")],
        "a FIFO",
    );
    // Another root is the operator's to name, and is kept to as well.
    let elsewhere = import("elsewhere", "m.json");
    let shared = base.join("shared").display().to_string();
    check_refused(
        &db,
        &[
            case(&["routine", "import", &elsewhere], "No such file"),
            case(
                &[
                    "routine",
                    "import",
                    &import("up", "../outside.json"),
                    "--mission-root",
                    &shared,
                ],
                "climbs out",
            ),
            case(
                &[
                    "routine",
                    "import",
                    &import("zero", "zero"),
                    "--mission-root",
                    "/dev",
                ],
                "a device",
            ),
        ],
    )
    .await;

    // Inside the root it reads: a plain name, a subdirectory, a `..` that stays inside, a link
    // that stays inside, and another root given by --mission-root.
    for (name, mission) in [
        ("plain", "ok.json"),
        ("nested", "sub/ok.json"),
        ("back", "sub/../ok.json"),
        ("linked", "in.json"),
    ] {
        let out = ok(url, &["routine", "import", &import(name, mission)]);
        assert!(out.starts_with("created"), "{name}: {out}");
    }
    let out = ok(
        url,
        &["routine", "import", &elsewhere, "--mission-root", &shared],
    );
    assert!(out.starts_with("created"), "{out}");
    assert_eq!(
        db.stored("elsewhere").await["payload"]["repository"],
        "https://git.example.com/team/repo.git"
    );
}

#[tokio::test]
async fn a_mission_given_on_the_command_line_must_be_a_regular_file() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    let good = files.write("good.json", MISSION);
    let pipe = files.path("pipe.json");
    fifo(Path::new(&pipe));
    let create = |mission: &str| {
        [
            "routine",
            "create",
            "--name",
            "m",
            "--schedule",
            "0 3 * * *",
            "--mission",
            mission,
        ]
        .map(String::from)
    };
    let id = created_id(&ok(url, &create(&good).each_ref().map(String::as_str))).to_string();
    for args in [
        create(&pipe).to_vec(),
        ["routine", "update", &id, "--mission", &pipe]
            .map(String::from)
            .to_vec(),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused_promptly(url, &args, "a FIFO");
    }
    check_refused(
        &db,
        &[
            case(
                &create("/dev/zero").each_ref().map(String::as_str),
                "a device",
            ),
            case(
                &["routine", "update", &id, "--mission", "/dev/null"],
                "a device",
            ),
            case(
                &create(&files.path("")).each_ref().map(String::as_str),
                "a directory",
            ),
        ],
    )
    .await;
}

/// The operator's other files, each a FIFO (or a device): refused at once, naming the flag and
/// saying the file is not a regular file, instead of waiting for a writer that never comes. No
/// database is reached: each is refused before anything connects.
#[test]
fn every_file_the_command_line_names_must_be_a_regular_file() {
    let files = MissionFiles::new();
    let pipe = files.path("pipe");
    fifo(Path::new(&pipe));
    for path in [pipe.as_str(), "/dev/zero"] {
        let kind = if path == pipe { "a FIFO" } else { "a device" };
        let flagged: [(&str, Vec<&str>); 7] = [
            (
                "--mission-config",
                vec![
                    "routine",
                    "create",
                    "--name",
                    "n",
                    "--schedule",
                    "0 3 * * *",
                ]
                .into_iter()
                .chain(["--message", "hi", "--mission-config", path])
                .collect(),
            ),
            (
                "--mission-config",
                vec!["run", "--mission-backend", "docker", "--mission-image", "i"]
                    .into_iter()
                    .chain(["--mission-config", path])
                    .collect(),
            ),
            (
                "--mission-config",
                vec![
                    "run",
                    "--mission-backend",
                    "process",
                    "--mission-config",
                    path,
                ]
                .into_iter()
                .chain(["--mission-command", "true"])
                .collect(),
            ),
            (
                "--http-token-file",
                vec!["run", "--listen", "127.0.0.1:0", "--http-token-file", path],
            ),
            (
                "--webhook-secret-file",
                vec!["run", "--message-backend", "webhook", "--webhook-url"]
                    .into_iter()
                    .chain(["https://hooks.example.com/x", "--webhook-secret-file", path])
                    .collect(),
            ),
            (
                "--nats-credentials-file",
                vec!["run", "--message-backend", "nats", "--nats-url"]
                    .into_iter()
                    .chain(["nats://127.0.0.1:1", "--nats-credentials-file", path])
                    .collect(),
            ),
            (
                "--database-url-file",
                vec!["--database-url-file", path, "routine", "list"],
            ),
        ];
        for (flag, args) in flagged {
            let mut command = cm_scheduler();
            if flag == "--database-url-file" {
                command.env_remove("DATABASE_URL");
            } else {
                command.args(["--database-url", NOWHERE]);
            }
            command.args(&args);
            refused_at_once(command, &[flag, kind, "not a regular file"]);
        }
    }
    // A certificate named in the database URL on a FIFO is refused before any connection.
    let mut command = cm_scheduler();
    command.args([
        "--database-url",
        &format!("{NOWHERE}?sslmode=verify-full&sslrootcert={pipe}"),
        "routine",
        "list",
    ]);
    refused_at_once(command, &["sslrootcert", "a FIFO"]);
}

#[tokio::test]
async fn overlap_is_refused_on_a_message_routine_by_create_as_by_update_and_import() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let files = MissionFiles::new();
    files.write("m.json", MISSION);
    let mission = files.path("m.json");
    let note = created_id(&ok(
        url,
        &create_args("note", "0 3 * * *", &["--message", "hi"]),
    ))
    .to_string();
    let job = created_id(&ok(
        url,
        &create_args("job", "0 3 * * *", &["--mission", &mission]),
    ))
    .to_string();
    let message_line = files.write(
        "message.jsonl",
        r#"{"name": "n2", "schedule": "0 3 * * *", "message": "hi", "overlap": "allow"}"#,
    );
    check_refused(
        &db,
        &[
            case(
                &create_args("m", "0 3 * * *", &["--message", "m", "--overlap", "allow"]),
                "--overlap is for mission routines",
            ),
            case(
                &["routine", "update", &note, "--overlap", "allow"],
                "--overlap is for mission routines",
            ),
            // A mission routine made a message routine cannot keep one either.
            case(
                &[
                    "routine",
                    "update",
                    &job,
                    "--message",
                    "hi",
                    "--overlap",
                    "allow",
                ],
                "--overlap is for mission routines",
            ),
            case(
                &["routine", "import", &message_line],
                "\"overlap\" is for mission routines",
            ),
        ],
    )
    .await;
    // A mission routine takes it, from create and from update.
    ok(
        url,
        &create_args(
            "m",
            "0 3 * * *",
            &["--mission", &mission, "--overlap", "allow"],
        ),
    );
    assert_eq!(db.stored("m").await["overlap"], "allow");
    ok(url, &["routine", "update", &job, "--overlap", "replace"]);
    assert_eq!(db.stored("job").await["overlap"], "replace");
}
