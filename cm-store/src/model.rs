//! The routine types the store's modules share: a routine as stored and as created, a change to
//! one, what an import wrote, a page's cursor and pending requests. [`crate::routines`] (the
//! [`RoutineStore`](crate::RoutineStore) trait) and [`crate::catalog`] (its statements) both
//! take them from here, so neither imports the other's types.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use cm_domain::{MisfirePolicy, OverlapPolicy, Schedule, Zone};
use serde_json::Value;
use uuid::Uuid;

use crate::StoreError;

/// What a routine does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutineKind {
    /// Posts a message (the payload) through the message backend.
    Message,
    /// Launches a container through the mission backend.
    Mission,
}

impl RoutineKind {
    /// The kind as stored: `message` or `mission`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutineKind::Message => "message",
            RoutineKind::Mission => "mission",
        }
    }
}

impl fmt::Display for RoutineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for RoutineKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl FromStr for RoutineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "message" => Ok(RoutineKind::Message),
            "mission" => Ok(RoutineKind::Mission),
            other => Err(format!(
                "unknown routine kind {other:?} (expected message or mission)"
            )),
        }
    }
}

/// A routine to create. The schedule is already parsed, so an invalid one cannot be stored.
#[derive(Debug, Clone)]
pub struct NewRoutine {
    /// A name for people, unique (check it with `cm_domain::RoutineName`).
    pub name: String,
    /// When it runs.
    pub schedule: Schedule,
    /// What it does.
    pub kind: RoutineKind,
    /// What the backend receives: the message, or the mission's description.
    pub payload: Value,
    /// What to do with occurrences found late.
    pub misfire: MisfirePolicy,
    /// What a mission's occurrence does while an earlier run is still running. A message
    /// routine has no run to overlap: it takes the default (`forbid`), and the store refuses
    /// another policy for one ([`StoreError::InvalidRoutine`]).
    pub overlap: OverlapPolicy,
    /// Created paused: never due until resumed.
    pub paused: bool,
    /// A run limit: at most this many scheduled occurrences fire, then the routine is
    /// finished. `None` is no limit.
    pub runs_left: Option<u32>,
}

/// A stored routine.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize)]
pub struct Routine {
    /// Its id.
    pub id: Uuid,
    /// Its group ([`crate::group_of`] of its id): every row of the routine carries it.
    pub group_id: i16,
    /// Its name.
    pub name: String,
    /// The cron expression as written.
    pub schedule: String,
    /// The IANA zone the expression is read in.
    pub timezone: String,
    /// `message` or `mission`.
    #[sqlx(try_from = "String")]
    pub kind: RoutineKind,
    /// What the backend receives.
    pub payload: Value,
    /// `fire-once`, `catch-up` or `skip`.
    pub misfire_policy: String,
    /// What a mission's occurrence does while an earlier run is still running: `allow`,
    /// `forbid` (the default) or `replace`. Meaningless for messages.
    pub overlap: String,
    /// Whether it is paused.
    pub paused: bool,
    /// Why cm paused it by itself (its last fires all failed); `None` when it runs or a person
    /// paused it.
    pub paused_reason: Option<String>,
    /// Its next occurrence; `None` while paused or when the schedule has no more.
    pub next_run_at: Option<DateTime<Utc>>,
    /// When a tick last claimed occurrences of it.
    pub last_run_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last changed.
    pub updated_at: DateTime<Utc>,
    /// The file `routine import --sync` keeps it in step with; `None` for a routine made by
    /// hand or imported without a source.
    pub source: Option<String>,
    /// How many more scheduled occurrences it may fire (`--limit-runs`); `None` is no limit.
    pub runs_left: Option<i32>,
}

impl Routine {
    /// The parsed schedule.
    pub fn parsed_schedule(&self) -> Result<Schedule, StoreError> {
        Schedule::parse(&self.schedule, &self.timezone).map_err(|e| StoreError::CorruptRoutine {
            routine_id: self.id,
            reason: e.to_string(),
        })
    }

    /// Whether the routine is *finished*: not paused, and its schedule owes nothing after
    /// `now` (its window closed, its one instant fired, or its run limit is spent). It fires no more unless an edit
    /// gives it occurrences again.
    pub fn is_finished(&self, now: DateTime<Utc>) -> bool {
        !self.paused
            && self.next_run_at.is_none()
            && (self.runs_left == Some(0)
                || self.parsed_schedule().is_ok_and(|s| s.is_over_after(now)))
    }

