//! Fairness between concurrency keys: the lateness of a small tenant's every-second routines
//! while a big tenant's burst drains. One in-process scheduler (its own pool, the real loop
//! through `Scheduler::spawn`, `SchedulerConfig::default()`), messages written to the outbox in
//! the claim (the default backend).
//!
//! The big tenant is `--fairness-big` message routines of concurrency key `big`, each due once
//! a year; the small tenant is [`SMALL`] message routines due every second. Both are created
//! parked a day ahead, the scheduler started, and then every clock is put at one instant T in
//! one statement, the big routines' schedule with it (the yearly cron whose occurrence is T, so
//! each owes exactly that one fire). T is a whole second far enough ahead that the statement has
//! committed before it: the burst comes due at T, with nothing owed before.
//!
//! The run is made twice back to back, from fresh routines: the small tenant with key `small`
//! (`keyed`), then with no key (`no key`, the baseline). No key has a limit, so nothing waits on
//! one: what differs is only how a claim shares its batch when more is due than it takes.
//!
//! From the ledger: the drain (T to the `claimed_at` of the burst's last fire), and
//! `claimed_at − scheduled_at` of the small tenant's fires scheduled from T until that last
//! claim. Every big routine must have fired exactly once, for T, and every small routine once a
//! second from T to its clock, each fire with its outbox row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use chrono::{DateTime, Datelike, TimeDelta, Timelike, Utc};
use cm_dispatch::{OutboxDispatcher, RoutedDispatcher};
use cm_domain::SchedulerConfig;
use cm_scheduler::{Scheduler, Stats};
use cm_store::PgStore;
use sqlx::PgPool;

use super::Options;
use super::ledger::{self, Routines};

/// The small tenant's routines.
pub(super) const SMALL: u32 = 10;

/// How long a run may take from T until every fire it waits for is claimed.
pub(super) const LIMIT: Duration = Duration::from_secs(600);

/// The big tenant's concurrency key, and its routines' name prefix.
const BIG_KEY: &str = "big";

/// The small tenant's concurrency key in the keyed run, and its routines' name prefix.
const SMALL_KEY: &str = "small";

/// The small tenant's key in one of the two runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// The small routines share key `small`.
    Keyed,
    /// The small routines have no key (the baseline).
    NoKey,
}

impl Variant {
    /// Both, in the order they run.
    pub const ALL: [Variant; 2] = [Variant::Keyed, Variant::NoKey];

    /// The name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Keyed => "keyed (`small`)",
            Variant::NoKey => "no key",
        }
    }

    /// The name in a progress line.
    pub fn short(self) -> &'static str {
        match self {
            Variant::Keyed => "keyed",
            Variant::NoKey => "without a key",
        }
    }

    fn key(self) -> Option<&'static str> {
        match self {
            Variant::Keyed => Some(SMALL_KEY),
            Variant::NoKey => None,
        }
    }
}

/// What one fairness run measured.
#[derive(Debug, Clone)]
pub(super) struct FairnessRun {
    /// The small tenant's key.
    pub variant: Variant,
    /// The big tenant's routines, each fired once for T.
    pub big: u32,
    /// From T to the `claimed_at` of the big burst's last fire.
    pub drain: Duration,
    /// The small tenant's fires scheduled from T until that last claim.
    pub small_fires: i64,
    /// p50, p99 and max of their `claimed_at − scheduled_at`, in milliseconds.
    pub claimed: [f64; 3],
    /// How long before T the statement that put the clocks had committed.
    pub lead: Duration,
    /// The distinct claims (claim tokens) the big burst's fires came in.
    pub claims: i64,
}

impl FairnessRun {
    /// The small tenant's claimed p99 over the drain.
    pub fn p99_over_drain(&self) -> f64 {
        self.claimed[1] / (self.drain.as_secs_f64() * 1000.0)
    }
}

