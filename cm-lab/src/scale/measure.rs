//! The scale run's steps, in order: idle tick, throughput, `fires` first page, retention. Each
//! returns its report rows.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, Datelike, TimeDelta, Timelike, Utc};
use cm_domain::{FireCap, Lease, MisfireRules, SchedulerConfig};
use cm_store::{
    ClaimDueParams, FireFilter, FireLedger, InClaimEffect, InClaimWrites, PgStore,
    explain::HotStatement,
};
use sqlx::PgPool;

use super::{FEW_OCCURRENCES, Options, Row, count, load, progress};
use crate::bench::processes::Fleet;
use crate::chaos::scheduler_command;

/// The retention the scale ledger is pruned to (the binary's default).
const RETENTION: Duration = Duration::from_secs(30 * 86_400);

/// The engine's flags in the throughput runs: the bench's (`cargo xtask bench`).
fn run_flags() -> Vec<String> {
    crate::bench::options::Options::full().run_flags()
}

/// The claim the engine's tick makes with the bench's flags (cap 200, outbox in the claim).
fn claim_params() -> ClaimDueParams {
    let config = SchedulerConfig {
        misfire_grace: Duration::from_secs(3600),
        max_backlog: SchedulerConfig::MAX_BACKLOG,
        ..SchedulerConfig::default()
    };
    let cap = FireCap::new(200).expect("200 is a cap");
    ClaimDueParams {
        claimant: "scale".into(),
        lease: Lease::new(Duration::from_secs(60)).expect("60 s is a lease"),
        cap,
        rules: MisfireRules::from(&config),
        max_routines: 400,
        in_claim: InClaimWrites {
            message: Some(InClaimEffect::Outbox),
            mission: Some(InClaimEffect::Outbox),
        },
        mission_room: None,
        after: None,
        group: None,
    }
}

/// Every step; the report's rows.
pub(super) async fn all(
    options: &Options,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let store = PgStore::connect(url).await?;
    store.migrate().await?;
    let mut rows = Vec::new();
    if options.runs("idle") {
        rows.extend(idle(options, &store, binary, url, dir).await?);
    }
    let mut fire_rate = None;
    if options.runs("throughput") {
        let (throughput, rate) = throughput(options, store.pool(), binary, url, dir).await?;
        rows.extend(throughput);
        fire_rate = Some(rate);
    }
    if options.runs("due-at-once") {
        rows.extend(due_at_once(options, store.pool(), binary, url, dir).await?);
    }
    if options.runs("every-second") {
        rows.extend(every_second_row(options, store.pool(), binary, url, dir).await?);
    }
    if options.runs("jitter") {
        rows.extend(super::jitter::jitter(options, store.pool(), binary, url, dir).await?);
    }
    if options.runs("mission-rate") {
        rows.extend(super::missions::mission_rate(options, store.pool(), binary, url, dir).await?);
    }
    if options.runs("fires") {
        rows.extend(ledger(options, &store, binary, url).await?);
    }
    if options.runs("retention") {
        // Paced to the throughput step's fire rate, or to the rate the bench measured last.
        rows.extend(retention(options, &store, fire_rate.unwrap_or(20_000.0)).await?);
    }
    if options.runs("create") {
        rows.extend(super::create::create(options, store.pool(), binary, url, dir).await?);
    }
    store.pool().close().await;
    Ok(rows)
}

/// The median and the 99th percentile of `samples`, in milliseconds.
pub(super) fn median_p99(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples
            .get(i)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    (at(0.5), at(0.99))
}

