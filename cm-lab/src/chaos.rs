//! `cargo xtask chaos`: scheduler processes killed with SIGKILL at random while faults are
//! injected under them (PostgreSQL restarted, connections cut, the network hung, the primary
//! failed over, the xmin horizon pinned, the connections starved, the broker killed, the
//! webhook receiver down), then one ledger check that no occurrence was lost or doubled, and
//! the backend's check of what it received (`docs/CHAOS.md`).
//!
//! The run, in order:
//!
//! 1. builds `cm-scheduler`, creates a fresh database `cm_chaos_<random>` on the server,
//!    migrates it, starts the backend (a webhook receiver, a `nats-server`, a `dockerd`;
//!    [`backend`]) and creates `--routines` routines firing every second with the `catch-up`
//!    misfire policy (message routines, or mission routines with `--mission-backend docker`),
//!    recording each one's first `next_run_at`;
//! 2. starts what the faults need before the schedulers (a standby, a TCP forwarder), then `--processes`
//!    schedulers ([`fleet`]), each logging to its own file and serving `/readyz`;
//! 3. for `--duration` seconds lets each [`fault`] act when it is due, SIGKILLs always among
//!    them;
//! 4. has every fault heal what it still holds, pauses every routine (through the binary),
//!    waits until no `claimed` row is left, stops the schedulers with SIGTERM and checks that
//!    each exits 0;
//! 5. checks the ledger ([`ledger`]) and the backend, and gathers each fault's figures;
//! 6. prints a summary ([`report`]) and fails if anything was lost, doubled or left unsettled,
//!    if a scheduler stalled or died on its own, if one exited non-zero on SIGTERM, or if a
//!    fault's own requirement failed.
//!
//! The seed fixes the sequence of decisions (intervals, victims, instance ids, restart times); the
//! interleaving with the schedulers' own timing is not reproducible, so a seed reproduces the kind
//! of run, not the exact one.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use uuid::Uuid;

use crate::database_url;

mod backend;
mod citus;
mod events;
mod fault;
mod fleet;
pub(crate) use fleet::{log_tail, scheduler_command, scheduler_output};
mod forwarder;
mod ledger;
mod options;
mod postgres;
mod report;
mod rng;

use backend::{Backend, Takeover};
use fault::{Chaos, Fault, OWN_APPLICATION};
use fleet::Fleet;
use options::{Options, USAGE, parse_args};
use postgres::Cluster;
use report::{DRAIN_TIMEOUT, Report};
use rng::Rng;

/// What puts the machine back after a run (a failover's clusters), run whatever happened.
type Restore = Box<dyn FnOnce() -> anyhow::Result<()>>;

