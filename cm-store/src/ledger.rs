//! The occurrence ledger, `routine_fires`: the tick's claim, settling, the reaper, and reading
//! fires back.
//!
//! # The claim
//!
//! [`FireLedger::claim_due`] is one transaction of (usually) two statements:
//!
//! 1. one statement reads the database's clock (`now()` is fixed for the whole transaction),
//!    takes the due requests (occurrences asked for by hand; those of missions no more than
//!    the mission room) and locks the due routines, oldest first, with `FOR UPDATE SKIP
//!    LOCKED`, so several schedulers share the due set instead of queueing on it;
//! 2. the domain plans each routine with its misfire policy and the claim with the cap
//!    (`cm-domain`'s [`plan_claim`]: routines whole, oldest first; scheduled missions in what
//!    the requested ones left of the mission room);
//! 3. one statement claims every planned occurrence, `INSERT … ON CONFLICT … DO UPDATE …
//!    RETURNING (xmax = 0) AS inserted` over arrays, and moves each routine's `next_run_at` to
//!    where the plan says (an `UPDATE` in the same statement); the upsert takes a row over only
//!    when it is `claimed` and its lease has run out, and otherwise rewrites it unchanged, so
//!    the row always comes back and a loser sees what the winner holds;
//! 4. commit.
//!
//! The claim and the clocks commit together, so the clock never moves past an occurrence the
//! ledger does not hold. A claim that comes back [`TickClaim::more_due`] is followed at once by
//! another, resumed after [`TickClaim::resume_after`], so a scheduler drains what is due as
//! fast as the database allows while each transaction stays at most the cap.
//!
//! # The transactional outbox
//!
//! When a routine's backend is database-local ([`InClaimEffect::Outbox`], named per kind in
//! [`ClaimDueParams::in_claim`]), step 4 inserts its fresh occurrences already `fired`, and the
//! same statement writes their outbox rows: a fire and its message exist together or not at all,
//! with one row write per table per occurrence. `xmax = 0` still tells a fresh insert from an
//! existing row, so an occurrence another scheduler holds (InFlight) or settled (Settled) gets no
//! message, and a crashed claim taken over (Retry) goes through the dispatch path as usual.
//!
//! # Settling
//!
//! [`FireLedger::settle_fires`] settles many claims in one statement, each row still fenced on
//! its token and attempt, and says per row whether it was settled, taken over by another
//! claimant, or gone with its routine.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::{
    ClaimOutcome, ClaimRow, ClaimToken, DueRoutine as PlannedRoutine, ErrorText, FireCap,
    FireOrigin, FireOutcome, FireStatus, Lease, MisfireRules, Occurrence, Settlement, TickPlan,
    plan_claim, plan_routine_due,
};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::{FromRow, Postgres, Transaction};
use uuid::Uuid;

use crate::groups::{GroupId, group_of};
use crate::routines::RoutineKind;
use crate::{FireCursor, PgStore, StoreError};

/// Listing fires. `$1` the routine or NULL, `$2`/`$3` the cursor's instant and routine or NULL,
/// `$4` the limit; the argument is the condition on the outcome (`outcome_condition_sql!`),
/// or `true`. The order (scheduled_at, routine_id) descending is an index's backward scan:
/// `routine_fires_scheduled_idx` without a filter, `routine_fires_failures_idx` for failures,
/// `routine_fires_runs_idx` for a run's state, `routine_fires_status_scheduled_idx` for the rest, the primary key with a routine. The
/// cursor's row comparison resumes the scan; the redundant `scheduled_at <= $2` lets it start
/// there on the primary key too, whose columns are in the other order.
macro_rules! list_fires_sql {
    ($outcome:expr) => {
        concat!(
            "
SELECT routine_id, scheduled_at, status, origin, claimant, attempt, claimed_at,
       lease_expires_at, completed_at, error, receipt, run_state, run_exit_code, run_reason,
       run_started_at, run_finished_at
FROM routine_fires
WHERE ($1::uuid IS NULL OR routine_id = $1)
  AND (",
            $outcome,
            ")
  AND ($2::timestamptz IS NULL
       OR ((scheduled_at, routine_id) < ($2, $3::uuid) AND scheduled_at <= $2))
ORDER BY scheduled_at DESC, routine_id DESC
LIMIT $4"
        )
    };
}

/// Listing fires of every outcome (see `list_fires_sql!`).
pub const LIST_FIRES_SQL: &str = list_fires_sql!("true");

/// The listing statement for fires of `outcome`, or of every outcome (see `list_fires_sql!`).
pub fn list_fires_statement(outcome: Option<FireOutcome>) -> &'static str {
    match outcome {
        None => LIST_FIRES_SQL,
        Some(FireOutcome::Claimed) => list_fires_sql!(outcome_condition_sql!(claimed)),
        Some(FireOutcome::Fired) => list_fires_sql!(outcome_condition_sql!(fired)),
        Some(FireOutcome::Skipped) => list_fires_sql!(outcome_condition_sql!(skipped)),
        Some(FireOutcome::Running) => list_fires_sql!(outcome_condition_sql!(running)),
        Some(FireOutcome::Succeeded) => list_fires_sql!(outcome_condition_sql!(succeeded)),
        Some(FireOutcome::Failed) => list_fires_sql!(outcome_condition_sql!(failed)),
        Some(FireOutcome::Lost) => list_fires_sql!(outcome_condition_sql!(lost)),
    }
}

/// An effect the store writes itself, inside the claim's own transaction, instead of leaving the
/// occurrence to a dispatch: what a database-local backend does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InClaimEffect {
    /// A row in `outbox_messages` carrying the routine's payload, keyed by the occurrence.
    Outbox,
}

/// Which routine kinds' fresh occurrences the claim settles with an in-claim effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InClaimWrites {
    /// The effect for message routines, if their backend is database-local.
    pub message: Option<InClaimEffect>,
    /// The effect for mission routines, if their backend is database-local.
    pub mission: Option<InClaimEffect>,
}

impl InClaimWrites {
    /// The effect for routines of `kind`.
    pub fn for_kind(&self, kind: RoutineKind) -> Option<InClaimEffect> {
        match kind {
            RoutineKind::Message => self.message,
            RoutineKind::Mission => self.mission,
        }
    }
}

/// What a tick's claim needs to know.
#[derive(Debug, Clone)]
pub struct ClaimDueParams {
    /// The instance claiming (kept on the rows it holds).
    pub claimant: String,
    /// How long its claims last.
    pub lease: Lease,
    /// The most occurrences the tick claims.
    pub cap: FireCap,
    /// The misfire grace, backlog and walk bound.
    pub rules: MisfireRules,
    /// The most due routines one tick locks and plans.
    pub max_routines: u32,
    /// The kinds whose fresh occurrences are settled with their effect inside the claim.
    pub in_claim: InClaimWrites,
    /// The most mission occurrences this claim may take, scheduled and requested (trigger,
    /// backfill) together: what is left of the launch rate's budget and of the in-flight room;
    /// `None` for no bound. Missions past it are not claimed: scheduled ones stay due
    /// ([`TickClaim::held`]), requested ones stay in the request table, in order, their lease
    /// not running, until a later claim has room.
    pub mission_room: Option<usize>,
    /// Resume the due walk after this routine (the previous claim's
    /// [`TickClaim::resume_after`]) instead of from the oldest due routine; `None` for the
    /// whole walk.
    pub after: Option<DueCursor>,
    /// Claim within this group only: every statement of the claim names it, so on Citus the
    /// claim touches one shard and commits on one worker. `None` claims across every group
    /// (plain PostgreSQL only: a distributed table refuses such a claim's row locks).
    pub group: Option<GroupId>,
}

/// A place in the due walk, `(next_run_at, id)` of a routine: a claim resumed there reads the
/// index from that point, not over the entries its predecessors left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueCursor {
    /// The routine's `next_run_at` when it was locked.
    pub next_run_at: DateTime<Utc>,
    /// The routine.
    pub routine_id: Uuid,
}

/// What the reaper needs to know.
#[derive(Debug, Clone)]
pub struct ReapParams {
    /// The instance taking the expired claims over.
    pub claimant: String,
    /// How long its claims last.
    pub lease: Lease,
    /// The most claims one pass takes over.
    pub limit: u32,
    /// Take over claims of this group only (see [`ClaimDueParams::group`]); `None` for every
    /// group.
    pub group: Option<GroupId>,
}

/// The result of one claim (a tick's, or a reaper pass's).
#[derive(Debug, Clone, PartialEq)]
pub struct TickClaim {
    /// The database's clock when the claim ran.
    pub now: DateTime<Utc>,
    /// A local instant taken just before the claim's transaction began, after its connection
    /// was acquired: no lease the claim took started earlier, so a dispatch's time is counted
    /// from here.
    pub began: Instant,
    /// The token every row this claim took carries.
    pub token: ClaimToken,
    /// The rows the claim statement returned, oldest occurrence first.
    pub fires: Vec<ClaimedFire>,
    /// Due occurrences the cap deferred to a later tick.
    pub deferred: usize,
    /// Due mission occurrences the mission room held back (not claimed; still owed).
    pub held: usize,
    /// Whether the claim reached a bound (the cap, or the routines it may lock), so more may be
    /// due: the caller claims again at once.
    pub more_due: bool,
    /// Where a claim following this one may resume the due walk: after the last locked routine
    /// that nothing was deferred from. `None` when there is no such routine.
    pub resume_after: Option<DueCursor>,
    /// Misfires skipped by the routines' policies.
    pub skipped: u64,
    /// Due routines whose stored schedule or policy could not be read; each was paused so it
    /// stops coming due, and is reported here to be logged as an error.
    pub unusable: Vec<UnusableRoutine>,
}

/// A due routine whose stored row the domain refuses (written by hand, or by an older version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnusableRoutine {
    /// The routine.
    pub routine_id: Uuid,
    /// What is wrong with it.
    pub reason: String,
}

/// One occurrence a claim returned, with what its dispatch needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedFire {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// The routine's name, for logs.
    pub routine_name: String,
    /// What the routine does.
    pub kind: RoutineKind,
    /// Where the occurrence came from (the routine's schedule, a trigger, a backfill).
    pub origin: FireOrigin,
    /// What the backend receives.
    pub payload: Value,
    /// The row as the claim statement returned it.
    pub row: ClaimRow,
    /// What the in-claim effect produced, for an occurrence settled in the claim
    /// ([`ClaimOutcome::SettledInClaim`]); `None` otherwise.
    pub receipt: Option<String>,
    /// When the occurrence was first claimed, by the database's clock: a takeover leaves it,
    /// so a retry knows how old its first attempt is.
    pub first_claimed_at: DateTime<Utc>,
    /// When the occurrence came due: its instant, or later by its schedule's jitter. Lateness
    /// is measured from it.
    pub planned_at: DateTime<Utc>,
}