/// Idle claims at each size, the due query's buffers, and an idle scheduler's peak memory at the
/// largest size.
async fn idle(
    options: &Options,
    store: &PgStore,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let sizes = &options.sizes;
    let pool = store.pool();
    let params = claim_params();
    let mut rows = Vec::new();
    let mut medians = Vec::new();
    let mut loaded = 0;
    for &n in &sizes.idle {
        let began = Instant::now();
        load::add_parked_routines(pool, loaded, n).await?;
        loaded = n;
        progress!(
            "idle: {n} parked routines loaded in {:.1} s",
            began.elapsed().as_secs_f64()
        );
        // Warm the cache and the pool as a running scheduler's would be.
        for _ in 0..10 {
            store.claim_due(&params).await?;
        }
        let mut samples = Vec::new();
        for _ in 0..sizes.samples {
            let began = Instant::now();
            let claim = store.claim_due(&params).await?;
            samples.push(began.elapsed());
            ensure!(claim.fires.is_empty(), "an idle claim found something due");
        }
        let (median, p99) = median_p99(samples);
        medians.push(median);
        let plan = due_plan(pool).await?;
        progress!("idle: {n} routines: claim median {median:.2} ms, p99 {p99:.2} ms; {plan}");
        rows.push(Row::new(
            "Idle claim (nothing due), median / p99",
            count(n.into()),
            format!("{median:.2} ms / {p99:.2} ms"),
            format!("{} claims; due query: {plan}", sizes.samples),
        ));
    }
    let ratio = medians.last().unwrap_or(&f64::NAN) / medians.first().unwrap_or(&f64::NAN);
    rows.push(Row::new(
        "Idle claim, median largest / smallest",
        format!(
            "{} / {}",
            count(sizes.idle[sizes.idle.len() - 1].into()),
            count(sizes.idle[0].into())
        ),
        format!("{ratio:.2}"),
        "target ≤ 1.5, and under 2 ms at 1M",
    ));

    // An idle scheduler on the largest size, with defaults and with the bench's 10 ms tick: its
    // peak memory and its CPU.
    for (flags, what) in [
        (Vec::new(), "defaults (1 s tick)"),
        (run_flags(), "10 ms tick"),
    ] {
        let mut fleet = Fleet::start_named(binary, url, &flags, dir, "idle", &["scale-idle"])?;
        tokio::task::block_in_place(|| fleet.wait_ready())?;
        let pid = fleet.pids()[0];
        let cpu_before = cpu_seconds(pid)?;
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(sizes.idle_run_seconds) {
            fleet.alive()?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let cpu = (cpu_seconds(pid)? - cpu_before) / began.elapsed().as_secs_f64();
        let hwm = vm_hwm_kib(pid)?;
        tokio::task::block_in_place(|| fleet.stop())?;
        progress!(
            "idle scheduler, {what}: VmHWM {:.1} MiB, CPU {:.1}%",
            hwm as f64 / 1024.0,
            cpu * 100.0
        );
        rows.push(Row::new(
            format!("Idle `cm-scheduler run`, {what}: peak memory (VmHWM)"),
            count(loaded.into()),
            format!("{:.1} MiB", hwm as f64 / 1024.0),
            format!(
                "{} s; CPU {:.1}% of a core; target < 64 MiB, CPU < 2% at defaults",
                sizes.idle_run_seconds,
                cpu * 100.0
            ),
        ));
    }
    Ok(rows)
}

/// The due query's `EXPLAIN (ANALYZE, BUFFERS)`: the index it reads, the buffers of its top
/// node and its execution time, as the text plan prints them.
async fn due_plan(pool: &PgPool) -> anyhow::Result<String> {
    let plan = PgStore::new(pool.clone())
        .explain_analyze(&HotStatement::Due {
            max_routines: 400,
            requests: 80,
            mission_room: None,
            after: None,
            group: None,
        })
        .await?;
    let top = &plan[0];
    let blocks: Vec<String> = [
        ("hit", "Shared Hit Blocks"),
        ("read", "Shared Read Blocks"),
        ("dirtied", "Shared Dirtied Blocks"),
        ("written", "Shared Written Blocks"),
    ]
    .iter()
    .filter_map(|(name, key)| {
        let n = top["Plan"][key].as_i64().unwrap_or(0);
        (n > 0).then(|| format!("{name}={n}"))
    })
    .collect();
    let buffers = if blocks.is_empty() {
        "no buffers".to_string()
    } else {
        format!("Buffers: shared {}", blocks.join(" "))
    };
    let index = if plan.to_string().contains("\"routines_due_idx\"") {
        "routines_due_idx"
    } else {
        "NOT routines_due_idx"
    };
    let time = top["Execution Time"]
        .as_f64()
        .map_or("".into(), |ms| format!("Execution Time: {ms:.3} ms"));
    Ok(format!("{index}, {buffers}, {time}"))
}

/// A process's peak resident memory, in KiB.
fn vm_hwm_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/<pid>/status")
}

/// A process's user and system CPU time so far, in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) end at its closing parenthesis.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// A cron field listing the distinct values.
fn list(values: &[u32]) -> String {
    let mut values = values.to_vec();
    values.dedup();
    values
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A schedule whose one occurrence is the whole second two seconds before the database's now,
/// and that instant: the next one is a year later.
async fn one_occurrence(pool: &PgPool) -> anyhow::Result<(String, DateTime<Utc>)> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let t = now.with_nanosecond(0).context("a whole second")? - TimeDelta::seconds(2);
    Ok((only_at(t), t))
}

/// A schedule whose one occurrence this year is the whole second `t`.
pub(super) fn only_at(t: DateTime<Utc>) -> String {
    format!(
        "{} {} {} {} {} *",
        t.second(),
        t.minute(),
        t.hour(),
        t.day(),
        t.month()
    )
}