/// `cargo xtask chaos [...]`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let default_seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut options = match parse_args(args, default_seed) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return Ok(());
        }
        Err(e) => {
            eprintln!("xtask chaos: {e:#}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let command = options.command();
    // On a pg_auto_failover formation the run's own connections go to the primary of the
    // moment; the schedulers get the formation's multi-host URL.
    if options.auto_failover.is_some() {
        let nodes = fault::autofailover::node_urls(&options.server_url)?;
        let primary = fault::autofailover::current_primary(&rt, &nodes)?;
        options.formation_url = Some(std::mem::replace(&mut options.server_url, primary));
    }
    let workers = citus::workers(&options.citus_workers)?;
    let cluster = if let (Some(first), true) = (workers.first(), options.db_restarts > 0) {
        // On Citus a restart takes down a worker: the coordinator stays up.
        Some(first.clone())
    } else if options.db_restarts > 0 || options.failover.is_some() {
        Some(Cluster::resolve(
            options.pg_cluster.as_deref(),
            &options.server_url,
        )?)
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
        if options.docker {
            "docker mission"
        } else {
            options.backend.name()
        }
    );

    super::run({
        let mut c = super::cargo();
        c.args(["build", "--quiet", "--package", "cm-scheduler"]);
        c
    })?;
    let built = crate::target_dir().join("debug/cm-scheduler");

    // The name is random on its own rather than derived from the seed, so two runs with one
    // seed (one of them kept) never meet in one database.
    let db_name = format!(
        "cm_chaos_{:08x}",
        (default_seed ^ u64::from(std::process::id())) & 0xffff_ffff
    );
    let url = database_url(&options.server_url, &db_name)?;
    let log_dir = std::env::temp_dir().join(format!("cm-chaos-{db_name}"));
    std::fs::create_dir_all(&log_dir)?;
    // The run starts schedulers from a link to (or a copy of) the binary it built: a build of
    // another checkout sharing the target directory would otherwise replace it halfway through
    // the run. Removed when the run ends.
    let binary = log_dir.join("cm-scheduler");
    let _ = std::fs::remove_file(&binary);
    if std::fs::hard_link(&built, &binary).is_err() {
        std::fs::copy(&built, &binary)
            .with_context(|| format!("copying {} to {}", built.display(), binary.display()))?;
    }
    rt.block_on(sqlx::Postgres::create_database(&url))
        .with_context(|| format!("creating database {db_name}"))?;
    if !workers.is_empty() {
        citus::prepare(&rt, &options.server_url, &db_name, &workers)?;
    }
    eprintln!("chaos: database {db_name}, logs in {}", log_dir.display());
    let _watchdog = Watchdog::start(&db_name, options.duration * 2 + STUCK_AFTER);

    let mut restores: Vec<Restore> = Vec::new();
    let result = exercise(
        &options,
        &rt,
        cluster.as_ref(),
        &binary,
        &db_name,
        &log_dir,
        &mut restores,
    );

    // Whatever happened, PostgreSQL must be running again for everyone else.
    if let Some(cluster) = &cluster
        && options.failover.is_none()
        && !super::postgres_answers(&cluster.url(&options.server_url)?)
    {
        eprintln!("chaos: PostgreSQL is down; starting it");
        cluster.start()?;
    }
    let _ = std::fs::remove_file(&binary);
    let (report, final_url) = match result {
        Ok(done) => done,
        Err(e) => {
            for restore in restores {
                if let Err(r) = restore() {
                    eprintln!("chaos: could not put the clusters back: {r:#}");
                }
            }
            eprintln!("chaos: the run failed; database {db_name} kept for inspection");
            return Err(e);
        }
    };
    let problems = report.problems();
    let keep = options.keep || !problems.is_empty();
    if !keep {
        rt.block_on(sqlx::Postgres::force_drop_database(&final_url))
            .with_context(|| format!("dropping database {db_name}"))?;
        citus::drop_on_workers(&rt, &options.server_url, &db_name, &workers)?;
    }
    for restore in restores {
        restore()?;
    }

    let head = [
        ("seed".to_string(), options.seed.to_string()),
        ("command".to_string(), command),
        (
            "database".to_string(),
            format!("{db_name} ({})", if keep { "kept" } else { "dropped" }),
        ),
    ];
    report.print(&head, &log_dir, started.elapsed());
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

/// How long past twice its chaos a run may take (the set-up, the drain, the checks) before the
/// watchdog calls it stuck.
const STUCK_AFTER: Duration = Duration::from_secs(600);

/// Ends a run that is stuck: every step of the run waits on something (a query, a process, a
/// server), and one that never answers must fail the run in minutes, saying so, rather than hold
/// a CI job until its own limit. Dropping it ends the watch.
struct Watchdog {
    _stop: std::sync::mpsc::Sender<()>,
}

impl Watchdog {
    fn start(db_name: &str, limit: Duration) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let db_name = db_name.to_string();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                eprintln!(
                    "chaos: STUCK: the run has not ended {} s after it began; its schedulers \
                     are killed and database {db_name} is kept for inspection",
                    limit.as_secs()
                );
                // Every scheduler of the run names its database on its command line.
                let _ = std::process::Command::new("pkill")
                    .args(["-KILL", "-f", &format!("/{db_name}")])
                    .status();
                std::process::exit(1);
            }
        });
        Watchdog { _stop: tx }
    }
}

