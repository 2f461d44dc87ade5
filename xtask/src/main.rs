//! Developer tasks for cm, run as `cargo xtask <task>`. xtask itself depends on nothing but the
//! standard library, so it builds in seconds and each task builds only what it needs.
//!
//! - `demo [--database-url URL]`: builds `cm-scheduler` and runs it on this machine's
//!   PostgreSQL (database `cm` by default) with a demo routine, its fires logged as they happen
//!   (the README's first command). The scheduler replaces xtask, so Ctrl-C reaches it alone: it
//!   settles what is in flight and exits 0.
//! - `test [ARGS]`: the whole test suite (the README's second command): `cargo test --workspace`,
//!   then the tests that need a service this machine has (Citus, a Docker engine, Chromium, …),
//!   ending with one line that counts what passed, failed and was skipped, and why
//!   ([`testrun`]).
//! - `ci`: what CI runs: formatting, clippy with warnings as errors, and `test` with every
//!   service required.
//! - `bench`, `chaos`, `scale`: the measuring and fault-injection harness, the `cm-lab` crate,
//!   built (in release for `bench` and `scale`) and run with the same arguments; `--help` lists
//!   each one's flags.
//!
//! The tidy checks (the domain is pure, every source file says what it is for) are ordinary
//! tests in this crate, so `cargo test --workspace` runs them.

use std::process::{Command, ExitCode};

mod cargo_env;
mod rooms;
mod testrun;
mod tidy;

use cargo_env::{cargo, postgres_answers, target_dir, workspace_root};

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/cm";

/// What every routine the demo's scheduler fires logs: each fire at info (target
/// `cm_scheduler::fires`), warnings and errors, and none of the per-tick debug lines.
const DEMO_LOG: &str = "info,sqlx=warn";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or_default();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(rest),
        Some("test") => testrun::run(rest, std::env::var("CI").is_ok_and(|ci| ci == "true")),
        Some("ci") => ci(),
        Some(task @ ("bench" | "chaos" | "scale")) => lab(task, rest),
        _ => {
            eprintln!("usage: cargo xtask <demo|test|ci|bench|chaos|scale> [ARGS]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("xtask: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(e)) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
        Err(Failure::Exit(code)) => ExitCode::from(code),
    }
}

/// How a task ends when it does not succeed.
#[derive(Debug)]
enum Failure {
    /// Bad input: one line, exit 2.
    Usage(String),
    /// Something it ran failed: one line, exit 1.
    Failed(String),
    /// A program it ran ended with this code, which xtask passes on (it said why itself).
    Exit(u8),
}

type Outcome = Result<(), Failure>;

/// Runs `command` to its end; an error names it and how it ended.
fn run(mut command: Command) -> Outcome {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .map_err(|e| Failure::Failed(format!("cannot start {shown}: {e}")))?;
    if !status.success() {
        return Err(Failure::Failed(format!("{shown} failed with {status}")));
    }
    Ok(())
}

/// `cargo run [--release] -p cm-lab -- TASK ARGS`: the harness, built only for its tasks.
/// `bench` and `scale` measure, so they run optimised; `chaos` checks, in a debug build.
fn lab(task: &str, args: &[String]) -> Outcome {
    let mut c = cargo();
    c.arg("run");
    if task != "chaos" {
        c.arg("--release");
    }
    c.args(["--quiet", "--package", "cm-lab", "--", task])
        .args(args);
    let status = c
        .status()
        .map_err(|e| Failure::Failed(format!("cannot start cargo: {e}")))?;
    match status.code() {
        Some(0) => Ok(()),
        // cm-lab said what went wrong; its exit code (2 for bad input) is passed on.
        Some(code) => Err(Failure::Exit(u8::try_from(code).unwrap_or(1))),
        None => Err(Failure::Failed(format!(
            "cm-lab {task} ended with {status}"
        ))),
    }
}

fn demo(args: &[String]) -> Outcome {
    // Not DATABASE_URL: `.cargo/config.toml` points that at the server database the tests
    // create their own databases from, and the demo must not write there.
    let url = match args {
        [] => DEFAULT_DATABASE_URL.to_string(),
        [flag, url] if flag == "--database-url" => url.clone(),
        _ => {
            return Err(Failure::Usage(
                "usage: cargo xtask demo [--database-url URL]".into(),
            ));
        }
    };
    if !postgres_answers(&url) {
        return Err(Failure::Failed(format!(
            "PostgreSQL does not answer at {url}.\n\
             Start it (on Debian: `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`),\n\
             or pass --database-url URL for a server that runs."
        )));
    }
    // Not --quiet: the first build takes minutes, and cargo's progress shows it is moving.
    run({
        let mut c = cargo();
        c.args(["build", "--package", "cm-scheduler"]);
        c
    })?;
    let binary = target_dir().join("debug/cm-scheduler");
    let scheduler = |args: &[&str]| {
        let mut c = Command::new(&binary);
        c.arg("--database-url").arg(&url).args(args);
        if std::env::var_os("RUST_LOG").is_none() {
            c.env("RUST_LOG", DEMO_LOG);
        }
        c
    };
    // `migrate` creates the database if it does not exist yet.
    run(scheduler(&["migrate"]))?;
    let listed = scheduler(&["routine", "list", "--json"])
        .output()
        .map_err(|e| Failure::Failed(format!("listing routines: {e}")))?;
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
    // The scheduler takes xtask's place (cargo's `run` already gave xtask its own), so a
    // terminal's Ctrl-C reaches it alone, and the shell's prompt comes back after its last line
    // with its exit code, 0 after a clean stop.
    use std::os::unix::process::CommandExt as _;
    let e = scheduler(&["run", "--listen", "127.0.0.1:9464"]).exec();
    Err(Failure::Failed(format!(
        "cannot start {}: {e}",
        binary.display()
    )))
}

fn ci() -> Outcome {
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
    testrun::run(&[], true)
}