    /// `active`, `paused` or `finished` (see [`Routine::is_finished`]).
    pub fn state(&self, now: DateTime<Utc>) -> &'static str {
        if self.paused {
            "paused"
        } else if self.is_finished(now) {
            "finished"
        } else {
            "active"
        }
    }

    /// The parsed misfire policy.
    pub fn misfire(&self) -> Result<MisfirePolicy, StoreError> {
        self.misfire_policy
            .parse()
            .map_err(
                |e: cm_domain::ParseMisfirePolicyError| StoreError::CorruptRoutine {
                    routine_id: self.id,
                    reason: e.to_string(),
                },
            )
    }
}

/// Where a page of `routine list` ends: the next page starts after this routine, in
/// `(created_at, id)` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutineCursor {
    /// The last listed routine's creation time.
    pub created_at: DateTime<Utc>,
    /// The last listed routine's id.
    pub id: Uuid,
}

impl RoutineCursor {
    /// The cursor after `routine`.
    pub fn after(routine: &Routine) -> RoutineCursor {
        RoutineCursor {
            created_at: routine.created_at,
            id: routine.id,
        }
    }
}

/// What a routine does, changed as one: its kind and the payload that kind expects.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutineAction {
    /// Message or mission.
    pub kind: RoutineKind,
    /// What the backend receives.
    pub payload: Value,
}

/// A change to a routine; `None` leaves a setting as it is. A change of expression or zone
/// recomputes the next run from the database's clock (unless the routine is paused); claims
/// already taken and the fire history are untouched.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoutineUpdate {
    /// A new name (already checked with `cm_domain::RoutineName`).
    pub name: Option<String>,
    /// A new cron expression, read in the new zone if one is given, else in the current one.
    pub expression: Option<String>,
    /// A new zone for the (new or current) expression.
    pub zone: Option<Zone>,
    /// A new misfire policy.
    pub misfire: Option<MisfirePolicy>,
    /// A new kind and payload.
    pub action: Option<RoutineAction>,
    /// A new overlap policy: only a mission routine (after the change) has one, and the store
    /// refuses it for a message routine ([`StoreError::InvalidRoutine`]).
    pub overlap: Option<cm_domain::OverlapPolicy>,
    /// A new run limit: `Some(Some(n))` lets it fire `n` more scheduled occurrences (and
    /// revives a routine whose limit was spent), `Some(None)` removes the limit.
    pub runs_left: Option<Option<u32>>,
}

/// One routine an import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedRoutine {
    /// The routine as stored.
    pub routine: Routine,
    /// Whether the import created it (otherwise it updated the routine of that name).
    pub created: bool,
}

/// An occurrence asked for by hand that no tick has claimed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct PendingRequest {
    /// The occurrence asked for.
    pub scheduled_at: DateTime<Utc>,
    /// When it was asked for.
    pub requested_at: DateTime<Utc>,
}

impl PendingRequest {
    /// Whether it is a manual trigger (an occurrence at the instant it was asked for) rather
    /// than a backfilled past occurrence.
    pub fn is_trigger(&self) -> bool {
        self.scheduled_at == self.requested_at
    }
}

/// A routine's pending requests: how many, and the oldest few.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingRequests {
    /// How many are pending.
    pub total: u64,
    /// The oldest occurrences, at most the limit asked for.
    pub oldest: Vec<PendingRequest>,
}

/// What a sync did to one routine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAction {
    /// The file has a routine the source did not: created.
    Created,
    /// The file changes a routine of the source (or claims one of its name without a source):
    /// updated in place, its history kept.
    Updated,
    /// A routine without a source that a line of the file names, or whose schedule and
    /// payload a line has: it joins the source (its settings made the line's, its history
    /// kept), so a plain import followed by a sync converges to the file.
    Adopted,
    /// The file has the routine as stored: not written.
    Unchanged,
    /// The source has a routine the file no longer has: deleted with its fires.
    Deleted,
}

impl SyncAction {
    /// The action as the command line prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncAction::Created => "created",
            SyncAction::Updated => "updated",
            SyncAction::Adopted => "adopted",
            SyncAction::Unchanged => "unchanged",
            SyncAction::Deleted => "deleted",
        }
    }
}

/// One routine a sync touched: as stored after it (as it was, for one deleted).
#[derive(Debug, Clone, PartialEq)]
pub struct SyncedRoutine {
    /// The routine.
    pub routine: Routine,
    /// What the sync did to it.
    pub action: SyncAction,
}