/// What one throughput run measured.
struct Drain {
    fires: i64,
    seconds: f64,
    first_claim_seconds: f64,
    peak_kib: Vec<u64>,
}

impl Drain {
    fn rate(&self) -> f64 {
        self.fires as f64 / self.seconds
    }
}

/// Two processes draining `routines × per` owed occurrences; the rate from the ledger.
async fn drain(
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
    routines: u32,
    per: u32,
) -> anyhow::Result<Drain> {
    load::reset(pool).await?;
    load::add_parked_routines(pool, 0, routines).await?;
    let label = format!("drain-{routines}x{per}");
    let mut fleet = Fleet::start_named(
        binary,
        url,
        &run_flags(),
        dir,
        &label,
        &["scale-a", "scale-b"],
    )?;
    tokio::task::block_in_place(|| fleet.wait_ready())?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    // Schedules whose owed occurrences are all in the past and whose next is far ahead, so a
    // run ends when the owed ones are fired: one instant two seconds ago, or seconds 0-49 of the
    // two minutes before the last.
    let (schedule, at) = if per == 1 {
        one_occurrence(pool).await?
    } else {
        ensure!(
            per == FEW_OCCURRENCES,
            "a few-routine run owes {FEW_OCCURRENCES} each"
        );
        let m = now
            .with_nanosecond(0)
            .and_then(|t| t.with_second(0))
            .context("a whole minute")?
            - TimeDelta::minutes(2);
        let n = m + TimeDelta::minutes(1);
        (
            format!(
                "0-49 {} {} {} {} *",
                list(&[m.minute(), n.minute()]),
                list(&[m.hour(), n.hour()]),
                list(&[m.day(), n.day()]),
                list(&[m.month(), n.month()])
            ),
            m,
        )
    };
    let from = load::set_clocks(pool, &schedule, at).await?;
    let expected = i64::from(routines) * i64::from(per);
    let limit = Instant::now() + Duration::from_secs(900);
    let mut peak_kib = vec![0; 2];
    loop {
        fleet.alive()?;
        for (peak, pid) in peak_kib.iter_mut().zip(fleet.pids()) {
            *peak = vm_hwm_kib(pid)?;
        }
        let (settled, owed): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM cm.routine_fires WHERE status <> 'claimed'),
                    (SELECT count(*) FROM cm.routines WHERE next_run_at <= now())",
        )
        .fetch_one(pool)
        .await?;
        if settled >= expected && owed == 0 {
            break;
        }
        if Instant::now() > limit {
            bail!("{label}: {settled} of {expected} fires settled after 900 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::task::block_in_place(|| fleet.stop())?;
    let (fires, fired, outbox, first, last): (i64, i64, i64, DateTime<Utc>, DateTime<Utc>) =
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status = 'fired'),
                    (SELECT count(*) FROM cm.outbox_messages), min(claimed_at), max(completed_at)
             FROM cm.routine_fires",
        )
        .fetch_one(pool)
        .await?;
    ensure!(
        fires == expected && fired == expected && outbox == expected,
        "{label}: {fires} ledger rows, {fired} fired, {outbox} outbox rows; {expected} owed"
    );
    let seconds = |to: DateTime<Utc>| (to - from).num_microseconds().unwrap_or(0) as f64 / 1e6;
    Ok(Drain {
        fires,
        seconds: seconds(last),
        first_claim_seconds: seconds(first),
        peak_kib,
    })
}

