//! `cm-scheduler health`, the container's HEALTHCHECK, against whole `run --listen` processes:
//! 0 from a ready scheduler, non-zero with the reason from an unready one (its 503's body) and
//! from an address nothing listens on.

use std::process::{Output, Stdio};

use crate::operate::Running;
use crate::support::{TestDb, cm_scheduler};

/// `cm-scheduler health --listen ADDR`, with no CM_LISTEN of the environment's.
fn health(addr: &str) -> Output {
    cm_scheduler()
        .env_remove("CM_LISTEN")
        .args(["health", "--listen", addr, "--timeout", "2s"])
        .stdin(Stdio::null())
        .output()
        .expect("running cm-scheduler health")
}

/// A loopback port nothing listens on: bound, read and released.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_zero_against_a_ready_scheduler() {
    let db = TestDb::new().await;
    let scheduler = Running::start_with(&db.url, &[], &[]);
    scheduler.await_answer("/readyz", 200, "ready").await;
    let out = health(scheduler.addr());
    assert!(out.status.success(), "health failed: {}", stderr(&out));
    assert_eq!(stderr(&out), "");
    // The same through the environment the image sets for `run` and `health` alike.
    let out = cm_scheduler()
        .env("CM_LISTEN", scheduler.addr())
        .arg("health")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "health with CM_LISTEN: {}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_gives_the_503s_reason_in_one_line() {
    // A database server that is not there: the scheduler stays up, unready.
    let url = format!("postgres://postgres@127.0.0.1:{}/cm_absent", free_port());
    let scheduler = Running::start_with(&url, &[], &[]);
    let body = scheduler
        .await_answer("/readyz", 503, "waiting for the database")
        .await;
    let out = health(scheduler.addr());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = stderr(&out);
    assert_eq!(line.lines().count(), 1, "{line:?}");
    assert!(
        line.starts_with("cm-scheduler: not ready (503): "),
        "{line:?}"
    );
    let first = body
        .split_whitespace()
        .take(4)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(line.contains(&first), "{line:?} does not carry {body:?}");
}

#[test]
fn health_names_the_address_nothing_listens_on() {
    let addr = format!("127.0.0.1:{}", free_port());
    let out = health(&addr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("cm-scheduler: connection refused at {addr}\n")
    );
}

#[test]
fn health_refuses_a_bad_address_in_one_line() {
    let out = health("not-an-address");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

#[test]
fn health_without_an_address_says_where_to_give_one() {
    // `run` serves nothing unless told where; `health` must not guess an address that another
    // process may hold.
    let out = cm_scheduler()
        .env_remove("CM_LISTEN")
        .arg("health")
        .stdin(Stdio::null())
        .output()
        .expect("running cm-scheduler health");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = stderr(&out);
    assert_eq!(line.lines().count(), 1, "{line:?}");
    assert!(
        line.contains("--listen") && line.contains("CM_LISTEN"),
        "{line:?}"
    );
}
