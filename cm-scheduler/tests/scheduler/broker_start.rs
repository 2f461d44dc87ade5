//! A message broker that does not answer when the scheduler starts (a NATS server restarting
//! at that moment) is waited for, as the database is: the process stays up, `/readyz` says why,
//! and it fires once the server answers.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cm_store::{PgStore, RoutineKind, RoutineStore};

use crate::operate::{Running, every_second, fired_count};
use crate::support::{TestDb, eventually_within};

/// A `nats-server -js` of the test's own on `port`, with a store directory of its own; killed
/// and its store removed when dropped.
struct NatsServer {
    child: Child,
    store: std::path::PathBuf,
}

impl NatsServer {
    fn start(port: u16) -> NatsServer {
        let store =
            std::env::temp_dir().join(format!("cm-nats-start-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&store).expect("the store directory");
        let child = Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting nats-server");
        NatsServer { child, store }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_nats_server_that_is_not_there_yet() {
    let db = TestDb::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let mut scheduler = Running::start_with(
        &db.url,
        &[
            "--message-backend",
            "nats",
            "--nats-url",
            &url,
            "--nats-stream",
            "CMSTART",
        ],
        &[],
    );
    let body = scheduler
        .await_answer("/readyz", 503, "waiting for NATS")
        .await;
    assert!(
        body.contains("cannot connect to NATS") && body.contains(&format!("127.0.0.1:{port}")),
        "{body}"
    );
    PgStore::new(db.pool.clone())
        .create_routine(every_second("heartbeat", RoutineKind::Message, "UTC"))
        .await
        .unwrap();
    // Still waiting a few seconds on, not exited, and nothing fired: time passes on purpose, to
    // show it does not give up and does not dispatch before the server answers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    scheduler.assert_alive();
    assert_eq!(fired_count(&db.pool).await, 0);

    let _server = NatsServer::start(port);
    scheduler.await_answer("/readyz", 200, "ready").await;
    let fired = eventually_within(Duration::from_secs(30), async || {
        let n = fired_count(&db.pool).await;
        (n > 0).then_some(n)
    })
    .await;
    assert!(
        fired.is_some(),
        "nothing fired; the log:\n{}",
        scheduler.log()
    );
    scheduler.assert_alive();
    let log = scheduler.log();
    assert!(log.contains("NATS does not answer yet; retrying"), "{log}");
    assert!(log.contains("message backend: NATS JetStream"), "{log}");
}
