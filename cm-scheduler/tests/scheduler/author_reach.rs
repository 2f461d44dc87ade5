//! What a routine author can reach, through the binary: a repository whose host is the
//! scheduler's own or a metadata service, in every URL form; env names and label keys outside
//! the operator's allow lists (the defaults without one), and the floor no allow list opens.
//! Each refused by `routine create`, `update` and `import` (exit 2, one line, nothing written),
//! and at dispatch for a routine stored around the command line (settled `failed`, nothing
//! launched).

use crate::cli::{MissionFiles, Run, check_fails, create_args, created_id, ok, run};
use crate::crash::{SchedulerProcess, eventually};
use crate::support::{TestDb, cm_scheduler};

/// `routine create --name NAME` of the mission file at `path`, then `extra` flags.
fn create(name: &str, path: &str, extra: &[&str]) -> Vec<String> {
    create_on("0 9 * * *", name, path, extra)
}

/// [`create`] on `schedule`.
fn create_on(schedule: &str, name: &str, path: &str, extra: &[&str]) -> Vec<String> {
    create_args(name, schedule, &[&["--mission", path], extra].concat())
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn mission_at(repository: &str) -> String {
    format!(r#"{{"repository": "{repository}", "task": "t"}}"#)
}

fn mission_with(extra: &str) -> String {
    format!(r#"{{"repository": "https://git.example.com/team/r.git", "task": "t", {extra}}}"#)
}

/// The review's `ssh://` repositories (each created before, and a runner's `ssh` connected to
/// the scheduler's PostgreSQL port), and the same hosts in every other form.
const DENIED_REPOSITORIES: [&str; 24] = [
    "ssh://git@127.0.0.1:5432/r.git",
    "ssh://git@0x7f000001:5432/r.git",
    "ssh://git@127.1:5432/r.git",
    "ssh://git@0.0.0.0:5432/r.git",
    "ssh://git@169.254.169.254/latest",
    "ssh://git@2130706433:5432/r.git",
    "ssh://git@017700000001/r.git",
    "ssh://git@0x7f.0.0.1/r.git",
    "ssh://git@127.0.0.%31:5432/r.git",
    "ssh://git@127.0.0.1.:5432/r.git",
    "ssh://git@[127.0.0.1]:5432/r.git",
    "ssh://git@[::ffff:127.0.0.1]:5432/r.git",
    "ssh://git@[::1]/r.git",
    "ssh://git@[fe80::1%25eth0]/r.git",
    "ssh://git@[fd00:ec2::254]/latest",
    "ssh://git@0xa9fea9fe/latest",
    "ssh://git@localhost.:5432/r.git",
    "ssh://127.1/r.git",
    "git+ssh://git@127.1/r.git",
    "deploy@127.1:r.git",
    "git@[::1]:r.git",
    "https://0x7f.1/r.git",
    "https://0251.0376.0251.0376/latest",
    "git://127.0.0.1/r.git",
];

#[tokio::test]
async fn repositories_reaching_the_scheduler_or_a_metadata_service_are_refused_in_every_form() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    for (i, repository) in DENIED_REPOSITORIES.iter().enumerate() {
        let path = files.write(&format!("m{i}.json"), &mission_at(repository));
        check_fails(
            &db.url,
            &refs(&create("m", &path, &[])),
            2,
            "\"repository\"",
        );
        // The operator's repository_hosts admits names, never these addresses.
        check_fails(
            &db.url,
            &refs(&create(
                "m",
                &path,
                &["--mission-repository-host", "127.0.0.1,localhost,0.0.0.0"],
            )),
            2,
            "\"repository\"",
        );
    }
    // The issue's own, with the reason named.
    for (repository, why) in [
        (
            "ssh://git@127.0.0.1:5432/r.git",
            "host 127.0.0.1 is a loopback address",
        ),
        (
            "ssh://git@0x7f000001:5432/r.git",
            "host 127.0.0.1 is a loopback address",
        ),
        (
            "ssh://git@127.1:5432/r.git",
            "host 127.0.0.1 is a loopback address",
        ),
        (
            "ssh://git@0.0.0.0:5432/r.git",
            "host 0.0.0.0 is an unspecified address",
        ),
        (
            "ssh://git@169.254.169.254/latest",
            "host 169.254.169.254 is the metadata service's address",
        ),
    ] {
        let path = files.write("issue.json", &mission_at(repository));
        check_fails(&db.url, &refs(&create("m", &path, &[])), 2, why);
    }
    // Import and update read the repository with the same parser.
    let path = files.write("bad.json", &mission_at("ssh://git@127.1:5432/r.git"));
    let import = files.write(
        "routines.jsonl",
        "{\"name\": \"m\", \"schedule\": \"0 9 * * *\", \"mission\": \"bad.json\"}\n",
    );
    check_fails(&db.url, &["routine", "import", &import], 2, "loopback");
    let id = created_id(&ok(
        &db.url,
        &create_args("r", "0 9 * * *", &["--message", "hi"]),
    ));
    check_fails(
        &db.url,
        &["routine", "update", &id.to_string(), "--mission", &path],
        2,
        "loopback",
    );
    assert_eq!(db.count("routines").await, 1, "only the message routine");
    // A host that is a name, in the forms these take, is created (it is resolved at dispatch).
    for (i, repository) in [
        "ssh://git@git.example.com:2222/team/r.git",
        "deploy@git.example.com:team/r.git",
        "ssh://git@[2001:db8::1]/team/r.git",
    ]
    .iter()
    .enumerate()
    {
        let path = files.write(&format!("ok{i}.json"), &mission_at(repository));
        created_id(&ok(&db.url, &refs(&create(&format!("ok{i}"), &path, &[]))));
    }
}

/// The review's env names (each created before): refused whatever the operator allows, since
/// the floor lists them. A name outside the floor is refused by the default allow list and
/// created once the operator allows it, by flag or by its environment variable.
#[tokio::test]
async fn env_names_are_refused_unless_allowed_and_the_floor_always() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    for name in [
        "LUA_INIT",
        "ZDOTDIR",
        "RUSTC_WRAPPER",
        "CARGO_BUILD_RUSTC_WRAPPER",
        "GOFLAGS",
        "GOPROXY",
        "PIP_INDEX_URL",
        "NPM_CONFIG_REGISTRY",
        "AWS_ENDPOINT_URL",
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "LESSOPEN",
        "GLIBC_TUNABLES",
        "XDG_CONFIG_HOME",
        "JAVA_OPTS",
        "MAVEN_OPTS",
        "CLASSPATH",
    ] {
        let path = files.write(
            &format!("{name}.json"),
            &mission_with(&format!(r#""env": {{"{name}": "x"}}"#)),
        );
        let field = format!("\"env.{name}\"");
        check_fails(&db.url, &refs(&create("m", &path, &[])), 2, &field);
        for allow in ["*", name] {
            check_fails(
                &db.url,
                &refs(&create("m", &path, &["--mission-env-allow", allow])),
                2,
                "changes how a mission runs",
            );
        }
    }
    let debug = files.write(
        "debug.json",
        &mission_with(r#""env": {"DEBUG": "1", "TZ": "UTC"}"#),
    );
    check_fails(
        &db.url,
        &refs(&create("m", &debug, &[])),
        2,
        "\"env.DEBUG\": is not among the names a routine may set (env_allow: TZ, LANG, LANGUAGE, \
         LC_*, the default)",
    );
    // The operator's list replaces the default: TZ is no longer in it.
    check_fails(
        &db.url,
        &refs(&create("m", &debug, &["--mission-env-allow", "DEBUG"])),
        2,
        "\"env.TZ\"",
    );
    assert_eq!(
        db.count("routines").await,
        0,
        "bad input must write nothing"
    );
    created_id(&ok(
        &db.url,
        &refs(&create("a", &debug, &["--mission-env-allow", "DEBUG,TZ"])),
    ));
    let mut command = cm_scheduler();
    command
        .env("CM_MISSION_ENV_ALLOW", "DEBUG,TZ")
        .args(["--database-url", &db.url])
        .args(create("b", &debug, &[]));
    let out: Run = run(command);
    assert_eq!(out.code, Some(0), "{out:?}");
    // The config file's list, and the flag in its place.
    let config = files.write("config.json", r#"{"env_allow": ["DEBUG", "TZ"]}"#);
    created_id(&ok(
        &db.url,
        &refs(&create("c", &debug, &["--mission-config", &config])),
    ));
    check_fails(
        &db.url,
        &refs(&create(
            "d",
            &debug,
            &["--mission-config", &config, "--mission-env-allow", "TZ"],
        )),
        2,
        "\"env.DEBUG\"",
    );
    check_fails(
        &db.url,
        &refs(&create("d", &debug, &["--mission-env-allow", "not a name"])),
        2,
        "env_allow entry",
    );
}

/// Label keys Docker, Kubernetes, ingress and proxy controllers and service meshes read are
/// refused whatever the operator allows; any other key outside `routine/*` is refused until the
/// operator allows it.
#[tokio::test]
async fn label_keys_are_refused_unless_allowed_and_reserved_ones_always() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    for key in [
        "traefik.enable",
        "traefik.http.routers.r.rule",
        "com.docker.compose.project",
        "io.kubernetes.pod.name",
        "app.kubernetes.io/name",
        "nginx.ingress.kubernetes.io/rewrite-target",
        "k8s.io/x",
        "istio-injection",
        "sidecar.istio.io/inject",
        "linkerd.io/inject",
        "caddy",
        "com.centurylinklabs.watchtower.enable",
    ] {
        let path = files.write(
            "reserved.json",
            &mission_with(&format!(r#""labels": {{"{key}": "x"}}"#)),
        );
        let field = format!("\"labels.{key}\"");
        check_fails(&db.url, &refs(&create("m", &path, &[])), 2, &field);
        check_fails(
            &db.url,
            &refs(&create("m", &path, &["--mission-label-allow", "*"])),
            2,
            "reads it",
        );
    }
    let team = files.write(
        "team.json",
        &mission_with(r#""labels": {"team": "platform"}"#),
    );
    check_fails(
        &db.url,
        &refs(&create("m", &team, &[])),
        2,
        "label_allow: routine/*, the default",
    );
    assert_eq!(
        db.count("routines").await,
        0,
        "bad input must write nothing"
    );
    created_id(&ok(
        &db.url,
        &refs(&create("a", &team, &["--mission-label-allow", "team"])),
    ));
    let prefixed = files.write(
        "prefixed.json",
        &mission_with(r#""labels": {"routine/team": "platform"}"#),
    );
    created_id(&ok(&db.url, &refs(&create("b", &prefixed, &[]))));
}

/// Routines written around the command line (by an older version, or straight into the table):
/// an env name and a label key the allow lists do not admit, and an `ssh://` repository on the
/// scheduler's own host. Each occurrence settles `failed` with the reason; nothing runs. With
/// the operator's allow lists given to `run`, the first two launch.
#[tokio::test]
async fn stored_routines_outside_the_rules_fail_at_dispatch_and_run_nothing() {
    let db = TestDb::new().await;
    let files = MissionFiles::new();
    let ran = files.path("ran");
    let script = files.write(
        "runner.sh",
        &format!("echo \"$CM_ROUTINE_NAME\" >> {ran}\n"),
    );
    let good = files.write("good.json", &mission_with(r#""env": {"TZ": "UTC"}"#));
    let mut ids = Vec::new();
    for (name, payload) in [
        ("env", mission_with(r#""env": {"DEBUG": "1"}"#)),
        ("label", mission_with(r#""labels": {"team": "platform"}"#)),
        ("ssh", mission_at("ssh://git@127.1:5432/r.git")),
    ] {
        let id = created_id(&ok(
            &db.url,
            &refs(&create_on("* * * * * *", name, &good, &["--paused"])),
        ));
        sqlx::query("UPDATE cm.routines SET payload = $2::jsonb WHERE id = $1")
            .bind(id)
            .bind(&payload)
            .execute(&db.pool)
            .await
            .unwrap();
        ok(&db.url, &["routine", "resume", &id.to_string()]);
        ids.push((name, id));
    }
    let workdir = files.path("work");
    let process = |extra: &[&str]| {
        // Failures must not pause the routines before the second scheduler launches them.
        let mut args = vec![
            "--pause-after-failures",
            "0",
            "--mission-backend",
            "process",
            "--mission-workdir",
            &workdir,
        ];
        args.extend_from_slice(extra);
        args.extend(["--mission-command", "sh", &script]);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let args = process(&[]);
    let scheduler = SchedulerProcess::start_with(&db, "reach", &refs(&args), &[]);
    for (name, id) in &ids {
        let failed: Option<String> = eventually(async || {
            sqlx::query_scalar(
                "SELECT error FROM cm.routine_fires WHERE routine_id = $1 AND status = 'failed' \
                 LIMIT 1",
            )
            .bind(id)
            .fetch_optional(&db.pool)
            .await
            .unwrap()
            .flatten()
        })
        .await;
        let error = failed.unwrap_or_else(|| panic!("{name}: no failed fire: {}", scheduler.log()));
        let expected = match *name {
            "env" => "mission field \"env.DEBUG\": is not among the names a routine may set",
            "label" => "mission field \"labels.team\": is not among the label keys",
            _ => "host 127.0.0.1 is a loopback address",
        };
        assert!(error.contains(expected), "{name}: {error}");
    }
    let fired: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE status = 'fired'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(fired, 0);
    assert!(
        !std::path::Path::new(&ran).exists(),
        "a mission was launched"
    );
    drop(scheduler);

    // The operator allows the name and the key: those two launch; the address never does.
    let args = process(&[
        "--mission-env-allow",
        "DEBUG",
        "--mission-label-allow",
        "team",
    ]);
    let scheduler = SchedulerProcess::start_with(&db, "allowed", &refs(&args), &[]);
    let launched = eventually(async || {
        let names = std::fs::read_to_string(&ran).unwrap_or_default();
        (names.contains("env") && names.contains("label")).then_some(names)
    })
    .await;
    let names = launched.unwrap_or_else(|| panic!("nothing launched: {}", scheduler.log()));
    assert!(!names.contains("ssh"), "{names}");
    drop(scheduler);

    // A malformed list is refused at start, as a malformed config file is.
    let out = crate::cli::cm(
        &db.url,
        &refs(&[
            "run".to_owned(),
            "--mission-backend".to_owned(),
            "process".to_owned(),
            "--mission-label-allow".to_owned(),
            "a b".to_owned(),
            "--mission-command".to_owned(),
            "true".to_owned(),
        ]),
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("label_allow entry \"a b\""), "{out:?}");
}
