//! Whole `cm-scheduler` processes killed with SIGKILL between claim and settle, or sent SIGTERM.
//!
//! The product has no test hook, so the tests stop a scheduler at an exact step with the
//! database's own locks. The schedulers here run the outbox as a dispatched backend
//! (`--outbox-mode dispatched`: a dispatch after the claim inserts into `outbox_messages`, as an
//! external backend's effect would be made) and a settle updates `routine_fires`; a test transaction holding `LOCK TABLE … IN EXCLUSIVE MODE` on one of
//! them makes that statement wait while plain reads go on. A scheduler whose dispatch is waiting
//! on the outbox lock has committed its claim and written nothing else: it is between claim and
//! settle, and stays there until the test lets go.
//!
//! Killing the process does not end a statement its server backend is already running:
//! PostgreSQL notices a vanished client only when it next reads from it or writes to it. Whether
//! a backend left waiting on a lock then runs the dead scheduler's statement depends on how far
//! the client got (a statement sqlx is still preparing waits in its Parse step and is dropped; one
//! already prepared, or sent by a simple-protocol client, runs and commits once the lock is
//! released). A crash takes its connections with it (a real one does, once TCP gives up), so to
//! be independent of that, the tests end those orphaned backends with `pg_terminate_backend`
//! after the SIGKILL and before releasing the lock.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::cli::create_args;
use crate::support::{TestDb, cm_scheduler, poll};

/// The settings both schedulers of a crash test run with: a short lease so the takeover comes
/// quickly, and a dispatch timeout shorter than it, as the binary requires.
const RUN_SETTINGS: &[&str] = &[
    "--tick-interval",
    "200ms",
    "--lease",
    "4s",
    "--dispatch-timeout",
    "3s",
    "--outbox-mode",
    "dispatched",
];

/// How long a test waits for something the schedulers should do within a few seconds.
const PATIENCE: Duration = Duration::from_secs(20);

