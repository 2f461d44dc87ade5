//! `ServiceConfig::validate`: every rule `run`'s flags must keep, refused in one line before
//! anything starts (no database, no socket: the checks read no file and open no connection).

use clap::Parser as _;
use cm_scheduler::Failure;
use cm_scheduler::flags::{Cli, Command};
use cm_scheduler::service::ServiceConfig;

/// `run FLAGS` on `postgres://cm@db/cm`, validated: `ok`, or the refusal.
fn check(flags: &str, expected: &str) {
    let cli = Cli::try_parse_from(
        ["cm-scheduler", "run"]
            .into_iter()
            .chain(flags.split_whitespace()),
    )
    .unwrap_or_else(|e| panic!("{flags}: {e}"));
    let Command::Run(run) = cli.command else {
        panic!("{flags}: not run");
    };
    let config = ServiceConfig {
        database_url: "postgres://cm@db/cm".into(),
        run: *run,
    };
    let got = match config.validate() {
        Ok(_) => "ok".to_owned(),
        Err(Failure::Input(message)) => message,
        Err(Failure::Other(message)) => format!("other: {message}"),
    };
    assert_eq!(got, expected, "{flags}");
}

#[test]
fn run_flags_are_checked_before_anything_starts() {
    check("", "ok");
    check("--tick-interval 5s --group-lease 15s", "ok");
    check("--lease 0s", "--lease must be greater than zero");
    check(
        "--max-fires-per-tick 0",
        "--max-fires-per-tick must be at least 1",
    );
    check(
        "--tick-interval 10s",
        "--tick-interval 10s needs a --group-lease of at least three tick intervals (30s; it \
         is 15s, 15s unless given): a group's lease is renewed at most once a tick; shorten the \
         interval or lengthen the lease",
    );
    check("--listen 127.0.0.1:0", "ok");
    check(
        "--listen 0.0.0.0:8080",
        "--listen 0.0.0.0:8080 is not a loopback address: give --http-token-file with the \
         status page's bearer token",
    );
    check("--listen 0.0.0.0:8080 --http-token-file token", "ok");
    check("--allowed-host cm.example", "--allowed-host needs --listen");
}

#[test]
fn the_database_url_is_checked_with_the_flags() {
    let cli = Cli::try_parse_from(["cm-scheduler", "run"]).unwrap();
    let Command::Run(run) = cli.command else {
        panic!("not run");
    };
    let config = ServiceConfig {
        database_url: "mysql://cm@db/cm".into(),
        run: *run,
    };
    assert_eq!(
        config.validate().unwrap_err(),
        Failure::Input(
            "invalid --database-url mysql://cm@db/cm: the scheme is \"mysql\", not postgres \
             (expected postgres://USER@HOST:PORT/DATABASE)"
                .into()
        )
    );
}