impl ClaimedFire {
    /// What the row means for the claimant holding `token`.
    pub fn outcome(&self, token: ClaimToken) -> ClaimOutcome {
        ClaimOutcome::classify(&self.row, token)
    }

    /// The fenced reference a settle of this claim uses.
    pub fn fire_ref(&self) -> FireRef {
        FireRef {
            occurrence: self.occurrence,
            token: self.row.token,
            attempt: self.row.attempt,
        }
    }
}

/// Names one claim of one occurrence: a settle updates the row only if it still carries this
/// token and attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FireRef {
    /// The occurrence.
    pub occurrence: Occurrence,
    /// The claim's token.
    pub token: ClaimToken,
    /// The claim's attempt.
    pub attempt: u32,
}

/// The end of one claim, to be written by [`FireLedger::settle_fires`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireSettle {
    /// The claim being settled (fenced on its token and attempt).
    pub fire: FireRef,
    /// How its dispatch ended.
    pub settlement: Settlement,
    /// What the target answered, kept on the row (bounded to [`MAX_RECEIPT_BYTES`]).
    pub receipt: Option<String>,
}

/// The largest receipt kept on a row, in bytes; longer ones are cut on a character boundary.
pub const MAX_RECEIPT_BYTES: usize = 1024;

/// [`FireLedger::settle_fires`]'s fenced update, with `$tail` added to its conditions.
macro_rules! settle_fires_sql {
    ($tail:literal) => {
        concat!(
            "UPDATE routine_fires AS f
             SET status = t.status, error = t.error, receipt = t.receipt, completed_at = now()
             FROM UNNEST($1::uuid[], $2::timestamptz[], $3::uuid[], $4::int[], $5::text[],
                         $6::text[], $7::text[])
                  AS t(routine_id, scheduled_at, claim_token, attempt, status, error, receipt)
             WHERE f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
               AND f.claim_token = t.claim_token AND f.attempt = t.attempt
               AND f.status = 'claimed'",
            $tail,
            " RETURNING f.routine_id, f.scheduled_at"
        )
    };
}

/// What a settle found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SettleOutcome {
    /// The claim was still this claimant's: the row is now `fired` or `failed`.
    Settled,
    /// The row no longer carries the claim's token and attempt (its lease ran out and another
    /// claimant took it over), or it is already settled. Nothing changed.
    TakenOver,
    /// The row is gone: its routine was deleted while the dispatch ran (a claimed row is never
    /// pruned). Nothing changed, and there is nothing left to settle.
    Gone,
    /// Not written: on Citus a batch's settles are written group by group, and the statement
    /// of this row's group failed (its worker is down, say) while others were written. The row
    /// stays claimed, for the reaper after its lease.
    Unwritten,
}

/// Which fires to list.
#[derive(Debug, Clone)]
pub struct FireFilter {
    /// Only this routine's.
    pub routine_id: Option<Uuid>,
    /// Only with this outcome (a mission's is its run's: [`FireOutcome`]); `Failed` lists every
    /// failure, runs lost included ([`FireOutcome::is_failure`]).
    pub outcome: Option<FireOutcome>,
    /// At most this many, newest occurrence first.
    pub limit: u32,
    /// Only fires after this one in the listing's order: the next page of a listing whose last
    /// page ended there.
    pub after: Option<FireCursor>,
}

impl Default for FireFilter {
    /// Every routine, every status, the newest 100.
    fn default() -> Self {
        FireFilter {
            routine_id: None,
            outcome: None,
            limit: 100,
            after: None,
        }
    }
}

/// A row of `routine_fires`, as listed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fire {
    /// The routine.
    pub routine_id: Uuid,
    /// The occurrence's instant.
    pub scheduled_at: DateTime<Utc>,
    /// `claimed`, `fired` or `failed`.
    pub status: String,
    /// `schedule`, `trigger` or `backfill`.
    pub origin: String,
    /// The instance holding (or that last held) the claim.
    pub claimant: String,
    /// The claim's attempt.
    pub attempt: u32,
    /// When the current claim was taken.
    pub claimed_at: DateTime<Utc>,
    /// When the lease runs (or ran) out.
    pub lease_expires_at: DateTime<Utc>,
    /// When it was settled.
    pub completed_at: Option<DateTime<Utc>>,
    /// The error a `failed` row keeps.
    pub error: Option<String>,
    /// What the target answered to the dispatch that settled it.
    pub receipt: Option<String>,
    /// A mission's run: `running`, `succeeded`, `failed` or `lost`; `None` for a message, or a
    /// mission not launched.
    pub run_state: Option<String>,
    /// The run's exit code, when its runtime reported one.
    pub run_exit_code: Option<i32>,
    /// Why the run failed or was lost.
    pub run_reason: Option<String>,
    /// When the run started, by its runtime's clock (kept when it ended).
    pub run_started_at: Option<DateTime<Utc>>,
    /// When the run ended, by its runtime's clock.
    pub run_finished_at: Option<DateTime<Utc>>,
}

impl Fire {
    /// How long the run took, when its runtime reported its start and end.
    pub fn run_duration(&self) -> Option<chrono::TimeDelta> {
        Some(self.run_finished_at? - self.run_started_at?)
            .filter(|d| *d >= chrono::TimeDelta::zero())
    }

    /// What the fire's effect did: its run's state for a mission launched and watched, else its
    /// dispatch's status ([`FireOutcome::of`]). A row whose texts are unknown reads as its
    /// status, or `claimed`.
    pub fn outcome(&self) -> FireOutcome {
        let status = self.status.parse().unwrap_or(FireStatus::Claimed);
        let run = self.run_state.as_deref().and_then(|r| r.parse().ok());
        FireOutcome::of(status, run)
    }

    /// Why the fire failed: its dispatch's error, or its run's reason (`exit code 3`); `None`
    /// when its outcome is not a failure.
    pub fn failure(&self) -> Option<&str> {
        if !self.outcome().is_failure() {
            return None;
        }
        match self.status.as_str() {
            "failed" => self.error.as_deref(),
            _ => self.run_reason.as_deref(),
        }
    }
}

/// The occurrence ledger.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait FireLedger: Send + Sync {
    /// Claims what is due now, in one transaction (see the module documentation).
    async fn claim_due(&self, params: &ClaimDueParams) -> Result<TickClaim, StoreError>;

    /// Settles a claim, fenced on its token and attempt; see [`SettleOutcome`] for what a settle
    /// that changed nothing means.
    async fn settle_fire(
        &self,
        fire: &FireRef,
        settlement: &Settlement,
    ) -> Result<SettleOutcome, StoreError>;

    /// Settles many claims in one statement, each row fenced on its claim's token and attempt
    /// as [`FireLedger::settle_fire`] does. Returns one outcome per entry, in order. Either every
    /// row that could be settled is, or (on error) none is.
    async fn settle_fires(&self, settles: &[FireSettle]) -> Result<Vec<SettleOutcome>, StoreError>;

    /// Takes over claims whose lease has run out (their claimant crashed), oldest claim first.
    /// Two reapers never take the same row.
    async fn reap_expired(&self, params: &ReapParams) -> Result<TickClaim, StoreError>;

    /// Records on a claim that is still held, fenced like a settle, what its attempt met as it
    /// ended without settling (a backend that panicked, a settle that could not be written). The
    /// row stays `claimed` for the reaper; the claim that takes it over reads the error back
    /// ([`ClaimRow::last_error`]), and an abandon keeps it. Returns whether the row was held.
    async fn note_unsettled(&self, fire: &FireRef, error: &ErrorText) -> Result<bool, StoreError>;

    /// Lists fires, newest occurrence first (ties: routine id descending), from the filter's
    /// cursor on. Each filter's order is served by an index, so a page reads about as many rows
    /// as it returns however large the ledger is.
    async fn list_fires(&self, filter: &FireFilter) -> Result<Vec<Fire>, StoreError>;

    /// Deletes at most `limit` settled rows settled, and scheduled, longer than `retention` ago,
    /// oldest first. Returns how many it deleted. Rows still `claimed` are never pruned.
    async fn prune_settled(&self, retention: Duration, limit: u32) -> Result<u64, StoreError>;

    /// [`FireLedger::prune_settled`] among the fires of `group` only (on Citus, one shard). By
    /// default, every group's.
    async fn prune_settled_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let _ = group;
        self.prune_settled(retention, limit).await
    }
}

/// A row returned by the claim and reaper statements.
#[derive(FromRow)]
struct ClaimedRow {
    inserted: bool,
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    status: String,
    claimant: String,
    claim_token: Uuid,
    attempt: i32,
    lease_expires_at: DateTime<Utc>,
    name: String,
    kind: String,
    origin: String,
    payload: Value,
    receipt: Option<String>,
    error: Option<String>,
    first_claimed_at: Option<DateTime<Utc>>,
    /// When the occurrence came due, where its jitter delayed it.
    planned_at: Option<DateTime<Utc>>,
    /// How many outbox messages the claim statement wrote (the outbox claim only).
    written: Option<i64>,
}

impl TryFrom<ClaimedRow> for ClaimedFire {
    type Error = StoreError;

    fn try_from(r: ClaimedRow) -> Result<Self, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptRoutine {
            routine_id: r.routine_id,
            reason,
        };
        let status = r
            .status
            .parse()
            .map_err(|e: cm_domain::ParseFireStatusError| corrupt(e.to_string()))?;
        let kind = r.kind.parse().map_err(corrupt)?;
        let origin = r
            .origin
            .parse()
            .map_err(|e: cm_domain::ParseFireOriginError| corrupt(e.to_string()))?;
        Ok(ClaimedFire {
            occurrence: Occurrence::new(r.routine_id, r.scheduled_at),
            routine_name: r.name,
            kind,
            origin,
            payload: r.payload,
            receipt: r.receipt,
            // Only a row written before the column existed has none: its first claim is
            // unknown, and is taken as long ago.
            first_claimed_at: r.first_claimed_at.unwrap_or(DateTime::<Utc>::MIN_UTC),
            planned_at: r.planned_at.unwrap_or(r.scheduled_at),
            row: ClaimRow {
                inserted: r.inserted,
                status,
                claimant: r.claimant,
                token: ClaimToken(r.claim_token),
                attempt: u32::try_from(r.attempt).unwrap_or(1),
                lease_expires_at: r.lease_expires_at,
                last_error: r.error.filter(|_| r.status == "claimed"),
            },
        })
    }
}

