//! `cargo xtask chaos`: scheduler processes killed with SIGKILL at random and PostgreSQL
//! restarted under them, then a ledger check that no occurrence was lost or doubled.
//!
//! The run, in order:
//!
//! 1. builds `cm-scheduler`, creates a fresh database `cm_chaos_<random>` on the server, migrates
//!    it and creates `--routines` message routines firing every second with the `catch-up`
//!    misfire policy, recording each one's first `next_run_at`;
//! 2. starts `--processes` scheduler processes (`cm-scheduler run`), each logging to its own file
//!    (with `--message-backend webhook`, after starting a slow webhook receiver of its own on
//!    127.0.0.1 and writing a random signing secret; see [`webhook`]);
//! 3. for `--duration` seconds kills a random one with SIGKILL every 1 to 4 seconds (half of the
//!    kills aimed just after a whole second, when the occurrences of that second are being
//!    claimed and dispatched) and starts it again, under its old instance id or a new one; and
//!    restarts PostgreSQL `--db-restarts` times;
//! 4. pauses every routine (through the binary), waits until no `claimed` row is left, stops the
//!    schedulers with SIGTERM and checks that each exits 0;
//! 5. checks the ledger: every second from a routine's first occurrence to its last has exactly
//!    one `routine_fires` row, every row is settled, and every `fired` row has exactly one
//!    `outbox_messages` row written by one of its attempts, with no message that has no fire.
//!    With the webhook backend, the receiver's record replaces the outbox: every `fired` row was
//!    delivered with a valid signature and accepted, no delivery names an occurrence without a
//!    row, and every repeated delivery of one `webhook-id` names the same occurrence at a higher
//!    attempt (or is the backend's resend of one attempt right after a 503);
//! 6. prints a summary and fails if anything was lost, doubled or left unsettled, if a scheduler
//!    stalled or died on its own, or if one exited non-zero on SIGTERM.
//!
//! The seed fixes the sequence of decisions (intervals, victims, instance ids, restart times); the
//! interleaving with the schedulers' own timing is not reproducible, so a seed reproduces the kind
//! of run, not the exact one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgPool, PgPoolOptions};
use uuid::Uuid;

use crate::database_url;

mod webhook;

const USAGE: &str = "usage: cargo xtask chaos [--short] [--database-url URL] [--routines N]
                          [--processes N] [--duration SECONDS] [--seed N] [--db-restarts N]
                          [--terminate-backends N] [--pg-cluster VERSION/NAME] [--keep]
                          [--message-backend outbox|webhook]";

/// The server the chaos database is created on. Not `DATABASE_URL`: `.cargo/config.toml` sets
/// that for every process cargo runs, so it would silently win over what the user meant.
const DEFAULT_SERVER_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The schedulers' settings. A short tick and lease make crashes visible within seconds; the
/// ten-minute grace and the large backlog make sure an outage skips no occurrence by policy, so
/// every second of every routine is owed and a gap in the ledger can only be a loss.
const RUN_FLAGS: &[&str] = &[
    "--tick-interval",
    "200ms",
    "--lease",
    "3s",
    "--dispatch-timeout",
    "2s",
    "--max-attempts",
    "10",
    "--misfire-grace",
    "10m",
    "--max-backlog",
    "10000",
];

/// How long the drain after the chaos may take: expired leases (3 s) must be reaped and retried.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a scheduler may take to exit after SIGTERM: it settles in-flight dispatches, each
/// bounded by the 2 s dispatch timeout.
const SIGTERM_TIMEOUT: Duration = Duration::from_secs(20);

/// How far a routine's last occurrence may trail the moment the routines were paused. Every
/// routine fires every second, so a larger gap means the schedulers had stopped keeping up: a
/// stall would otherwise pass the check, since only the span up to the last occurrence is owed.
const MAX_LAG: Duration = Duration::from_secs(15);

/// Where the schedulers send their messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageBackend {
    /// The transactional outbox, the product's default.
    Outbox,
    /// Signed HTTP POSTs to the run's own slow receiver.
    Webhook,
}

impl MessageBackend {
    fn name(self) -> &'static str {
        match self {
            MessageBackend::Outbox => "outbox",
            MessageBackend::Webhook => "webhook",
        }
    }
}

/// The settings of one run.
#[derive(Debug, Clone, PartialEq)]
struct Options {
    server_url: String,
    routines: usize,
    processes: usize,
    duration: Duration,
    seed: u64,
    db_restarts: u32,
    terminate_backends: u32,
    pg_cluster: Option<String>,
    keep: bool,
    backend: MessageBackend,
}

impl Options {
    fn defaults(seed: u64) -> Self {
        Options {
            server_url: DEFAULT_SERVER_URL.to_string(),
            routines: 20,
            processes: 3,
            duration: Duration::from_secs(60),
            seed,
            db_restarts: 1,
            terminate_backends: 2,
            pg_cluster: None,
            keep: false,
            backend: MessageBackend::Outbox,
        }
    }

    /// `--short`, the run CI makes on every change: under two minutes in all, with every kind
    /// of fault (SIGKILLs, one PostgreSQL restart, the schedulers' connections terminated).
    fn short(self) -> Self {
        Options {
            routines: 10,
            processes: 3,
            duration: Duration::from_secs(40),
            db_restarts: 1,
            terminate_backends: 2,
            ..self
        }
    }
}

/// Parses the arguments after `chaos`; `None` means help was asked for.
fn parse_args(args: &[String], default_seed: u64) -> anyhow::Result<Option<Options>> {
    fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str) -> anyhow::Result<&'a str> {
        it.next()
            .map(String::as_str)
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))
    }
    fn number<T: std::str::FromStr>(flag: &str, text: &str) -> anyhow::Result<T> {
        text.parse()
            .map_err(|_| anyhow::anyhow!("{flag} expects a number, not {text:?}\n{USAGE}"))
    }
    let mut options = Options::defaults(default_seed);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--database-url" => options.server_url = value(&mut it, flag)?.to_string(),
            "--routines" => options.routines = number(flag, value(&mut it, flag)?)?,
            "--processes" => options.processes = number(flag, value(&mut it, flag)?)?,
            "--duration" => {
                let text = value(&mut it, flag)?;
                let seconds: u64 = number(flag, text.strip_suffix('s').unwrap_or(text))?;
                options.duration = Duration::from_secs(seconds);
            }
            "--seed" => options.seed = number(flag, value(&mut it, flag)?)?,
            "--db-restarts" => options.db_restarts = number(flag, value(&mut it, flag)?)?,
            "--terminate-backends" => {
                options.terminate_backends = number(flag, value(&mut it, flag)?)?;
            }
            "--short" => options = options.short(),
            "--pg-cluster" => options.pg_cluster = Some(value(&mut it, flag)?.to_string()),
            "--keep" => options.keep = true,
            "--message-backend" => {
                options.backend = match value(&mut it, flag)? {
                    "outbox" => MessageBackend::Outbox,
                    "webhook" => MessageBackend::Webhook,
                    other => {
                        bail!("--message-backend is outbox or webhook, not {other:?}\n{USAGE}")
                    }
                }
            }
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if options.routines == 0 || options.processes == 0 {
        bail!("--routines and --processes must be at least 1");
    }
    if options.duration < Duration::from_secs(5) {
        bail!("--duration must be at least 5 seconds");
    }
    Ok(Some(options))
}

