//! `cargo xtask bench`: fires per second and lateness of the scheduler, beside the raw cost of
//! the same SQL measured in the same run.
//!
//! The machine this runs on is shared and noisy, so an absolute figure says little on its own.
//! Each figure of the engine therefore comes with an in-run baseline that costs the same
//! database work without the engine around it, and the ratio is what survives the noise:
//!
//! - **Throughput**: a backlog of `routines × backlog-seconds` owed occurrences (every-second
//!   routines whose clock is put back) is drained three ways, interleaved over several rounds:
//!   by `Scheduler::tick` in a loop (the engine), and by the same store calls driven directly,
//!   once sequentially and once concurrently (the baselines). Every run is checked against the
//!   ledger afterwards, so a fast number cannot come from lost fires.
//! - **Lateness**: two in-process schedulers (separate pools) run their real loop over
//!   every-second routines for a while; the ledger's `claimed_at − scheduled_at` and
//!   `completed_at − scheduled_at` are reported beside the round trip of `SELECT now()` on the
//!   same pool, measured during the run.
//!
//! Everything happens in a fresh database `cm_bench_<random>` on the given server, dropped at
//! the end, so the bench never writes into a database someone uses.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, Utc};
use cm_dispatch::OutboxDispatcher;
use cm_domain::{
    FireCap, Lease, MisfirePolicy, MisfireRules, Schedule, SchedulerConfig, Settlement,
};
use cm_scheduler::Scheduler;
use cm_store::{
    ClaimDueParams, ClaimedFire, FireLedger, NewRoutine, OutboxMessage, OutboxStore, PgStore,
    RoutineKind, RoutineStore,
};
use tokio::task::JoinSet;

/// When the bench started, for the progress lines.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Prints a progress line to stderr with the seconds since the bench started, so a slow phase
/// on a busy machine shows where the time went.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!(
            "xtask bench [{:6.1} s]: {}",
            STARTED.get_or_init(Instant::now).elapsed().as_secs_f64(),
            format_args!($($arg)*)
        )
    };
}

const USAGE: &str = "usage: cargo run --release -p xtask -- bench [--routines N] \
[--backlog-seconds S] [--rounds N] [--cap N] [--lateness-routines N] [--duration SECONDS] \
[--database-url URL]";

/// The bench's parameters.
#[derive(Debug, Clone)]
struct Options {
    /// Every-second routines in the throughput backlog.
    routines: u32,
    /// How far their clock is put back: the backlog is `routines × backlog_seconds` occurrences.
    backlog_seconds: u32,
    /// Rounds of the interleaved throughput runs.
    rounds: u32,
    /// `max_fires_per_tick`, for the throughput runs and the lateness runs.
    cap: usize,
    /// Every-second routines in the lateness runs.
    lateness_routines: u32,
    /// How long each lateness run lasts.
    duration: Duration,
    /// The server to create the bench database on (its database part names the maintenance
    /// database to connect to for creating and dropping).
    database_url: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            routines: 200,
            backlog_seconds: 30,
            rounds: 3,
            cap: 500,
            lateness_routines: 100,
            duration: Duration::from_secs(20),
            // Not DATABASE_URL: `.cargo/config.toml` sets it for every cargo-run process, and
            // this names only the server; the bench writes to a database of its own.
            database_url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
        }
    }
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            if flag == "--help" || flag == "-h" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
            let number = || -> anyhow::Result<u32> {
                let n: u32 = value
                    .parse()
                    .with_context(|| format!("{flag} {value}: not a number"))?;
                ensure!(n > 0, "{flag} must be at least 1");
                Ok(n)
            };
            match flag.as_str() {
                "--routines" => options.routines = number()?,
                "--backlog-seconds" => options.backlog_seconds = number()?,
                "--rounds" => options.rounds = number()?,
                "--cap" => options.cap = number()? as usize,
                "--lateness-routines" => options.lateness_routines = number()?,
                "--duration" => options.duration = Duration::from_secs(number()?.into()),
                "--database-url" => options.database_url = value.clone(),
                _ => bail!("unknown flag {flag}\n{USAGE}"),
            }
        }
        Ok(options)
    }
}

