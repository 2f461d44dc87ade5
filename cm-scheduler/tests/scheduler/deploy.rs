//! The deployment files run as written: `deploy/systemd/cm-scheduler.service`'s command line,
//! environment and credential, told to notify a socket the test listens on as systemd would;
//! `deploy/kubernetes/deployment.yaml`'s container (its arguments, environment, Secret and
//! ConfigMap files) against the fake API server granting only `role.yaml`'s rules, probed as
//! the kubelet probes it; and the unit checked by `systemd-analyze verify` and `security`.
//!
//! What is changed to run them here, and only that: the binary's path (the unit's
//! `/usr/local/bin`, the image's `/cm-scheduler`) is the one cargo built; mounted and credential
//! paths are directories of the test's; the listen port is a free one (the machine is shared);
//! the cluster is the fake, through `KUBECONFIG`. The sandbox itself (`DynamicUser`,
//! `ProtectSystem`, the pod's security context) is not applied: no systemd runs as PID 1 and no
//! kubelet runs here.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cm_dispatch::fakes::kubernetes::FakeKubernetes;
use serde_json::Value;

use crate::cli::{BIN, ok};
use crate::notify::{Supervisor, terminate, wait_exit};
use crate::support::{PATIENCE, TestDb, cm_scheduler, poll_blocking, wait_until};

/// The repository's `deploy/`.
fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .join("deploy")
}

/// A systemd unit file as `section -> key -> values` (a key may be given several times).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn unit() -> Unit {
    let text = std::fs::read_to_string(deploy().join("systemd/cm-scheduler.service")).unwrap();
    let mut unit = Unit::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line.split_once('=').expect("KEY=VALUE");
        unit.entry(section.clone())
            .or_default()
            .entry(key.trim().to_owned())
            .or_default()
            .push(value.trim().to_owned());
    }
    unit
}

/// The one value of `key` in `[Service]`.
fn service(unit: &Unit, key: &str) -> String {
    let values = &unit["Service"][key];
    assert_eq!(values.len(), 1, "{key}: {values:?}");
    values[0].clone()
}

/// `deploy/kubernetes/NAME`.
fn manifest(name: &str) -> Value {
    let text = std::fs::read_to_string(deploy().join("kubernetes").join(name)).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status code of `GET path` on 127.0.0.1:`port`, as a probe sends it; `None` without an
/// answer.
fn get(port: u16, path: &str) -> Option<u16> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 10.0.0.7:{port}\r\nUser-Agent: kube-probe/1.33\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split_whitespace().nth(1)?.parse().ok()
}

/// Creates an every-second routine in the test's database and returns a wait for its first
/// fire: a process that fires it runs on that database, and on no other.
fn fires_here(db: &TestDb) -> impl Future<Output = ()> + '_ {
    ok(
        &db.url,
        &[
            "routine",
            "create",
            "--name",
            "deployed",
            "--every",
            "1s",
            "--message",
            "hi",
        ],
    );
    async move {
        wait_until(
            "a fire of the test's routine in the test's database",
            PATIENCE,
            async || db.count("routine_fires").await,
            |fires| *fires > 0,
        )
        .await;
    }
}

