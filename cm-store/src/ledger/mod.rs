//! The occurrence ledger, `routine_fires`: the tick's claim, settling, the reaper, and reading
//! fires back.
//!
//! # The claim
//!
//! [`FireLedger::claim_due`] is one transaction of (usually) four statements, `BEGIN` and `COMMIT` among them:
//!
//! 1. one statement reads the database's clock (`now()` is fixed for the whole transaction),
//!    takes the due requests (occurrences asked for by hand; those of missions no more than
//!    the mission room) and locks the due routines, oldest first, with `FOR UPDATE SKIP
//!    LOCKED`, so several schedulers share the due set instead of queueing on it;
//! 2. the domain plans each routine with its misfire policy and the claim with the cap
//!    (`cm-domain`'s [`plan_claim`](cm_domain::plan_claim): routines whole, oldest first;
//!    scheduled missions in what the requested ones left of the mission room);
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
//! claimant, or gone with its routine. It never waits on a row another transaction holds (a
//! caller's open `cm.delete_routine`, a slow statement): it leaves that row out and reports it
//! [`SettleOutcome::Locked`], so a lock held on one routine's rows delays that routine's settles
//! only. The caller comes back to it with [`FireLedger::settle_waiting`], which queues on the
//! row's lock: the reaper skips locked rows instead of queueing, so the claim's own settle takes
//! the row first when its holder lets go, and a lock never makes an occurrence delivered twice.
//!
//! # Where things are
//!
//! - this file: the [`FireLedger`] trait and the types it takes and returns;
//! - `due`: the claim's first statement read back (the clock, the requests, the due routines);
//! - `claim`: the claim's transaction ([`FireLedger::claim_due`]) and its writes;
//! - `advance`: the routines' clocks a claim moves, and where a drain resumes;
//! - `claimed`: the rows the claim and reaper statements return, made [`ClaimedFire`]s;
//! - `settle`: settling claims, one or a batch, and noting an attempt that did not settle;
//! - `reap`: the reaper and the pruning of settled fires;
//! - `list`: listing fires;
//! - `citus`: the claim written per table on Citus, kept on one shard;
//! - `sql`: every statement of the above.

mod advance;
mod citus;
mod claim;
mod claim_news;
mod claimed;
mod due;
mod gate;
mod list;
mod reap;
mod settle;
mod sql;

pub(crate) use citus::shard_claim_queries;
pub(crate) use claim::bind_group;
pub(crate) use due::{due_query, take_requests_query};
pub(crate) use list::{FireRow, list_query};
pub(crate) use reap::{prune_query, reap_query};
pub(crate) use sql::{
    given_up_error_sql, next_occurrence_sql, reason_instant_sql, retry_decision_sql, retry_wait_sql,
};

/// A row a statement recording outcomes wrote: the occurrence (routine and instant), and when
/// its failure is tried again, the retry's instant.
pub(crate) type Written = (Uuid, DateTime<Utc>, Option<DateTime<Utc>>);

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::{
    ClaimOutcome, ClaimRow, ClaimToken, ErrorText, FireCap, FireOrigin, FireOutcome, FireStatus,
    Lease, MisfireRules, Occurrence, RoutineKind, Settlement,
};
use serde_json::Value;
use uuid::Uuid;

use crate::groups::GroupId;
use crate::{FireCursor, PgStore, StoreError};

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
    /// How many retries of the occurrence (after failed outcomes, by its routine's retry
    /// policy) have begun: 0 for its first attempt. A mission's run of retry N is named
    /// `<key>-r<N>` ([`cm_domain::Occurrence::run_name`]).
    pub retry: u32,
    /// The attempt the occurrence's latest retry began with (1 while its first attempt's
    /// claims are the latest): an attempt after it took over a claim whose claimant stopped.
    pub retry_began: u32,
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