/// A row of the claim's first statement ([`DUE_SQL`]): the clock, a due request, or a due
/// routine, told apart by `source`.
#[derive(FromRow)]
struct DueRow {
    source: String,
    now: DateTime<Utc>,
    id: Option<Uuid>,
    at: Option<DateTime<Utc>>,
    schedule: Option<String>,
    timezone: Option<String>,
    misfire_policy: Option<String>,
    kind: Option<String>,
    origin: Option<String>,
    runs_left: Option<i32>,
    overlap: Option<String>,
}

/// A due routine as the claim reads it.
struct DueRoutine {
    id: Uuid,
    schedule: String,
    timezone: String,
    misfire_policy: String,
    kind: String,
    next_run_at: DateTime<Utc>,
    /// Scheduled occurrences it may still fire; `None` is no limit.
    runs_left: Option<i32>,
    /// Its overlap policy, as stored.
    overlap: String,
}

/// An occurrence asked for by hand, taken by the claim.
#[derive(Debug, Clone, Copy)]
struct Request {
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    origin: FireOrigin,
    /// Whether its routine is a mission: it takes the mission room.
    mission: bool,
}

impl Request {
    /// A request as a request walk returns it: routine, instant, stored origin, routine kind.
    fn read(
        routine_id: Uuid,
        scheduled_at: DateTime<Utc>,
        origin: &str,
        kind: &str,
    ) -> Result<Request, StoreError> {
        Ok(Request {
            routine_id,
            scheduled_at,
            origin: request_origin(routine_id, origin)?,
            mission: kind == RoutineKind::Mission.as_str(),
        })
    }
}

/// Begins a claim's (or reaper pass's) transaction on an acquired connection, and returns it
/// with the local instant it began at and the database's clock, read once for the whole
/// transaction. The connection is acquired by the caller first, so a wait for one (the database
/// restarting, the pool exhausted) is not counted against the leases the transaction takes.
async fn begin_claim<'c>(
    store: &PgStore,
    conn: &'c mut PoolConnection<Postgres>,
) -> Result<(Transaction<'c, Postgres>, Instant, DateTime<Utc>), StoreError> {
    let began = Instant::now();
    let mut tx = store.begin_on(conn).await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *tx)
        .await?;
    Ok((tx, began, now))
}

fn lease_seconds(lease: Lease) -> f64 {
    lease.duration().as_secs_f64()
}

/// How many of a tick's `cap` claims are kept for occurrences asked for by hand (a fifth, at
/// least one), so a sustained backlog of scheduled work cannot starve a trigger or a backfill.
pub fn request_share(cap: usize) -> usize {
    (cap / 5).max(1)
}

/// Deletes and returns up to `limit` requested occurrences that are due, oldest first, skipping
/// those another claim holds; at most `missions` of them of mission routines (`None`: no
/// bound). The mission requests past that bound stay in the table, in order, for a later claim.
async fn take_requests(
    tx: &mut Transaction<'_, Postgres>,
    limit: usize,
    missions: Option<usize>,
    group: Option<GroupId>,
) -> Result<Vec<Request>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let missions = missions.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
    let query = match group {
        None => sqlx::query_as(TAKE_REQUESTS_SQL).bind(limit).bind(missions),
        Some(group) => sqlx::query_as(TAKE_GROUP_REQUESTS_SQL)
            .bind(limit)
            .bind(missions)
            .bind(group),
    };
    let rows: Vec<(Uuid, DateTime<Utc>, String, String)> = query.fetch_all(&mut **tx).await?;
    rows.into_iter()
        .map(|(id, at, origin, kind)| Request::read(id, at, &origin, &kind))
        .collect()
}

/// A request's stored origin, read back.
fn request_origin(routine_id: Uuid, origin: &str) -> Result<FireOrigin, StoreError> {
    origin.parse().map_err(
        |e: cm_domain::ParseFireOriginError| StoreError::CorruptRoutine {
            routine_id,
            reason: e.to_string(),
        },
    )
}

/// A receipt cut to [`MAX_RECEIPT_BYTES`] on a character boundary, without the NUL characters
/// PostgreSQL's text refuses.
fn bounded_receipt(receipt: &str) -> String {
    let mut text: String = receipt.chars().filter(|c| *c != '\0').collect();
    if text.len() > MAX_RECEIPT_BYTES {
        let mut end = MAX_RECEIPT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// What the claim's first statement read: the clock, the requests and the due routines.
struct DueSet {
    now: DateTime<Utc>,
    requested: Vec<Request>,
    due: Vec<DueRoutine>,
}

/// Splits the rows of [`DUE_SQL`] into the clock, the requests and the due routines.
fn split_due_rows(rows: Vec<DueRow>) -> Result<DueSet, StoreError> {
    let mut now = None;
    let mut requested = Vec::new();
    let mut due = Vec::new();
    for row in rows {
        now = Some(row.now);
        match (row.source.as_str(), row.id, row.at) {
            ("request", Some(id), Some(at)) => requested.push(Request::read(
                id,
                at,
                row.origin.as_deref().unwrap_or_default(),
                row.kind.as_deref().unwrap_or_default(),
            )?),
            ("due", Some(id), Some(next_run_at)) => due.push(DueRoutine {
                id,
                schedule: row.schedule.unwrap_or_default(),
                timezone: row.timezone.unwrap_or_default(),
                misfire_policy: row.misfire_policy.unwrap_or_default(),
                kind: row.kind.unwrap_or_default(),
                next_run_at,
                runs_left: row.runs_left,
                overlap: row.overlap.unwrap_or_default(),
            }),
            _ => {}
        }
    }
    let now = now.ok_or_else(|| {
        StoreError::Database(sqlx::Error::Protocol(
            "the due query returned no clock row".into(),
        ))
    })?;
    requested.sort_by_key(|r| (r.scheduled_at, r.routine_id));
    due.sort_by_key(|r| (r.next_run_at, r.id));
    Ok(DueSet {
        now,
        requested,
        due,
    })
}

/// The outbox sequence number a fire settled in the claim names in its receipt.
fn outbox_seq(row: &ClaimedRow) -> Option<i64> {
    row.receipt
        .as_deref()?
        .strip_prefix("outbox seq ")?
        .parse()
        .ok()
}

/// After the outbox claim: when it wrote fewer messages than its fresh fires drew numbers for
/// (a message of the occurrence was already there), finds which numbers were not written and
/// says so in those fires' receipts. The usual claim writes them all and reads nothing more.
async fn mark_unwritten_messages(
    tx: &mut Transaction<'_, Postgres>,
    rows: &mut [ClaimedRow],
) -> Result<(), StoreError> {
    let drawn: Vec<i64> = rows
        .iter()
        .filter(|r| r.inserted)
        .filter_map(outbox_seq)
        .collect();
    let written = rows.first().and_then(|r| r.written).unwrap_or(0);
    if drawn.len() as i64 == written {
        return Ok(());
    }
    let present: std::collections::HashSet<i64> =
        sqlx::query_scalar("SELECT seq FROM outbox_messages WHERE seq = ANY($1)")
            .bind(&drawn)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .collect();
    for row in rows.iter_mut().filter(|r| r.inserted) {
        if outbox_seq(row).is_some_and(|seq| !present.contains(&seq)) {
            row.receipt = Some("outbox: the message was already written".into());
        }
    }
    Ok(())
}

/// Records the occurrences a `buffer-one` routine's run kept waiting that are not launched:
/// `skipped`, naming the one launched instead. An occurrence already in the ledger (a trigger
/// of the same instant) keeps its row.
async fn record_buffer_skips(
    tx: &mut Transaction<'_, Postgres>,
    skipped: &[(Uuid, DateTime<Utc>, DateTime<Utc>)],
    token: ClaimToken,
    now: DateTime<Utc>,
    group_count: u16,
) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = skipped.iter().map(|(id, _, _)| *id).collect();
    let instants: Vec<DateTime<Utc>> = skipped.iter().map(|(_, at, _)| *at).collect();
    let groups: Vec<GroupId> = ids.iter().map(|id| group_of(*id, group_count)).collect();
    let errors: Vec<String> = skipped
        .iter()
        .map(|(_, _, launched)| {
            format!(
                "skipped: buffer-one launched the newest occurrence due during the run, {}",
                launched.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .collect();
    sqlx::query(
        "INSERT INTO routine_fires
             (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at,
              lease_expires_at, status, completed_at, error, origin, group_id)
         SELECT t.routine_id, t.scheduled_at, 'buffer-one', $4, 1, $5, $5, 'skipped', $5, t.error,
                'schedule', t.group_id
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::text[], $6::smallint[])
              AS t(routine_id, scheduled_at, error, group_id)
         ON CONFLICT DO NOTHING",
    )
    .bind(&ids)
    .bind(&instants)
    .bind(&errors)
    .bind(token.0)
    .bind(now)
    .bind(&groups)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Where a following claim may resume the due walk: after the last of the locked routines
/// (in the walk's order) before the first one the cap deferred occurrences of, which the next
/// claim must see again.
fn resume_after(due: &[DueRoutine], tick: &TickPlan) -> Option<DueCursor> {
    let deferred: std::collections::HashSet<Uuid> = tick
        .advances
        .iter()
        .filter(|a| a.deferred > 0)
        .map(|a| a.routine_id)
        .collect();
    due.iter()
        .take_while(|r| !deferred.contains(&r.id))
        .last()
        .map(|r| DueCursor {
            next_run_at: r.next_run_at,
            routine_id: r.id,
        })
}

/// The routine rows a claim writes: each routine whose clock moved or that fired (a requested
/// occurrence counts as a run too). Routines whose occurrences were all deferred keep their
/// row as it was.
struct Advance {
    ids: Vec<Uuid>,
    next_run_at: Vec<Option<DateTime<Utc>>>,
    moves: Vec<bool>,
    ran: Vec<bool>,
    /// How many scheduled occurrences of each the claim claims: a run limit is lowered by it.
    claimed: Vec<i32>,
}

impl Advance {
    fn new(due: &[DueRoutine], tick: &TickPlan, requested: &[Request]) -> Advance {
        let was: std::collections::HashMap<Uuid, DateTime<Utc>> =
            due.iter().map(|r| (r.id, r.next_run_at)).collect();
        let mut advance = Advance {
            ids: Vec::new(),
            next_run_at: Vec::new(),
            moves: Vec::new(),
            ran: Vec::new(),
            claimed: Vec::new(),
        };
        for a in &tick.advances {
            let moves = a.next_run_at != was.get(&a.routine_id).copied();
            if a.claimed > 0 || moves {
                advance.ids.push(a.routine_id);
                advance.next_run_at.push(a.next_run_at);
                advance.moves.push(moves);
                advance.ran.push(a.claimed > 0);
                advance
                    .claimed
                    .push(i32::try_from(a.claimed).unwrap_or(i32::MAX));
            }
        }
        let mut requested_only: Vec<Uuid> = requested
            .iter()
            .map(|r| r.routine_id)
            .filter(|id| !advance.ids.contains(id))
            .collect();
        requested_only.sort_unstable();
        requested_only.dedup();
        for id in requested_only {
            advance.ids.push(id);
            advance.next_run_at.push(None);
            advance.moves.push(false);
            advance.ran.push(true);
            advance.claimed.push(0);
        }
        advance
    }

    /// Binds the four arrays of the advance (`advance_cte!`, [`ADVANCE_SQL`]), which come
    /// before the statement's clock; the fifth, the claimed counts, is bound last of all
    /// ([`Advance::bind_claimed`]).
    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.next_run_at)
            .bind(&self.moves)
            .bind(&self.ran)
    }

    /// Binds the claimed counts, the statement's last parameter (after its group, if any).
    fn bind_claimed<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        query.bind(&self.claimed)
    }
}

/// What the claim statement writes: the planned occurrences (oldest first), each one's group,
/// the claim's token, and its clock (read once, by the due statement).
struct ClaimInput<'a> {
    token: ClaimToken,
    now: DateTime<Utc>,
    claims: &'a [(Occurrence, FireOrigin)],
    groups: &'a [GroupId],
    /// When each occurrence came due, where a jitter delayed it; `None`, the occurrence itself.
    planned: Vec<Option<DateTime<Utc>>>,
}