/// The same number of owed occurrences drained from many routines (one each) and from few (a
/// hundred each). Returns the rows and the many-routine run's fire rate.
async fn throughput(
    options: &Options,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<(Vec<Row>, f64)> {
    let sizes = &options.sizes;
    let mut rows = Vec::new();
    let few = drain(pool, binary, url, dir, sizes.few, FEW_OCCURRENCES).await?;
    progress!(
        "throughput, {} routines x {FEW_OCCURRENCES}: {:.0}/s",
        sizes.few,
        few.rate()
    );
    let many = drain(pool, binary, url, dir, sizes.many, 1).await?;
    progress!(
        "throughput, {} routines x 1: {:.0}/s",
        sizes.many,
        many.rate()
    );
    for (run, routines, per) in [(&few, sizes.few, FEW_OCCURRENCES), (&many, sizes.many, 1)] {
        rows.push(Row::new(
            format!("Throughput, {per} occurrence(s) per routine, 2 processes"),
            count(routines.into()),
            format!("{:.0} fires/s", run.rate()),
            format!(
                "{} fires in {:.1} s (first claim after {:.2} s); peak memory {:.1} / {:.1} MiB",
                run.fires,
                run.seconds,
                run.first_claim_seconds,
                run.peak_kib[0] as f64 / 1024.0,
                run.peak_kib[1] as f64 / 1024.0
            ),
        ));
    }
    rows.push(Row::new(
        "Throughput, many routines / few",
        format!("{} / {}", count(sizes.many.into()), count(sizes.few.into())),
        format!("{:.2}", many.rate() / few.rate()),
        "same occurrences owed; target ≥ 0.8",
    ));
    Ok((rows, many.rate()))
}

/// What one "due at once" run measured.
struct Burst {
    fires: i64,
    /// From the shared second to the last fire settled.
    seconds: f64,
    lateness: (f64, f64, f64),
    peak_kib: Vec<u64>,
    cpu_seconds: Vec<f64>,
}

impl Burst {
    fn rate(&self) -> f64 {
        self.fires as f64 / self.seconds
    }

    fn note(&self) -> String {
        let per_process = |values: &[String]| values.join(" / ");
        format!(
            "all {} fired {:.2} s after their second ({:.0}/s); lateness p50 {:.2} s, p99 {:.2} s, \
             max {:.2} s; peak memory {} MiB; CPU {} s",
            self.fires,
            self.seconds,
            self.rate(),
            self.lateness.0,
            self.lateness.1,
            self.lateness.2,
            per_process(
                &self
                    .peak_kib
                    .iter()
                    .map(|k| format!("{:.1}", *k as f64 / 1024.0))
                    .collect::<Vec<_>>()
            ),
            per_process(
                &self
                    .cpu_seconds
                    .iter()
                    .map(|c| format!("{c:.1}"))
                    .collect::<Vec<_>>()
            ),
        )
    }
}

/// The slowest load of [`burst`] in this run, in microseconds a routine.
static LOAD_MICROS_PER_ROUTINE: AtomicU64 = AtomicU64::new(0);

/// Records how long a load of `routines` took.
fn note_load(routines: u32, took: TimeDelta) {
    let per =
        took.num_microseconds().unwrap_or(i64::MAX).max(0) as u64 / u64::from(routines.max(1));
    LOAD_MICROS_PER_ROUTINE.fetch_max(per, Ordering::Relaxed);
}

/// How far ahead a burst of `routines` is scheduled: 5 s and a second for each 10,000, or half
/// as much again as the slowest load seen so far would take for them, whichever is longer (a
/// load takes three times as long on one machine as on another).
fn load_margin(routines: u32) -> TimeDelta {
    let fixed = TimeDelta::seconds(5 + i64::from(routines / 10_000));
    let per = LOAD_MICROS_PER_ROUTINE.load(Ordering::Relaxed);
    let seen =
        TimeDelta::microseconds((per * u64::from(routines) * 3 / 2) as i64) + TimeDelta::seconds(5);
    fixed.max(seen)
}

/// `processes` schedulers started with `flags`, then `routines` message routines whose one
/// occurrence is the same whole second, committed before it; waits until all are fired.
async fn burst(
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
    routines: u32,
    flags: &[String],
    processes: usize,
) -> anyhow::Result<Burst> {
    let label = format!("burst-{routines}-{}-{processes}", flags.len());
    let names = &["scale-a", "scale-b"][..processes];
    let mut tries = 0;
    let (mut fleet, cpu_before, at) = loop {
        load::reset(pool).await?;
        let mut fleet = Fleet::start_named(binary, url, flags, dir, &label, names)?;
        tokio::task::block_in_place(|| fleet.wait_ready())?;
        let cpu_before: Vec<f64> = fleet
            .pids()
            .into_iter()
            .map(cpu_seconds)
            .collect::<anyhow::Result<_>>()?;
        // The shared second leaves room for the load to commit before it.
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
        let margin = load_margin(routines);
        let at = now.with_nanosecond(0).context("a whole second")? + margin;
        let loaded = load::add_due_routines(pool, routines, &only_at(at), at).await?;
        note_load(routines, loaded - now);
        if loaded < at {
            break (fleet, cpu_before, at);
        }
        // A load slower than its margin fired part of the burst as it committed: the run is
        // thrown away and made again, from an empty database and new processes, with a margin
        // from the load just seen.
        tries += 1;
        ensure!(
            tries < 3,
            "{label}: the load committed at {loaded}, after the shared second {at}, {tries} times"
        );
        tokio::task::block_in_place(|| fleet.stop())?;
        progress!(
            "{label}: the load committed at {loaded}, after the shared second {at}; again with a margin of {} s",
            load_margin(routines).num_seconds()
        );
    };
    let limit = Instant::now() + Duration::from_secs(900);
    let mut peak_kib = vec![0; processes];
    loop {
        fleet.alive()?;
        for (peak, pid) in peak_kib.iter_mut().zip(fleet.pids()) {
            *peak = vm_hwm_kib(pid)?;
        }
        if drained_after(pool, at).await? {
            break;
        }
        if Instant::now() > limit {
            bail!("{label}: routines still due after 900 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu_seconds: Vec<f64> = fleet
        .pids()
        .into_iter()
        .zip(&cpu_before)
        .map(|(pid, before)| Ok(cpu_seconds(pid)? - before))
        .collect::<anyhow::Result<_>>()?;
    tokio::task::block_in_place(|| fleet.stop())?;
    let (fires, fired, outbox, last, p50, p99, max): (i64, i64, i64, DateTime<Utc>, f64, f64, f64) =
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status = 'fired'),
                    (SELECT count(*) FROM cm.outbox_messages), max(completed_at),
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY l),
                    percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
             FROM (SELECT *, extract(epoch FROM completed_at - scheduled_at)::float8 AS l
                   FROM cm.routine_fires) f",
        )
        .fetch_one(pool)
        .await?;
    let expected = i64::from(routines);
    ensure!(
        fires == expected && fired == expected && outbox == expected,
        "{label}: {fires} ledger rows, {fired} fired, {outbox} outbox rows; {expected} owed"
    );
    Ok(Burst {
        fires,
        seconds: (last - at).num_microseconds().unwrap_or(0) as f64 / 1e6,
        lateness: (p50, p99, max),
        peak_kib,
        cpu_seconds,
    })
}

/// Whether the database's clock is past `at` and no routine is due: a burst owed at `at` or
/// before is all claimed.
pub(super) async fn drained_after(pool: &PgPool, at: DateTime<Utc>) -> anyhow::Result<bool> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    if now <= at {
        return Ok(false);
    }
    let owed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM cm.routines WHERE next_run_at <= now() LIMIT 1) d",
    )
    .fetch_one(pool)
    .await?;
    Ok(owed == 0)
}