/// The run's own pool on the chaos database at `url`: two connections kept open, named so the
/// faults that act on every other connection leave them alone.
pub(crate) fn own_pool(rt: &tokio::runtime::Runtime, url: &str) -> anyhow::Result<PgPool> {
    let options = url
        .parse::<PgConnectOptions>()?
        .application_name(OWN_APPLICATION)
        // The run's own statements never wait on a lock for ever: a fault that holds one (a
        // caller's open transaction) is released by this same thread, so such a wait would hang
        // the run; it fails it instead, naming the statement.
        .options([("lock_timeout", "30s")]);
    Ok(rt.block_on(
        PgPoolOptions::new()
            .max_connections(2)
            .min_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options),
    )?)
}

/// Each routine's id and first occurrence.
type Firsts = Vec<(Uuid, DateTime<Utc>)>;

/// How many seconds apart a routine of a `--retries` run that retries fires: far enough apart
/// for a retry (after at least a second) to come before the next occurrence.
const RETRIED_EVERY: i64 = 5;

/// Creates the routines and returns each one's id and first occurrence, and the seconds
/// between its occurrences (1; with `retries`, [`RETRIED_EVERY`] for every third routine,
/// which retries a failed outcome that many times).
fn create_routines(
    rt: &tokio::runtime::Runtime,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    (count, retries): (usize, Option<u32>),
    backend: &Backend,
) -> anyhow::Result<(Firsts, Vec<i64>)> {
    let mut ids = Vec::with_capacity(count);
    let mut steps = std::collections::HashMap::new();
    let every_five = format!("*/{RETRIED_EVERY} * * * * *");
    for i in 0..count {
        let name = format!("chaos {i:02}");
        let what = backend.routine_args(i);
        let retried = retries.filter(|_| i % 3 == 2).map(|n| n.to_string());
        let schedule = match retried {
            Some(_) => every_five.as_str(),
            None => "* * * * * *",
        };
        let mut args = vec![
            "routine",
            "create",
            "--name",
            &name,
            "--schedule",
            schedule,
            "--misfire",
            "catch-up",
        ];
        if let Some(n) = &retried {
            args.extend(["--retries", n, "--retry-backoff", "1s..2s"]);
        }
        args.extend(what.iter().map(String::as_str));
        let out = scheduler_output(binary, url, &args)?;
        let id: Uuid = out
            .trim()
            .parse()
            .with_context(|| format!("routine create printed {out:?}, not an id"))?;
        ids.push(id);
        steps.insert(id, if retried.is_some() { RETRIED_EVERY } else { 1 });
    }
    // The schedulers are not running yet, so each next_run_at is the routine's first occurrence.
    let firsts: Vec<(Uuid, DateTime<Utc>)> = rt.block_on(
        sqlx::query_as(
            "SELECT id, next_run_at FROM cm.routines WHERE id = ANY($1) AND next_run_at IS NOT NULL",
        )
        .bind(&ids)
        .fetch_all(pool),
    )?;
    if firsts.len() != ids.len() {
        bail!(
            "only {} of {} routines have a next run",
            firsts.len(),
            ids.len()
        );
    }
    let steps = firsts.iter().map(|(id, _)| steps[id]).collect();
    Ok((firsts, steps))
}

/// The address of the server `url` names, for the forwarder.
fn server_address(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let parsed = url::Url::parse(url).with_context(|| format!("invalid URL {url:?}"))?;
    let host = parsed.host_str().unwrap_or("127.0.0.1");
    (host, parsed.port().unwrap_or(5432))
        .to_socket_addrs()?
        .find(|a| a.is_ipv4())
        .with_context(|| format!("no IPv4 address for {host}"))
}

