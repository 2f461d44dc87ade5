//! Helpers the store's tests share, so each test states only what it sets up and what it checks.
//!
//! Tests move time by writing instants into the database (a routine's `next_run_at`, a fire's
//! lease) with raw SQL: the store itself only ever reads the database's clock.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, TimeDelta, TimeZone, Timelike, Utc};
use cm_domain::{
    ClaimToken, FireCap, FireOutcome, Lease, MisfirePolicy, MisfireRules, Occurrence, Schedule,
};
use cm_store::{
    ClaimDueParams, Fire, FireFilter, FireLedger, InClaimEffect, InClaimWrites, MissionRuns,
    NewRoutine, PgStore, ReapParams, Routine, RoutineKind, RoutineQuery, RoutineStore,
    RoutineSummary, StatusReader,
};
use sqlx::PgPool;
use uuid::Uuid;

/// Once a year, on 1 January at midnight UTC. Its latest occurrence (this year's) is always in
/// the past and its next one far in the future, so a test that makes this year's occurrence due
/// knows exactly what is owed, whatever minute the test runs in.
pub const YEARLY: &str = "0 0 1 1 *";

/// Every minute: the schedule of the outage tests, where many occurrences are missed.
pub const EVERY_MINUTE: &str = "* * * * *";

/// The lease every claim in these tests takes.
pub const LEASE: Duration = Duration::from_secs(60);

/// The lease as the database adds it to `now()`.
pub fn lease_delta() -> TimeDelta {
    TimeDelta::from_std(LEASE).unwrap()
}

/// Creates an unpaused message routine on `expr` (UTC) with `policy`, under a name of its own
/// (names are unique).
pub async fn create(store: &PgStore, expr: &str, policy: MisfirePolicy) -> Routine {
    let name = format!("test routine {}", Uuid::new_v4().simple());
    create_named(store, &name, expr, policy).await
}

/// Creates an unpaused message routine called `name` on `expr` (UTC) with `policy`.
pub async fn create_named(
    store: &PgStore,
    name: &str,
    expr: &str,
    policy: MisfirePolicy,
) -> Routine {
    store
        .create_routine(
            message(name, expr)
                .into_builder()
                .misfire(policy)
                .overlap(cm_domain::OverlapPolicy::default())
                .build()
                .unwrap(),
        )
        .await
        .unwrap()
}

/// An unpaused message routine called `name` on `expr` (UTC), fire-once, as a routines file
/// describes one.
pub fn message(name: &str, expr: &str) -> NewRoutine {
    NewRoutine::builder(
        name,
        Schedule::parse(expr, "UTC").unwrap(),
        RoutineKind::Message,
        serde_json::json!({ "text": name }),
    )
    .build()
    .unwrap()
}

/// The database's clock.
pub async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Midnight UTC on 1 January of `year`.
pub fn jan1(year: i32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0).unwrap()
}

/// `t` with its seconds and fraction cut off.
pub fn minute_floor(t: DateTime<Utc>) -> DateTime<Utc> {
    t.with_nanosecond(0).unwrap().with_second(0).unwrap()
}

/// Every whole minute from `from` through `to`, both included.
pub fn minutes(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    std::iter::successors(Some(from), |m| Some(*m + TimeDelta::minutes(1)))
        .take_while(|m| *m <= to)
        .collect()
}

/// Sets a routine's `next_run_at`, as if the scheduler had been down since `at`.
pub async fn set_next_run(pool: &PgPool, id: Uuid, at: DateTime<Utc>) {
    let updated = sqlx::query("UPDATE cm.routines SET next_run_at = $2 WHERE id = $1")
        .bind(id)
        .bind(at)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(updated, 1, "routine {id} not found");
}

/// Creates a yearly routine and makes this year's occurrence (1 January, always in the past)
/// its due `next_run_at`. Returns the routine and that occurrence's instant.
pub async fn due_yearly(
    store: &PgStore,
    pool: &PgPool,
    policy: MisfirePolicy,
) -> (Routine, DateTime<Utc>) {
    let routine = create(store, YEARLY, policy).await;
    let due = jan1(db_now(pool).await.year());
    set_next_run(pool, routine.id, due).await;
    (routine, due)
}

/// Misfire rules with `grace_secs` of grace and a catch-up backlog of `max_backlog`.
pub fn rules(grace_secs: u64, max_backlog: usize) -> MisfireRules {
    MisfireRules {
        grace: Duration::from_secs(grace_secs),
        max_backlog,
        max_scan: MisfireRules::DEFAULT_MAX_SCAN,
    }
}