/// Runs the bench and prints its Markdown report to stdout (progress goes to stderr).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    STARTED.get_or_init(Instant::now);
    if cfg!(debug_assertions) {
        progress!(
            "WARNING: built without optimisations; the engine's figures are not \
             representative. Use `cargo run --release -p xtask -- bench`."
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(bench(options))
}

async fn bench(options: Options) -> anyhow::Result<()> {
    let name = format!(
        "cm_bench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let bench_url = crate::database_url(&options.database_url, &name)?;
    PgStore::create_database_if_missing(&bench_url)
        .await
        .with_context(|| format!("creating {name} on {}", options.database_url))?;
    progress!("created database {name}");
    let result = measure(&options, &bench_url).await;
    // The database goes whether the bench succeeded or not; the bench's own error comes first.
    let dropped =
        <sqlx::Postgres as sqlx::migrate::MigrateDatabase>::force_drop_database(&bench_url).await;
    result?;
    dropped.with_context(|| format!("dropping {name}"))?;
    progress!("dropped database {name}");
    Ok(())
}

/// What the report says about the machine and the server.
#[derive(Debug, Clone)]
struct Facts {
    cores: usize,
    server_version: String,
    /// Whether each commit waits for its WAL flush: it decides what a single-row commit costs.
    synchronous_commit: String,
    fsync: String,
    started_at: DateTime<Utc>,
}

async fn measure(options: &Options, url: &str) -> anyhow::Result<()> {
    let admin = PgStore::connect(url).await?;
    admin.migrate().await?;
    let show = |setting: &'static str| {
        let pool = admin.pool().clone();
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
                .fetch_one(&pool)
                .await
        }
    };
    let facts = Facts {
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        server_version: show("server_version").await?,
        synchronous_commit: show("synchronous_commit").await?,
        fsync: show("fsync").await?,
        started_at: Utc::now(),
    };

    // One pool for every throughput run, warmed to its full size first, so no variant pays
    // for opening connections that another one finds open.
    let work = PgStore::connect(url).await?;
    warm(&work).await?;

    create_routines(&admin, options.routines, MisfirePolicy::CatchUp).await?;
    progress!("migrated; {} routines created", options.routines);
    let variants = [Variant::Sequential, Variant::Concurrent, Variant::Engine];
    let mut runs = Vec::new();
    for round in 0..options.rounds {
        // Each round starts with a different variant, so none always runs first (after a
        // vacuum) or last.
        for i in 0..variants.len() {
            let variant = variants[(i + round as usize) % variants.len()];
            let start = reset_backlog(&admin, options.backlog_seconds).await?;
            let run = throughput(&work, variant, options).await?;
            verify_backlog(&admin, start, &run).await?;
            progress!(
                "round {} {}: {} fires in {:.2} s ({:.0}/s), ledger checked",
                round + 1,
                variant.name(),
                run.fired,
                run.elapsed.as_secs_f64(),
                run.rate()
            );
            runs.push((round + 1, variant, run));
        }
    }
    work.pool().close().await;

    let mut lateness = Vec::new();
    for tick in [Duration::from_secs(1), Duration::from_millis(200)] {
        progress!("lateness run at tick {tick:?} for {:?}", options.duration);
        let result = lateness_run(&admin, url, tick, options).await?;
        progress!(
            "lateness at tick {tick:?}: {} fires, claim p50 {:.1} ms, ledger checked",
            result.fires,
            result.claim[0]
        );
        lateness.push(result);
    }
    admin.pool().close().await;

    report(options, &facts, &runs, &lateness);
    Ok(())
}

/// Opens every connection of the pool (ten, as `PgStore::connect` sets) before timing starts.
async fn warm(store: &PgStore) -> anyhow::Result<()> {
    let mut pings = JoinSet::new();
    for _ in 0..10 {
        let store = store.clone();
        pings.spawn(async move {
            // Holding the connection a moment makes the pool open a new one for each ping.
            let mut conn = store.pool().acquire().await?;
            sqlx::query("SELECT pg_sleep(0.05)")
                .execute(&mut *conn)
                .await?;
            anyhow::Ok(())
        });
    }
    while let Some(done) = pings.join_next().await {
        done??;
    }
    Ok(())
}

