//! Developer tasks for cm, run as `cargo xtask <task>`.
//!
//! - `demo [--database-url URL]`: runs the scheduler on this machine's PostgreSQL (database `cm`
//!   by default) with a demo routine and shows its fires as they happen (the README's first
//!   command).
//! - `ci`: what CI runs: formatting, clippy with warnings as errors, and the whole test suite.
//! - `bench [--quick] [--batch N] [--tick DURATION] [--engine-args "FLAGS"] [--rounds N] ...`:
//!   fires per second of two `cm-scheduler` processes beside raw-SQL baselines (pgbench) of the
//!   same work, and lateness with and without a stalled dispatch, in fresh databases it drops
//!   afterwards (`docs/BENCHMARKS.md`; `--help` lists every flag). Run it built in release:
//!   `cargo run --release -p xtask -- bench`.
//! - `chaos [--short] [--routines N] [--processes N] [--duration SECONDS] [--seed N]
//!   [--db-restarts N] [--terminate-backends N] [--keep] [--database-url URL]
//!   [--message-backend outbox|webhook]`: scheduler processes killed with SIGKILL at random,
//!   PostgreSQL restarted and their connections terminated under them, then a ledger check that
//!   nothing was lost or doubled (`docs/CHAOS.md`; `--short` is CI's run, under two minutes;
//!   with `webhook`, the messages go to a slow receiver of the run's own, which checks every
//!   delivery's signature, and the check covers every delivery).
//! - `scale [--quick] [--keep] [--database-url URL]`: the store at a million routines and ten
//!   million ledger rows: idle claim cost, throughput of many routines against few, peak memory,
//!   `fires` first page, and retention beside the claims, in a fresh database it drops afterwards
//!   (`docs/BENCHMARKS.md`, "Scale"). Run it built in release:
//!   `cargo run --release -p xtask -- scale`.
//!
//! The tidy checks (the domain is pure, every source file says what it is for) are ordinary
//! tests in this crate, so `cargo test --workspace` runs them.

use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

mod bench;
mod chaos;
mod scale;
mod tidy;

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/cm";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("chaos") => chaos::run(&args[1..]),
        Some("scale") => scale::run(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <demo|ci|bench|chaos|scale>");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A cargo command, without the variables `cargo run` set for xtask itself. Build scripts
/// such as ring's (through cc) ask to be rerun when `CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`
/// and the like change in cargo's environment, so a cargo started with xtask's values rebuilt
/// ring and everything above it (rustls, reqwest, kube, async-nats), and the next cargo started
/// from a shell rebuilt them again.
fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if is_set_by_cargo_run(&key) {
            command.env_remove(key.as_ref());
        }
    }
    command
}

/// Whether `cargo run` sets `key` for the program it runs (as opposed to configuration a
/// person exported, such as `CARGO_HOME` or `CARGO_TARGET_DIR`).
fn is_set_by_cargo_run(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_EXE_")
        || [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_MANIFEST_LINKS",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_RUSTC_CURRENT_DIR",
        ]
        .contains(&key)
}

fn run(mut command: Command) -> anyhow::Result<()> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// The options of a measuring command (`bench`, `scale`), or `None` once `--help` has printed
/// its usage. Bad input is one line and exit 2, before anything is built or created; a build
/// without optimisations is warned about, since its in-process figures mean little.
fn measuring_options<T>(
    command: &str,
    parsed: anyhow::Result<Option<T>>,
    usage: &str,
) -> Option<T> {
    let options = match parsed {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{usage}");
            return None;
        }
        Err(e) => {
            eprintln!("xtask {command}: {e:#}");
            std::process::exit(2);
        }
    };
    if cfg!(debug_assertions) {
        eprintln!(
            "xtask {command}: WARNING: built without optimisations; the in-process figures are \
             not representative. Use `cargo run --release -p xtask -- {command}`."
        );
    }
    Some(options)
}

/// Whether something accepts TCP connections at the URL's host and port.
fn postgres_answers(url: &str) -> bool {
    let rest = url.split("://").nth(1).unwrap_or("");
    let host_port = rest.split('/').next().unwrap_or("");
    let host_port = host_port.rsplit('@').next().unwrap_or("");
    let with_port = if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5432")
    };
    use std::net::ToSocketAddrs;
    with_port
        .to_socket_addrs()
        .map(|mut addrs| {
            addrs.any(|a| {
                std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok()
            })
        })
        .unwrap_or(false)
}