impl ClaimInput<'_> {
    /// The occurrences as the claim statements' parallel arrays: routines, instants, origins.
    fn columns(&self) -> (Vec<Uuid>, Vec<DateTime<Utc>>, Vec<&'static str>) {
        (
            self.claims.iter().map(|(o, _)| o.routine_id).collect(),
            self.claims.iter().map(|(o, _)| o.scheduled_at).collect(),
            self.claims
                .iter()
                .map(|(_, origin)| origin.as_str())
                .collect(),
        )
    }
}

/// Whether message and mission routines are settled with an outbox row in the claim.
fn outbox_kinds(params: &ClaimDueParams) -> (bool, bool) {
    let outbox = Some(InClaimEffect::Outbox);
    (
        params.in_claim.message == outbox,
        params.in_claim.mission == outbox,
    )
}

/// Binds the group a statement is kept in, its last parameter, when there is one.
fn bind_group<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    group: Option<GroupId>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    match group {
        Some(group) => query.bind(group),
        None => query,
    }
}

impl PgStore {
    /// The claim's second statement: every planned occurrence claimed (and, for an in-claim
    /// kind, settled with its effect) and the routines' clocks moved, together.
    async fn claim_rows(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        params: &ClaimDueParams,
        claim: &ClaimInput<'_>,
        advance: &Advance,
    ) -> Result<Vec<ClaimedFire>, StoreError> {
        if let Some(group) = params.group
            && self.is_citus().await?
        {
            return self
                .claim_rows_on_one_shard(tx, params, claim, advance, group)
                .await;
        }
        let (token, claims) = (claim.token, claim.claims);
        let (ids, instants, origins) = claim.columns();
        let (message, mission) = outbox_kinds(params);
        let writes_messages = message || mission;
        let statement = match (writes_messages, params.group) {
            (true, None) => CLAIM_WITH_OUTBOX_SQL,
            (true, Some(_)) => CLAIM_GROUP_WITH_OUTBOX_SQL,
            (false, None) => CLAIM_SQL,
            (false, Some(_)) => CLAIM_GROUP_SQL,
        };
        let keys: Vec<String> = if writes_messages {
            claims
                .iter()
                .map(|(o, _)| o.idempotency_key().as_str().to_owned())
                .collect()
        } else {
            Vec::new()
        };
        let query = sqlx::query(statement)
            .bind(&ids)
            .bind(&instants)
            .bind(&params.claimant)
            .bind(token.0)
            .bind(lease_seconds(params.lease))
            .bind(&origins);
        // The outbox claim's own parameters come next ($7-$9), then the advance's.
        let query = if writes_messages {
            query.bind(message).bind(mission).bind(&keys)
        } else {
            query
        };
        let query = advance.bind(query).bind(claim.now).bind(claim.groups);
        let query = advance
            .bind_claimed(bind_group(query, params.group))
            .bind(&claim.planned);
        let mut rows: Vec<ClaimedRow> = query
            .try_map(|row| ClaimedRow::from_row(&row))
            .fetch_all(&mut **tx)
            .await?;
        if writes_messages {
            mark_unwritten_messages(tx, &mut rows).await?;
        }
        rows.into_iter().map(ClaimedFire::try_from).collect()
    }
}

#[async_trait]
impl FireLedger for PgStore {
    async fn claim_due(&self, params: &ClaimDueParams) -> Result<TickClaim, StoreError> {
        let token = ClaimToken::new_v4();
        let cap = params.cap.get();
        let mut conn = self.pool.acquire().await?;
        let began = Instant::now();
        let mut tx = self.begin_on(&mut conn).await?;

        // Occurrences asked for by hand get a guaranteed share of the cap, taken first, so a
        // sustained backlog of scheduled work cannot starve them; scheduled work gets the rest,
        // and requests may fill whatever it leaves. Each request is deleted in this transaction,
        // with its claim. The clock, the requests and the due routines come in one statement.
        // Requested missions take the mission room like scheduled ones: together they never
        // exceed it, and the requests past it stay in the table for a later claim.
        let share = request_share(cap);
        let mission_room = params
            .mission_room
            .map(|room| i64::try_from(room).unwrap_or(i64::MAX));
        let statement = match (params.after, params.group) {
            (None, None) => DUE_SQL,
            (None, Some(_)) => DUE_GROUP_SQL,
            (Some(_), None) => DUE_AFTER_SQL,
            (Some(_), Some(_)) => DUE_GROUP_AFTER_SQL,
        };
        let mut query = sqlx::query_as(statement)
            .bind(i64::from(params.max_routines))
            .bind(i64::try_from(share).unwrap_or(i64::MAX))
            .bind(mission_room);
        if let Some(after) = params.after {
            query = query.bind(after.next_run_at).bind(after.routine_id);
        }
        if let Some(group) = params.group {
            query = query.bind(group);
        }
        let rows: Vec<DueRow> = query.fetch_all(&mut *tx).await?;
        let DueSet {
            now,
            mut requested,
            due,
        } = split_due_rows(rows)?;
        let requests_may_remain = requested.len() == share;
        // What the requested missions leave of the room for the scheduled ones.
        let requested_missions = requested.iter().filter(|r| r.mission).count();
        let limited_room = params
            .mission_room
            .map(|room| room.saturating_sub(requested_missions));

        let mut plans = Vec::with_capacity(due.len());
        let mut unusable = Vec::new();
        // Occurrences a `buffer-one` routine's run kept waiting that are not launched: recorded
        // `skipped`, naming the newest, which is.
        let mut skipped_by_buffer: Vec<(Uuid, DateTime<Utc>, DateTime<Utc>)> = Vec::new();
        // Parsing an expression costs far more than walking it, and many routines share one
        // (every hour, every minute): each distinct (expression, zone) is parsed once a claim.
        let mut parsed: std::collections::HashMap<
            (&str, &str),
            Result<cm_domain::Schedule, String>,
        > = std::collections::HashMap::new();
        for routine in &due {
            let schedule = parsed
                .entry((routine.schedule.as_str(), routine.timezone.as_str()))
                .or_insert_with(|| {
                    cm_domain::Schedule::parse(&routine.schedule, &routine.timezone)
                        .map_err(|e| e.to_string())
                })
                .as_ref()
                .map_err(Clone::clone);
            let policy = routine
                .misfire_policy
                .parse::<cm_domain::MisfirePolicy>()
                .map_err(|e| e.to_string());
            // A buffering mission (its run is free, or the walk would not have locked it): what
            // its run kept waiting is the buffer policy's to decide, not the misfire policy's.
            let buffering = routine
                .overlap
                .parse::<cm_domain::OverlapPolicy>()
                .ok()
                .filter(|o| o.buffers() && routine.kind == "mission");
            match (schedule, policy) {
                (Ok(schedule), Ok(policy)) => {
                    let policy = match buffering {
                        Some(_) => cm_domain::MisfirePolicy::CatchUp,
                        None => policy,
                    };
                    let mut plan = plan_routine_due(
                        routine.id,
                        routine.next_run_at,
                        schedule,
                        now,
                        policy,
                        &params.rules,
                    );
                    if let Some(overlap) = buffering {
                        let buffered =
                            cm_domain::buffer_plan(overlap, &plan.occurrences, plan.next_run_at);
                        plan.occurrences = buffered.launch.into_iter().collect();
                        plan.next_run_at = buffered.next_run_at;
                        if let Some(launch) = buffered.launch {
                            skipped_by_buffer.extend(
                                buffered
                                    .skipped
                                    .into_iter()
                                    .map(|at| (routine.id, at, launch)),
                            );
                        }
                    }
                    plans.push(PlannedRoutine {
                        routine_id: routine.id,
                        plan: plan.limited_to(routine.runs_left.map(|n| n.max(0).unsigned_abs())),
                        limited: params.mission_room.is_some() && routine.kind == "mission",
                    })
                }
                (Err(reason), _) | (_, Err(reason)) => unusable.push(UnusableRoutine {
                    routine_id: routine.id,
                    reason,
                }),
            }
        }
        let tick = match FireCap::new(cap.saturating_sub(requested.len())) {
            Some(scheduled_cap) => plan_claim(&plans, scheduled_cap, limited_room.unwrap_or(0)),
            // The requests took the whole cap (a cap of one): every scheduled occurrence waits
            // for a later tick, and no routine's clock moves.
            None => TickPlan {
                deferred: plans.iter().map(|p| p.plan.occurrences.len()).sum(),
                ..TickPlan::default()
            },
        };

        let room = cap.saturating_sub(tick.claims.len() + requested.len());
        if requests_may_remain && room > 0 {
            // The scheduled missions planned took their part of the room too.
            let scheduled_missions: usize = plans
                .iter()
                .zip(&tick.advances)
                .filter(|(plan, _)| plan.limited)
                .map(|(_, advance)| advance.claimed)
                .sum();
            let missions_left = limited_room.map(|room| room.saturating_sub(scheduled_missions));
            requested.extend(take_requests(&mut tx, room, missions_left, params.group).await?);
        }
        let mut claims: Vec<(Occurrence, FireOrigin)> = tick
            .claims
            .iter()
            .map(|o| (*o, FireOrigin::Schedule))
            .collect();
        for request in &requested {
            let occurrence = Occurrence::new(request.routine_id, request.scheduled_at);
            // A requested slot the schedule also planned this tick is claimed once.
            if !tick.claims.contains(&occurrence) {
                claims.push((occurrence, request.origin));
            }
        }
        // Oldest first: the outbox numbers a claim's messages in this order, so each routine's
        // occurrences reach a consumer in `scheduled_at` order.
        claims.sort_by_key(|(o, _)| *o);

        let advance = Advance::new(&due, &tick, &requested);
        let mut fires = if claims.is_empty() {
            if !advance.ids.is_empty() {
                let statement = match params.group {
                    None => ADVANCE_SQL,
                    Some(_) => ADVANCE_GROUP_SQL,
                };
                let query = advance.bind(sqlx::query(statement)).bind(now);
                advance
                    .bind_claimed(bind_group(query, params.group))
                    .execute(&mut *tx)
                    .await?;
            }
            Vec::new()
        } else {
            let count = self.group_count().await?;
            let groups: Vec<GroupId> = claims
                .iter()
                .map(|(o, _)| group_of(o.routine_id, count))
                .collect();
            // The planned instants of scheduled occurrences whose schedule has a jitter.
            let jittered: std::collections::HashMap<Uuid, &cm_domain::Schedule> = due
                .iter()
                .filter_map(|r| {
                    let schedule = parsed
                        .get(&(r.schedule.as_str(), r.timezone.as_str()))?
                        .as_ref()
                        .ok()?;
                    schedule.jitter().map(|_| (r.id, schedule))
                })
                .collect();
            let planned = claims
                .iter()
                .map(|(o, origin)| match (origin, jittered.get(&o.routine_id)) {
                    (FireOrigin::Schedule, Some(schedule)) => {
                        Some(schedule.planned(o.routine_id, o.scheduled_at))
                    }
                    _ => None,
                })
                .collect();
            let claim = ClaimInput {
                token,
                now,
                claims: &claims,
                groups: &groups,
                planned,
            };
            self.claim_rows(&mut tx, params, &claim, &advance).await?
        };
        fires.sort_by_key(|f| f.occurrence);
        if !skipped_by_buffer.is_empty() {
            record_buffer_skips(
                &mut tx,
                &skipped_by_buffer,
                token,
                now,
                self.group_count().await?,
            )
            .await?;
        }

        if !unusable.is_empty() {
            let ids: Vec<Uuid> = unusable.iter().map(|u| u.routine_id).collect();
            let query = sqlx::query(match params.group {
                None => {
                    "UPDATE routines SET paused = true, next_run_at = NULL, updated_at = $2
                     WHERE id = ANY($1)"
                }
                Some(_) => {
                    "UPDATE routines SET paused = true, next_run_at = NULL, updated_at = $2
                     WHERE id = ANY($1) AND group_id = $3"
                }
            })
            .bind(&ids)
            .bind(now);
            bind_group(query, params.group).execute(&mut *tx).await?;
        }
        tx.commit().await?;

        Ok(TickClaim {
            now,
            began,
            token,
            more_due: claims.len() >= cap || due.len() >= params.max_routines as usize,
            resume_after: resume_after(&due, &tick),
            fires,
            deferred: tick.deferred,
            held: tick.held,
            skipped: tick.advances.iter().map(|a| a.skipped).sum(),
            unusable,
        })
    }