async fn create_routines(store: &PgStore, n: u32, misfire: MisfirePolicy) -> anyhow::Result<()> {
    let schedule = Schedule::parse("* * * * * *", "UTC").expect("a valid schedule");
    for i in 0..n {
        store
            .create_routine(NewRoutine {
                name: format!("bench {i}"),
                schedule: schedule.clone(),
                kind: RoutineKind::Message,
                payload: serde_json::json!({ "text": "bench" }),
                misfire,
                paused: false,
            })
            .await?;
    }
    Ok(())
}

/// Empties the ledger and the outbox and puts every routine's clock `seconds` back (on a whole
/// second, an occurrence of `* * * * * *`). Returns that instant.
async fn reset_backlog(store: &PgStore, seconds: u32) -> anyhow::Result<DateTime<Utc>> {
    let pool = store.pool();
    sqlx::query("TRUNCATE routine_fires, outbox_messages")
        .execute(pool)
        .await?;
    let start: DateTime<Utc> = sqlx::query_scalar(
        "UPDATE routines
         SET next_run_at = date_trunc('second', now()) - make_interval(secs => $1),
             last_run_at = NULL
         RETURNING next_run_at",
    )
    .bind(f64::from(seconds))
    .fetch_all(pool)
    .await?
    .into_iter()
    .next()
    .context("no routines")?;
    // Every run starts from tables of the same shape: the updates of the previous run leave
    // dead row versions in `routines` that the next run's claims would otherwise wade through.
    sqlx::query("VACUUM ANALYZE routines, routine_fires, outbox_messages")
        .execute(pool)
        .await?;
    Ok(start)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The store calls of a tick, one fire after another.
    Sequential,
    /// The store calls of a tick, the fires of one claim all at once (as the engine does).
    Concurrent,
    /// `Scheduler::tick`.
    Engine,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Sequential => "baseline, sequential",
            Variant::Concurrent => "baseline, concurrent",
            Variant::Engine => "engine (`Scheduler::tick`)",
        }
    }
}

/// What one throughput run did.
#[derive(Debug, Clone)]
struct Throughput {
    fired: u64,
    claims: u64,
    elapsed: Duration,
}

impl Throughput {
    fn rate(&self) -> f64 {
        self.fired as f64 / self.elapsed.as_secs_f64()
    }
}

/// The scheduler settings of the throughput runs: a large cap, and a misfire grace longer than
/// any backlog here, so every owed occurrence fires and none is skipped.
fn throughput_config(options: &Options) -> SchedulerConfig {
    SchedulerConfig {
        tick_interval: Duration::from_millis(10),
        max_fires_per_tick: FireCap::new(options.cap).expect("the cap is at least 1"),
        lease: Lease::new(Duration::from_secs(60)).expect("not zero"),
        dispatch_timeout: Duration::from_secs(30),
        misfire_grace: Duration::from_secs(3600),
        max_backlog: 100_000,
        ..SchedulerConfig::default()
    }
}