impl TestDb {
    /// Creates a message routine through the command line and returns its id.
    fn create_routine(&self, schedule: &str) -> Uuid {
        let out = cli(
            &self.url,
            &create_args("crash", schedule, &["--message", "tick"]),
        );
        assert!(
            out.status.success(),
            "routine create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("routine create prints a UUID")
    }

    /// Pauses a routine through the command line, so nothing but the occurrence under test is
    /// ever claimed again.
    fn pause_routine(&self, id: Uuid) {
        let out = cli(&self.url, &["routine", "pause", &id.to_string()]);
        assert!(
            out.status.success(),
            "routine pause failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub(crate) async fn fires(&self) -> Vec<FireRow> {
        sqlx::query_as(
            "SELECT routine_id, scheduled_at, status, claimant, attempt, error, claimed_at,
                    lease_expires_at
             FROM cm.routine_fires ORDER BY scheduled_at",
        )
        .fetch_all(&self.pool)
        .await
        .expect("reading routine_fires")
    }

    async fn outbox(&self) -> Vec<OutboxRow> {
        sqlx::query_as(
            "SELECT routine_id, scheduled_at, attempt FROM cm.outbox_messages ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await
        .expect("reading outbox_messages")
    }

    /// Starts a transaction holding `table` in EXCLUSIVE mode: writers wait, readers do not.
    async fn lock(&self, table: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut tx = self
            .pool
            .begin()
            .await
            .expect("beginning the lock transaction");
        // The table names are the test's own constants, never input.
        sqlx::query(AssertSqlSafe(format!(
            "LOCK TABLE cm.{table} IN EXCLUSIVE MODE"
        )))
        .execute(&mut *tx)
        .await
        .expect("locking the table");
        tx
    }

    /// How many backends are waiting for a lock on `table`.
    async fn waiting_on(&self, table: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::text::regclass",
        )
        .bind(format!("cm.{table}"))
        .fetch_one(&self.pool)
        .await
        .expect("reading pg_locks")
    }

    /// Ends the backends a killed scheduler left waiting on `table`'s lock (see the module
    /// documentation), and waits until they are gone.
    async fn terminate_waiters(&self, table: &str) {
        sqlx::query(
            "SELECT pg_terminate_backend(a.pid)
             FROM pg_stat_activity a
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
               AND a.wait_event_type = 'Lock'",
        )
        .execute(&self.pool)
        .await
        .expect("terminating orphaned backends");
        eventually(async || (self.waiting_on(table).await == 0).then_some(()))
            .await
            .expect("the orphaned backends did not end");
    }
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct FireRow {
    pub(crate) routine_id: Uuid,
    pub(crate) scheduled_at: DateTime<Utc>,
    pub(crate) status: String,
    pub(crate) claimant: String,
    attempt: i32,
    error: Option<String>,
    claimed_at: DateTime<Utc>,
    lease_expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct OutboxRow {
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    attempt: i32,
}

/// Runs a short command of the binary to completion.
fn cli(url: &str, args: &[&str]) -> std::process::Output {
    cm_scheduler()
        .arg("--database-url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running cm-scheduler")
}

/// A `cm-scheduler run` process, killed when dropped so a failing test leaves nothing running.
pub(crate) struct SchedulerProcess {
    child: Child,
    log: PathBuf,
}

impl SchedulerProcess {
    /// Starts `run` with `RUN_SETTINGS`; its log goes to a file, because a pipe nobody drains
    /// would block the process once full.
    fn start(db: &TestDb, instance_id: &str) -> SchedulerProcess {
        SchedulerProcess::start_with(db, instance_id, &[], &[])
    }

    /// Starts `run` with `RUN_SETTINGS`, then `args`, with `env` added to its environment.
    pub(crate) fn start_with(
        db: &TestDb,
        instance_id: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> SchedulerProcess {
        SchedulerProcess::start_with_settings(db, instance_id, RUN_SETTINGS, args, env)
    }

    /// Starts `run` with `settings` in place of `RUN_SETTINGS`, then `args`, with `env` added.
    pub(crate) fn start_with_settings(
        db: &TestDb,
        instance_id: &str,
        settings: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> SchedulerProcess {
        let log = std::env::temp_dir().join(format!("{}-{instance_id}.log", db.name));
        let mut command = cm_scheduler();
        command
            .arg("--database-url")
            .arg(&db.url)
            .args(["run", "--instance-id", instance_id])
            .args(settings)
            .args(args);
        let child = crate::support::spawn_logged(&mut command, env, &log);
        SchedulerProcess { child, log }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process's id, to read its `/proc` entries.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the process gets no chance to settle anything.
    pub(crate) fn kill(&mut self) {
        self.child.kill().expect("sending SIGKILL");
        self.child.wait().expect("reaping the killed scheduler");
    }

    /// SIGTERM: the graceful shutdown docs/guide/design.md promises ("Operations").
    fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// The exit status, if the process ends within `timeout`.
    async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = &mut self.child;
        poll(
            timeout,
            async || child.try_wait().expect("polling the scheduler"),
            Option::is_some,
        )
        .await
        .ok()
        .flatten()
    }

    /// Stops the process with SIGTERM and asserts it exits 0 within a few seconds.
    pub(crate) async fn shut_down_gracefully(&mut self) {
        self.terminate();
        let status = self.wait_exit(Duration::from_secs(10)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "after SIGTERM the scheduler should exit 0 within 10 s, got {status:?}; its log:\n{}",
            self.log()
        );
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        crate::support::end_scheduler(&mut self.child, &self.log);
    }
}

/// Polls `probe` every 50 ms until it answers, for at most `PATIENCE`.
pub(crate) async fn eventually<T>(probe: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    crate::support::eventually_within(PATIENCE, probe).await
}

/// Waits until scheduler A, started while the test holds the outbox lock, holds a claim and its
/// dispatch is waiting inside the outbox INSERT. Returns the claimed row.
async fn claim_and_block(db: &TestDb, a: &SchedulerProcess) -> FireRow {
    let fire = eventually(async || {
        let fires = db.fires().await;
        let claimed = fires
            .iter()
            .any(|f| f.status == "claimed" && f.claimant == "A");
        (claimed && db.waiting_on("outbox_messages").await > 0).then_some(fires)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "A never claimed an occurrence and blocked on the outbox; its log:\n{}",
            a.log()
        )
    });
    // The schedule fires every five seconds and this looks within a fraction of one after the
    // first claim, so A can only have claimed the one occurrence whose dispatch is blocked.
    assert_eq!(
        fire.len(),
        1,
        "A claimed more than one occurrence: {fire:?}"
    );
    fire.into_iter().next().unwrap()
}

/// Waits until the occurrence `claimed` names is settled and returns its row.
/// With A dead and its occurrence still `claimed`: pauses the routine (so only that occurrence
/// matters), releases `lock`, starts B, and asserts B took the expired claim over as attempt 2
/// and settled it `fired` (`verb` says what B had left to do).
async fn b_takes_over(
    db: &TestDb,
    routine: Uuid,
    lock: sqlx::Transaction<'static, sqlx::Postgres>,
    claimed: &FireRow,
    verb: &str,
) -> (SchedulerProcess, FireRow) {
    db.pause_routine(routine);
    lock.rollback().await.expect("releasing the lock");

    let b = SchedulerProcess::start(db, "B");
    let fire = taken_over_by_b(db, claimed, &b, verb).await;
    (b, fire)
}

/// Waits until B settles the occurrence `claimed` names, and asserts B took the expired claim
/// over as attempt 2 and settled it `fired` (`verb` says what B had left to do).
pub(crate) async fn taken_over_by_b(
    db: &TestDb,
    claimed: &FireRow,
    b: &SchedulerProcess,
    verb: &str,
) -> FireRow {
    retried_by(db, claimed, b, "B", verb).await
}

/// Waits until `process` (instance `instance`) settles the occurrence `claimed` names, and
/// asserts it took the expired claim over as attempt 2 and settled it `fired`, with no error
/// (`verb` says what the second attempt had left to do).
pub(crate) async fn retried_by(
    db: &TestDb,
    claimed: &FireRow,
    process: &SchedulerProcess,
    instance: &str,
    verb: &str,
) -> FireRow {
    let fire = settled(db, claimed, process).await;
    assert_eq!(
        (
            fire.status.as_str(),
            fire.attempt,
            fire.claimant.as_str(),
            fire.error.as_deref()
        ),
        ("fired", 2, instance, None),
        "{instance} should take the expired claim over as attempt 2 and {verb} it: {fire:?}; \
         its log:\n{}",
        process.log()
    );
    fire
}

async fn settled(db: &TestDb, claimed: &FireRow, b: &SchedulerProcess) -> FireRow {
    eventually(async || {
        db.fires().await.into_iter().find(|f| {
            f.routine_id == claimed.routine_id
                && f.scheduled_at == claimed.scheduled_at
                && f.status != "claimed"
        })
    })
    .await
    .unwrap_or_else(|| panic!("B never settled the occurrence; its log:\n{}", b.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_claim_and_dispatch_is_taken_over_once() {
    let db = TestDb::new().await;
    let routine = db.create_routine("*/5 * * * * *");

    let outbox_lock = db.lock("outbox_messages").await;
    let mut a = SchedulerProcess::start(&db, "A");
    let claimed = claim_and_block(&db, &a).await;
    a.kill();
    db.terminate_waiters("outbox_messages").await;

    // The crash left the occurrence owed: still claimed by A's first attempt, nothing sent.
    let fires = db.fires().await;
    assert_eq!(fires.len(), 1, "{fires:?}");
    let orphan = &fires[0];
    assert_eq!(
        (
            orphan.routine_id,
            orphan.status.as_str(),
            orphan.attempt,
            orphan.claimant.as_str()
        ),
        (routine, "claimed", 1, "A"),
        "a killed scheduler's claim should stay as it was: {orphan:?}"
    );
    assert_eq!(
        db.outbox().await,
        vec![],
        "A was killed before its outbox INSERT ran"
    );

    let (mut b, fire) = b_takes_over(&db, routine, outbox_lock, &claimed, "fire").await;
    assert_eq!(
        db.outbox().await,
        vec![OutboxRow {
            routine_id: routine,
            scheduled_at: claimed.scheduled_at,
            attempt: 2
        }],
        "the occurrence should be sent exactly once, by B's attempt"
    );
    assert!(
        fire.claimed_at >= orphan.lease_expires_at,
        "B took the claim over before A's lease ran out: {orphan:?} then {fire:?}"
    );
    assert_eq!(
        db.fires().await,
        vec![fire],
        "no other occurrence should have been claimed"
    );

    b.shut_down_gracefully().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_dispatch_and_settle_is_not_sent_twice() {
    let db = TestDb::new().await;
    let routine = db.create_routine("*/5 * * * * *");

    // Stop A inside its dispatch, then hold the ledger too, so that when the outbox lets A's
    // INSERT through, A's settle is the statement left waiting.
    let outbox_lock = db.lock("outbox_messages").await;
    let mut a = SchedulerProcess::start(&db, "A");
    let claimed = claim_and_block(&db, &a).await;
    let ledger_lock = db.lock("routine_fires").await;
    outbox_lock
        .rollback()
        .await
        .expect("releasing the outbox lock");
    let sent = eventually(async || {
        let outbox = db.outbox().await;
        (!outbox.is_empty() && db.waiting_on("routine_fires").await > 0).then_some(outbox)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "A never wrote its message and blocked on its settle; its log:\n{}",
            a.log()
        )
    });
    a.kill();
    db.terminate_waiters("routine_fires").await;

    // The message went out under attempt 1, but the ledger does not know it.
    let a_message = OutboxRow {
        routine_id: routine,
        scheduled_at: claimed.scheduled_at,
        attempt: 1,
    };
    assert_eq!(sent, vec![a_message.clone()]);
    let fires = db.fires().await;
    assert_eq!(
        fires
            .iter()
            .map(|f| (f.status.as_str(), f.attempt, f.claimant.as_str()))
            .collect::<Vec<_>>(),
        vec![("claimed", 1, "A")],
        "A's settle never ran: {fires:?}"
    );

    let (mut b, fire) = b_takes_over(&db, routine, ledger_lock, &claimed, "settle").await;
    // B's dispatch found the occurrence's message already there and wrote nothing: the
    // idempotency key absorbed the retry.
    assert_eq!(
        db.outbox().await,
        vec![a_message],
        "the retry must not send a second message"
    );
    assert_eq!(
        db.fires().await,
        vec![fire],
        "no other occurrence should have been claimed"
    );

    b.shut_down_gracefully().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_0_and_leaves_nothing_claimed() {
    let db = TestDb::new().await;
    db.create_routine("* * * * * *");

    let mut scheduler = SchedulerProcess::start(&db, "S");
    eventually(async || {
        let fired = db
            .fires()
            .await
            .iter()
            .filter(|f| f.status == "fired")
            .count();
        (fired >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the scheduler did not fire twice; its log:\n{}",
            scheduler.log()
        )
    });
    scheduler.shut_down_gracefully().await;

    let fires = db.fires().await;
    assert!(
        fires.iter().all(|f| f.status == "fired"),
        "every claim should be settled fired: {fires:?}"
    );
    // Each fired occurrence sent exactly one message, and nothing was sent unaccounted for.
    let sent: Vec<_> = db
        .outbox()
        .await
        .into_iter()
        .map(|m| (m.routine_id, m.scheduled_at))
        .collect();
    let fired: Vec<_> = fires
        .iter()
        .map(|f| (f.routine_id, f.scheduled_at))
        .collect();
    assert_eq!(sent, fired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_dispatch_settles_before_exiting() {
    let db = TestDb::new().await;
    let routine = db.create_routine("*/5 * * * * *");

    let outbox_lock = db.lock("outbox_messages").await;
    let mut scheduler = SchedulerProcess::start(&db, "A");
    let claimed = claim_and_block(&db, &scheduler).await;
    scheduler.terminate();
    // The dispatch is still waiting on the lock, so the scheduler must still be finishing it.
    assert_eq!(
        scheduler.wait_exit(Duration::from_millis(500)).await,
        None,
        "the scheduler exited with a dispatch in flight; its log:\n{}",
        scheduler.log()
    );
    // Let the dispatch through well within its 3 s timeout.
    outbox_lock
        .rollback()
        .await
        .expect("releasing the outbox lock");
    let status = scheduler.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "after SIGTERM the scheduler should exit 0 within 10 s, got {status:?}; its log:\n{}",
        scheduler.log()
    );

    let fires = db.fires().await;
    assert_eq!(
        fires
            .iter()
            .map(|f| (f.scheduled_at, f.status.as_str(), f.attempt))
            .collect::<Vec<_>>(),
        vec![(claimed.scheduled_at, "fired", 1)],
        "the in-flight occurrence should be settled before exit: {fires:?}"
    );
    assert_eq!(
        db.outbox().await,
        vec![OutboxRow {
            routine_id: routine,
            scheduled_at: claimed.scheduled_at,
            attempt: 1
        }]
    );
}