/// The "due at once" step: defaults against the bench's tuned flags at each size, then the
/// per-fire cost at a small and a large burst.
async fn due_at_once(
    options: &Options,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let tuned = run_flags();
    for &routines in &options.sizes.burst {
        let defaults = burst(pool, binary, url, dir, routines, &[], 2).await?;
        progress!("due at once, {routines}, defaults: {}", defaults.note());
        let fast = burst(pool, binary, url, dir, routines, &tuned, 2).await?;
        progress!("due at once, {routines}, tuned: {}", fast.note());
        rows.push(Row::new(
            "Due at once, defaults, 2 processes",
            count(routines.into()),
            format!("{:.2} s", defaults.seconds),
            defaults.note(),
        ));
        rows.push(Row::new(
            format!("Due at once, tuned ({}), 2 processes", tuned.join(" ")),
            count(routines.into()),
            format!("{:.2} s", fast.seconds),
            fast.note(),
        ));
        rows.push(Row::new(
            "Due at once, rate defaults / tuned",
            count(routines.into()),
            format!("{:.2}", defaults.rate() / fast.rate()),
            "same run; target ≥ 0.7",
        ));
    }
    let flags: Vec<String> = ["--max-fires-per-tick", "2000", "--tick-interval", "50ms"]
        .map(String::from)
        .to_vec();
    let (small, large) = options.sizes.burst_pair;
    for processes in [1, 2] {
        let a = burst(pool, binary, url, dir, small, &flags, processes).await?;
        let b = burst(pool, binary, url, dir, large, &flags, processes).await?;
        progress!(
            "due at once, {} processes: {small} at {:.0}/s, {large} at {:.0}/s",
            processes,
            a.rate(),
            b.rate()
        );
        rows.push(Row::new(
            format!("Due at once, {large} / {small} fire rate, {processes} process(es)"),
            format!("{} / {}", count(large.into()), count(small.into())),
            format!("{:.2}", b.rate() / a.rate()),
            format!(
                "{}: {:.0}/s against {:.0}/s; target ≥ 0.8",
                flags.join(" "),
                b.rate(),
                a.rate()
            ),
        ));
    }
    Ok(rows)
}

/// The "every second" step: [`every_second`] at the sizes of the run, as a report row.
async fn every_second_row(
    options: &Options,
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let (routines, seconds) = options.sizes.every_second;
    let (p50, p99, max, fires) = every_second(pool, binary, url, dir, routines, seconds).await?;
    progress!(
        "every second, defaults: {fires} fires, lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        p50 * 1000.0,
        p99 * 1000.0,
        max * 1000.0
    );
    Ok(vec![Row::new(
        "Every-second routines, defaults, 2 processes: lateness p50 / p99 / max",
        count(routines.into()),
        format!(
            "{:.0} / {:.0} / {:.0} ms",
            p50 * 1000.0,
            p99 * 1000.0,
            max * 1000.0
        ),
        format!(
            "`* * * * * *` for {seconds} s, {fires} fires, ledger checked; target p99 ≤ 100 ms"
        ),
    )])
}

