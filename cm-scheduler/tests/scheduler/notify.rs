//! The systemd notify protocol through the binary, with the test as the supervisor: it binds a
//! Unix datagram socket, names it in `NOTIFY_SOCKET` (and a watchdog in `WATCHDOG_USEC`), runs
//! `cm-scheduler run`, and reads what arrives, as systemd does for a `Type=notify` unit.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cli::{NOWHERE, create_args, ok};
use crate::support::{PATIENCE, TestDb, cm_scheduler, poll_blocking, wait_until_blocking};

/// A socket the test listens on, in a directory of its own, removed at the end.
pub(crate) struct Supervisor {
    pub(crate) dir: PathBuf,
    socket: UnixDatagram,
}

/// One datagram, and when it came.
#[derive(Debug, Clone)]
pub(crate) struct Heard {
    pub(crate) at: Instant,
    pub(crate) text: String,
}

impl Heard {
    pub(crate) fn says(&self, assignment: &str) -> bool {
        self.text.lines().any(|line| line == assignment)
    }
}

impl Supervisor {
    pub(crate) fn new() -> Supervisor {
        let dir = std::env::temp_dir().join(format!("cm-notify-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = UnixDatagram::bind(dir.join("notify")).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Supervisor { dir, socket }
    }

    /// `cm-scheduler --database-url URL run ARGS` told to notify this socket, with a watchdog
    /// of `watchdog`; its log in the test's directory.
    fn start(&self, url: &str, args: &[&str], watchdog: Duration) -> Child {
        let log = std::fs::File::create(self.dir.join("log")).unwrap();
        cm_scheduler()
            .args(["--database-url", url, "run"])
            .args(args)
            .env("NOTIFY_SOCKET", self.dir.join("notify"))
            .env("WATCHDOG_USEC", watchdog.as_micros().to_string())
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting cm-scheduler run")
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Every datagram that arrives within `within`, until one `until` accepts (included).
    pub(crate) fn listen(&self, within: Duration, until: impl Fn(&Heard) -> bool) -> Vec<Heard> {
        let deadline = Instant::now() + within;
        let mut heard = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.socket.recv(&mut buf) {
                let one = Heard {
                    at: Instant::now(),
                    text: String::from_utf8_lossy(&buf[..n]).into_owned(),
                };
                let done = until(&one);
                heard.push(one);
                if done {
                    break;
                }
            }
        }
        heard
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn terminate(child: &Child) {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success());
}

/// The exit status, waiting at most `patience`.
pub(crate) fn wait_exit(child: &mut Child, patience: Duration) -> Option<std::process::ExitStatus> {
    let exited = poll_blocking(patience, || child.try_wait().unwrap(), Option::is_some);
    if exited.is_err() {
        let _ = child.kill();
    }
    exited.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_after_the_first_good_tick_watchdog_from_the_loop_stopping_on_sigterm() {
    let db = TestDb::new().await;
    ok(
        &db.url,
        &create_args("every-second", "* * * * * *", &["--message", "hi"]),
    );
    let supervisor = Supervisor::new();
    // Ticks 3 s apart, a watchdog of 1 s: the loop pings every half second while it waits for
    // the next tick, not only when a tick ends.
    let watchdog = Duration::from_secs(1);
    let mut child = supervisor.start(&db.url, &["--tick-interval", "3s"], watchdog);

    let before_ready = supervisor.listen(Duration::from_secs(30), |h| h.says("READY=1"));
    let ready = before_ready
        .last()
        .filter(|h| h.says("READY=1"))
        .unwrap_or_else(|| {
            panic!(
                "no READY=1 within 30 s; heard {before_ready:?}; log:\n{}",
                supervisor.log()
            )
        })
        .clone();
    // The first thing said is what it waits for; READY=1 comes once a tick went through, and
    // that tick claimed the every-second routine's occurrence.
    assert!(
        before_ready[0].says("STATUS=waiting for the database"),
        "{before_ready:?}"
    );
    assert!(ready.says("STATUS=ticking"), "{ready:?}");
    let fires: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        fires >= 1,
        "READY=1 came before any tick claimed: {before_ready:?}"
    );

    // Four seconds of a healthy loop: pings all along, none more than the watchdog apart
    // (systemd would restart it past that), over at least one tick.
    let after = supervisor.listen(Duration::from_secs(4), |_| false);
    let pings: Vec<Instant> = std::iter::once(ready.at)
        .chain(after.iter().filter(|h| h.says("WATCHDOG=1")).map(|h| h.at))
        .collect();
    assert!(pings.len() >= 6, "too few pings in 4 s: {after:?}");
    let longest = pings.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        longest < watchdog,
        "a gap of {longest:?} between pings, past the watchdog's {watchdog:?}: {after:?}"
    );
    assert!(
        !after.iter().any(|h| h.says("READY=1")),
        "READY=1 is said once: {after:?}"
    );

    // SIGTERM: STOPPING=1 before what is in flight settles, then exit 0.
    terminate(&child);
    let stopping = supervisor.listen(Duration::from_secs(10), |h| h.says("STOPPING=1"));
    assert!(
        stopping.last().is_some_and(|h| h.says("STOPPING=1")),
        "no STOPPING=1 within 10 s of SIGTERM: {stopping:?}; log:\n{}",
        supervisor.log()
    );
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "log:\n{}",
        supervisor.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_that_cannot_reach_its_database_never_says_ready() {
    let supervisor = Supervisor::new();
    let mut child = supervisor.start(NOWHERE, &["--tick-interval", "1s"], Duration::from_secs(1));
    let heard = supervisor.listen(Duration::from_secs(4), |_| false);
    assert!(
        heard
            .first()
            .is_some_and(|h| h.says("STATUS=waiting for the database")),
        "{heard:?}; log:\n{}",
        supervisor.log()
    );
    assert!(
        !heard.iter().any(|h| h.says("READY=1")),
        "ready without a database: {heard:?}"
    );
    // It never reached the tick loop, so the watchdog was never pinged: systemd's start-up
    // timeout (not the watchdog) is what bounds this wait.
    assert!(!heard.iter().any(|h| h.says("WATCHDOG=1")), "{heard:?}");
    terminate(&child);
    let stopping = supervisor.listen(Duration::from_secs(10), |h| h.says("STOPPING=1"));
    assert!(
        stopping.last().is_some_and(|h| h.says("STOPPING=1")),
        "{stopping:?}; log:\n{}",
        supervisor.log()
    );
    let status = wait_exit(&mut child, Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}

/// A claim that found nothing due.
fn empty_claim() -> cm_store::TickClaim {
    cm_store::TickClaim {
        now: chrono::Utc::now(),
        began: Instant::now(),
        token: cm_domain::ClaimToken(uuid::Uuid::from_u128(0xA)),
        fires: Vec::new(),
        deferred: 0,
        held: 0,
        more_due: false,
        resume_after: None,
        skipped: 0,
        unusable: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_that_never_ends_stops_the_watchdog_pings() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex, mpsc};

    // The loop against a ledger double: the first claim fails, the second finds nothing, the
    // third never returns until the test lets it (a loop stuck in a tick: the thread is held,
    // as by a lock that is never granted), and the rest find nothing.
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let claims = Arc::new(AtomicUsize::new(0));
    let counted = claims.clone();
    let mut ledger = cm_store::MockFireLedger::new();
    ledger
        .expect_claim_due()
        .returning(move |_| match counted.fetch_add(1, Ordering::SeqCst) {
            0 => Err(cm_store::StoreError::Database(sqlx::Error::PoolTimedOut)),
            2 => {
                let _ = released.lock().unwrap().recv();
                Ok(empty_claim())
            }
            _ => Ok(empty_claim()),
        });
    ledger
        .expect_reap_expired()
        .returning(|_| Ok(empty_claim()));
    ledger.expect_prune_settled().returning(|_, _| Ok(0));
    let mut dispatcher = cm_dispatch::MockDispatcher::new();
    dispatcher.expect_in_claim_effect().returning(|_| None);
    let config = cm_domain::SchedulerConfig {
        tick_interval: Duration::from_millis(100),
        lease: cm_domain::Lease::new(Duration::from_secs(1)).unwrap(),
        dispatch_timeout: Duration::from_millis(100),
        ..cm_domain::SchedulerConfig::default()
    };
    let supervisor = Supervisor::new();
    let watchdog = Duration::from_millis(400);
    let notifier = cm_scheduler::notify::Notifier::new(
        supervisor.dir.join("notify").to_str().unwrap(),
        Some(watchdog),
    )
    .unwrap();
    let scheduler = Arc::new(
        cm_scheduler::Scheduler::new(Arc::new(ledger), Arc::new(dispatcher), config, "me")
            .unwrap()
            .with_notifier(notifier),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = scheduler.clone().spawn(async {
        let _ = stopped.await;
    });

    // The failed tick is said (and pinged: the loop is alive), READY=1 only after the good one.
    let heard = tokio::task::block_in_place(|| {
        supervisor.listen(Duration::from_secs(5), |h| h.says("READY=1"))
    });
    let failing = heard
        .iter()
        .position(|h| h.says("STATUS=ticks are failing (the log says why); retrying every tick"))
        .unwrap_or_else(|| panic!("{heard:?}"));
    assert!(heard[failing].says("WATCHDOG=1"), "{heard:?}");
    assert!(heard.last().unwrap().says("READY=1"), "{heard:?}");

    // The third tick hangs: once it has begun, no ping comes for well past the watchdog.
    wait_until_blocking(
        "the third tick's claim",
        PATIENCE,
        || claims.load(Ordering::SeqCst),
        |claims| *claims >= 3,
    );
    let stuck = tokio::task::block_in_place(|| {
        let _ = supervisor.listen(Duration::from_millis(50), |_| false);
        supervisor.listen(watchdog * 3, |_| false)
    });
    assert!(
        !stuck.iter().any(|h| h.says("WATCHDOG=1")),
        "pinged while a tick hung: {stuck:?}"
    );

    // Let it go: the pings come back, and the loop stops when asked.
    release.send(()).unwrap();
    let back = tokio::task::block_in_place(|| {
        supervisor.listen(Duration::from_secs(2), |h| h.says("WATCHDOG=1"))
    });
    assert!(
        back.iter().any(|h| h.says("WATCHDOG=1")),
        "no ping after the tick ended: {back:?}"
    );
    stop.send(()).unwrap();
    let summary = run.await.unwrap();
    assert!(summary.ticks >= 3, "{summary:?}");
    let stopping = tokio::task::block_in_place(|| {
        supervisor.listen(Duration::from_secs(2), |h| h.says("STOPPING=1"))
    });
    assert!(
        stopping.iter().any(|h| h.says("STOPPING=1")),
        "{stopping:?}"
    );
}