/// SplitMix64: a small seeded generator, written out so that a seed means the same sequence
/// whatever version of a random-number crate the workspace ends up with.
#[derive(Debug, Clone)]
struct Rng {
    state: u64,
}

impl Rng {
    fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (the modulo bias is irrelevant at these sizes).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A duration between `lo` and `hi` milliseconds, both included.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// How PostgreSQL is taken down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RestartMode {
    /// Stop, wait two seconds, start: an outage long enough for ticks, settles and new
    /// connections to fail, and for occurrences to pile up and be caught up.
    Outage,
    /// `pg_ctlcluster restart`: every connection is cut, but the server is back at once.
    Restart,
}

/// When, after the start of the chaos, each database restart happens, and how. They are spread
/// evenly with some jitter, alternating between a real outage and a quick restart.
fn plan_db_restarts(rng: &mut Rng, duration: Duration, count: u32) -> Vec<(Duration, RestartMode)> {
    let slot = duration / (count + 1);
    (0..count)
        .map(|i| {
            let center = slot * (i + 1);
            let jitter = rng.millis(0, (slot / 2).as_millis() as u64);
            let at = center.saturating_sub(slot / 4) + jitter;
            let mode = if i % 2 == 0 {
                RestartMode::Outage
            } else {
                RestartMode::Restart
            };
            (at, mode)
        })
        .collect()
}

/// When, after the start of the chaos, the schedulers' connections are terminated: spread
/// evenly, at a quarter and three quarters of the run for two.
fn plan_terminations(duration: Duration, count: u32) -> Vec<Duration> {
    (0..count)
        .map(|i| duration * (2 * i + 1) / (2 * count))
        .collect()
}

/// `pg_terminate_backend` on every other connection to the chaos database (the schedulers',
/// and this run's own idle ones, which its pool replaces): what a failover or an operator's
/// kill looks like to a client. Returns how many were cut.
async fn terminate_backends(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
         FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await?)
}

/// When the next kill happens after `from`, and whether it is aimed. Half of the kills are aimed
/// 0 to 60 ms after a whole second of the wall clock: the schedulers tick a few milliseconds after
/// each 200 ms boundary and the occurrences fall on whole seconds, so that is when claims and
/// dispatches are in flight and a kill leaves a claimed row for the reaper.
fn next_kill(rng: &mut Rng, from: Instant) -> (Instant, bool) {
    let base = from + rng.millis(1000, 4000);
    if !rng.coin() {
        return (base, false);
    }
    let jitter = rng.millis(0, 60);
    let wall = SystemTime::now() + base.saturating_duration_since(Instant::now());
    let into_second = wall
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_millis();
    let to_next_second = Duration::from_millis(u64::from(1000 - into_second));
    (base + to_next_second + jitter, true)
}

/// One scheduler process.
struct Scheduler {
    instance_id: String,
    child: Child,
    log: PathBuf,
}

/// The scheduler processes. Dropping it kills whatever still runs, so an error anywhere in the
/// run leaves no scheduler behind.
struct Fleet {
    binary: PathBuf,
    url: String,
    log_dir: PathBuf,
    slots: Vec<Scheduler>,
    /// Flags every scheduler gets after [`RUN_FLAGS`]: the message backend's.
    backend_args: Vec<String>,
    /// Processes started so far, for unique log names and instance ids.
    started: u32,
    last_spawn: Option<Instant>,
}

impl Fleet {
    fn spawn(&mut self, slot: usize, instance_id: Option<String>) -> anyhow::Result<Scheduler> {
        self.started += 1;
        let instance_id = instance_id.unwrap_or_else(|| format!("chaos-{slot}-g{}", self.started));
        let log = self
            .log_dir
            .join(format!("{:03}-{instance_id}.log", self.started));
        let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = scheduler_command(&self.binary, &self.url)
            .arg("run")
            .arg("--instance-id")
            .arg(&instance_id)
            .args(RUN_FLAGS)
            .args(&self.backend_args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.last_spawn = Some(Instant::now());
        Ok(Scheduler {
            instance_id,
            child,
            log,
        })
    }

    /// Kills slot `slot` with SIGKILL and starts it again; returns the old and new instance ids.
    fn kill_and_restart(&mut self, slot: usize, same_id: bool) -> anyhow::Result<(String, String)> {
        let old = &mut self.slots[slot];
        old.child.kill().context("SIGKILL")?;
        old.child.wait()?;
        let old_id = old.instance_id.clone();
        let new = self.spawn(slot, same_id.then(|| old_id.clone()))?;
        let new_id = new.instance_id.clone();
        self.slots[slot] = new;
        Ok((old_id, new_id))
    }

    /// Finds schedulers that exited on their own (none should), and starts them again.
    fn restart_dead(&mut self) -> anyhow::Result<Vec<String>> {
        let mut dead = Vec::new();
        for slot in 0..self.slots.len() {
            if let Some(status) = self.slots[slot].child.try_wait()? {
                let s = &self.slots[slot];
                dead.push(format!(
                    "{} exited on its own with {status}; its log ({}) ends:\n{}",
                    s.instance_id,
                    s.log.display(),
                    log_tail(&s.log, 8)
                ));
                self.slots[slot] = self.spawn(slot, None)?;
            }
        }
        Ok(dead)
    }

    /// Sends SIGTERM to every scheduler and waits for each to exit.
    fn terminate_all(&mut self) -> Vec<Termination> {
        for s in &self.slots {
            let sent = Command::new("kill")
                .args(["-TERM", &s.child.id().to_string()])
                .status();
            if !matches!(sent, Ok(status) if status.success()) {
                eprintln!("chaos: could not send SIGTERM to {}", s.instance_id);
            }
        }
        let signalled = Instant::now();
        let mut out = Vec::new();
        for s in &mut self.slots {
            let status = loop {
                match s.child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if signalled.elapsed() < SIGTERM_TIMEOUT => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        let _ = s.child.kill();
                        let _ = s.child.wait();
                        break None;
                    }
                }
            };
            out.push(Termination {
                instance_id: s.instance_id.clone(),
                status,
                after: signalled.elapsed(),
                log: s.log.clone(),
            });
        }
        out
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if matches!(s.child.try_wait(), Ok(None)) {
                let _ = s.child.kill();
                let _ = s.child.wait();
            }
        }
    }
}

/// How one scheduler ended after SIGTERM.
#[derive(Debug)]
struct Termination {
    instance_id: String,
    /// `None`: it did not exit within [`SIGTERM_TIMEOUT`] and was killed.
    status: Option<ExitStatus>,
    after: Duration,
    log: PathBuf,
}