/// Steps 1 to 5 of the module documentation, on the database `db_name`. Returns the report and
/// the URL the chaos database has at the end (another server's after a failover).
fn exercise(
    options: &Options,
    rt: &tokio::runtime::Runtime,
    cluster: Option<&Cluster>,
    binary: &Path,
    db_name: &str,
    log_dir: &Path,
    restores: &mut Vec<Restore>,
) -> anyhow::Result<(Report, String)> {
    let mut rng = Rng::new(options.seed);
    let mut report = Report::default();
    let url = database_url(&options.server_url, db_name)?;
    let migrate: &[&str] = if options.citus_workers.is_empty() {
        &["migrate"]
    } else {
        &["migrate", "--citus"]
    };
    scheduler_output(binary, &url, migrate)?;
    let pool = own_pool(rt, &url)?;
    let backend = Backend::start(options, log_dir)?;
    let (firsts, steps) = create_routines(
        rt,
        &pool,
        binary,
        &url,
        (options.routines, options.retries),
        &backend,
    )?;
    let ids: Vec<Uuid> = firsts.iter().map(|f| f.0).collect();
    let keyed = match options.concurrency_limit {
        Some(limit) => rt.block_on(fault::limit::set_up(&pool, &ids, limit))?.len(),
        None => 0,
    };

    let standby = match (options.failover, &options.standby_cluster, cluster) {
        (Some(mode), Some(name), Some(primary)) => {
            let standby = Cluster::named(name)?;
            fault::failover::prepare(rt, primary, &standby, mode, &options.server_url)?;
            let (p, s, server, db) = (
                primary.clone(),
                standby.clone(),
                options.server_url.clone(),
                db_name.to_string(),
            );
            restores.push(Box::new(move || {
                fault::failover::restore(&p, &s, &server, &db)
            }));
            Some(standby)
        }
        _ => None,
    };
    let forwarder = if options.forwarded() {
        let f = forwarder::Forwarder::start(server_address(&options.server_url)?)?;
        eprintln!(
            "chaos: the schedulers reach PostgreSQL through 127.0.0.1:{}",
            f.port()
        );
        Some(f)
    } else {
        None
    };
    let scheduler_url = match (&forwarder, &options.formation_url, &options.pooler) {
        (Some(f), _, _) => f.url(&url)?,
        (None, Some(multi), _) => fault::autofailover::with_database(multi, db_name)?,
        (None, None, Some(pooler)) => {
            eprintln!("chaos: the schedulers reach PostgreSQL through the pooler at {pooler}");
            database_url(pooler, db_name)?
        }
        (None, None, None) => url.clone(),
    };
    // With --events-webhook: the receiver, a routine of the toggler's own, and a one-second
    // deadline on every routine (none on those that retry), which the faults make some
    // occurrences miss.
    let events = match options.events {
        true => Some(events::EventsReceiver::start(options.seed, log_dir)?),
        false => None,
    };
    let toggled: Option<Uuid> = match &events {
        Some(_) => Some(rt.block_on(async {
            // The routines that retry (`--retries`) get none: their retries are bounded by
            // their next occurrence, and a deadline would end them first.
            sqlx::query(
                "UPDATE cm.routines SET deadline_secs = CASE WHEN retries > 0 THEN NULL ELSE 1 END",
            )
            .execute(&pool)
            .await?;
            sqlx::query_scalar::<_, Uuid>(
                "SELECT cm.create_routine('chaos toggled', '0 0 1 1 *', 'UTC', 'toggled')",
            )
            .fetch_one(&pool)
            .await
        })?),
        None => None,
    };
    let mut scheduler_args = backend.scheduler_args();
    if let Some(events) = &events {
        scheduler_args.extend(events.scheduler_args());
    }
    let mut scheduler_env = backend.scheduler_env();
    if options.pooler.is_some() {
        scheduler_env.push(("CM_DATABASE_POOLED".into(), "true".into()));
    }
    let fleet = Fleet::start(
        binary,
        &scheduler_url,
        log_dir,
        options.processes,
        scheduler_args,
        scheduler_env,
    )?;

    let start = Instant::now();
    let mut faults: Vec<Box<dyn Fault>> = vec![Box::new(fault::kill::Kills::new(
        &mut rng,
        start,
        fault::kill::aim_for(options),
    ))];
    if let Some(cluster) = cluster
        && options.db_restarts > 0
    {
        faults.push(Box::new(fault::restart::Restarts::new(
            cluster.clone(),
            &mut rng,
            start,
            options.duration,
            options.db_restarts,
        )));
    }
    if options.terminate_backends > 0 {
        faults.push(Box::new(fault::terminate::Terminations::new(
            start,
            options.duration,
            options.terminate_backends,
        )));
    }
    if options.held_locks > 0 {
        faults.push(Box::new(fault::locks::HeldLocks::new(
            start,
            options.duration,
            options.held_locks,
            toggled.into_iter().collect(),
        )));
    }
    if let Some(length) = options.network_hang {
        faults.push(Box::new(fault::hang::Hang::new(
            start,
            options.duration,
            length,
        )));
    }
    if let Some(length) = options.starve_pool {
        faults.push(Box::new(fault::starve::Starve::new(
            start,
            options.duration,
            length,
        )));
    }
    if let Some(length) = options.pin_xmin {
        faults.push(Box::new(fault::pin::Pin::new(
            start,
            options.duration,
            length,
            options.pin_baseline,
        )));
    }
    if let (Some(mode), Some(standby), Some(primary)) = (options.failover, standby, cluster) {
        faults.push(Box::new(fault::failover::Failover::new(
            primary.clone(),
            standby,
            mode,
            start,
            options.duration,
        )));
    }
    if let (Some(monitor), Some(multi)) = (&options.auto_failover, &options.formation_url) {
        faults.push(Box::new(fault::autofailover::AutoFailover::new(
            monitor.clone(),
            fault::autofailover::node_urls(multi)?,
            start,
            options.duration,
            2,
        )));
    }
    if let Backend::Nats(nats) = &backend
        && options.broker_restarts > 0
    {
        faults.push(Box::new(fault::broker::BrokerRestarts::new(
            nats.server(),
            start,
            options.duration,
            options.broker_restarts,
        )));
    }
    if let Backend::Docker(docker) = &backend
        && options.dockerd_restarts > 0
    {
        faults.push(Box::new(fault::dockerd::DockerdRestarts::new(
            docker.engine(),
            start,
            options.duration,
            options.dockerd_restarts,
        )));
    }
    if options.shard_moves > 0 {
        let mut workers = citus::workers(&options.citus_workers)?.into_iter();
        let (Some(from), Some(to)) = (workers.next(), workers.next()) else {
            bail!("--shard-moves needs two --citus-workers");
        };
        faults.push(Box::new(fault::moves::ShardMoves::new(
            from,
            to,
            options.shard_moves,
            start,
            options.duration,
        )));
    }
    if let Some(length) = options.worker_outage {
        let first = citus::workers(&options.citus_workers)?
            .into_iter()
            .next()
            .context("--worker-outage needs --citus-workers")?;
        faults.push(Box::new(fault::worker::WorkerOutage::new(
            first,
            start,
            options.duration,
            length,
        )));
    }
    let toggles = toggled.map(|routine| {
        let toggles = events::Toggles::new(routine, start);
        let count = toggles.count();
        faults.push(Box::new(toggles));
        (routine, count)
    });
    if let Some(limit) = options.concurrency_limit {
        faults.push(Box::new(fault::limit::LimitWatch::new(
            limit,
            keyed,
            start,
            options.duration,
        )));
    }
    if options.poison_routine {
        faults.push(Box::new(fault::poison::Poison::new(
            start,
            options.duration,
        )));
    }
    if let Backend::Webhook(webhook) = &backend {
        faults.push(Box::new(fault::held::HeldKill::new(
            webhook.held_answers(),
            webhook.port(),
            start,
            options.duration,
        )));
    }
    if let (Backend::Webhook(webhook), Some(length)) = (&backend, options.receiver_outage) {
        faults.push(Box::new(fault::outage::ReceiverOutage::new(
            webhook.outage_switch(),
            start,
            options.duration,
            length,
        )));
    }

    let mut chaos = Chaos {
        rt,
        fleet,
        pool,
        database: db_name.to_string(),
        server_url: options.server_url.clone(),
        start,
        end: start + options.duration,
        quiet_until: start,
        rng,
        forwarder,
        failover_at: None,
        citus: !options.citus_workers.is_empty(),
    };
    let result = chaos_loop(&mut chaos, &mut faults, &mut report);
    // Healed whatever the loop ended with, so the drain and the check see a working system.
    for fault in &mut faults {
        if let Err(e) = fault.heal(&mut chaos) {
            chaos.say(format!("could not heal a fault: {e:#}"));
        }
    }
    result?;
    chaos.say("the chaos ends; pausing every routine");

    // Pausing stops new occurrences from coming due; the database's clock at this point is what
    // the last occurrences are compared with to detect a stall.
    let url = database_url(&chaos.server_url, db_name)?;
    let paused_at = chaos.db_now()?;
    for id in &ids {
        scheduler_output(binary, &url, &["routine", "pause", &id.to_string()])?;
    }
    let drain_start = Instant::now();
    report.drained_in = loop {
        let claimed: i64 = rt.block_on(
            sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE status = 'claimed'")
                .fetch_one(&chaos.pool),
        )?;
        if claimed == 0 {
            break Some(drain_start.elapsed());
        }
        if drain_start.elapsed() > DRAIN_TIMEOUT {
            break None;
        }
        for dead in chaos.fleet.restart_dead()? {
            chaos.say(format!("UNEXPECTED: {dead}"));
            report.died_on_their_own.push(dead);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    chaos.say(match report.drained_in {
        Some(d) => format!("no claimed row left after {d:.1?}; SIGTERM to every scheduler"),
        None => "claimed rows are still left; SIGTERM to every scheduler".to_string(),
    });
    if events.is_some() {
        let drain_start = Instant::now();
        loop {
            let undelivered: i64 = rt.block_on(
                sqlx::query_scalar(
                    "SELECT count(*) FROM cm.routine_events WHERE delivered_at IS NULL",
                )
                .fetch_one(&chaos.pool),
            )?;
            if undelivered == 0 || drain_start.elapsed() > events::EVENTS_DRAIN {
                chaos.say(format!(
                    "{undelivered} events undelivered after {:.1?}",
                    drain_start.elapsed()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    report.terminations = chaos.fleet.terminate_all();

    let checks = if options.citus_workers.is_empty() {
        chaos.pool.clone()
    } else {
        // A transaction a restart left prepared on a worker is only committed (or rolled back)
        // by the coordinator's recovery; what the ledger holds is read after it.
        let recovered = citus::recover(rt, &url)?;
        chaos.say(format!(
            "Citus: {recovered} prepared transactions recovered before the check"
        ));
        citus::checking_pool(rt, &url)?
    };
    report.ledger = rt.block_on(ledger::check_ledger(&checks, &firsts, &steps, paused_at))?;
    let rows = rt.block_on(ledger::fire_rows(&checks))?;
    report.backend = backend.check(
        rt,
        &checks,
        &rows,
        Takeover::new(chaos.failover_at, options),
        log_dir,
    )?;
    report.faults = faults.iter().map(|f| f.findings()).collect();
    if let (Some(events), Some((routine, count))) = (&events, &toggles) {
        report
            .faults
            .push(rt.block_on(events.check(&checks, *routine, count))?);
    }
    rt.block_on(checks.close());
    rt.block_on(chaos.pool.close());
    Ok((report, url))
}

/// Step 3: lets each fault act when it is due until the chaos ends, replacing any scheduler
/// that died on its own.
fn chaos_loop(
    chaos: &mut Chaos<'_>,
    faults: &mut [Box<dyn Fault>],
    report: &mut Report,
) -> anyhow::Result<()> {
    loop {
        for dead in chaos.fleet.restart_dead()? {
            chaos.say(format!("UNEXPECTED: {dead}"));
            report.died_on_their_own.push(dead);
        }
        let now = Instant::now();
        if now >= chaos.end {
            return Ok(());
        }
        let due = faults
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.next_at().map(|at| (at, i)))
            .min();
        match due {
            Some((at, i)) if at <= now => faults[i].act(chaos)?,
            // Short naps, so a scheduler that dies on its own is noticed and replaced quickly.
            due => std::thread::sleep(
                due.map_or(chaos.end, |(at, _)| at.min(chaos.end))
                    .saturating_duration_since(now)
                    .min(Duration::from_millis(100)),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_forwarder_targets_the_servers_address() {
        assert_eq!(
            server_address("postgres://postgres@127.0.0.1:5440/postgres").unwrap(),
            "127.0.0.1:5440".parse().unwrap()
        );
        assert_eq!(
            server_address("postgres://postgres@localhost/postgres")
                .unwrap()
                .port(),
            5432
        );
    }
}
