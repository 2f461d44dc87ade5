//! What a routine may ask for and what the command line reads, through the binary: a mission's
//! `env` can never steer its runner (refused at create, update and import, and a routine stored
//! before the rule is settled `failed` at dispatch, never launched), repositories never name the
//! scheduler's host or a metadata service, the operator's `env_allow` and `repository_hosts`
//! decide both, every file is read no further than its limit, a message's text is bounded, and
//! names hold no invisible or bidirectional characters.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli::{BIN, MissionFiles, NOWHERE, Run, check_fails, create_args, created_id, ok, run};
use crate::crash::{SchedulerProcess, eventually};
use crate::support::{TestDb, cm_scheduler};

const OK_FIELDS: &str = r#""repository": "https://git.example.com/team/repo.git", "task": "lint""#;

fn mission_with(extra: &str) -> String {
    format!("{{{OK_FIELDS}, {extra}}}")
}

fn create_mission(name: &str, path: &str) -> Vec<String> {
    create_args(name, "0 9 * * *", &["--mission", path])
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[tokio::test]
async fn a_mission_env_that_would_steer_its_runner_is_refused_everywhere() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    for (name, value) in [
        ("BASH_ENV", "$(id > /tmp/x)"),
        ("PATH", "/tmp/evil"),
        ("GIT_SSH_COMMAND", "sh -c id"),
        ("GIT_CONFIG_COUNT", "1"),
        ("LD_PRELOAD", "/tmp/evil.so"),
        ("HTTPS_PROXY", "http://evil.example:3128"),
        ("SSH_AUTH_SOCK", "/tmp/agent"),
    ] {
        let path = files.write(
            &format!("{name}.json"),
            &mission_with(&format!(r#""env": {{"{name}": "{value}"}}"#)),
        );
        let field = format!("\"env.{name}\"");
        check_fails(&db.url, &refs(&create_mission("m", &path)), 2, &field);
        let import = files.write(
            &format!("{name}.jsonl"),
            &format!(
                "{{\"name\": \"ok\", \"schedule\": \"0 9 * * *\", \"message\": \"hi\"}}\n\
                 {{\"name\": \"m\", \"schedule\": \"0 9 * * *\", \"mission\": \"{name}.json\"}}\n"
            ),
        );
        check_fails(&db.url, &["routine", "import", &import], 2, ":2: ");
        check_fails(&db.url, &["routine", "import", &import], 2, &field);
    }
    assert_eq!(
        db.count("routines").await,
        0,
        "bad input must write nothing"
    );

    // Update: an existing message routine cannot become such a mission.
    let id = created_id(&ok(
        &db.url,
        &create_args("r", "0 9 * * *", &["--message", "hi"]),
    ));
    let bad = files.write("bad.json", &mission_with(r#""env": {"BASH_ENV": "x"}"#));
    check_fails(
        &db.url,
        &["routine", "update", &id.to_string(), "--mission", &bad],
        2,
        "\"env.BASH_ENV\"",
    );
    let kind: String = sqlx::query_scalar("SELECT kind FROM cm.routines WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(kind, "message");
}

/// Repositories that reach the scheduler's host or a metadata service, or hand ssh an option,
/// and label keys the runtime reserves: each refused at create, naming its field.
#[tokio::test]
async fn repositories_and_labels_the_runtime_would_misuse_are_refused() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let repositories = [
        "ssh://-oProxyCommand=touch%20x@git.example.com/r.git",
        "https://169.254.169.254/latest/meta-data",
        "https://127.0.0.1/r.git",
        "https://[::1]/r.git",
        "https://localhost/r.git",
        "https://0.0.0.0/r.git",
        "git@127.1:r.git",
        "https://metadata.google.internal/computeMetadata/v1",
    ]
    .map(|r| {
        (
            format!(r#"{{"repository": "{r}", "task": "t"}}"#),
            "repository".to_owned(),
        )
    });
    let labels = [
        "job-name",
        "controller-uid",
        "batch.kubernetes.io/job-name",
        "kubernetes.io/x",
        "k8s.io/x",
        "cm.attempt",
    ]
    .map(|key| {
        (
            mission_with(&format!(r#""labels": {{"{key}": "x"}}"#)),
            format!("labels.{key}"),
        )
    });
    for (i, (mission, field)) in repositories.iter().chain(&labels).enumerate() {
        let path = files.write(&format!("m{i}.json"), mission);
        check_fails(
            &db.url,
            &refs(&create_mission("m", &path)),
            2,
            &format!("\"{field}\""),
        );
    }
    assert_eq!(db.count("routines").await, 0);
}

#[tokio::test]
async fn the_operators_policy_narrows_env_names_and_repository_hosts() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let config = files.write(
        "config.json",
        r#"{"env_allow": ["REPORT_*", "LANG"], "repository_hosts": ["git.example.com"]}"#,
    );
    let allowed = files.write(
        "allowed.json",
        &mission_with(r#""env": {"REPORT_FORMAT": "md", "LANG": "C"}"#),
    );
    let other_name = files.write("other-name.json", &mission_with(r#""env": {"DEBUG": "1"}"#));
    let other_host = files.write(
        "other-host.json",
        r#"{"repository": "https://elsewhere.example/r.git", "task": "t"}"#,
    );
    let with_config = |name: &str, path: &str| {
        let mut args = create_mission(name, path);
        args.extend(["--mission-config".into(), config.clone()]);
        args
    };
    check_fails(
        &db.url,
        &refs(&with_config("a", &other_name)),
        2,
        "\"env.DEBUG\"",
    );
    check_fails(
        &db.url,
        &refs(&with_config("b", &other_host)),
        2,
        "repository_hosts",
    );
    // CM_MISSION_CONFIG stands for the flag, so an operator sets it once for every command.
    let mut command = cm_scheduler();
    command
        .env("CM_MISSION_CONFIG", &config)
        .args(["--database-url", &db.url])
        .args(create_mission("c", &other_name));
    let out: Run = run(command);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("env.DEBUG"), "{out:?}");
    assert_eq!(db.count("routines").await, 0);
    // Without the policy the default allow list applies (the time zone and the locale);
    // with it, what it allows is created.
    check_fails(
        &db.url,
        &refs(&create_mission("e", &other_name)),
        2,
        "env_allow: TZ, LANG, LANGUAGE, LC_*, the default",
    );
    created_id(&ok(&db.url, &refs(&with_config("d", &allowed))));
    // A malformed policy is refused as input.
    let broken = files.write("broken.json", r#"{"env_allow": ["not a name"]}"#);
    let mut args = create_mission("f", &allowed);
    args.extend(["--mission-config".into(), broken]);
    check_fails(&db.url, &refs(&args), 2, "env_allow");
}

/// Runs the binary with at most 50 MiB of data memory, so a file read whole before its limit
/// is checked cannot pass: it would fail to allocate.
fn bounded_run(args: &[&str]) -> (Run, Duration) {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("ulimit -d 51200 && exec \"$@\"")
        .arg("sh")
        .arg(BIN)
        .env_remove("DATABASE_URL")
        .args(["--database-url", NOWHERE])
        .args(args)
        .stdin(Stdio::null());
    let started = Instant::now();
    let out = run(command);
    (out, started.elapsed())
}

#[test]
fn endless_files_are_refused_at_their_limit_at_once() {
    let files = MissionFiles::new();
    let secret = files.write("secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    // A file the command line names must be a regular file (a device is refused unread): a
    // sparse one of a GiB. An import, which may be a pipe, is read from /dev/zero.
    let huge = files.path("huge.json");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(1 << 30))
        .expect("writing a sparse file");
    let cases: &[(&[&str], &str)] = &[
        (
            &create_args("m", "0 9 * * *", &["--mission", &huge]),
            "256 KiB",
        ),
        (&["routine", "import", "/dev/zero"], "1 MiB"),
        (&["routine", "import", "--crontab", "/dev/zero"], "1 MiB"),
        (
            &create_args(
                "m",
                "0 9 * * *",
                &["--message", "x", "--mission-config", &huge],
            ),
            "256 KiB",
        ),
        (
            &[
                "run",
                "--mission-backend",
                "docker",
                "--mission-image",
                "i",
                "--mission-config",
                &huge,
            ],
            "256 KiB",
        ),
        (
            &["run", "--listen", "127.0.0.1:0", "--http-token-file", &huge],
            "64 KiB",
        ),
        (
            &[
                "run",
                "--message-backend",
                "webhook",
                "--webhook-url",
                "https://hooks.example.com/x",
                "--webhook-secret-file",
                &huge,
            ],
            "64 KiB",
        ),
        (
            &[
                "run",
                "--message-backend",
                "nats",
                "--nats-url",
                "nats://127.0.0.1:1",
                "--nats-credentials-file",
                &huge,
            ],
            "64 KiB",
        ),
    ];
    for (args, limit) in cases {
        let (out, took) = bounded_run(args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("the most allowed") && out.stderr.contains(limit),
            "{args:?}: {out:?}"
        );
        assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {out:?}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
    }
    drop(secret);
}

#[tokio::test]
async fn message_text_is_bounded_and_names_hold_no_invisible_characters() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let big = "x".repeat(cm_domain::MAX_MESSAGE_BYTES + 1);
    let import = files.write(
        "big.jsonl",
        &format!("{{\"name\": \"big\", \"schedule\": \"0 9 * * *\", \"message\": \"{big}\"}}\n"),
    );
    check_fails(
        &db.url,
        &["routine", "import", &import],
        2,
        "at most 262144",
    );
    let import = files.write(
        "huge.jsonl",
        &format!(
            "{{\"name\": \"big\", \"schedule\": \"0 9 * * *\", \"message\": \"{}\"}}\n",
            "x".repeat(2 * 1024 * 1024)
        ),
    );
    check_fails(&db.url, &["routine", "import", &import], 2, "1 MiB");
    for name in ["pay\u{202e}lor", "zero\u{200b}width", "bom\u{feff}"] {
        check_fails(
            &db.url,
            &create_args(name, "0 9 * * *", &["--message", "x"]),
            2,
            "invisible",
        );
    }
    assert_eq!(db.count("routines").await, 0);
    // At the limit it is a message (a command-line argument cannot be this long: Linux caps
    // one at 128 KiB, so the import carries it).
    let at_limit = "x".repeat(cm_domain::MAX_MESSAGE_BYTES);
    let import = files.write(
        "max.jsonl",
        &format!(
            "{{\"name\": \"max\", \"schedule\": \"0 9 * * *\", \"message\": \"{at_limit}\"}}\n"
        ),
    );
    ok(&db.url, &["routine", "import", &import]);
    assert_eq!(db.count("routines").await, 1);
}

/// A mission routine written around the rules (stored before them, or straight into the table)
/// whose `env` sets `BASH_ENV` to a command: with a bash program as the process backend's
/// command, bash would run it first. Its occurrence settles `failed` naming the variable, and
/// nothing runs.
#[tokio::test]
async fn a_stored_mission_that_would_steer_its_runner_fails_at_dispatch_and_runs_nothing() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let pwned = files.path("pwned");
    let ran = files.path("ran");
    let script = files.write("runner.sh", &format!("touch {ran}\n"));
    let good = files.write("good.json", &mission_with(r#""env": {"TZ": "UTC"}"#));
    let id = created_id(&ok(
        &db.url,
        &create_args("m", "* * * * * *", &["--mission", &good, "--paused"]),
    ));
    // What an older version, or a write around the CLI, could have stored.
    sqlx::query(
        "UPDATE cm.routines SET payload = jsonb_set(payload, '{env}', jsonb_build_object('BASH_ENV', $2::text))
         WHERE id = $1",
    )
    .bind(id)
    .bind(format!("$(touch {pwned})"))
    .execute(&db.pool)
    .await
    .unwrap();
    ok(&db.url, &["routine", "resume", &id.to_string()]);
    let workdir = files.path("work");
    let scheduler = SchedulerProcess::start_with(
        &db,
        "steer",
        &[
            "--mission-backend",
            "process",
            "--mission-workdir",
            &workdir,
            "--mission-command",
            "bash",
            &script,
        ],
        &[],
    );
    let failed: Option<String> = eventually(async || {
        sqlx::query_scalar(
            "SELECT error FROM cm.routine_fires WHERE routine_id = $1 AND status = 'failed' LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
        .flatten()
    })
    .await;
    let error = failed.unwrap_or_else(|| panic!("no failed fire: {}", scheduler.log()));
    assert!(error.contains("env.BASH_ENV"), "{error}");
    let fired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1 AND status = 'fired'",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(fired, 0);
    assert!(
        !std::path::Path::new(&pwned).exists(),
        "BASH_ENV ran a command"
    );
    assert!(
        !std::path::Path::new(&ran).exists(),
        "the mission was launched"
    );
    drop(scheduler);
}