/// Waits until `GET path` answers 200, for at most `patience`.
fn until_ok(port: u16, path: &str, patience: Duration) -> bool {
    poll_blocking(patience, || get(port, path), |status| *status == Some(200)).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_units_command_line_runs_and_notifies_as_systemd_would_hear_it() {
    let unit = unit();
    assert_eq!(service(&unit, "Type"), "notify");
    assert_eq!(service(&unit, "NotifyAccess"), "main");
    let watchdog = humantime::parse_duration(&service(&unit, "WatchdogSec")).unwrap();
    let db = TestDb::new().await;
    let supervisor = Supervisor::new();

    // The credential: systemd copies the file LoadCredential names into the directory `%d`
    // stands for.
    let credentials = supervisor.dir.join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    let load = service(&unit, "LoadCredential");
    let (name, _source) = load.split_once(':').expect("NAME:PATH");
    std::fs::write(credentials.join(name), format!("{}\n", db.url)).unwrap();

    let exec = service(&unit, "ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/cm-scheduler"));
    let args: Vec<String> = words
        .map(|w| w.replace("%d", credentials.to_str().unwrap()))
        .collect();
    let fired = fires_here(&db);
    let port = free_port();
    let mut command = cm_scheduler();
    // The database is the unit's to name: nothing of the test's environment stands in.
    command.env_remove("DATABASE_URL").args(&args);
    for assignment in &unit["Service"]["Environment"] {
        let (key, value) = assignment.split_once('=').unwrap();
        let value = match key {
            "CM_LISTEN" => {
                assert_eq!(value, "127.0.0.1:8080", "the image's address");
                format!("127.0.0.1:{port}")
            }
            _ => value.to_owned(),
        };
        command.env(key, value);
    }
    let log = std::fs::File::create(supervisor.dir.join("log")).unwrap();
    let mut child = command
        .env("NOTIFY_SOCKET", supervisor.dir.join("notify"))
        .env("WATCHDOG_USEC", watchdog.as_micros().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();

    let heard = supervisor.listen(Duration::from_secs(30), |h| h.says("READY=1"));
    assert!(
        heard.last().is_some_and(|h| h.says("READY=1")),
        "no READY=1: {heard:?}; log:\n{}",
        supervisor.log()
    );
    // Ticks every second: each one pings, far inside the unit's watchdog.
    let pings = supervisor.listen(Duration::from_secs(5), |h| h.says("WATCHDOG=1"));
    assert!(pings.iter().any(|h| h.says("WATCHDOG=1")), "{pings:?}");
    assert!(until_ok(port, "/readyz", Duration::from_secs(10)));
    // The log is JSON lines, as the unit asks (journald keeps them whole).
    assert!(
        supervisor
            .log()
            .lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "{}",
        supervisor.log()
    );
    // It runs on the database the credential names.
    fired.await;

    terminate(&child);
    let stopping = supervisor.listen(Duration::from_secs(10), |h| h.says("STOPPING=1"));
    assert!(
        stopping.iter().any(|h| h.says("STOPPING=1")),
        "{stopping:?}"
    );
    let stop_timeout = humantime::parse_duration(&service(&unit, "TimeoutStopSec")).unwrap();
    let status = wait_exit(&mut child, stop_timeout);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{}",
        supervisor.log()
    );
}

/// `systemd-analyze`, or a panic saying how to get it.
fn systemd_analyze() -> &'static str {
    match Command::new("systemd-analyze").arg("--version").output() {
        Ok(out) if out.status.success() => "systemd-analyze",
        result => panic!(
            "systemd-analyze does not run (apt-get install systemd; .ci/run does): {result:?}"
        ),
    }
}

/// `systemd-analyze ARGS UNIT`, the unit being `text` written as `cm-scheduler.service` in a
/// directory of its own: (success, what it printed).
fn analyze(args: &[&str], text: &str) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("cm-unit-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cm-scheduler.service");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(systemd_analyze())
        .args(args)
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
#[ignore = "needs systemd-analyze: apt-get install systemd (.ci/run installs it)"]
fn the_systemd_unit_passes_systemd_analyze_verify_and_security() {
    let text = std::fs::read_to_string(deploy().join("systemd/cm-scheduler.service")).unwrap();
    // verify checks that ExecStart's program exists and is executable: the unit names
    // /usr/local/bin/cm-scheduler, where the docs install it; here it names the built binary.
    // Nothing else is changed.
    assert_eq!(text.matches("/usr/local/bin/cm-scheduler").count(), 2);
    let here = text.replace(
        "ExecStart=/usr/local/bin/cm-scheduler",
        &format!("ExecStart={BIN}"),
    );
    let (ok, said) = analyze(&["verify"], &here);
    assert!(ok && said.trim().is_empty(), "verify: {said}");

    // The sandbox, scored offline: exposure 1.5 or less of 10 ("OK"; 1.2 when written).
    let (ok, said) = analyze(&["security", "--offline=true", "--threshold=15"], &here);
    assert!(ok, "security: {said}");
    assert!(said.contains("Overall exposure level"), "{said}");

    // verify is no rubber stamp: a misspelt key is reported, a missing program fails.
    let misspelt = here.replace("WatchdogSec=", "WatchdogSecs=");
    let (_, said) = analyze(&["verify"], &misspelt);
    assert!(said.contains("Unknown key"), "{said}");
    let (ok, said) = analyze(
        &["verify"],
        &text.replace("/usr/local/bin/", "/nonexistent/"),
    );
    assert!(!ok, "a missing program passed: {said}");
}