/// Every-second message routines `* * * * * *` (`catch-up`), `routines` of them first due on
/// one whole second, fired by two processes with default flags for `seconds` seconds: lateness
/// (`completed_at − scheduled_at`) p50 / p99 / max, in seconds. The ledger is checked: every
/// occurrence from the first second to each routine's clock has exactly one row, `fired`, with
/// its outbox row.
async fn every_second(
    pool: &PgPool,
    binary: &Path,
    url: &str,
    dir: &Path,
    routines: u32,
    seconds: u64,
) -> anyhow::Result<(f64, f64, f64, i64)> {
    load::reset(pool).await?;
    let label = format!("every-second-{routines}");
    let mut fleet = Fleet::start_named(binary, url, &[], dir, &label, &["scale-a", "scale-b"])?;
    tokio::task::block_in_place(|| fleet.wait_ready())?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let at = now.with_nanosecond(0).context("a whole second")? + TimeDelta::seconds(3);
    let loaded = load::add_due_routines(pool, routines, "* * * * * *", at).await?;
    ensure!(
        loaded < at,
        "{label}: the load committed at {loaded}, after the first second {at}"
    );
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(seconds + 3) {
        fleet.alive()?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::task::block_in_place(|| fleet.stop())?;
    let (fires, fired, outbox, owed, p50, p99, max): (i64, i64, i64, i64, f64, f64, f64) =
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status = 'fired'),
                    (SELECT count(*) FROM cm.outbox_messages),
                    (SELECT sum(extract(epoch FROM next_run_at - $1))::bigint FROM cm.routines),
                    percentile_cont(0.5) WITHIN GROUP (ORDER BY l),
                    percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
             FROM (SELECT *, extract(epoch FROM completed_at - scheduled_at)::float8 AS l
                   FROM cm.routine_fires) f",
        )
        .bind(at)
        .fetch_one(pool)
        .await?;
    ensure!(
        fires == owed && fired == owed && outbox == owed,
        "{label}: {fires} ledger rows, {fired} fired, {outbox} outbox rows; {owed} owed by the clocks"
    );
    Ok((p50, p99, max, fires))
}