impl Termination {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// A `cm-scheduler` command on the database `url`, with the product's default log settings.
pub(crate) fn scheduler_command(binary: &Path, url: &str) -> Command {
    let mut c = Command::new(binary);
    c.arg("--database-url").arg(url);
    // The URL is always passed; removing DATABASE_URL (set by `.cargo/config.toml` for cargo's
    // children) makes sure nothing falls back to the tests' server database. The log settings
    // are fixed so the log digest finds its markers: no colour codes, the default levels.
    c.env_remove("DATABASE_URL")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info,sqlx=warn");
    c
}

/// Runs a short `cm-scheduler` command and returns its stdout.
fn scheduler_output(binary: &Path, url: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = scheduler_command(binary, url)
        .args(args)
        .output()
        .with_context(|| format!("running cm-scheduler {args:?}"))?;
    if !output.status.success() {
        bail!(
            "cm-scheduler {args:?} failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Writes `text` to a new file only its owner may read (the webhook's signing secret).
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// The last `lines` lines of a log file, indented, for an error message.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The PostgreSQL cluster to restart, as `VERSION/NAME`: the only version under
/// `/etc/postgresql` unless given.
fn pg_cluster(given: Option<&str>) -> anyhow::Result<(String, String)> {
    if let Some(given) = given {
        let (version, name) = given
            .split_once('/')
            .with_context(|| format!("--pg-cluster expects VERSION/NAME, not {given:?}"))?;
        return Ok((version.to_string(), name.to_string()));
    }
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .context("no /etc/postgresql: pass --pg-cluster VERSION/NAME, or --db-restarts 0")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    versions.sort();
    match versions.as_slice() {
        [one] => Ok((one.clone(), "main".to_string())),
        _ => bail!(
            "found PostgreSQL versions {versions:?} under /etc/postgresql: pass --pg-cluster VERSION/NAME"
        ),
    }
}

/// Closes every inherited descriptor above stderr, then runs `pg_ctlcluster` with the script's
/// arguments.
const PG_CTL_SCRIPT: &str = r#"for fd in $(ls /proc/$$/fd); do
    [ "$fd" -gt 2 ] && [ -e "/proc/$$/fd/$fd" ] && eval "exec $fd>&-"
done
exec pg_ctlcluster "$@""#;

/// `pg_ctlcluster --skip-systemctl-redirect VERSION NAME action`, with no descriptor but stdin,
/// stdout and stderr. A server it starts runs on after the chaos run, and would keep whatever
/// descriptor it inherited: the run's caller's `flock` on a shared lock file (flock(1) hands its
/// descriptor to the command), held by PostgreSQL until its next restart.
fn pg_ctl(cluster: &(String, String), action: &str) -> anyhow::Result<()> {
    super::run({
        let mut c = Command::new("bash");
        c.args([
            "-c",
            PG_CTL_SCRIPT,
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            &cluster.0,
            &cluster.1,
            action,
        ]);
        c
    })
}

/// Takes PostgreSQL down and brings it back; returns how long it did not answer. Starting is
/// tried a few times: whatever happens, the server must be up again for everyone else.
fn restart_postgres(
    rt: &tokio::runtime::Runtime,
    cluster: &(String, String),
    server_url: &str,
    mode: RestartMode,
) -> anyhow::Result<Duration> {
    let down = Instant::now();
    match mode {
        RestartMode::Outage => {
            pg_ctl(cluster, "stop")?;
            std::thread::sleep(Duration::from_secs(2));
            start_postgres(cluster)?;
        }
        RestartMode::Restart => {
            if let Err(e) = pg_ctl(cluster, "restart") {
                eprintln!("chaos: restart failed ({e:#}); starting it");
                start_postgres(cluster)?;
            }
        }
    }
    wait_for_postgres(rt, server_url, Duration::from_secs(30))?;
    Ok(down.elapsed())
}

fn start_postgres(cluster: &(String, String)) -> anyhow::Result<()> {
    let mut last = None;
    for _ in 0..3 {
        match pg_ctl(cluster, "start") {
            Ok(()) => return Ok(()),
            Err(e) => {
                eprintln!("chaos: starting PostgreSQL failed: {e:#}");
                last = Some(e);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    Err(last.expect("three tries were made"))
}

fn wait_for_postgres(
    rt: &tokio::runtime::Runtime,
    server_url: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let answered = rt.block_on(async {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect(server_url)
                .await?;
            let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await?;
            pool.close().await;
            Ok::<_, sqlx::Error>(one)
        });
        match answered {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() > timeout => {
                bail!("PostgreSQL did not answer within {timeout:?}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// What the ledger holds after the run.
#[derive(Debug, Clone, Default, PartialEq)]
struct Ledger {
    routines: usize,
    /// Routines with no fire at all.
    never_fired: usize,
    /// Seconds owed: for each routine, its first occurrence to its last, inclusive.
    occurrences: i64,
    /// Rows of `routine_fires`.
    rows: i64,
    /// Owed seconds without a row.
    missing_slots: i64,
    missing_examples: Vec<String>,
    /// Rows for no owed second: before the routine's first occurrence, off the one-second grid,
    /// or of a routine the run did not create.
    unexpected_rows: i64,
    claimed: i64,
    fired: i64,
    failed: i64,
    /// Rows taken over after a crash (attempt > 1).
    retried: i64,
    max_attempt: i64,
    /// Unsettled and failed rows, for the report.
    odd_rows: Vec<String>,
    messages: i64,
    fired_without_message: i64,
    messages_without_fire: i64,
    /// Messages whose fire is `failed`: delivered once, but the ledger says it failed.
    messages_of_failed: i64,
    /// Messages written by an attempt the ledger never reached.
    messages_ahead_of_attempt: i64,
    /// Two messages for one occurrence (the primary key forbids it; checked all the same).
    duplicate_messages: i64,
    /// Messages written by an attempt after the first.
    messages_by_retry: i64,
    /// Outbox rows written although the schedulers sent every message to the webhook.
    stray_messages: i64,
    /// How far the latest routine's last occurrence trails the pause, in seconds.
    max_lag_secs: f64,
}

impl Ledger {
    fn missing(&self) -> i64 {
        self.missing_slots + self.fired_without_message + self.never_fired as i64
    }

    fn doubled(&self) -> i64 {
        self.messages_without_fire
            + self.messages_ahead_of_attempt
            + self.duplicate_messages
            + self.stray_messages
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.missing_slots > 0 {
            problems.push(format!(
                "{} owed occurrences have no ledger row (first: {})",
                self.missing_slots,
                self.missing_examples.join(", ")
            ));
        }
        if self.never_fired > 0 {
            problems.push(format!("{} routines never fired", self.never_fired));
        }
        if self.fired_without_message > 0 {
            problems.push(format!(
                "{} fired occurrences have no outbox message",
                self.fired_without_message
            ));
        }
        if self.doubled() > 0 {
            problems.push(format!(
                "doubled: {} messages without a fire, {} written by an attempt the ledger never \
                 reached, {} second messages for one occurrence, {} outbox messages under the \
                 webhook backend",
                self.messages_without_fire,
                self.messages_ahead_of_attempt,
                self.duplicate_messages,
                self.stray_messages
            ));
        }
        if self.unexpected_rows > 0 {
            problems.push(format!(
                "{} ledger rows for seconds that were never owed",
                self.unexpected_rows
            ));
        }
        if self.claimed > 0 {
            problems.push(format!("{} rows are still claimed", self.claimed));
        }
        if self.max_lag_secs > MAX_LAG.as_secs_f64() {
            problems.push(format!(
                "a routine's last occurrence trails the pause by {:.1} s: the schedulers stalled",
                self.max_lag_secs
            ));
        }
        problems
    }
}

/// The per-routine span, as the check reads it back.
type Span = (Uuid, DateTime<Utc>, i64, Option<DateTime<Utc>>);

/// Reads the ledger and the outbox back and checks them against the routines' first occurrences.
/// Under the webhook backend the outbox must stay empty; the receiver's record is checked
/// against the ledger by [`webhook::check_deliveries`].
async fn check_ledger(
    pool: &PgPool,
    firsts: &[(Uuid, DateTime<Utc>)],
    paused_at: DateTime<Utc>,
    backend: MessageBackend,
) -> anyhow::Result<Ledger> {
    let ids: Vec<Uuid> = firsts.iter().map(|f| f.0).collect();
    let starts: Vec<DateTime<Utc>> = firsts.iter().map(|f| f.1).collect();
    let mut ledger = Ledger {
        routines: firsts.len(),
        ..Ledger::default()
    };

    let spans: Vec<Span> = sqlx::query_as(
        "SELECT b.id, b.first, count(f.scheduled_at), max(f.scheduled_at)
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS b(id, first)
         LEFT JOIN routine_fires f ON f.routine_id = b.id
         GROUP BY b.id, b.first",
    )
    .bind(&ids)
    .bind(&starts)
    .fetch_all(pool)
    .await?;
    for (_, first, _, last) in &spans {
        match last {
            Some(last) if last >= first => {
                ledger.occurrences += (*last - *first).num_seconds() + 1;
                let lag = (paused_at - *last).num_milliseconds() as f64 / 1000.0;
                ledger.max_lag_secs = ledger.max_lag_secs.max(lag);
            }
            _ => ledger.never_fired += 1,
        }
    }

    // Every owed second without a row: the heart of "nothing lost".
    let missing: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
        "SELECT b.id, s.at
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS b(id, first)
         CROSS JOIN LATERAL (SELECT max(scheduled_at) AS last FROM routine_fires
                             WHERE routine_id = b.id) l
         CROSS JOIN LATERAL generate_series(b.first, l.last, interval '1 second') AS s(at)
         WHERE NOT EXISTS (SELECT 1 FROM routine_fires f
                           WHERE f.routine_id = b.id AND f.scheduled_at = s.at)
         ORDER BY s.at, b.id",
    )
    .bind(&ids)
    .bind(&starts)
    .fetch_all(pool)
    .await?;
    ledger.missing_slots = missing.len() as i64;
    ledger.missing_examples = missing
        .iter()
        .take(10)
        .map(|(id, at)| format!("{id} at {}", at.to_rfc3339()))
        .collect();

    ledger.unexpected_rows = sqlx::query_scalar(
        "SELECT count(*)
         FROM routine_fires f
         LEFT JOIN UNNEST($1::uuid[], $2::timestamptz[]) AS b(id, first) ON b.id = f.routine_id
         WHERE b.id IS NULL OR f.scheduled_at < b.first
            OR date_trunc('second', f.scheduled_at) <> f.scheduled_at",
    )
    .bind(&ids)
    .bind(&starts)
    .fetch_one(pool)
    .await?;

    let (rows, claimed, fired, failed, retried, max_attempt): (i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(*),
                    count(*) FILTER (WHERE status = 'claimed'),
                    count(*) FILTER (WHERE status = 'fired'),
                    count(*) FILTER (WHERE status = 'failed'),
                    count(*) FILTER (WHERE attempt > 1),
                    COALESCE(max(attempt), 0)::bigint
             FROM routine_fires",
        )
        .fetch_one(pool)
        .await?;
    ledger.rows = rows;
    ledger.claimed = claimed;
    ledger.fired = fired;
    ledger.failed = failed;
    ledger.retried = retried;
    ledger.max_attempt = max_attempt;

    let odd: Vec<(Uuid, DateTime<Utc>, String, i32, String, String)> = sqlx::query_as(
        "SELECT routine_id, scheduled_at, status, attempt, claimant, COALESCE(error, '')
         FROM routine_fires WHERE status <> 'fired'
         ORDER BY scheduled_at, routine_id LIMIT 20",
    )
    .fetch_all(pool)
    .await?;
    ledger.odd_rows = odd
        .into_iter()
        .map(|(id, at, status, attempt, claimant, error)| {
            format!(
                "{} {id} {status} attempt {attempt} by {claimant}{}",
                at.to_rfc3339(),
                if error.is_empty() {
                    String::new()
                } else {
                    format!(": {error}")
                }
            )
        })
        .collect();

    if backend == MessageBackend::Webhook {
        ledger.stray_messages = sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
            .fetch_one(pool)
            .await?;
        return Ok(ledger);
    }
    let outbox: (i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT
           (SELECT count(*) FROM outbox_messages),
           (SELECT count(*) FROM routine_fires f
            WHERE f.status = 'fired' AND NOT EXISTS (
              SELECT 1 FROM outbox_messages o
              WHERE o.routine_id = f.routine_id AND o.scheduled_at = f.scheduled_at)),
           (SELECT count(*) FROM outbox_messages o
            WHERE NOT EXISTS (
              SELECT 1 FROM routine_fires f
              WHERE f.routine_id = o.routine_id AND f.scheduled_at = o.scheduled_at)),
           (SELECT count(*) FROM outbox_messages o
            JOIN routine_fires f USING (routine_id, scheduled_at) WHERE f.status = 'failed'),
           (SELECT count(*) FROM outbox_messages o
            JOIN routine_fires f USING (routine_id, scheduled_at) WHERE o.attempt > f.attempt),
           (SELECT count(*) - count(DISTINCT (routine_id, scheduled_at)) FROM outbox_messages),
           (SELECT count(*) FROM outbox_messages WHERE attempt > 1)",
    )
    .fetch_one(pool)
    .await?;
    (
        ledger.messages,
        ledger.fired_without_message,
        ledger.messages_without_fire,
        ledger.messages_of_failed,
        ledger.messages_ahead_of_attempt,
        ledger.duplicate_messages,
        ledger.messages_by_retry,
    ) = outbox;
    Ok(ledger)
}

/// Every ledger row, for the webhook check.
async fn fire_rows(pool: &PgPool) -> anyhow::Result<Vec<webhook::FireRow>> {
    let rows: Vec<(Uuid, DateTime<Utc>, String, i32, String)> = sqlx::query_as(
        "SELECT routine_id, scheduled_at, status, attempt, COALESCE(error, '')
         FROM routine_fires ORDER BY scheduled_at, routine_id",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(routine_id, scheduled_at, status, attempt, error)| webhook::FireRow {
                routine_id,
                scheduled_at,
                status,
                attempt,
                error,
            },
        )
        .collect())
}

/// Lines of the schedulers' logs worth counting: what crashes and the outage made them do.
const LOG_MARKERS: &[(&str, &str)] = &[
    ("expired claims taken over", "took over an expired claim"),
    ("retries that found the message written", "duplicate=true"),
    ("settles fenced off", "settle matched nothing"),
    ("settle write failures", "settle failed"),
    ("dispatch errors", "dispatch failed"),
    ("dispatch timeouts", "dispatch timed out"),
    // With `error=` after them, so the exit line's `last_error=tick failed: …` is not counted.
    ("failed ticks", "tick failed error="),
    ("failed reaper passes", "reaper pass failed error="),
    ("abandoned occurrences", "occurrence abandoned"),
    (
        "left to the reaper (no lease left)",
        "no lease left to dispatch",
    ),
    ("panics", "panicked"),
];

/// How often each marker appears in the logs under `dir`.
fn log_digest(dir: &Path) -> Vec<(&'static str, usize)> {
    let mut counts = vec![0usize; LOG_MARKERS.len()];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            for (i, (_, needle)) in LOG_MARKERS.iter().enumerate() {
                if line.contains(needle) {
                    counts[i] += 1;
                }
            }
        }
    }
    LOG_MARKERS
        .iter()
        .zip(counts)
        .map(|((label, _), n)| (*label, n))
        .collect()
}

/// Everything a run did and found.
#[derive(Debug, Default)]
struct Report {
    kills: u32,
    aimed_kills: u32,
    same_id_restarts: u32,
    db_restarts: Vec<(RestartMode, Duration)>,
    backends_terminated: Vec<i64>,
    died_on_their_own: Vec<String>,
    drained_in: Option<Duration>,
    terminations: Vec<Termination>,
    ledger: Ledger,
    /// With the webhook backend: where the receiver listened, and what it got.
    webhook: Option<(String, webhook::WebhookCheck)>,
}

impl Report {
    fn problems(&self) -> Vec<String> {
        let mut problems = self.ledger.problems();
        if let Some((_, check)) = &self.webhook {
            problems.extend(check.problems());
        }
        for dead in &self.died_on_their_own {
            problems.push(format!("a scheduler died without being killed: {dead}"));
        }
        if self.drained_in.is_none() {
            problems.push(format!(
                "claimed rows were still left {} s after the routines were paused",
                DRAIN_TIMEOUT.as_secs()
            ));
        }
        for t in self.terminations.iter().filter(|t| !t.ok()) {
            problems.push(format!(
                "{} did not exit 0 on SIGTERM ({}); its log ({}) ends:\n{}",
                t.instance_id,
                t.status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("still running after {SIGTERM_TIMEOUT:?}")),
                t.log.display(),
                log_tail(&t.log, 8)
            ));
        }
        problems
    }
}

/// `cargo xtask chaos [...]`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let default_seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let Some(options) = parse_args(args, default_seed)? else {
        println!("{USAGE}");
        return Ok(());
    };
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cluster = if options.db_restarts > 0 {
        Some(pg_cluster(options.pg_cluster.as_deref())?)
    } else {
        None
    };
    if !super::postgres_answers(&options.server_url) {
        bail!("PostgreSQL does not answer at {}", options.server_url);
    }
    eprintln!(
        "chaos: seed {} ({} routines, {} schedulers, {} s, {} database restarts, {} backend)",
        options.seed,
        options.routines,
        options.processes,
        options.duration.as_secs(),
        options.db_restarts,
        options.backend.name()
    );

    super::run({
        let mut c = super::cargo();
        c.args(["build", "--quiet", "--package", "cm-scheduler"]);
        c
    })?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::workspace_root().join("target"));
    let binary = target.join("debug/cm-scheduler");

    // The name is random on its own rather than derived from the seed, so two runs with one
    // seed (one of them kept) never meet in one database.
    let db_name = format!(
        "cm_chaos_{:08x}",
        (default_seed ^ u64::from(std::process::id())) & 0xffff_ffff
    );
    let url = database_url(&options.server_url, &db_name)?;
    let log_dir = std::env::temp_dir().join(format!("cm-chaos-{db_name}"));
    std::fs::create_dir_all(&log_dir)?;
    rt.block_on(sqlx::Postgres::create_database(&url))
        .with_context(|| format!("creating database {db_name}"))?;
    eprintln!("chaos: database {db_name}, logs in {}", log_dir.display());

    let result = exercise(&options, &rt, cluster.as_ref(), &binary, &url, &log_dir);

    // Whatever happened, PostgreSQL must be running again for everyone else.
    if let Some(cluster) = &cluster
        && !super::postgres_answers(&options.server_url)
    {
        eprintln!("chaos: PostgreSQL is down; starting it");
        start_postgres(cluster)?;
    }
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            eprintln!("chaos: the run failed; database {db_name} kept for inspection");
            return Err(e);
        }
    };
    let problems = report.problems();
    let keep = options.keep || !problems.is_empty();
    if !keep {
        rt.block_on(sqlx::Postgres::force_drop_database(&url))
            .with_context(|| format!("dropping database {db_name}"))?;
    }