/// Claim parameters with a cap and misfire rules of the test's choosing.
pub fn claim_params(claimant: &str, cap: usize, rules: MisfireRules) -> ClaimDueParams {
    ClaimDueParams {
        claimant: claimant.into(),
        lease: Lease::new(LEASE).unwrap(),
        cap: FireCap::new(cap).unwrap(),
        rules,
        max_routines: 100,
        in_claim: InClaimWrites::default(),
        mission_room: None,
        after: None,
        group: None,
    }
}

/// [`params`] for a scheduler whose message routines go to the database outbox, written in the
/// claim's own transaction.
pub fn outbox_params(claimant: &str) -> ClaimDueParams {
    ClaimDueParams {
        in_claim: InClaimWrites {
            message: Some(InClaimEffect::Outbox),
            mission: None,
        },
        ..params(claimant)
    }
}

/// Claim parameters for tests about anything but the cap and misfires: cap 25, no grace, a
/// backlog of 100.
pub fn params(claimant: &str) -> ClaimDueParams {
    claim_params(claimant, 25, rules(0, 100))
}

/// Reaper parameters.
pub fn reap_params(claimant: &str, limit: u32) -> ReapParams {
    ReapParams {
        claimant: claimant.into(),
        lease: Lease::new(LEASE).unwrap(),
        limit,
        group: None,
    }
}

/// A ledger row to write by hand, standing for what another (possibly crashed) scheduler left.
#[derive(Debug, Clone)]
pub struct Seed {
    /// `claimed`, `fired` or `failed`.
    pub status: &'static str,
    /// The instance that holds (or held) the claim.
    pub claimant: &'static str,
    /// The claim's token.
    pub token: ClaimToken,
    /// The claim's attempt.
    pub attempt: i32,
    /// How long ago the claim was taken, in seconds.
    pub claimed_ago: f64,
    /// How long the lease has left, in seconds; negative when it already ran out.
    pub lease_left: f64,
}

impl Seed {
    /// A `claimed` row held by another instance, first attempt, taken two minutes ago, whose
    /// lease has `lease_left` seconds left.
    pub fn claimed(lease_left: f64) -> Self {
        Seed {
            status: "claimed",
            claimant: "other",
            token: ClaimToken::new_v4(),
            attempt: 1,
            claimed_ago: 120.0,
            lease_left,
        }
    }

    /// A settled row (`fired` or `failed`) whose lease ran out an hour ago: only its status
    /// keeps a claim from taking it over.
    pub fn settled(status: &'static str) -> Self {
        Seed {
            status,
            lease_left: -3600.0,
            ..Seed::claimed(0.0)
        }
    }
}

/// Writes `seed` as the ledger row of `occurrence`. A settled row gets a completion time, and a
/// failed one the error `seeded failure`, as the schema's checks require.
pub async fn seed_fire(pool: &PgPool, occurrence: Occurrence, seed: &Seed) {
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, status, completed_at, error, claimant, claim_token,
              attempt, claimed_at, lease_expires_at)
         VALUES ($1, $2, $3::text,
                 CASE WHEN $3::text = 'claimed' THEN NULL ELSE now() END,
                 CASE WHEN $3::text = 'failed' THEN 'seeded failure' END,
                 $4, $5, $6,
                 now() - make_interval(secs => $7), now() + make_interval(secs => $8))",
    )
    .bind(occurrence.routine_id)
    .bind(occurrence.scheduled_at)
    .bind(seed.status)
    .bind(seed.claimant)
    .bind(seed.token.0)
    .bind(seed.attempt)
    .bind(seed.claimed_ago)
    .bind(seed.lease_left)
    .execute(pool)
    .await
    .unwrap();
}