/// Kubernetes's names for the files the Deployment mounts: the test's content for each Secret
/// key it reads (a Secret this test does not know fails it, so a new one is tested too).
fn secret_file(secret: &str, key: &str, db: &TestDb) -> String {
    match (secret, key) {
        ("cm-scheduler-database", "url") => format!("{}\n", db.url),
        ("cm-scheduler-http-token", "token") => "a-status-page-token-7f3a\n".to_owned(),
        other => panic!("deployment.yaml reads a Secret this test does not know: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployments_container_runs_as_written_with_only_the_roles_rules() {
    let deployment = manifest("deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    assert_eq!(deployment["spec"]["replicas"], 2);

    // The image's user (Dockerfile) is the one the pod runs as.
    let dockerfile =
        std::fs::read_to_string(deploy().parent().unwrap().join("Dockerfile")).unwrap();
    let user = format!(
        "USER {}:{}",
        pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    );
    assert!(dockerfile.lines().any(|l| l == user), "{user}");

    let db = TestDb::new().await;
    let root = std::env::temp_dir().join(format!("cm-pod-{}", uuid::Uuid::new_v4().simple()));
    // Each mount a directory of the test's, filled as the kubelet fills it.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    let configmap = manifest("configmap.yaml");
    for mount in container["volumeMounts"].as_array().unwrap() {
        let name = mount["name"].as_str().unwrap();
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"));
        if let Some(sources) = volume["projected"]["sources"].as_array() {
            for source in sources {
                let secret = source["secret"]["name"].as_str().unwrap();
                for item in source["secret"]["items"].as_array().unwrap() {
                    let key = item["key"].as_str().unwrap();
                    std::fs::write(
                        dir.join(item["path"].as_str().unwrap()),
                        secret_file(secret, key, &db),
                    )
                    .unwrap();
                }
            }
        } else if let Some(map) = volume["configMap"]["name"].as_str() {
            assert_eq!(configmap["metadata"]["name"], map);
            for (file, text) in configmap["data"].as_object().unwrap() {
                std::fs::write(dir.join(file), text.as_str().unwrap()).unwrap();
            }
        } else {
            panic!("a volume this test does not fill: {volume}");
        }
        mounts.push((mount["mountPath"].as_str().unwrap().to_owned(), dir));
    }
    let local = |text: &str| -> String {
        mounts.iter().fold(text.to_owned(), |text, (at, dir)| {
            text.replace(at.as_str(), dir.to_str().unwrap())
        })
    };

    // The cluster: the fake, granting the Role's rules and nothing else, in the namespace of
    // the ConfigMap's mission config.
    let role = manifest("role.yaml");
    let mut grants = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for resource in rule["resources"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                grants.push(format!(
                    "{} {}",
                    verb.as_str().unwrap(),
                    resource.as_str().unwrap()
                ));
            }
        }
    }
    let namespace = role["metadata"]["namespace"].as_str().unwrap();
    let fake = FakeKubernetes::start(&[namespace], "pod-service-account-token");
    fake.grant_only(Some(&grants.iter().map(String::as_str).collect::<Vec<_>>()));
    let kubeconfig = root.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig(namespace)).unwrap();

    let http_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "http")
        .expect("a port named http")["containerPort"]
        .as_u64()
        .unwrap();
    let port = free_port();
    let mut command = cm_scheduler();
    // The database is the manifest's to name: nothing of the test's environment stands in.
    command.env_remove("DATABASE_URL");
    for arg in container["args"].as_array().unwrap() {
        command.arg(local(arg.as_str().unwrap()));
    }
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = var["value"].as_str().expect("a plain value");
        let value = if name == "CM_LISTEN" {
            assert_eq!(value, format!("0.0.0.0:{http_port}"), "the probes' port");
            format!("0.0.0.0:{port}")
        } else {
            local(value)
        };
        command.env(name, value);
    }
    // The manifest names the database by a file of the Secret's: the command is given that
    // file, holding the URL of the test's database, and no URL of its own.
    let given: BTreeMap<String, Option<String>> = command
        .get_envs()
        .map(|(k, v)| {
            let text = |s: &std::ffi::OsStr| s.to_string_lossy().into_owned();
            (text(k), v.map(text))
        })
        .collect();
    assert_eq!(given.get("DATABASE_URL"), Some(&None), "{given:?}");
    let url_file = given
        .get("DATABASE_URL_FILE")
        .cloned()
        .flatten()
        .unwrap_or_else(|| panic!("the container is given no DATABASE_URL_FILE: {given:?}"));
    assert_eq!(
        std::fs::read_to_string(&url_file).unwrap().trim(),
        db.url,
        "{url_file}"
    );
    let fired = fires_here(&db);
    let log = root.join("log");
    let mut child = command
        .env_remove("NOTIFY_SOCKET")
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // Probed as the kubelet probes it: liveness, then readiness, on the named port.
    for probe in ["livenessProbe", "readinessProbe"] {
        let http = &container[probe]["httpGet"];
        assert_eq!(http["port"], "http", "{probe}");
        let path = http["path"].as_str().unwrap();
        assert!(
            until_ok(port, path, Duration::from_secs(30)),
            "{probe} {path} never answered 200; log:\n{}",
            read_log()
        );
    }
    // It started past the permission check, with the Role alone.
    let asked = fake.permissions_asked();
    assert!(
        asked.contains("create selfsubjectaccessreviews"),
        "{asked:?}"
    );
    // And it runs on the database the file names.
    fired.await;

    terminate(&child);
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(grace));
    let said = read_log();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{said}");
}