/// What a settle found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SettleOutcome {
    /// The claim was still this claimant's: the row is now `fired` or `failed`.
    Settled,
    /// The claim was still this claimant's, and its failure is tried again under its routine's
    /// retry policy: the row stays `claimed`, its lease running out at `at`, when the reaper
    /// takes it over as the next attempt (the attempt's error is kept on the row).
    Retrying {
        /// When the retry is due.
        at: DateTime<Utc>,
    },
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
    /// Not written yet: another transaction holds the row's lock (a caller's open transaction
    /// that deletes or locks the routine, say), and the settle skipped it rather than wait. The
    /// claim is still this claimant's; settle it again later
    /// ([`FireLedger::settle_waiting`]). While the lock is held the reaper skips the row too.
    Locked,
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
    /// How many retries of the occurrence have begun (its routine's retry policy): 0 while
    /// its first attempt is the last.
    pub retry: u32,
    /// What each earlier attempt that was retried met, oldest first; the last attempt's is the
    /// fire's own columns.
    pub tries: Vec<EarlierTry>,
}

/// An attempt of an occurrence that failed and was tried again, as its fire keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EarlierTry {
    /// The attempt's number.
    pub attempt: u32,
    /// `failed` (a failed dispatch, launch or run) or `lost` (a mission's run gone).
    pub outcome: String,
    /// The dispatch's or launch's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A mission run's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why a mission's run failed or was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The tail of a mission run's output (its last 4,000 characters), secrets scrubbed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// When the run started, by its runtime's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// When the run ended, by its runtime's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// When its failure was recorded.
    pub ended_at: DateTime<Utc>,
    /// When the retry after it was due.
    pub retry_at: DateTime<Utc>,
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
    /// row that could be settled is, or (on error) none is. A row another transaction holds
    /// locked is skipped, never waited on, and reported [`SettleOutcome::Locked`]: one locked
    /// row never fails the batch.
    async fn settle_fires(&self, settles: &[FireSettle]) -> Result<Vec<SettleOutcome>, StoreError>;

    /// Settles one claim that a settle found [`SettleOutcome::Locked`], waiting up to `wait` for
    /// its row's lock. Queued on the lock, it takes the row as soon as its holder lets go, ahead
    /// of any reaper (which skips locked rows). [`SettleOutcome::Locked`] again when the holder
    /// kept it past `wait`; nothing changed then. By default, a [`FireLedger::settle_fires`] of
    /// the one settle, which does not wait.
    async fn settle_waiting(
        &self,
        settle: &FireSettle,
        wait: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        let _ = wait;
        Ok(self
            .settle_fires(std::slice::from_ref(settle))
            .await?
            .pop()
            .unwrap_or(SettleOutcome::Unwritten))
    }

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
    /// oldest occurrence first. Returns how many it deleted. Rows still `claimed` are never
    /// pruned.
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

/// How many of a tick's `cap` claims are kept for occurrences asked for by hand (a fifth, at
/// least one), so a sustained backlog of scheduled work cannot starve a trigger or a backfill.
pub fn request_share(cap: usize) -> usize {
    (cap / 5).max(1)
}

#[async_trait]
impl FireLedger for PgStore {
    async fn claim_due(&self, params: &ClaimDueParams) -> Result<TickClaim, StoreError> {
        claim::claim_due(self, params).await
    }

    async fn settle_fire(
        &self,
        fire: &FireRef,
        settlement: &Settlement,
    ) -> Result<SettleOutcome, StoreError> {
        settle::settle_fire(self, fire, settlement).await
    }

    async fn settle_fires(&self, settles: &[FireSettle]) -> Result<Vec<SettleOutcome>, StoreError> {
        settle::settle_fires(self, settles).await
    }

    async fn settle_waiting(
        &self,
        settle: &FireSettle,
        wait: Duration,
    ) -> Result<SettleOutcome, StoreError> {
        settle::settle_waiting(self, settle, wait).await
    }

    async fn reap_expired(&self, params: &ReapParams) -> Result<TickClaim, StoreError> {
        reap::reap_expired(self, params).await
    }

    async fn note_unsettled(&self, fire: &FireRef, error: &ErrorText) -> Result<bool, StoreError> {
        settle::note_unsettled(self, fire, error).await
    }

    async fn list_fires(&self, filter: &FireFilter) -> Result<Vec<Fire>, StoreError> {
        list::list_fires(self, filter).await
    }

    async fn prune_settled(&self, retention: Duration, limit: u32) -> Result<u64, StoreError> {
        reap::prune_settled(self, None, retention, limit).await
    }

    async fn prune_settled_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        reap::prune_settled(self, Some(group), retention, limit).await
    }
}