/// Writes, as an operator's hand might, a message of another occurrence holding the outbox
/// number drawn next, in the group of the routine `routine_id`; returns that number.
pub async fn take_next_outbox_number(pool: &PgPool, routine_id: Uuid) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO cm.outbox_messages
             (seq, routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
         OVERRIDING SYSTEM VALUE
         SELECT setval('cm.outbox_messages_seq_seq', nextval('cm.outbox_messages_seq_seq'),
                       false),
                gen_random_uuid(), now(), 'by hand', 1, '{}', cm.cm_group_of($1, group_count)
         FROM cm.cm_settings
         RETURNING seq",
    )
    .bind(routine_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Makes the lease of an occurrence's row run out (one second ago), as if its claimant had
/// crashed a lease ago.
pub async fn expire_lease(pool: &PgPool, occurrence: Occurrence) {
    let updated = sqlx::query(
        "UPDATE cm.routine_fires SET lease_expires_at = now() - interval '1 second'
         WHERE routine_id = $1 AND scheduled_at = $2",
    )
    .bind(occurrence.routine_id)
    .bind(occurrence.scheduled_at)
    .execute(pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(updated, 1, "no ledger row for {occurrence:?}");
}

/// A routine's ledger rows, oldest occurrence first.
pub async fn ledger(store: &PgStore, routine_id: Uuid) -> Vec<Fire> {
    let mut fires = store
        .list_fires(&FireFilter {
            routine_id: Some(routine_id),
            outcome: None,
            limit: 10_000,
            after: None,
        })
        .await
        .unwrap();
    fires.reverse();
    fires
}

/// The failed ledger rows, newest first (what `fires --status failed` lists).
pub async fn failed_fires(store: &PgStore) -> Vec<Fire> {
    store
        .list_fires(&FireFilter {
            outcome: Some(FireOutcome::Failed),
            ..FireFilter::default()
        })
        .await
        .unwrap()
}

/// The occurrences whose mission runs the watch still asks about (at most ten).
pub async fn unfinished_occurrences(store: &PgStore) -> Vec<Occurrence> {
    store
        .unfinished_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.occurrence)
        .collect()
}

/// The routine summaries of the status page's first page: ten routines, five recent fires each.
pub async fn page_summaries(store: &PgStore) -> Vec<RoutineSummary> {
    store
        .routine_summaries(&RoutineQuery {
            limit: 10,
            recent_fires: 5,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// The one ledger row of an occurrence.
pub async fn fire_of(store: &PgStore, occurrence: Occurrence) -> Fire {
    ledger(store, occurrence.routine_id)
        .await
        .into_iter()
        .find(|f| f.scheduled_at == occurrence.scheduled_at)
        .unwrap_or_else(|| panic!("no ledger row for {occurrence:?}"))
}

/// The claim token an occurrence's row carries (listing fires does not show it).
pub async fn token_of(pool: &PgPool, occurrence: Occurrence) -> ClaimToken {
    ClaimToken(
        sqlx::query_scalar(
            "SELECT claim_token FROM cm.routine_fires WHERE routine_id = $1 AND scheduled_at = $2",
        )
        .bind(occurrence.routine_id)
        .bind(occurrence.scheduled_at)
        .fetch_one(pool)
        .await
        .unwrap(),
    )
}

/// How many ledger rows the database holds, over all routines.
pub async fn fire_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A due yearly routine whose occurrence row (claimed by another instance, lease live) a second
/// session holds locked `FOR UPDATE` until the returned transaction ends: a claim of it waits
/// on that lock. Returns the occurrence and the holding transaction.
pub async fn due_and_held(
    store: &PgStore,
    pool: &PgPool,
) -> (Occurrence, sqlx::Transaction<'static, sqlx::Postgres>) {
    let (routine, due) = due_yearly(store, pool, MisfirePolicy::FireOnce).await;
    let occurrence = Occurrence::new(routine.id, due);
    seed_fire(pool, occurrence, &Seed::claimed(300.0)).await;
    let mut held = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM cm.routine_fires WHERE routine_id = $1 FOR UPDATE")
        .bind(routine.id)
        .execute(&mut *held)
        .await
        .unwrap();
    (occurrence, held)
}

/// How long a test waits for a state before failing: generous, because the machine may be
/// busy with other builds; a state that comes costs only the time it takes.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Looks with `look` every 50 ms until what it sees `holds`, and returns it; after `patience`,
/// fails the test naming what was awaited and what `look` saw last.
pub async fn wait_until<T: Debug>(
    what: &str,
    patience: Duration,
    mut look: impl AsyncFnMut() -> T,
    holds: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + patience;
    loop {
        let seen = look().await;
        if holds(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "waited {patience:?} for {what}; last saw {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `n` sessions of this database wait on a lock.
pub async fn lock_waiters(pool: &PgPool, n: i64) {
    wait_until(
        &format!("{n} sessions waiting on a lock"),
        PATIENCE,
        async || {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await
            .unwrap()
        },
        |waiting| *waiting >= n,
    )
    .await;
}

/// A store on `pool`'s database whose connections give up a lock wait after 300 ms, as a
/// scheduler's do (`StoreOptions::for_lease`).
pub async fn impatient_store(pool: &PgPool) -> PgStore {
    let options = cm_store::StoreOptions {
        lock_timeout: Some(std::time::Duration::from_millis(300)),
        ..cm_store::StoreOptions::default()
    };
    PgStore::connect_with_options((*pool.connect_options()).clone(), &options)
        .await
        .unwrap()
}