/// The median wall time of `runs` runs of the binary with `args`, in milliseconds.
fn time_binary(binary: &Path, url: &str, args: &[&str], runs: usize) -> anyhow::Result<f64> {
    let mut samples = Vec::new();
    for _ in 0..runs {
        let began = Instant::now();
        let output = scheduler_command(binary, url)
            .args(args)
            .output()
            .context("running cm-scheduler")?;
        samples.push(began.elapsed());
        ensure!(
            output.status.success() && !output.stdout.is_empty(),
            "cm-scheduler {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(median_p99(samples).0)
}

/// The `fires` first page at each ledger size, through the binary and through the store.
async fn ledger(
    options: &Options,
    store: &PgStore,
    binary: &Path,
    url: &str,
) -> anyhow::Result<Vec<Row>> {
    let sizes = &options.sizes;
    let pool = store.pool();
    load::reset(pool).await?;
    load::add_parked_routines(pool, 0, sizes.ledger_routines).await?;
    let routine = load::routine_id(pool, 1).await?;
    let routine_text = routine.to_string();
    // The ledger ends an hour ago, so the retention step's claims (of the last minutes) meet none
    // of its rows; it spans 60 days, so half of the largest one is past the 30-day retention.
    let end: DateTime<Utc> =
        sqlx::query_scalar("SELECT date_trunc('second', now()) - interval '1 hour'")
            .fetch_one(pool)
            .await?;
    let total = *sizes.ledger.last().context("no ledger sizes")?;
    let mut loaded = 0;
    let mut rows = Vec::new();
    for &n in &sizes.ledger {
        let began = Instant::now();
        load::add_settled_fires(pool, (loaded, n), total, sizes.ledger_routines, end, 60).await?;
        loaded = n;
        progress!(
            "ledger: {n} rows loaded in {:.1} s",
            began.elapsed().as_secs_f64()
        );
        let shapes: [(&str, Vec<&str>, FireFilter); 3] = [
            (
                "`fires --limit 50`",
                vec!["fires", "--limit", "50"],
                FireFilter {
                    limit: 50,
                    ..FireFilter::default()
                },
            ),
            (
                "`fires --status failed --limit 50`",
                vec!["fires", "--status", "failed", "--limit", "50"],
                FireFilter {
                    outcome: Some(cm_domain::FireOutcome::Failed),
                    limit: 50,
                    ..FireFilter::default()
                },
            ),
            (
                "`fires --routine <id> --limit 50`",
                vec!["fires", "--routine", &routine_text, "--limit", "50"],
                FireFilter {
                    routine_id: Some(routine),
                    limit: 50,
                    ..FireFilter::default()
                },
            ),
        ];
        for (name, args, filter) in shapes {
            let binary_ms = tokio::task::block_in_place(|| time_binary(binary, url, &args, 7))?;
            let mut samples = Vec::new();
            for _ in 0..21 {
                let began = Instant::now();
                let page = store.list_fires(&filter).await?;
                samples.push(began.elapsed());
                ensure!(
                    page.len() == 50,
                    "{name}: a first page of {} rows",
                    page.len()
                );
            }
            let (store_ms, _) = median_p99(samples);
            progress!("ledger {n}: {name}: binary {binary_ms:.1} ms, store {store_ms:.2} ms");
            rows.push(Row::new(
                format!("{name} first page"),
                format!("{} ledger rows", count(n)),
                format!("{binary_ms:.1} ms"),
                format!("median of 7, process start included; the store call alone {store_ms:.2} ms (median of 21)"),
            ));
        }
    }
    Ok(rows)
}

/// What a claim loop did over a phase.
struct Claims {
    fires: u64,
    seconds: f64,
    latencies: Vec<Duration>,
}

impl Claims {
    fn rate(&self) -> f64 {
        self.fires as f64 / self.seconds
    }
}

/// Claims with the engine's parameters, one after the other, until `stop` is set.
async fn claim_loop(store: &PgStore, stop: &AtomicBool) -> anyhow::Result<Claims> {
    let params = claim_params();
    let began = Instant::now();
    let mut fires = 0;
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let claim = store.claim_due(&params).await?;
        latencies.push(t.elapsed());
        fires += claim.fires.len() as u64;
    }
    Ok(Claims {
        fires,
        seconds: began.elapsed().as_secs_f64(),
        latencies,
    })
}

/// How a phase prunes beside its claims.
#[derive(Debug, Clone, Copy)]
enum Prune {
    /// No prune.
    Off,
    /// Batches of the engine's size, one after the other: a retention backlog being worked off.
    BackToBack,
    /// Batches of the engine's size, paced so that the rows deleted keep up with this many rows a
    /// second and no more: the steady state, in which the prune removes what the fires write.
    Paced(f64),
}

/// Prunes batches of the engine's size as `prune` says, until `stop` is set; counts the rows.
async fn prune_loop(
    store: &PgStore,
    stop: &AtomicBool,
    prune: Prune,
    pruned: &AtomicU64,
) -> anyhow::Result<()> {
    if let Prune::Off = prune {
        return Ok(());
    }
    let began = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Prune::Paced(rate) = prune {
            let owed = rate * began.elapsed().as_secs_f64();
            if (pruned.load(Ordering::Relaxed) as f64) >= owed {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        }
        let n = store
            .prune_settled(RETENTION, cm_scheduler::PRUNE_BATCH)
            .await?;
        pruned.fetch_add(n, Ordering::Relaxed);
        if n == 0 {
            bail!("the prune ran out of rows past the retention");
        }
    }
    Ok(())
}

/// One phase: the claim loop for `seconds` (or none), with a prune beside it as `prune` says.
async fn phase(
    store: &PgStore,
    seconds: u64,
    claims: bool,
    prune: Prune,
) -> anyhow::Result<(Option<Claims>, u64, f64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let pruned = AtomicU64::new(0);
    let began = Instant::now();
    let timer = async {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        Ok::<(), anyhow::Error>(())
    };
    let claim = async {
        if claims {
            claim_loop(store, &stop).await.map(Some)
        } else {
            Ok(None)
        }
    };
    let prune = async { prune_loop(store, &stop, prune, &pruned).await };
    let (_, claimed, pruned_result) = tokio::try_join!(timer, claim, prune)?;
    let _: () = pruned_result;
    Ok((
        claimed,
        pruned.load(Ordering::Relaxed),
        began.elapsed().as_secs_f64(),
    ))
}

/// The claim rate with and without a prune beside it, over a ledger of millions of rows past the
/// retention, and the prune's own rate against the engine's fire rate.
async fn retention(options: &Options, store: &PgStore, fire_rate: f64) -> anyhow::Result<Vec<Row>> {
    let pool = store.pool();
    let seconds = options.sizes.phase_seconds;
    let past: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires
         WHERE completed_at < now() - make_interval(secs => $1)",
    )
    .bind(RETENTION.as_secs_f64())
    .fetch_one(pool)
    .await?;
    // A backlog the claims cannot finish in the phases, of the shape of the throughput's "many"
    // run: more routines each owing one occurrence, from two seconds ago.
    let claim_routines = options.sizes.claim_routines;
    let ledger_routines = options.sizes.ledger_routines;
    load::add_parked_routines(pool, ledger_routines, ledger_routines + claim_routines).await?;
    let (schedule, at) = one_occurrence(pool).await?;
    load::set_clocks(pool, &schedule, at).await?;
    load::vacuum(pool).await?;
    progress!(
        "retention: {past} rows past the retention; {} routines owe one occurrence each",
        ledger_routines + claim_routines
    );

    // Claims without a prune before and after each phase with one, so each is compared with
    // the mean of the two runs around it on a machine whose speed drifts.
    let (before, _, _) = phase(store, seconds, true, Prune::Off).await?;
    let (during, pruned_during, during_s) = phase(store, seconds, true, Prune::BackToBack).await?;
    let (between, _, _) = phase(store, seconds, true, Prune::Off).await?;
    let (paced, pruned_paced, paced_s) =
        phase(store, seconds, true, Prune::Paced(fire_rate)).await?;
    let (after, _, _) = phase(store, seconds, true, Prune::Off).await?;
    let (_, pruned_alone, alone_s) = phase(store, seconds, false, Prune::BackToBack).await?;
    let [before, during, between, paced, after] =
        [before, during, between, paced, after].map(|c| c.expect("claims ran"));
    let owed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routines WHERE next_run_at < now() - interval '1 s'",
    )
    .fetch_one(pool)
    .await?;
    ensure!(
        owed > 0,
        "the claim backlog ran out during the retention phases"
    );
    let baseline = (before.rate() + between.rate()) / 2.0;
    let paced_baseline = (between.rate() + after.rate()) / 2.0;
    let prune_rate = pruned_alone as f64 / alone_s;
    let paced_rate = pruned_paced as f64 / paced_s;
    progress!(
        "retention: claims {:.0}/s without, {:.0}/s beside the prune, {:.0}/s without, \
         {:.0}/s beside the paced prune, {:.0}/s without; prune {:.0} rows/s alone, {:.0} rows/s \
         beside the claims, paced {:.0} rows/s",
        before.rate(),
        during.rate(),
        between.rate(),
        paced.rate(),
        after.rate(),
        prune_rate,
        pruned_during as f64 / during_s,
        paced_rate
    );
    let latency = |c: &Claims| {
        let (median, p99) = median_p99(c.latencies.clone());
        format!("claim median {median:.1} ms, p99 {p99:.1} ms")
    };
    let ledger = count(*options.sizes.ledger.last().unwrap_or(&0));
    Ok(vec![
        Row::new(
            "Prune (`prune_settled`, batches of 10,000, back to back)",
            format!(
                "{ledger} ledger rows, {} past the retention",
                count(past.try_into().unwrap_or(0))
            ),
            format!("{prune_rate:.0} rows/s"),
            format!(
                "alone, {seconds} s; beside the claims {:.0} rows/s. The engine prunes a quarter \
                 lease of every half lease in each process (≥ {:.0} rows/s at this rate) against \
                 {fire_rate:.0} fires/s (2 processes, above): {:.1}× the fire rate",
                pruned_during as f64 / during_s,
                prune_rate / 2.0,
                prune_rate / 2.0 / fire_rate
            ),
        ),
        Row::new(
            "Claims beside a prune / without (in-process `claim_due`, cap 200, one occurrence per routine)",
            format!("{ledger} ledger rows"),
            format!("{:.2}", during.rate() / baseline),
            format!(
                "the worst case, a retention backlog: {:.0} fires/s beside the prune ({}), {:.0} \
                 before and {:.0} after without ({}; {})",
                during.rate(),
                latency(&during),
                before.rate(),
                between.rate(),
                latency(&before),
                latency(&between)
            ),
        ),
        Row::new(
            "Claims beside a prune paced to the fire rate / without (steady state)",
            format!("{ledger} ledger rows"),
            format!("{:.2}", paced.rate() / paced_baseline),
            format!(
                "the prune deletes {paced_rate:.0} rows/s (paced to {fire_rate:.0}, the fire rate \
                 above): {:.0} fires/s beside it ({}), {:.0} before and {:.0} after without ({})",
                paced.rate(),
                latency(&paced),
                between.rate(),
                after.rate(),
                latency(&after)
            ),
        ),
    ])
}
