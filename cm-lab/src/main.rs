//! cm's measuring and fault-injection harness, run through `cargo xtask bench|chaos|scale` (which
//! runs `cargo run [--release] -p cm-lab -- …`). It links the engine and every backend, so it is
//! built only when one of its tasks runs, never by `cargo xtask demo`.
//!
//! - `bench [--quick] [--batch N] [--tick DURATION] [--engine-args "FLAGS"] [--rounds N] ...`:
//!   fires per second of two `cm-scheduler` processes beside raw-SQL baselines (pgbench) of the
//!   same work, and lateness with and without a stalled dispatch, in fresh databases it drops
//!   afterwards (`docs/BENCHMARKS.md`; `--help` lists every flag). Built in release.
//! - `chaos [--short] [--routines N] [--processes N] [--duration SECONDS] [--seed N]
//!   [--db-restarts N] [--terminate-backends N] [--keep] [--database-url URL]
//!   [--message-backend outbox|webhook|nats] [--mission-backend docker] …`: scheduler processes
//!   killed with SIGKILL at random, PostgreSQL restarted and their connections terminated under
//!   them, then a ledger check that nothing was lost or doubled (`docs/CHAOS.md`; `--short` is
//!   CI's run, under two minutes).
//! - `scale [--quick] [--keep] [--database-url URL]`: the store at a million routines and ten
//!   million ledger rows (`docs/BENCHMARKS.md`, "Scale"). Built in release.

use std::process::{Command, ExitCode};

use anyhow::{Context, bail};

mod bench;
#[path = "../../xtask/src/cargo_env.rs"]
mod cargo_env;
mod chaos;
mod scale;

pub(crate) use cargo_env::{cargo, postgres_answers, target_dir, workspace_root};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench::run(&args[1..]),
        Some("chaos") => chaos::run(&args[1..]),
        Some("scale") => scale::run(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <bench|chaos|scale> [--help]");
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

/// Runs `command` to its end; an error names it and how it ended.
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
             not representative. Use `cargo xtask {command}`, which builds it in release."
        );
    }
    Some(options)
}

/// The URL of database `name` on the server `server_url` names (the bench's and the chaos run's
/// throwaway databases).
fn database_url(server_url: &str, name: &str) -> anyhow::Result<String> {
    let mut url = url::Url::parse(server_url)
        .with_context(|| format!("invalid --database-url {server_url:?}"))?;
    url.set_path(&format!("/{name}"));
    Ok(url.to_string())
}