/// Drains the backlog with `variant` until a claim finds nothing owed. New occurrences come due
/// every second while it runs, so the drain chases the clock; a variant slower than the
/// routines' own rate would never finish, which the time limit turns into an error.
async fn throughput(
    store: &PgStore,
    variant: Variant,
    options: &Options,
) -> anyhow::Result<Throughput> {
    let config = throughput_config(options);
    let limit = Duration::from_secs(120);
    let params = ClaimDueParams {
        claimant: format!("bench-{variant:?}"),
        lease: config.lease,
        cap: config.max_fires_per_tick,
        rules: MisfireRules::from(&config),
        // What `Scheduler::tick` asks for.
        max_routines: u32::try_from(options.cap * 4).unwrap_or(u32::MAX),
        in_claim: Default::default(),
    };
    let scheduler = Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(OutboxDispatcher::new(store.clone())),
        config,
        "bench-engine",
    )?;
    let mut run = Throughput {
        fired: 0,
        claims: 0,
        elapsed: Duration::ZERO,
    };
    let started = Instant::now();
    loop {
        ensure!(
            started.elapsed() < limit,
            "{} did not drain the backlog in {limit:?}",
            variant.name()
        );
        run.claims += 1;
        let (fired, more) = match variant {
            Variant::Engine => {
                let report = scheduler.tick().await?;
                ensure!(
                    report.failed + report.abandoned + report.unsettled + report.in_flight == 0,
                    "the engine did not fire everything it claimed: {report:?}"
                );
                (report.fired, report.fired + report.deferred > 0)
            }
            Variant::Sequential | Variant::Concurrent => {
                let claim = store.claim_due(&params).await?;
                let more = !claim.fires.is_empty() || claim.deferred > 0;
                let fired = claim.fires.len();
                if variant == Variant::Sequential {
                    for fire in claim.fires {
                        fire_directly(store, fire).await?;
                    }
                } else {
                    let mut fires = JoinSet::new();
                    for fire in claim.fires {
                        let store = store.clone();
                        fires.spawn(async move { fire_directly(&store, fire).await });
                    }
                    while let Some(done) = fires.join_next().await {
                        done??;
                    }
                }
                (fired, more)
            }
        };
        run.fired += fired as u64;
        if !more {
            break;
        }
    }
    run.elapsed = started.elapsed();
    Ok(run)
}

/// What the engine sends for one fresh claim with the outbox backend, and nothing else: the
/// outbox row, then the fenced settle.
async fn fire_directly(store: &PgStore, fire: ClaimedFire) -> anyhow::Result<()> {
    ensure!(fire.row.inserted, "a baseline claim found an existing row");
    let message = OutboxMessage {
        occurrence: fire.occurrence,
        idempotency_key: fire.occurrence.idempotency_key(),
        attempt: fire.row.attempt,
        payload: fire.payload.clone(),
    };
    store.outbox_insert(&message).await?;
    ensure!(
        store
            .settle_fire(&fire.fire_ref(), &Settlement::Fired)
            .await?
            == cm_store::SettleOutcome::Settled,
        "a baseline settle matched nothing"
    );
    Ok(())
}

/// Checks the ledger after a throughput run: every occurrence from `start` to each routine's
/// new clock is `fired`, once, with its outbox row, and the run counted exactly those.
async fn verify_backlog(
    store: &PgStore,
    start: DateTime<Utc>,
    run: &Throughput,
) -> anyhow::Result<()> {
    let (fired, other, outbox, owed): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT
             (SELECT count(*) FROM routine_fires WHERE status = 'fired'),
             (SELECT count(*) FROM routine_fires WHERE status <> 'fired'),
             (SELECT count(*) FROM outbox_messages),
             (SELECT coalesce(sum(extract(epoch FROM next_run_at - $1)), 0)::bigint
              FROM routines)",
    )
    .bind(start)
    .fetch_one(store.pool())
    .await?;
    ensure!(
        other == 0 && fired == owed && outbox == owed && u64::try_from(fired)? == run.fired,
        "the ledger does not match the run: {fired} fired, {other} not fired, {outbox} outbox \
         rows, {owed} occurrences owed, {} counted by the run",
        run.fired
    );
    Ok(())
}

/// What one lateness run measured. Lateness figures are milliseconds: p50, p90, p99, max.
#[derive(Debug, Clone)]
struct Lateness {
    tick: Duration,
    fires: i64,
    by_scheduler: Vec<i64>,
    claim: Vec<f64>,
    settle: Vec<f64>,
    ping_p50: f64,
    pings: usize,
}