/// One run: fresh routines, the scheduler started, every clock put at T, its loop until the
/// burst and the small tenant's fires until its last claim are claimed (at most [`LIMIT`]),
/// then the ledger checked and read.
pub(super) async fn run(
    pool: &PgPool,
    url: &str,
    options: &Options,
    variant: Variant,
) -> anyhow::Result<FairnessRun> {
    let big = options.fairness_big;
    ledger::reset(pool).await?;
    let limits: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.concurrency_limits")
        .fetch_one(pool)
        .await?;
    ensure!(
        limits == 0,
        "{limits} concurrency keys have a limit; the fairness runs measure keys without one"
    );
    // Parked a day ahead: nothing is due while the scheduler starts.
    let created = Instant::now();
    ledger::create_routines_of(
        pool,
        &Routines {
            n: big,
            prefix: BIG_KEY,
            // Every second while parked (any whole second is an occurrence), replaced by the
            // yearly cron of T when the clocks are put there.
            schedule: "* * * * * *",
            key: Some(BIG_KEY),
        },
        24 * 3600,
    )
    .await?;
    let took = created.elapsed();
    ledger::create_routines_of(
        pool,
        &Routines {
            n: SMALL,
            prefix: SMALL_KEY,
            schedule: "* * * * * *",
            key: variant.key(),
        },
        24 * 3600,
    )
    .await?;

    let store = PgStore::connect(url).await?;
    let dispatcher =
        RoutedDispatcher::new(Some(Arc::new(OutboxDispatcher::new(store.clone()))), None);
    let scheduler = Arc::new(Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(dispatcher),
        SchedulerConfig::default(),
        "bench-fairness",
    )?);
    let stats = scheduler.stats();
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let handle = scheduler.spawn(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    let result = async {
        // Two ticks begun: the first has finished, the loop runs.
        let ready = Instant::now() + Duration::from_secs(30);
        while Stats::get(&stats.ticks) < 2 {
            ensure!(
                Instant::now() < ready,
                "the scheduler did not tick within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Rewriting every row takes about what creating them took: T is twice that ahead, and
        // two seconds more, so the clocks are committed before any of them is due.
        let ahead = 2 + (2.0 * took.as_secs_f64()).ceil() as u32;
        let (at, lead) = put_clocks(pool, ahead).await?;
        let last = wait(pool, at).await?;
        anyhow::Ok((at, lead, last))
    }
    .await;
    stop.send(true).ok();
    let summary = handle.await?;
    store.pool().close().await;
    let (at, lead, last) = result?;
    ensure!(
        summary.tick_errors == 0 && summary.failed == 0,
        "the scheduler failed: {} tick errors (last: {:?}), {} fires failed",
        summary.tick_errors,
        summary.last_error,
        summary.failed
    );
    let label = format!("the fairness run ({})", variant.name());
    check_big(pool, at, big).await.context(label.clone())?;
    ledger::check_named(pool, at, true, Some(&format!("{SMALL_KEY} ")))
        .await?
        .ensure_sound(&label)?;

    type Row = (i64, i64, Option<Vec<f64>>);
    let (small_fires, duplicates, claimed): Row = sqlx::query_as(
        "SELECT count(*), count(*) - count(DISTINCT (f.routine_id, f.scheduled_at)),
                percentile_disc(ARRAY[0.5, 0.99, 1.0]) WITHIN GROUP (
                    ORDER BY extract(epoch FROM f.claimed_at - f.scheduled_at)::float8 * 1000)
         FROM cm.routine_fires f JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
         WHERE starts_with(r.name, $3) AND f.scheduled_at >= $1 AND f.scheduled_at <= $2",
    )
    .bind(at)
    .bind(last)
    .bind(format!("{SMALL_KEY} "))
    .fetch_one(pool)
    .await?;
    ensure!(
        duplicates == 0,
        "{label}: {duplicates} small-tenant fires more than once"
    );
    // One a second for each small routine, from T to the burst's last claim.
    let owed = i64::from(SMALL) * ((last - at).num_seconds() + 1);
    ensure!(
        small_fires == owed,
        "{label}: {small_fires} small-tenant fires between {at} and {last}, not {owed}"
    );
    let claims: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT f.claim_token)
         FROM cm.routine_fires f JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
         WHERE r.concurrency_key = $1",
    )
    .bind(BIG_KEY)
    .fetch_one(pool)
    .await?;
    let triple = match claimed.as_deref() {
        Some([a, b, c]) => [*a, *b, *c],
        _ => [f64::NAN; 3],
    };
    Ok(FairnessRun {
        variant,
        big,
        drain: (last - at).to_std().unwrap_or_default(),
        small_fires,
        claimed: triple,
        lead,
        claims,
    })
}