fn demo() -> anyhow::Result<()> {
    // Not DATABASE_URL: `.cargo/config.toml` points that at the server database the tests
    // create their own databases from, and the demo must not write there.
    let args: Vec<String> = std::env::args().skip(2).collect();
    let url = match args.as_slice() {
        [] => DEFAULT_DATABASE_URL.to_string(),
        [flag, url] if flag == "--database-url" => url.clone(),
        _ => bail!("usage: cargo xtask demo [--database-url URL]"),
    };
    if !postgres_answers(&url) {
        bail!(
            "PostgreSQL does not answer at {url}.\n\
             Start it (on Debian: `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`),\n\
             or pass --database-url URL for a server that runs."
        );
    }
    // Not --quiet: the first build takes minutes, and cargo's progress shows it is moving.
    run({
        let mut c = cargo();
        c.args(["build", "--package", "cm-scheduler"]);
        c
    })?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let binary = target.join("debug/cm-scheduler");
    let scheduler = |args: &[&str]| {
        let mut c = Command::new(&binary);
        c.arg("--database-url").arg(&url).args(args);
        // Each fire's own line (its routine and occurrence) is logged at debug.
        if std::env::var_os("RUST_LOG").is_none() {
            c.env("RUST_LOG", "info,sqlx=warn,cm_scheduler::engine=debug");
        }
        c
    };
    // `migrate` creates the database if it does not exist yet.
    run(scheduler(&["migrate"]))?;
    let listed = scheduler(&["routine", "list", "--json"])
        .output()
        .context("listing routines")?;
    let has_demo = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .any(|line| line.contains("\"name\":\"demo: every 5 seconds\""));
    if !has_demo {
        run(scheduler(&[
            "routine",
            "create",
            "--name",
            "demo: every 5 seconds",
            "--schedule",
            "*/5 * * * * *",
            "--message",
            "hello from cm",
        ]))?;
    }
    eprintln!(
        "xtask: running the scheduler on {url}; its fires are logged as they happen (Ctrl-C stops it)"
    );
    let shown = binary
        .strip_prefix(workspace_root())
        .unwrap_or(&binary)
        .display()
        .to_string();
    eprintln!(
        "xtask: `{shown} --database-url {url} fires` and the outbox_messages table show what it \
         wrote (`cargo install --path cm-scheduler` puts cm-scheduler on the PATH)"
    );
    run(scheduler(&["run", "--listen", "127.0.0.1:9464"]))
}

fn ci() -> anyhow::Result<()> {
    run({
        let mut c = cargo();
        c.args(["fmt", "--all", "--", "--check"]);
        c
    })?;
    run({
        let mut c = cargo();
        c.args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]);
        c
    })?;
    run({
        let mut c = cargo();
        c.args(["test", "--workspace", "--all-features"]);
        c
    })
}

/// The URL of database `name` on the server `server_url` names (the bench's and the chaos run's
/// throwaway databases).
fn database_url(server_url: &str, name: &str) -> anyhow::Result<String> {
    let mut url = url::Url::parse(server_url)
        .with_context(|| format!("invalid --database-url {server_url:?}"))?;
    url.set_path(&format!("/{name}"));
    Ok(url.to_string())
}

fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

#[cfg(test)]
mod cargo_env_tests {
    #[test]
    fn cargo_started_by_xtask_does_not_see_the_variables_cargo_set_for_xtask() {
        // This test runs under cargo too, with CARGO_PKG_NAME and CARGO_MANIFEST_DIR set.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let command = super::cargo();
        let removed: Vec<String> = command
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(key, _)| key.to_string_lossy().into_owned())
            .collect();
        for key in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
        ] {
            assert!(
                removed.iter().any(|k| k == key),
                "{key} is passed on: {removed:?}"
            );
        }
        assert!(!super::is_set_by_cargo_run("CARGO_TARGET_DIR"));
        assert!(!super::is_set_by_cargo_run("CARGO_HOME"));
    }
}