/// Two schedulers, each on its own pool, run their real loop (wall-clock aligned ticks) over
/// fresh every-second routines for the run's duration.
async fn lateness_run(
    admin: &PgStore,
    url: &str,
    tick: Duration,
    options: &Options,
) -> anyhow::Result<Lateness> {
    let pool = admin.pool();
    sqlx::query("TRUNCATE routine_fires, outbox_messages")
        .execute(pool)
        .await?;
    sqlx::query("DELETE FROM routines").execute(pool).await?;
    sqlx::query("VACUUM ANALYZE routines, routine_fires, outbox_messages")
        .execute(pool)
        .await?;
    create_routines(admin, options.lateness_routines, MisfirePolicy::FireOnce).await?;
    // Every routine starts at one whole second, two seconds ahead: a routine whose creation
    // committed just after a tick's snapshot would otherwise be claimed a whole tick late, a
    // set-up artefact rather than the engine's lateness.
    sqlx::query("UPDATE routines SET next_run_at = date_trunc('second', now()) + interval '2 s'")
        .execute(pool)
        .await?;

    let config = SchedulerConfig {
        tick_interval: tick,
        max_fires_per_tick: FireCap::new(options.cap).expect("the cap is at least 1"),
        ..SchedulerConfig::default()
    };
    let stop = tokio::time::Instant::now() + options.duration;
    let mut stores = Vec::new();
    let mut handles = Vec::new();
    for name in ["bench-a", "bench-b"] {
        let store = PgStore::connect(url).await?;
        let scheduler = Scheduler::new(
            Arc::new(store.clone()),
            Arc::new(OutboxDispatcher::new(store.clone())),
            config.clone(),
            name,
        )?;
        handles.push(Arc::new(scheduler).spawn(tokio::time::sleep_until(stop)));
        stores.push(store);
    }
    // The in-run baseline: the round trip of the cheapest statement, on scheduler A's pool,
    // while both schedulers run.
    let mut pings = Vec::new();
    while tokio::time::Instant::now() < stop {
        let sent = Instant::now();
        stores[0].ping().await?;
        pings.push(sent.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for handle in handles {
        let summary = handle.await?;
        ensure!(
            summary.tick_errors == 0,
            "a scheduler's tick failed: {:?}",
            summary.last_error
        );
    }
    for store in &stores {
        store.pool().close().await;
    }

    type Row = (i64, i64, i64, Option<Vec<f64>>, Option<Vec<f64>>);
    let (fires, unsettled, gaps, claim, settle): Row =
        sqlx::query_as(
            "WITH f AS (
                 SELECT *,
                        extract(epoch FROM claimed_at - scheduled_at)::float8 * 1000 AS claim_ms,
                        extract(epoch FROM completed_at - scheduled_at)::float8 * 1000 AS settle_ms
                 FROM routine_fires
             ),
             spans AS (
                 SELECT count(*) AS n,
                        extract(epoch FROM max(scheduled_at) - min(scheduled_at))::bigint + 1 AS owed
                 FROM routine_fires GROUP BY routine_id
             )
             SELECT
                 (SELECT count(*) FROM f),
                 (SELECT count(*) FROM f WHERE status <> 'fired'),
                 (SELECT coalesce(sum(owed - n), 0)::bigint FROM spans),
                 (SELECT percentile_disc(ARRAY[0.5, 0.9, 0.99, 1.0])
                      WITHIN GROUP (ORDER BY claim_ms) FROM f),
                 (SELECT percentile_disc(ARRAY[0.5, 0.9, 0.99, 1.0])
                      WITHIN GROUP (ORDER BY settle_ms) FROM f)",
        )
        .fetch_one(pool)
        .await?;
    let (Some(claim), Some(settle)) = (claim, settle) else {
        bail!("no routine fired in the lateness run");
    };
    ensure!(fires > 0, "no routine fired in the lateness run");
    ensure!(
        unsettled == 0 && gaps == 0,
        "the lateness run left {unsettled} fires unsettled and {gaps} occurrences missing"
    );
    let by_scheduler: Vec<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM routine_fires GROUP BY claimant ORDER BY claimant",
    )
    .fetch_all(pool)
    .await?;
    pings.sort_by(f64::total_cmp);
    Ok(Lateness {
        tick,
        fires,
        by_scheduler,
        claim,
        settle,
        ping_p50: pings.get(pings.len() / 2).copied().unwrap_or(f64::NAN),
        pings: pings.len(),
    })
}