/// Puts every routine's clock at T, the whole second `ahead` seconds after the database's now,
/// and the big routines' schedule to the yearly cron whose occurrence is T, in one statement.
/// Returns T and how long before it the statement had committed (zero if after).
async fn put_clocks(pool: &PgPool, ahead: u32) -> anyhow::Result<(DateTime<Utc>, Duration)> {
    let at: DateTime<Utc> =
        sqlx::query_scalar("SELECT date_trunc('second', now()) + make_interval(secs => $1)")
            .bind(f64::from(ahead))
            .fetch_one(pool)
            .await?;
    // Second, minute, hour, day of the month, month: once a year, at T (UTC).
    let yearly = format!(
        "{} {} {} {} {} *",
        at.second(),
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    );
    sqlx::query(
        "UPDATE cm.routines SET next_run_at = $1,
             schedule = CASE WHEN concurrency_key IS NOT DISTINCT FROM $3 THEN $2 ELSE schedule END",
    )
    .bind(at)
    .bind(&yearly)
    .bind(BIG_KEY)
    .execute(pool)
    .await?;
    let committed: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await?;
    Ok((at, (at - committed).to_std().unwrap_or_default()))
}

/// Polls until no big routine's clock is still at T (each one's fire claimed), then until no
/// small routine's clock is at or before the burst's last claim (every small fire scheduled
/// until then claimed). Returns that last claim's `claimed_at`.
async fn wait(pool: &PgPool, at: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    let limit = at + TimeDelta::from_std(LIMIT)?;
    let mut last: Option<DateTime<Utc>> = None;
    loop {
        let (now, owed): (DateTime<Utc>, i64) = match last {
            None => {
                sqlx::query_as(
                    "SELECT now(), count(*) FROM cm.routines
                     WHERE next_run_at <= $1 AND concurrency_key = $2",
                )
                .bind(at)
                .bind(BIG_KEY)
                .fetch_one(pool)
                .await?
            }
            Some(last) => {
                sqlx::query_as(
                    "SELECT now(), count(*) FROM cm.routines
                     WHERE next_run_at <= $1 AND starts_with(name, $2)",
                )
                .bind(last)
                .bind(format!("{SMALL_KEY} "))
                .fetch_one(pool)
                .await?
            }
        };
        match (owed, last) {
            (0, None) => {
                let claimed: Option<DateTime<Utc>> = sqlx::query_scalar(
                    "SELECT max(f.claimed_at)
                     FROM cm.routine_fires f
                     JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
                     WHERE r.concurrency_key = $1",
                )
                .bind(BIG_KEY)
                .fetch_one(pool)
                .await?;
                last = Some(claimed.context("the burst drained without a fire")?);
                continue;
            }
            (0, Some(last)) => return Ok(last),
            _ => {}
        }
        ensure!(
            now < limit,
            "the burst and the small tenant's fires were not claimed within {LIMIT:?} of T \
             ({owed} routines still owed; {})",
            if last.is_none() {
                "big ones"
            } else {
                "small ones"
            }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fails unless every big routine fired exactly once, for T, with nothing else in the ledger.
async fn check_big(pool: &PgPool, at: DateTime<Utc>, big: u32) -> anyhow::Result<()> {
    let (fires, routines, elsewhen, not_fired): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT f.routine_id),
                count(*) FILTER (WHERE f.scheduled_at <> $1),
                count(*) FILTER (WHERE f.status <> 'fired')
         FROM cm.routine_fires f JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
         WHERE r.concurrency_key = $2",
    )
    .bind(at)
    .bind(BIG_KEY)
    .fetch_one(pool)
    .await?;
    let big = i64::from(big);
    ensure!(
        fires == big && routines == big && elsewhen == 0 && not_fired == 0,
        "the big burst's ledger is not one fired row per routine for T: {fires} rows over \
         {routines} of {big} routines, {elsewhen} for another instant, {not_fired} not fired"
    );
    Ok(())
}