    async fn settle_fires(&self, settles: &[FireSettle]) -> Result<Vec<SettleOutcome>, StoreError> {
        if settles.is_empty() {
            return Ok(Vec::new());
        }
        if !self.is_citus().await? {
            return self.settle_fires_of(None, settles).await;
        }
        // On Citus, one statement per group, each on one shard: a worker that is down fails the
        // settles of its own groups alone, and the others are written.
        let count = self.group_count().await?;
        let mut by_group: std::collections::BTreeMap<GroupId, Vec<usize>> =
            std::collections::BTreeMap::new();
        for (i, settle) in settles.iter().enumerate() {
            by_group
                .entry(crate::group_of(settle.fire.occurrence.routine_id, count))
                .or_default()
                .push(i);
        }
        let mut outcomes = vec![SettleOutcome::Unwritten; settles.len()];
        let (mut written, mut failed) = (false, None);
        for (group, rows) in by_group {
            let part: Vec<FireSettle> = rows.iter().map(|i| settles[*i].clone()).collect();
            match self.settle_fires_of(Some(group), &part).await {
                Ok(done) => {
                    written = true;
                    for (i, outcome) in rows.into_iter().zip(done) {
                        outcomes[i] = outcome;
                    }
                }
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            Some(e) if !written => Err(e),
            _ => Ok(outcomes),
        }
    }

    async fn settle_fire(
        &self,
        fire: &FireRef,
        settlement: &Settlement,
    ) -> Result<SettleOutcome, StoreError> {
        let (settled, present): (bool, bool) = on_store!(self, |e| sqlx::query_as(SETTLE_SQL)
            .bind(fire.occurrence.routine_id)
            .bind(fire.occurrence.scheduled_at)
            .bind(fire.token.0)
            .bind(i32::try_from(fire.attempt).unwrap_or(i32::MAX))
            .bind(settlement.status().as_str())
            .bind(settlement.error())
            .fetch_one(e))?;
        Ok(match (settled, present) {
            (true, _) => SettleOutcome::Settled,
            (false, true) => SettleOutcome::TakenOver,
            (false, false) => SettleOutcome::Gone,
        })
    }

    async fn note_unsettled(&self, fire: &FireRef, error: &ErrorText) -> Result<bool, StoreError> {
        Ok(on_store!(self, |e| sqlx::query(
            "UPDATE routine_fires SET error = $5
             WHERE routine_id = $1 AND scheduled_at = $2
               AND claim_token = $3 AND attempt = $4 AND status = 'claimed'",
        )
        .bind(fire.occurrence.routine_id)
        .bind(fire.occurrence.scheduled_at)
        .bind(fire.token.0)
        .bind(i32::try_from(fire.attempt).unwrap_or(i32::MAX))
        .bind(error.as_str())
        .execute(e))?
        .rows_affected()
            == 1)
    }

    async fn reap_expired(&self, params: &ReapParams) -> Result<TickClaim, StoreError> {
        let token = ClaimToken::new_v4();
        let mut conn = self.pool.acquire().await?;
        let (mut tx, began, now) = begin_claim(self, &mut conn).await?;
        let query = sqlx::query(match params.group {
            None => REAP_SQL,
            Some(_) => REAP_GROUP_SQL,
        })
        .bind(i64::from(params.limit))
        .bind(&params.claimant)
        .bind(token.0)
        .bind(lease_seconds(params.lease));
        let rows: Vec<ClaimedRow> = bind_group(query, params.group)
            .try_map(|row| ClaimedRow::from_row(&row))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut fires = rows
            .into_iter()
            .map(ClaimedFire::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        fires.sort_by_key(|f| f.occurrence);
        Ok(TickClaim {
            now,
            began,
            token,
            fires,
            deferred: 0,
            held: 0,
            more_due: false,
            resume_after: None,
            skipped: 0,
            unusable: Vec::new(),
        })
    }

    async fn prune_settled(&self, retention: Duration, limit: u32) -> Result<u64, StoreError> {
        // The ledger is the dedupe: a settled row is what stops an occurrence firing twice, so
        // only rows far older than any occurrence a scheduler could compute again go.
        let deleted = on_store!(self, |e| sqlx::query(PRUNE_SQL)
            .bind(retention.as_secs_f64())
            .bind(i64::from(limit))
            .execute(e))?
        .rows_affected();
        Ok(deleted)
    }

    async fn prune_settled_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let deleted = on_store!(self, |e| sqlx::query(PRUNE_GROUP_SQL)
            .bind(retention.as_secs_f64())
            .bind(i64::from(limit))
            .bind(group)
            .execute(e))?
        .rows_affected();
        Ok(deleted)
    }

    async fn list_fires(&self, filter: &FireFilter) -> Result<Vec<Fire>, StoreError> {
        let sql = list_fires_statement(filter.outcome);
        let rows: Vec<FireRow> = on_store!(self, |e| sqlx::query_as(sql)
            .bind(filter.routine_id)
            .bind(filter.after.map(|c| c.scheduled_at))
            .bind(filter.after.map(|c| c.routine_id))
            .bind(i64::from(filter.limit))
            .fetch_all(e))?;
        Ok(rows.into_iter().map(Fire::from).collect())
    }
}

#[derive(FromRow)]
pub(crate) struct FireRow {
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    status: String,
    origin: String,
    claimant: String,
    attempt: i32,
    claimed_at: DateTime<Utc>,
    lease_expires_at: DateTime<Utc>,
    completed_at: Option<DateTime<Utc>>,
    error: Option<String>,
    receipt: Option<String>,
    run_state: Option<String>,
    run_exit_code: Option<i32>,
    run_reason: Option<String>,
    run_started_at: Option<DateTime<Utc>>,
    run_finished_at: Option<DateTime<Utc>>,
}

impl From<FireRow> for Fire {
    fn from(r: FireRow) -> Self {
        Fire {
            routine_id: r.routine_id,
            scheduled_at: r.scheduled_at,
            status: r.status,
            origin: r.origin,
            claimant: r.claimant,
            attempt: u32::try_from(r.attempt).unwrap_or(0),
            claimed_at: r.claimed_at,
            lease_expires_at: r.lease_expires_at,
            completed_at: r.completed_at,
            error: r.error,
            receipt: r.receipt,
            run_state: r.run_state,
            run_exit_code: r.run_exit_code,
            run_reason: r.run_reason,
            run_started_at: r.run_started_at,
            run_finished_at: r.run_finished_at,
        }
    }
}

/// Takes due requests, oldest occurrence first, skipping those another claim holds; `$limit` is
/// the parameter holding the most to take, `$missions` the most of them that may be of mission
/// routines (at most `$limit`; a NULL bound is none), `$walk` the walk's group filter and `$taken`
/// the deleted rows' own. The walk joins each request's routine for its kind and walks the two
/// kinds apart, so mission requests past their room stay in the table, in order, without
/// holding back the message requests behind them; of the two walks the oldest `$limit` are
/// taken. Each request's routine is locked FOR KEY SHARE with it, skipping a routine being
/// deleted: the claim then never waits on a routine while holding a request, the wait that
/// deadlocked against `delete_routine`. The lock is also what keeps the requested
/// occurrence's fire from outliving its routine (the ledger has no foreign key):
/// `delete_routine` waits for it, then deletes the fires the claim wrote. Returns each taken
/// request's routine, instant, origin and routine kind.
macro_rules! take_requests_sql {
    ($limit:literal, $missions:literal, $walk:literal, $taken:literal) => {
        concat!(
            "
DELETE FROM routine_requests d
USING (
    SELECT routine_id, scheduled_at, group_id, kind
    FROM (",
            take_requests_walk!("r.kind = 'mission'", $missions, $walk),
            "
        UNION ALL",
            take_requests_walk!("r.kind <> 'mission'", $limit, $walk),
            "
    ) walk
    ORDER BY scheduled_at, routine_id
    LIMIT ",
            $limit,
            "
) t
WHERE d.routine_id = t.routine_id AND d.scheduled_at = t.scheduled_at
  AND d.group_id = t.group_id",
            $taken,
            "
RETURNING d.routine_id, d.scheduled_at, d.origin, t.kind"
        )
    };
}

/// One kind's walk of `take_requests_sql!`: at most `$limit` due requests whose routine matches
/// `$kind`, oldest first, locked.
macro_rules! take_requests_walk {
    ($kind:literal, $limit:literal, $walk:literal) => {
        concat!(
            "
        SELECT * FROM (
            SELECT q.routine_id, q.scheduled_at, q.group_id, r.kind
            FROM routine_requests q
            JOIN routines r ON r.id = q.routine_id AND r.group_id = q.group_id
            WHERE q.scheduled_at <= now() AND ",
            $kind,
            $walk,
            "
            ORDER BY q.scheduled_at, q.routine_id
            LIMIT ",
            $limit,
            "
            FOR UPDATE OF q SKIP LOCKED
            FOR KEY SHARE OF r SKIP LOCKED
        ) w"
        )
    };
}

/// Takes at most `$1` due requests, at most `$2` of them of missions (see `take_requests_sql!`).
const TAKE_REQUESTS_SQL: &str = take_requests_sql!("$1", "least($1, $2::bigint)", "", "");

/// Takes at most `$1` due requests of the group `$3`, at most `$2` of them of missions.
pub const TAKE_GROUP_REQUESTS_SQL: &str = take_requests_sql!(
    "$1",
    "least($1, $2::bigint)",
    "\n              AND q.group_id = $3 AND r.group_id = $3",
    " AND d.group_id = $3"
);

/// The claim's first statement, around a due walk: the database's clock (one row, always), the
/// due requests (`$2` at most, at most `$3` of them of missions) and the due routines, locked.
/// `$1` is the most routines to lock; `$3` is the mission room (NULL: no bound), and with none
/// left mission routines are not locked at all (their launch budget is spent).
macro_rules! due_sql {
    ($walk:literal, $group:literal, $requests:literal, $take:literal, $busy:literal) => {
        concat!(
            "
WITH requested AS (",
            take_requests_sql!("$2", "least($2, $3::bigint)", $requests, $take),
            "
),
due AS (
    SELECT id, schedule, timezone, misfire_policy, kind, next_run_at, runs_left, overlap
    FROM routines
    WHERE next_run_at <= now()",
            $walk,
            $group,
            "
      AND ($3::bigint IS NULL OR $3::bigint > 0 OR kind <> 'mission')
      AND (overlap NOT IN ('buffer-one', 'buffer-all') OR NOT EXISTS (
              SELECT 1 FROM routine_fires b
              WHERE b.routine_id = routines.id AND b.group_id = routines.group_id",
            $busy,
            "
                AND (b.status = 'claimed' OR b.run_state = 'running')))
    ORDER BY next_run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
SELECT 'clock' AS source, now() AS now, NULL::uuid AS id, NULL::timestamptz AS at,
       NULL::text AS schedule, NULL::text AS timezone, NULL::text AS misfire_policy,
       NULL::text AS kind, NULL::text AS origin, NULL::integer AS runs_left,
       NULL::text AS overlap
UNION ALL
SELECT 'request', now(), routine_id, scheduled_at, NULL, NULL, NULL, kind, origin, NULL, NULL
FROM requested
UNION ALL
SELECT 'due', now(), id, next_run_at, schedule, timezone, misfire_policy, kind, NULL, runs_left,
       overlap
FROM due"
        )
    };
}

/// The claim's first statement over the whole due walk (see `due_sql!`). It reads
/// `routines_due_idx` `(next_run_at, id)` in order and stops after `$1` rows, however many
/// routines share the oldest instant.
pub const DUE_SQL: &str = due_sql!("", "", "", "", "");

/// [`DUE_SQL`] within the group `$4`: every table it reads is filtered on `group_id`, so on
/// Citus it runs on one shard. There it reads `routines_group_due_idx` `(group_id, next_run_at,
/// id)`, which `migrate --citus` creates; on plain PostgreSQL, `routines_due_idx` with a filter.
pub const DUE_GROUP_SQL: &str = due_sql!(
    "",
    "\n      AND group_id = $4",
    "\n              AND q.group_id = $4 AND r.group_id = $4",
    " AND d.group_id = $4",
    " AND b.group_id = $4"
);

/// The claim's first statement resumed after `($4, $5)`, the `(next_run_at, id)` of the last
/// routine a previous claim handled: the index scan starts there, so a drain does not re-read
/// the entries of the routines its earlier claims moved on (dead until vacuumed).
pub const DUE_AFTER_SQL: &str = due_sql!(
    "
      AND (next_run_at, id) > ($4::timestamptz, $5::uuid)",
    "",
    "",
    "",
    ""
);

/// [`DUE_AFTER_SQL`] within the group `$6`.
pub const DUE_GROUP_AFTER_SQL: &str = due_sql!(
    "
      AND (next_run_at, id) > ($4::timestamptz, $5::uuid)",
    "\n      AND group_id = $6",
    "\n              AND q.group_id = $6 AND r.group_id = $6",
    " AND d.group_id = $6",
    " AND b.group_id = $6"
);

/// Moves routines' clocks, the last four parameters of the claim statements: `$1` the routines,
/// `$2` their new `next_run_at`, `$3` whether it moves, `$4` whether the routine ran (claimed
/// an occurrence, `last_run_at` becomes now).
macro_rules! advance_cte {
    ($ids:literal, $next:literal, $moves:literal, $ran:literal, $now:literal, $group:literal,
     $claimed:literal) => {
        concat!(
            "
advanced AS (
    UPDATE routines AS r
    SET next_run_at = CASE WHEN t.moves THEN t.next_run_at ELSE r.next_run_at END,
        last_run_at = CASE WHEN t.ran THEN ",
            $now,
            "::timestamptz ELSE r.last_run_at END,
        runs_left = CASE WHEN r.runs_left IS NULL THEN NULL
                         ELSE greatest(r.runs_left - t.claimed, 0) END
    FROM UNNEST(",
            $ids,
            "::uuid[], ",
            $next,
            "::timestamptz[], ",
            $moves,
            "::bool[], ",
            $ran,
            "::bool[], ",
            $claimed,
            "::integer[]) AS t(id, next_run_at, moves, ran, claimed)
    WHERE r.id = t.id",
            $group,
            "
    RETURNING 1
)"
        )
    };
}

/// The advance alone, for a claim that moved clocks (misfires skipped) but claimed nothing;
/// `$5` is the claim's clock.
const ADVANCE_SQL: &str = concat!(
    "WITH ",
    advance_cte!("$1", "$2", "$3", "$4", "$5", "", "$6"),
    " SELECT count(*) FROM advanced"
);

/// `ADVANCE_SQL` within the group `$6`.
pub const ADVANCE_GROUP_SQL: &str = concat!(
    "WITH ",
    advance_cte!("$1", "$2", "$3", "$4", "$5", " AND r.group_id = $6", "$7"),
    " SELECT count(*) FROM advanced"
);

/// Deletes settled fires past the retention (`$1` seconds), at most `$2`, oldest settled first;
/// the argument keeps it in one group.
macro_rules! prune_sql {
    ($group:literal) => {
        concat!(
            "
DELETE FROM routine_fires
WHERE (routine_id, scheduled_at) IN (
    SELECT routine_id, scheduled_at FROM routine_fires
    WHERE status <> 'claimed'
      AND completed_at < now() - make_interval(secs => $1)
      AND scheduled_at < now() - make_interval(secs => $1)",
            $group,
            "
    ORDER BY completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)",
            $group
        )
    };
}

/// Prunes settled fires of every group.
const PRUNE_SQL: &str = prune_sql!("");

/// Prunes settled fires of the group `$3`.
const PRUNE_GROUP_SQL: &str = prune_sql!(" AND group_id = $3");

/// The settle. `$1`/`$2` the occurrence, `$3`/`$4` the claim's token and attempt, `$5` the
/// status, `$6` the error. Returns whether it settled the row and whether the row exists at
/// all (the second reads the statement's snapshot, from before the update), so a settle that
/// changed nothing tells a takeover from a deleted routine in the same round trip.
const SETTLE_SQL: &str = "
WITH settled AS (
    UPDATE routine_fires
    SET status = $5, error = $6, completed_at = now()
    WHERE routine_id = $1 AND scheduled_at = $2
      AND claim_token = $3 AND attempt = $4 AND status = 'claimed'
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM settled) AS settled,
       EXISTS (SELECT 1 FROM routine_fires WHERE routine_id = $1 AND scheduled_at = $2) AS present";

/// The claim's upsert clause, shared by both claim statements: on conflict the row is always
/// updated, so it is always returned, and `xmax = 0` tells a real insert from an update. The
/// update takes the row over (new claimant, token and lease, attempt + 1) only when it is
/// `claimed` and its lease has run out by this transaction's clock
/// (`cm_domain::claim::lease_expired`); otherwise every column is rewritten with its own value.
macro_rules! claim_upsert {
    ($now:literal) => {
        concat!(
            "
    ON CONFLICT (routine_id, scheduled_at, group_id) DO UPDATE SET
        claimant = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                        THEN excluded.claimant ELSE f.claimant END,
        claim_token = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                           THEN excluded.claim_token ELSE f.claim_token END,
        attempt = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                       THEN f.attempt + 1 ELSE f.attempt END,
        claimed_at = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                          THEN excluded.claimed_at ELSE f.claimed_at END,
        lease_expires_at = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                                THEN excluded.lease_expires_at ELSE f.lease_expires_at END
    RETURNING (f.xmax = 0) AS inserted, f.routine_id, f.scheduled_at, f.status, f.claimant,
              f.claim_token, f.attempt, f.lease_expires_at, f.receipt, f.origin, f.error,
              f.first_claimed_at, f.group_id, f.planned_at"
        )
    };
}

/// The claim statement when every occurrence goes to a dispatch (see [`CLAIM_SQL`]); the
/// argument is the filter that keeps it in one group (`$13`), or nothing.
macro_rules! claim_sql {
    ($group:literal, $claimed:literal, $planned:literal) => {
        concat!(
            "
WITH claimed AS (
    INSERT INTO routine_fires AS f
        (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at, lease_expires_at,
         origin, group_id, planned_at)
    SELECT t.routine_id, t.scheduled_at, $3, $4, 1, $11::timestamptz,
           $11::timestamptz + make_interval(secs => $5), t.origin, t.group_id, t.planned_at
    FROM UNNEST($1::uuid[], $2::timestamptz[], $6::text[], $12::smallint[], ",
            $planned,
            "::timestamptz[])
         AS t(routine_id, scheduled_at, origin, group_id, planned_at)",
            claim_upsert!("$11::timestamptz"),
            "
),",
            advance_cte!("$7", "$8", "$9", "$10", "$11", $group, $claimed),
            "
SELECT c.inserted, c.routine_id, c.scheduled_at, c.status, c.claimant, c.claim_token, c.attempt,
       c.lease_expires_at, r.name, r.kind, c.origin, r.payload, NULL::text AS receipt,
       NULL::bigint AS written, c.error, c.first_claimed_at, c.planned_at
FROM claimed c JOIN routines r ON r.id = c.routine_id AND r.group_id = c.group_id",
            $group
        )
    };
}

/// The claim statement when every occurrence goes to a dispatch. `$1`/`$2` are the occurrences
/// as parallel arrays, oldest first, `$3` the claimant, `$4` the claim token, `$5` the lease in
/// seconds, `$6` each occurrence's origin; `$7` to `$10` move the routines' clocks in the same
/// statement (`advance_cte!`); `$11` is the claim's clock (read once, in the due statement),
/// `$12` each occurrence's group; the last two, the advance's claimed counts and each
/// occurrence's planned instant (NULL: the occurrence itself), come after all others.
const CLAIM_SQL: &str = claim_sql!("", "$13", "$14");

/// `CLAIM_SQL` within the group `$13`.
pub const CLAIM_GROUP_SQL: &str = claim_sql!(" AND r.group_id = $13", "$14", "$15");

/// The claim statement with the transactional outbox (see [`CLAIM_WITH_OUTBOX_SQL`]); the
/// argument is the filter that keeps it in one group (`$16`), or nothing.
macro_rules! claim_with_outbox_sql {
    ($group:literal, $claimed:literal, $planned:literal) => {
        concat!(
            "
WITH input AS MATERIALIZED (
    SELECT o.*,
           CASE WHEN (o.kind = 'message' AND $7) OR (o.kind = 'mission' AND $8)
                THEN nextval('outbox_messages_seq_seq') END AS outbox_seq
    FROM (
        SELECT t.routine_id, t.scheduled_at, t.origin, t.idempotency_key, t.group_id,
               t.planned_at, r.name, r.kind, r.payload
        FROM UNNEST($1::uuid[], $2::timestamptz[], $6::text[], $9::text[], $15::smallint[], ",
            $planned,
            "::timestamptz[])
             WITH ORDINALITY
             AS t(routine_id, scheduled_at, origin, idempotency_key, group_id, planned_at, n)
        JOIN routines r ON r.id = t.routine_id AND r.group_id = t.group_id",
            $group,
            "
        ORDER BY t.n
    ) o
),
claimed AS (
    INSERT INTO routine_fires AS f
        (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at, lease_expires_at,
         status, completed_at, receipt, origin, group_id, planned_at)
    SELECT i.routine_id, i.scheduled_at, $3, $4, 1, $14::timestamptz,
           $14::timestamptz + make_interval(secs => $5),
           CASE WHEN i.outbox_seq IS NULL THEN 'claimed' ELSE 'fired' END,
           CASE WHEN i.outbox_seq IS NULL THEN NULL ELSE $14::timestamptz END,
           CASE WHEN i.outbox_seq IS NULL THEN NULL ELSE 'outbox seq ' || i.outbox_seq END,
           i.origin, i.group_id, i.planned_at
    FROM input i",
            claim_upsert!("$14::timestamptz"),
            "
),
outbox AS (
    INSERT INTO outbox_messages
        (seq, routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
    OVERRIDING SYSTEM VALUE
    SELECT i.outbox_seq, c.routine_id, c.scheduled_at, i.idempotency_key, 1, i.payload,
           c.group_id
    FROM claimed c
    JOIN input i ON i.routine_id = c.routine_id AND i.scheduled_at = c.scheduled_at
    WHERE c.inserted AND i.outbox_seq IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING seq
),",
            advance_cte!("$10", "$11", "$12", "$13", "$14", $group, $claimed),
            "
SELECT c.inserted, c.routine_id, c.scheduled_at, c.status, c.claimant, c.claim_token, c.attempt,
       c.lease_expires_at, i.name, i.kind, c.origin, i.payload, c.receipt,
       (SELECT count(*) FROM outbox) AS written, c.error, c.first_claimed_at, c.planned_at
FROM claimed c
JOIN input i ON i.routine_id = c.routine_id AND i.scheduled_at = c.scheduled_at"
        )
    };
}

/// The claim statement with the transactional outbox. `$1` to `$6` as in [`CLAIM_SQL`]; `$7`
/// and `$8` say whether message and mission routines are settled with an outbox row in the
/// claim, `$9` holds the occurrences' idempotency keys, `$10` to `$13` move the clocks, `$14`
/// is the claim's clock and `$15` each occurrence's group.
///
/// An occurrence of an in-claim kind is inserted already `fired`, its receipt naming the outbox
/// sequence number drawn for it, and its message is written by the same statement when (and
/// only when) the insert was fresh. The statement returns how many messages it wrote
/// (`written`, on every row) rather than joining them back to the fires: a join whose inner side
/// is a data-modifying CTE is planned as a nested loop over it, one pass per fire, which made a
/// claim's cost grow with the square of its batch. When fewer were written than fresh fires
/// want one (a message already there), the store finds which ([`PgStore::claim_rows`]). The sequence numbers are drawn in the order of the arrays
/// (oldest occurrence first), so within one claim a routine's messages are numbered in
/// `scheduled_at` order. A number is drawn before the insert so the fire row is written once;
/// numbers drawn for rows that turn out to exist are simply unused.
const CLAIM_WITH_OUTBOX_SQL: &str = claim_with_outbox_sql!("", "$16", "$17");

/// `CLAIM_WITH_OUTBOX_SQL` within the group `$16`.
pub const CLAIM_GROUP_WITH_OUTBOX_SQL: &str =
    claim_with_outbox_sql!(" AND r.group_id = $16", "$17", "$18");

/// The reaper's statement; the arguments keep it in one group, or are empty.
macro_rules! reap_sql {
    ($expired:literal, $update:literal) => {
        concat!(
            "
WITH expired AS (
    SELECT routine_id, scheduled_at, group_id
    FROM routine_fires
    WHERE status = 'claimed' AND lease_expires_at <= now()",
            $expired,
            "
    ORDER BY claimed_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE routine_fires AS f
SET claimant = $2, claim_token = $3, attempt = f.attempt + 1, claimed_at = now(),
    lease_expires_at = now() + make_interval(secs => $4)
FROM expired e, routines r
WHERE f.routine_id = e.routine_id AND f.scheduled_at = e.scheduled_at
  AND f.group_id = e.group_id AND r.id = f.routine_id AND r.group_id = f.group_id",
            $update,
            "
RETURNING false AS inserted, f.routine_id, f.scheduled_at, f.status, f.claimant,
          f.claim_token, f.attempt, f.lease_expires_at, r.name, r.kind, f.origin, r.payload,
          NULL::text AS receipt, NULL::bigint AS written, f.error, f.first_claimed_at,
          f.planned_at"
        )
    };
}

/// The reaper. `$1` is the most rows to take, `$2` the claimant, `$3` the claim token, `$4`
/// the lease in seconds. The expired rows are found through `routine_fires_lease_idx` (the lease
/// of `claimed` rows), so a pass reads the expired claims only, never the live ones; they are
/// taken oldest claim first and locked with `SKIP LOCKED`, so two reapers never take the same
/// row, and a row a claim statement holds is left to it.
pub const REAP_SQL: &str = reap_sql!("", "");

/// [`REAP_SQL`] within the group `$5`: on Citus the expired claims are found through
/// `routine_fires_group_lease_idx` `(group_id, lease_expires_at)` (created by `migrate --citus`).
pub const REAP_GROUP_SQL: &str = reap_sql!(" AND group_id = $5", " AND f.group_id = $5");

/// The claim on Citus, kept in one group: the fires' upsert ([`SHARD_CLAIM_SQL`]), the outbox
/// rows ([`SHARD_OUTBOX_SQL`]), the clocks ([`ADVANCE_GROUP_SQL`]) and the routines' names and
/// payloads ([`SHARD_ROUTINES_SQL`]), each a statement of its own. Citus runs a statement whose
/// CTEs write several tables through intermediate results on the coordinator and commits it in
/// two phases; each of these is a router statement on the group's shard, so the claim's
/// transaction stays on one worker and commits there in one phase. The same occurrences are
/// claimed, with the same upsert, as by the one-statement claim on plain PostgreSQL.
///
/// `$1`/`$2` the occurrences, `$3` the claimant, `$4` the token, `$5` the lease in seconds, `$6`
/// the origins, `$7` the claim's clock, `$8` each occurrence's outbox number (drawn before, for
/// every occurrence; used by in-claim kinds only), `$9`/`$10` whether message and mission
/// routines are settled in the claim, `$11` the group, `$12` each occurrence's planned instant.
pub const SHARD_CLAIM_SQL: &str = concat!(
    "
INSERT INTO routine_fires AS f
    (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at, lease_expires_at,
     status, completed_at, receipt, origin, group_id, planned_at)
SELECT t.routine_id, t.scheduled_at, $3, $4, 1, $7::timestamptz,
       $7::timestamptz + make_interval(secs => $5),
       CASE WHEN t.in_claim THEN 'fired' ELSE 'claimed' END,
       CASE WHEN t.in_claim THEN $7::timestamptz END,
       CASE WHEN t.in_claim THEN 'outbox seq ' || t.seq END,
       t.origin, t.group_id, t.planned_at
FROM (
    SELECT u.routine_id, u.scheduled_at, u.origin, u.seq, r.group_id, u.planned_at,
           (r.kind = 'message' AND $9) OR (r.kind = 'mission' AND $10) AS in_claim
    FROM routines r
    JOIN UNNEST($1::uuid[], $2::timestamptz[], $6::text[], $8::bigint[], $12::timestamptz[])
         AS u(routine_id, scheduled_at, origin, seq, planned_at)
      ON r.id = u.routine_id
    WHERE r.group_id = $11
) t",
    claim_upsert!("$7::timestamptz")
);

/// The outbox rows of the fresh occurrences settled in a claim on Citus: `$1`/`$2` the
/// occurrences, `$3` their numbers, `$4` their idempotency keys, `$5` the group. Returns the
/// numbers written (a message already there is not written again).
pub const SHARD_OUTBOX_SQL: &str = "
INSERT INTO outbox_messages
    (seq, routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
OVERRIDING SYSTEM VALUE
SELECT t.seq, t.routine_id, t.scheduled_at, t.idempotency_key, 1, r.payload, r.group_id
FROM routines r
JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::bigint[], $4::text[])
     AS t(routine_id, scheduled_at, seq, idempotency_key)
  ON r.id = t.routine_id
WHERE r.group_id = $5
ON CONFLICT DO NOTHING
RETURNING seq";

/// The names, kinds and payloads of the routines `$1` of the group `$2`.
pub const SHARD_ROUTINES_SQL: &str =
    "SELECT id, name, kind, payload FROM routines WHERE group_id = $2 AND id = ANY($1)";

/// A row of [`SHARD_CLAIM_SQL`]: the fire as the upsert left it.
#[derive(FromRow)]
struct UpsertedRow {
    inserted: bool,
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    status: String,
    claimant: String,
    claim_token: Uuid,
    attempt: i32,
    lease_expires_at: DateTime<Utc>,
    receipt: Option<String>,
    origin: String,
    error: Option<String>,
    first_claimed_at: Option<DateTime<Utc>>,
    planned_at: Option<DateTime<Utc>>,
}

impl PgStore {
    /// [`FireLedger::settle_fires`]'s statements, for the rows of `group` (on Citus, naming it
    /// keeps them on its shard) or of any group.
    async fn settle_fires_of(
        &self,
        group: Option<GroupId>,
        settles: &[FireSettle],
    ) -> Result<Vec<SettleOutcome>, StoreError> {
        let n = settles.len();
        let mut ids = Vec::with_capacity(n);
        let mut instants = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut statuses = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut receipts = Vec::with_capacity(n);
        for s in settles {
            ids.push(s.fire.occurrence.routine_id);
            instants.push(s.fire.occurrence.scheduled_at);
            tokens.push(s.fire.token.0);
            attempts.push(i32::try_from(s.fire.attempt).unwrap_or(i32::MAX));
            statuses.push(s.settlement.status().as_str());
            errors.push(s.settlement.error());
            receipts.push(s.receipt.as_deref().map(bounded_receipt));
        }
        // One fenced UPDATE for the batch; the rows it did not settle are then told apart
        // (taken over, or gone with a deleted routine) by a read of the same keys.
        let query = sqlx::query_as(match group {
            None => settle_fires_sql!(""),
            Some(_) => settle_fires_sql!(" AND f.group_id = $8"),
        })
        .bind(&ids)
        .bind(&instants)
        .bind(&tokens)
        .bind(&attempts)
        .bind(&statuses)
        .bind(&errors)
        .bind(&receipts);
        let query = match group {
            None => query,
            Some(group) => query.bind(group),
        };
        let settled: Vec<(Uuid, DateTime<Utc>)> = on_store!(self, |e| query.fetch_all(e))?;
        let settled: std::collections::HashSet<(Uuid, DateTime<Utc>)> =
            settled.into_iter().collect();
        if settled.len() == n {
            return Ok(vec![SettleOutcome::Settled; n]);
        }
        let (missed_ids, missed_instants): (Vec<Uuid>, Vec<DateTime<Utc>>) = ids
            .iter()
            .zip(&instants)
            .filter(|key| !settled.contains(&(*key.0, *key.1)))
            .map(|(id, at)| (*id, *at))
            .unzip();
        let query = sqlx::query_as(match group {
            None => {
                "SELECT f.routine_id, f.scheduled_at
                 FROM routine_fires f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[]) AS t(routine_id, scheduled_at)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at"
            }
            Some(_) => {
                "SELECT f.routine_id, f.scheduled_at
                 FROM routine_fires f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[]) AS t(routine_id, scheduled_at)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
                 WHERE f.group_id = $3"
            }
        })
        .bind(&missed_ids)
        .bind(&missed_instants);
        let query = match group {
            None => query,
            Some(group) => query.bind(group),
        };
        let present: std::collections::HashSet<(Uuid, DateTime<Utc>)> = on_store!(self, |e| query
            .fetch_all(e))?
        .into_iter()
        .collect();
        Ok(ids
            .iter()
            .zip(&instants)
            .map(|(id, at)| {
                if settled.contains(&(*id, *at)) {
                    SettleOutcome::Settled
                } else if present.contains(&(*id, *at)) {
                    SettleOutcome::TakenOver
                } else {
                    SettleOutcome::Gone
                }
            })
            .collect())
    }
}

impl PgStore {
    /// Whether the schema is distributed on Citus (`routines` is a distributed table), read
    /// once.
    pub(crate) async fn is_citus(&self) -> Result<bool, StoreError> {
        if let Some(citus) = self.citus.get() {
            return Ok(*citus);
        }
        let citus = on_store_conn!(self, |conn| async {
            let extension: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
            )
            .fetch_one(&mut *conn)
            .await?;
            Ok::<_, sqlx::Error>(
                extension
                    && sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                        WHERE logicalrelid = 'routines'::regclass)",
                    )
                    .fetch_one(&mut *conn)
                    .await?,
            )
        })?;
        Ok(*self.citus.get_or_init(|| citus))
    }

    /// The claim's writes on Citus, one router statement each (see [`SHARD_CLAIM_SQL`]).
    async fn claim_rows_on_one_shard(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        params: &ClaimDueParams,
        claim: &ClaimInput<'_>,
        advance: &Advance,
        group: GroupId,
    ) -> Result<Vec<ClaimedFire>, StoreError> {
        let claims = claim.claims;
        let (ids, instants, origins) = claim.columns();
        let (message, mission) = outbox_kinds(params);
        // Numbers drawn in the order of the occurrences (oldest first), as the one-statement
        // claim draws them.
        let seqs: Vec<i64> = if message || mission {
            sqlx::query_scalar(
                "SELECT nextval('outbox_messages_seq_seq') FROM generate_series(1, $1) ORDER BY 1",
            )
            .bind(i64::try_from(claims.len()).unwrap_or(i64::MAX))
            .fetch_all(&mut **tx)
            .await?
        } else {
            vec![0; claims.len()]
        };
        let upserted: Vec<UpsertedRow> = sqlx::query_as(SHARD_CLAIM_SQL)
            .bind(&ids)
            .bind(&instants)
            .bind(&params.claimant)
            .bind(claim.token.0)
            .bind(lease_seconds(params.lease))
            .bind(&origins)
            .bind(claim.now)
            .bind(&seqs)
            .bind(message)
            .bind(mission)
            .bind(group)
            .bind(&claim.planned)
            .fetch_all(&mut **tx)
            .await?;
        let fresh: Vec<&UpsertedRow> = upserted
            .iter()
            .filter(|r| r.inserted && r.receipt.is_some())
            .collect();
        let written = if fresh.is_empty() {
            0
        } else {
            let keys: Vec<String> = fresh
                .iter()
                .map(|r| {
                    Occurrence::new(r.routine_id, r.scheduled_at)
                        .idempotency_key()
                        .as_str()
                        .to_owned()
                })
                .collect();
            let seqs: Vec<i64> = fresh
                .iter()
                .filter_map(|r| {
                    r.receipt
                        .as_deref()?
                        .strip_prefix("outbox seq ")?
                        .parse()
                        .ok()
                })
                .collect();
            let written: Vec<i64> = sqlx::query_scalar(SHARD_OUTBOX_SQL)
                .bind(fresh.iter().map(|r| r.routine_id).collect::<Vec<_>>())
                .bind(fresh.iter().map(|r| r.scheduled_at).collect::<Vec<_>>())
                .bind(&seqs)
                .bind(&keys)
                .bind(group)
                .fetch_all(&mut **tx)
                .await?;
            written.len()
        };
        if !advance.ids.is_empty() {
            advance
                .bind_claimed(
                    advance
                        .bind(sqlx::query(ADVANCE_GROUP_SQL))
                        .bind(claim.now)
                        .bind(group),
                )
                .execute(&mut **tx)
                .await?;
        }
        let routines: std::collections::HashMap<Uuid, (String, String, Value)> =
            sqlx::query_as::<_, (Uuid, String, String, Value)>(SHARD_ROUTINES_SQL)
                .bind(&ids)
                .bind(group)
                .fetch_all(&mut **tx)
                .await?
                .into_iter()
                .map(|(id, name, kind, payload)| (id, (name, kind, payload)))
                .collect();
        let mut rows: Vec<ClaimedRow> = upserted
            .into_iter()
            .filter_map(|r| {
                let (name, kind, payload) = routines.get(&r.routine_id)?.clone();
                Some(ClaimedRow {
                    inserted: r.inserted,
                    routine_id: r.routine_id,
                    scheduled_at: r.scheduled_at,
                    status: r.status,
                    claimant: r.claimant,
                    claim_token: r.claim_token,
                    attempt: r.attempt,
                    lease_expires_at: r.lease_expires_at,
                    name,
                    kind,
                    origin: r.origin,
                    payload,
                    receipt: r.receipt,
                    error: r.error,
                    first_claimed_at: r.first_claimed_at,
                    planned_at: r.planned_at,
                    written: Some(i64::try_from(written).unwrap_or(i64::MAX)),
                })
            })
            .collect();
        if message || mission {
            mark_unwritten_messages(tx, &mut rows).await?;
        }
        rows.into_iter().map(ClaimedFire::try_from).collect()
    }
}