/// The median, the smallest and the largest of `values`.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = if values.len() % 2 == 1 {
        values[values.len() / 2]
    } else {
        (values[values.len() / 2 - 1] + values[values.len() / 2]) / 2.0
    };
    (median, values[0], values[values.len() - 1])
}

fn report(
    options: &Options,
    facts: &Facts,
    runs: &[(u32, Variant, Throughput)],
    lateness: &[Lateness],
) {
    let build = if cfg!(debug_assertions) {
        "debug (unoptimised: not representative)"
    } else {
        "release"
    };
    println!(
        "## Run of {}\n",
        facts.started_at.format("%Y-%m-%d %H:%M UTC")
    );
    println!("| | |\n|---|---|");
    println!("| cores (`available_parallelism`) | {} |", facts.cores);
    println!(
        "| PostgreSQL | {} (`synchronous_commit` {}, `fsync` {}) |",
        facts.server_version, facts.synchronous_commit, facts.fsync
    );
    println!("| build | {build} |");
    println!(
        "| throughput | {} routines `* * * * * *` (catch-up), clock put back {} s ({} owed at \
         the start), cap {} a tick, {} rounds |",
        options.routines,
        options.backlog_seconds,
        u64::from(options.routines) * u64::from(options.backlog_seconds),
        options.cap,
        options.rounds
    );
    println!(
        "| lateness | {} routines `* * * * * *`, 2 schedulers (own pools of 10), cap {}, {} s \
         a run |",
        options.lateness_routines,
        options.cap,
        options.duration.as_secs()
    );

    println!("\n### Throughput, every run\n");
    println!("| round | variant | fires | claims | wall (s) | fires/s |");
    println!("|---|---|---:|---:|---:|---:|");
    for (round, variant, run) in runs {
        println!(
            "| {round} | {} | {} | {} | {:.2} | {:.0} |",
            variant.name(),
            run.fired,
            run.claims,
            run.elapsed.as_secs_f64(),
            run.rate()
        );
    }

    let rates = |v: Variant| -> Vec<f64> {
        runs.iter()
            .filter(|(_, variant, _)| *variant == v)
            .map(|(_, _, run)| run.rate())
            .collect()
    };
    // The engine's rate over each baseline's, taken within each round: the runs of one round
    // are seconds apart, so their ratio is less exposed to the machine's mood than the rates.
    let ratios = |baseline: Variant| -> Vec<f64> {
        (1..=options.rounds)
            .filter_map(|round| {
                let rate = |v: Variant| {
                    runs.iter()
                        .find(|(r, variant, _)| *r == round && *variant == v)
                        .map(|(_, _, run)| run.rate())
                };
                Some(rate(Variant::Engine)? / rate(baseline)?)
            })
            .collect()
    };
    println!("\n### Throughput, summary\n");
    println!(
        "| variant | median fires/s | min | max | engine ÷ this, per round: median (min–max) |"
    );
    println!("|---|---:|---:|---:|---:|");
    for variant in [Variant::Sequential, Variant::Concurrent, Variant::Engine] {
        let (median, min, max) = spread(rates(variant));
        let ratio = if variant == Variant::Engine {
            "1".to_string()
        } else {
            let (median, min, max) = spread(ratios(variant));
            format!("{median:.2} ({min:.2}–{max:.2})")
        };
        println!(
            "| {} | {median:.0} | {min:.0} | {max:.0} | {ratio} |",
            variant.name()
        );
    }

    println!("\n### Lateness (ms after `scheduled_at`)\n");
    println!(
        "| tick | fires (A / B) | claimed p50 | p90 | p99 | max | settled p50 | p90 | p99 | max \
         | `SELECT now()` p50 (n) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in lateness {
        let split: Vec<String> = l.by_scheduler.iter().map(i64::to_string).collect();
        println!(
            "| {:?} | {} ({}) | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} \
             | {:.2} ({}) |",
            l.tick,
            l.fires,
            split.join(" / "),
            l.claim[0],
            l.claim[1],
            l.claim[2],
            l.claim[3],
            l.settle[0],
            l.settle[1],
            l.settle[2],
            l.settle[3],
            l.ping_p50,
            l.pings
        );
    }
}