    print_summary(
        &options,
        &report,
        &db_name,
        keep,
        &log_dir,
        started.elapsed(),
    );
    if problems.is_empty() {
        println!("result: PASS");
        Ok(())
    } else {
        println!("result: FAIL");
        for p in &problems {
            println!("  - {p}");
        }
        bail!("the chaos run found {} problems", problems.len())
    }
}

/// Steps 1 to 5 of the module documentation, on the database `url`.
fn exercise(
    options: &Options,
    rt: &tokio::runtime::Runtime,
    cluster: Option<&(String, String)>,
    binary: &Path,
    url: &str,
    log_dir: &Path,
) -> anyhow::Result<Report> {
    let mut rng = Rng::new(options.seed);
    let mut report = Report::default();
    scheduler_output(binary, url, &["migrate"])?;
    let pool = rt.block_on(
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url),
    )?;

    let mut ids = Vec::with_capacity(options.routines);
    for i in 0..options.routines {
        let name = format!("chaos {i:02}");
        let out = scheduler_output(
            binary,
            url,
            &[
                "routine",
                "create",
                "--name",
                &name,
                "--schedule",
                "* * * * * *",
                "--misfire",
                "catch-up",
                "--message",
                &format!("chaos message {i:02}"),
            ],
        )?;
        let id: Uuid = out
            .trim()
            .parse()
            .with_context(|| format!("routine create printed {out:?}, not an id"))?;
        ids.push(id);
    }
    // The schedulers are not running yet, so each next_run_at is the routine's first occurrence.
    let firsts: Vec<(Uuid, DateTime<Utc>)> = rt.block_on(
        sqlx::query_as(
            "SELECT id, next_run_at FROM routines WHERE id = ANY($1) AND next_run_at IS NOT NULL",
        )
        .bind(&ids)
        .fetch_all(&pool),
    )?;
    if firsts.len() != ids.len() {
        bail!(
            "only {} of {} routines have a next run",
            firsts.len(),
            ids.len()
        );
    }

    // The webhook receiver comes before the schedulers, so none of their first sends fails
    // to connect. Its answers follow the run's seed; its secret is new each run.
    let receiver = match options.backend {
        MessageBackend::Outbox => None,
        MessageBackend::Webhook => {
            let dir = log_dir.join("webhook");
            std::fs::create_dir_all(&dir)?;
            let secret = webhook::random_secret();
            let secret_file = dir.join("secret");
            write_private(&secret_file, &secret)?;
            let receiver = webhook::Receiver::start(&secret, options.seed)?;
            eprintln!(
                "chaos: webhook receiver at {}, secret in {}",
                receiver.url(),
                secret_file.display()
            );
            Some((receiver, secret_file))
        }
    };
    let backend_args = match &receiver {
        None => Vec::new(),
        Some((receiver, secret_file)) => vec![
            "--message-backend".to_string(),
            "webhook".to_string(),
            "--webhook-url".to_string(),
            receiver.url().to_string(),
            "--webhook-secret-file".to_string(),
            secret_file.display().to_string(),
        ],
    };

    let mut fleet = Fleet {
        binary: binary.to_path_buf(),
        url: url.to_string(),
        log_dir: log_dir.to_path_buf(),
        slots: Vec::new(),
        backend_args,
        started: 0,
        last_spawn: None,
    };
    for slot in 0..options.processes {
        let s = fleet.spawn(slot, None)?;
        fleet.slots.push(s);
    }

    // The chaos.
    let chaos_start = Instant::now();
    let chaos_end = chaos_start + options.duration;
    let restarts = plan_db_restarts(&mut rng, options.duration, options.db_restarts);
    let mut next_restart = 0;
    let terminations = plan_terminations(options.duration, options.terminate_backends);
    let mut next_termination = 0;
    let (mut kill_at, mut aimed) = next_kill(&mut rng, chaos_start);
    let say = |what: String| {
        eprintln!("chaos: {:6.2}s {what}", chaos_start.elapsed().as_secs_f64());
    };
    loop {
        for dead in fleet.restart_dead()? {
            say(format!("UNEXPECTED: {dead}"));
            report.died_on_their_own.push(dead);
        }
        let now = Instant::now();
        if now >= chaos_end {
            break;
        }
        if let (Some(cluster), Some((at, mode))) = (cluster, restarts.get(next_restart))
            && now >= chaos_start + *at
        {
            // Leave the newest scheduler time to connect first, so the outage hits schedulers
            // that are running (one still starting waits for the database by itself).
            if let Some(spawned) = fleet.last_spawn {
                std::thread::sleep(
                    (spawned + Duration::from_millis(1500)).saturating_duration_since(now),
                );
            }
            say(format!("PostgreSQL {mode:?} begins"));
            let outage = restart_postgres(rt, cluster, &options.server_url, *mode)?;
            say(format!("PostgreSQL answers again after {outage:.1?}"));
            report.db_restarts.push((*mode, outage));
            next_restart += 1;
            // The same reason the other way round: no process starts until the server is back
            // and settled.
            kill_at = kill_at.max(Instant::now() + Duration::from_secs(1));
            continue;
        }
        if let Some(at) = terminations.get(next_termination)
            && now >= chaos_start + *at
        {
            let cut = rt.block_on(terminate_backends(&pool))?;
            say(format!(
                "pg_terminate_backend cut {cut} connections to the chaos database"
            ));
            report.backends_terminated.push(cut);
            next_termination += 1;
            continue;
        }
        if now >= kill_at {
            let slot = rng.below(fleet.slots.len() as u64) as usize;
            let same_id = rng.coin();
            let (old, new) = fleet.kill_and_restart(slot, same_id)?;
            report.kills += 1;
            report.aimed_kills += u32::from(aimed);
            report.same_id_restarts += u32::from(same_id);
            say(format!(
                "SIGKILL {old}{}, started {new}",
                if aimed { " (aimed at a tick)" } else { "" }
            ));
            (kill_at, aimed) = next_kill(&mut rng, Instant::now());
            continue;
        }
        let mut wake = kill_at.min(chaos_end);
        if let Some((at, _)) = restarts.get(next_restart) {
            wake = wake.min(chaos_start + *at);
        }
        if let Some(at) = terminations.get(next_termination) {
            wake = wake.min(chaos_start + *at);
        }
        // Short naps, so a scheduler that dies on its own is noticed and replaced quickly.
        std::thread::sleep(
            wake.saturating_duration_since(now)
                .min(Duration::from_millis(100)),
        );
    }
    say("the chaos ends; pausing every routine".to_string());

    // Pausing stops new occurrences from coming due; the database's clock at this point is what
    // the last occurrences are compared with to detect a stall.
    let paused_at: DateTime<Utc> =
        rt.block_on(sqlx::query_scalar("SELECT now()").fetch_one(&pool))?;
    for id in &ids {
        scheduler_output(binary, url, &["routine", "pause", &id.to_string()])?;
    }
    let drain_start = Instant::now();
    report.drained_in = loop {
        let claimed: i64 = rt.block_on(
            sqlx::query_scalar("SELECT count(*) FROM routine_fires WHERE status = 'claimed'")
                .fetch_one(&pool),
        )?;
        if claimed == 0 {
            break Some(drain_start.elapsed());
        }
        if drain_start.elapsed() > DRAIN_TIMEOUT {
            break None;
        }
        for dead in fleet.restart_dead()? {
            say(format!("UNEXPECTED: {dead}"));
            report.died_on_their_own.push(dead);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    say(match report.drained_in {
        Some(d) => format!("no claimed row left after {d:.1?}; SIGTERM to every scheduler"),
        None => "claimed rows are still left; SIGTERM to every scheduler".to_string(),
    });
    report.terminations = fleet.terminate_all();

    report.ledger = rt.block_on(check_ledger(&pool, &firsts, paused_at, options.backend))?;
    if let Some((receiver, _)) = &receiver {
        let log = log_dir.join("webhook").join("deliveries.tsv");
        receiver.write_log(&log)?;
        let rows = rt.block_on(fire_rows(&pool))?;
        let check = webhook::check_deliveries(&rows, &receiver.deliveries());
        report.webhook = Some((receiver.url().to_string(), check));
    }
    rt.block_on(pool.close());
    Ok(report)
}

fn print_summary(
    options: &Options,
    report: &Report,
    db_name: &str,
    kept: bool,
    log_dir: &Path,
    elapsed: Duration,
) {
    let l = &report.ledger;
    let outages = report
        .db_restarts
        .iter()
        .map(|(mode, d)| format!("{mode:?} {:.1} s", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ");
    let exits = report
        .terminations
        .iter()
        .map(|t| match t.status {
            Some(s) => format!(
                "{} {} in {:.1} s",
                t.instance_id,
                s.code().map_or_else(|| s.to_string(), |c| c.to_string()),
                t.after.as_secs_f64()
            ),
            None => format!("{} did not exit", t.instance_id),
        })
        .collect::<Vec<_>>()
        .join(", ");
    println!("chaos summary");
    println!("  seed             {}", options.seed);
    println!(
        "  command          cargo xtask chaos --seed {} --routines {} --processes {} --duration {} --db-restarts {} --terminate-backends {}{}",
        options.seed,
        options.routines,
        options.processes,
        options.duration.as_secs(),
        options.db_restarts,
        options.terminate_backends,
        match options.backend {
            MessageBackend::Outbox => "",
            MessageBackend::Webhook => " --message-backend webhook",
        }
    );
    println!(
        "  database         {db_name} ({})",
        if kept { "kept" } else { "dropped" }
    );
    println!(
        "  kills            {} SIGKILLs ({} aimed just after a whole second), {} restarted under the same instance id",
        report.kills, report.aimed_kills, report.same_id_restarts
    );
    println!(
        "  db restarts      {}{}",
        report.db_restarts.len(),
        if outages.is_empty() {
            String::new()
        } else {
            format!(" ({outages})")
        }
    );
    println!(
        "  backends cut     {} pg_terminate_backend passes ({} connections)",
        report.backends_terminated.len(),
        report.backends_terminated.iter().sum::<i64>()
    );
    println!(
        "  occurrences      {} owed over {} routines; {} ledger rows",
        l.occurrences, l.routines, l.rows
    );
    match &report.webhook {
        None => {
            println!(
                "  missing          {} ({} owed seconds without a row, {} fired without a message, {} routines never fired)",
                l.missing(),
                l.missing_slots,
                l.fired_without_message,
                l.never_fired
            );
            println!(
                "  doubled          {} ({} messages for {} fired rows)",
                l.doubled(),
                l.messages,
                l.fired
            );
            println!(
                "  failed           {} ({} of them with a message written)",
                l.failed, l.messages_of_failed
            );
            println!(
                "  retried          {} rows with attempt > 1 (max attempt {}; {} messages written by a retry)",
                l.retried, l.max_attempt, l.messages_by_retry
            );
        }
        Some((url, w)) => {
            println!(
                "  missing          {} ({} owed seconds without a row, {} routines never fired, {} fired rows never delivered and accepted)",
                l.missing() + w.fired_undelivered as i64,
                l.missing_slots,
                l.never_fired,
                w.fired_undelivered
            );
            println!(
                "  doubled          {} ({} deliveries for occurrences without a row, {} outbox rows)",
                l.doubled() + w.deliveries_without_fire as i64,
                w.deliveries_without_fire,
                l.stray_messages
            );
            println!("  failed           {}", l.failed);
            for f in &w.failed {
                println!("    {f}");
            }
            println!(
                "  retried          {} rows with attempt > 1 (max attempt {})",
                l.retried, l.max_attempt
            );
            println!("  webhook          {url}");
            println!(
                "  deliveries       {} of {} distinct webhook-ids; {} second deliveries: {} by a later attempt ({} ids), {} resends of one attempt after a 503",
                w.deliveries,
                w.distinct_ids,
                w.second_deliveries,
                w.redeliveries,
                w.ids_redelivered,
                w.resends
            );
            println!(
                "  answers          {} accepted ({} of them after a delay), {} 503, {} 409 (id already accepted), {} 401/400",
                w.accepted, w.delayed, w.refused_503, w.duplicates_409, w.refused_bad
            );
            println!(
                "  max attempt      {} delivered; largest clock skew {} s",
                w.max_attempt, w.max_skew_secs
            );
            println!("  invalid sigs     {}", w.invalid_signatures);
            println!(
                "  order            {} repeated deliveries neither at a higher attempt nor a resend after a 503; {} ahead of the ledger",
                w.order_violations, w.ahead_of_ledger
            );
            println!(
                "  identity         {} deliveries whose id, key and body disagree; {} fired rows whose last attempt was not acknowledged",
                w.identity_mismatches, w.fired_unacknowledged
            );
        }
    }
    println!("  claimed left     {}", l.claimed);
    println!("  unexpected rows  {}", l.unexpected_rows);
    println!(
        "  lag at pause     {:.1} s (the last occurrence of the routine furthest behind, before the pause)",
        l.max_lag_secs
    );
    println!(
        "  drain            {}",
        report
            .drained_in
            .map_or("timed out".to_string(), |d| format!(
                "{:.1} s",
                d.as_secs_f64()
            ))
    );
    println!("  SIGTERM exits    {exits}");
    println!("  died on own      {}", report.died_on_their_own.len());
    println!("  time             {:.1} s", elapsed.as_secs_f64());
    println!("  logs             {}", log_dir.display());
    println!("  in the logs:");
    for (label, n) in log_digest(log_dir) {
        println!("    {n:5}  {label}");
    }
    if !l.odd_rows.is_empty() {
        println!("  rows not fired (first 20):");
        for row in &l.odd_rows {
            println!("    {row}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let options = parse_args(&[], 7).unwrap().unwrap();
        assert_eq!(options, Options::defaults(7));
        assert_eq!(options.backend, MessageBackend::Outbox);
        assert_eq!(options.routines, 20);
        assert_eq!(options.processes, 3);
        assert_eq!(options.duration, Duration::from_secs(60));
        assert_eq!(options.db_restarts, 1);
        assert_eq!(options.server_url, DEFAULT_SERVER_URL);
    }

    #[test]
    fn every_flag_is_read() {
        let options = parse_args(
            &args(&[
                "--database-url",
                "postgres://u@h:1/x",
                "--routines",
                "5",
                "--processes",
                "2",
                "--duration",
                "30s",
                "--seed",
                "42",
                "--db-restarts",
                "2",
                "--terminate-backends",
                "3",
                "--pg-cluster",
                "15/main",
                "--keep",
                "--message-backend",
                "webhook",
            ]),
            7,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            options,
            Options {
                server_url: "postgres://u@h:1/x".into(),
                routines: 5,
                processes: 2,
                duration: Duration::from_secs(30),
                seed: 42,
                db_restarts: 2,
                terminate_backends: 3,
                pg_cluster: Some("15/main".into()),
                keep: true,
                backend: MessageBackend::Webhook,
            }
        );
    }

    #[test]
    fn short_is_a_small_run_with_every_fault_that_later_flags_adjust() {
        let options = parse_args(&args(&["--short", "--db-restarts", "0"]), 7)
            .unwrap()
            .unwrap();
        assert_eq!(
            options,
            Options {
                routines: 10,
                duration: Duration::from_secs(40),
                db_restarts: 0,
                ..Options::defaults(7)
            }
        );
        // The backend is kept whatever the order.
        let options = parse_args(&args(&["--message-backend", "webhook", "--short"]), 7)
            .unwrap()
            .unwrap();
        assert_eq!(
            options,
            Options {
                backend: MessageBackend::Webhook,
                ..Options::defaults(7).short()
            }
        );
        let short = Options::defaults(7).short();
        assert_eq!((short.db_restarts, short.terminate_backends), (1, 2));
        assert_eq!(
            plan_terminations(short.duration, 2),
            [Duration::from_secs(10), Duration::from_secs(30)]
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--routines"][..],
            &["--routines", "many"],
            &["--processes", "0"],
            &["--duration", "2"],
            &["--frobnicate"],
            &["--message-backend", "nats"],
            &["--message-backend"],
        ] {
            assert!(parse_args(&args(bad), 1).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(parse_args(&args(&["--help"]), 1).unwrap(), None);
    }

    #[test]
    fn a_seed_fixes_the_sequence() {
        let a: Vec<u64> = {
            let mut r = Rng::new(9);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(9);
            (0..5).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, {
            let mut r = Rng::new(10);
            (0..5).map(|_| r.next_u64()).collect::<Vec<_>>()
        });
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let d = r.millis(1000, 4000);
            assert!((1000..=4000).contains(&d.as_millis()));
        }
    }

    #[test]
    fn database_restarts_fall_inside_the_run_in_order() {
        let mut rng = Rng::new(3);
        let plan = plan_db_restarts(&mut rng, Duration::from_secs(60), 2);
        assert_eq!(plan.len(), 2);
        assert!(plan[0].0 < plan[1].0);
        assert!(plan[1].0 < Duration::from_secs(60));
        assert_eq!(plan[0].1, RestartMode::Outage);
        assert_eq!(plan[1].1, RestartMode::Restart);
    }

    #[test]
    fn kills_come_one_to_five_seconds_apart() {
        let mut rng = Rng::new(5);
        let from = Instant::now();
        for _ in 0..200 {
            let (at, _) = next_kill(&mut rng, from);
            let after = at - from;
            assert!(after >= Duration::from_secs(1) && after <= Duration::from_millis(5100));
        }
    }

    /// The script pg_ctlcluster runs under passes on its arguments and no descriptor above
    /// stderr, whatever this process holds open (a test's own files, a caller's lock).
    #[test]
    fn pg_ctlcluster_inherits_no_descriptor() {
        let held = std::fs::File::open("Cargo.toml").unwrap();
        let script = PG_CTL_SCRIPT.replace(
            r#"exec pg_ctlcluster "$@""#,
            r#"echo "$@"; exec ls /proc/self/fd"#,
        );
        // Rust opens its files close-on-exec; `exec 7<` in a parent shell leaves one open, as
        // flock(1) does.
        let output = Command::new("bash")
            .args([
                "-c",
                r#"exec 7<Cargo.toml; exec bash -c "$0" x a b"#,
                &script,
            ])
            .output()
            .unwrap();
        drop(held);
        let text = String::from_utf8(output.stdout).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("a b"));
        // ls's own directory descriptor is the only one above stderr.
        let fds: Vec<u32> = lines.map(|l| l.parse().unwrap()).collect();
        assert_eq!(fds.iter().filter(|&&fd| fd > 2).count(), 1, "{fds:?}");
        assert!(!fds.contains(&7), "{fds:?}");
    }

    #[test]
    fn the_database_url_names_the_chaos_database() {
        assert_eq!(
            database_url("postgres://postgres@127.0.0.1:5432/postgres", "cm_chaos_1").unwrap(),
            "postgres://postgres@127.0.0.1:5432/cm_chaos_1"
        );
        assert_eq!(
            database_url("postgres://u:p@h/db?sslmode=disable", "c").unwrap(),
            "postgres://u:p@h/c?sslmode=disable"
        );
    }

    /// The check itself against the real schema: a clean ledger passes, and a lost occurrence,
    /// a message without a fire and a message from an attempt the ledger never reached are each
    /// found. Without this, a check that always passes would look like a product that never
    /// fails.
    #[sqlx::test(migrator = "cm_store::MIGRATOR")]
    async fn the_check_finds_what_was_lost_or_doubled(pool: PgPool) {
        let id = Uuid::new_v4();
        let first: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |s: i64| first + chrono::TimeDelta::seconds(s);
        sqlx::query(
            "INSERT INTO routines (id, name, schedule, kind, payload, misfire_policy)
             VALUES ($1, 'check', '* * * * * *', 'message', '{}', 'catch-up')",
        )
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO routine_fires
                 (routine_id, scheduled_at, status, completed_at, claimant, claim_token, attempt,
                  lease_expires_at)
             SELECT $1, $2 + make_interval(secs => s::double precision), 'fired', now(), 'test',
                    gen_random_uuid(), 1, now()
             FROM generate_series(0, 4) AS s",
        )
        .bind(id)
        .bind(first)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
             SELECT routine_id, scheduled_at, routine_id::text || scheduled_at::text, attempt, '{}'
             FROM routine_fires",
        )
        .execute(&pool)
        .await
        .unwrap();
        let firsts = [(id, first)];

        let clean = check_ledger(&pool, &firsts, at(5), MessageBackend::Outbox)
            .await
            .unwrap();
        // Under the webhook backend, the outbox's rows are strays.
        let webhook = check_ledger(&pool, &firsts, at(5), MessageBackend::Webhook)
            .await
            .unwrap();
        assert_eq!(webhook.stray_messages, 5);
        assert!(!webhook.problems().is_empty());
        assert_eq!((clean.occurrences, clean.fired, clean.messages), (5, 5, 5));
        assert!(clean.problems().is_empty(), "{:?}", clean.problems());

        // Second 2 is lost whole; second 3 keeps its message but loses its fire; second 0's
        // message claims to come from an attempt the ledger never reached.
        for sql in [
            "DELETE FROM outbox_messages WHERE scheduled_at = $1",
            "DELETE FROM routine_fires WHERE scheduled_at = $1",
        ] {
            sqlx::query(sql).bind(at(2)).execute(&pool).await.unwrap();
        }
        sqlx::query("DELETE FROM routine_fires WHERE scheduled_at = $1")
            .bind(at(3))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("UPDATE outbox_messages SET attempt = 2 WHERE scheduled_at = $1")
            .bind(at(0))
            .execute(&pool)
            .await
            .unwrap();
        let broken = check_ledger(&pool, &firsts, at(5), MessageBackend::Outbox)
            .await
            .unwrap();
        assert_eq!(broken.missing_slots, 2, "{broken:?}");
        assert_eq!(broken.messages_without_fire, 1, "{broken:?}");
        assert_eq!(broken.messages_ahead_of_attempt, 1, "{broken:?}");
        assert_eq!(broken.missing(), 2);
        assert_eq!(broken.doubled(), 2);
        assert!(!broken.problems().is_empty());
    }

    #[test]
    fn a_clean_ledger_has_no_problems_and_each_fault_is_named() {
        let clean = Ledger {
            routines: 2,
            occurrences: 10,
            rows: 10,
            fired: 10,
            messages: 10,
            retried: 3,
            ..Ledger::default()
        };
        assert!(clean.problems().is_empty());
        for (broken, word) in [
            (
                Ledger {
                    missing_slots: 1,
                    ..clean.clone()
                },
                "no ledger row",
            ),
            (
                Ledger {
                    messages_without_fire: 1,
                    ..clean.clone()
                },
                "doubled",
            ),
            (
                Ledger {
                    messages_ahead_of_attempt: 1,
                    ..clean.clone()
                },
                "doubled",
            ),
            (
                Ledger {
                    claimed: 1,
                    ..clean.clone()
                },
                "still claimed",
            ),
            (
                Ledger {
                    fired_without_message: 1,
                    ..clean.clone()
                },
                "no outbox message",
            ),
            (
                Ledger {
                    max_lag_secs: 60.0,
                    ..clean.clone()
                },
                "stalled",
            ),
        ] {
            let problems = broken.problems();
            assert!(
                problems.iter().any(|p| p.contains(word)),
                "{broken:?} gave {problems:?}"
            );
        }
        // A failed occurrence is reported, not a failure of the run: the product settles it
        // with its error kept, as the design asks.
        assert!(Ledger { failed: 1, ..clean }.problems().is_empty());
    }
}
