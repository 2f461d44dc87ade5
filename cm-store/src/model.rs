//! The routine types the store's modules share: a routine as stored and as created, a change to
//! one, what an import wrote, a page's cursor and pending requests. [`crate::routines`] (the
//! [`RoutineStore`](crate::RoutineStore) trait) and [`crate::catalog`] (its statements) both
//! take them from here, so neither imports the other's types.

use chrono::{DateTime, Utc};
use cm_domain::definition::{self, DefinitionError};
use cm_domain::{
    ConcurrencyKey, MisfirePolicy, MissionPolicy, OnHoliday, OverlapPolicy, RetryPolicy,
    RoutineKind, RoutineState, Schedule, Zone,
};
use serde_json::Value;
use uuid::Uuid;

use crate::StoreError;

/// A routine to create, checked whole when it is built ([`NewRoutine::builder`]): its name is
/// the domain's (trimmed, printable, not an id), its schedule is parsed, its payload is what its
/// kind needs, a message has no overlap policy and a run limit is at least 1. So an invalid
/// routine cannot be stored by any path, and everything `routine create` can set (overlap,
/// misfire, paused, a run limit) is written in the one insert, in the caller's transaction.
///
/// ```
/// use cm_domain::{MisfirePolicy, Schedule};
/// use cm_store::NewRoutine;
///
/// let standup = NewRoutine::message("standup", Schedule::parse("0 9 * * MON-FRI", "UTC")?, "in 5")
///     .misfire(MisfirePolicy::Skip)
///     .build()?;
/// assert_eq!(standup.name(), "standup");
///
/// let refused = NewRoutine::message("  ", Schedule::parse("@daily", "UTC")?, "hi").build();
/// assert_eq!(refused.unwrap_err().to_string(), "the name must not be empty");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NewRoutine {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) kind: RoutineKind,
    pub(crate) payload: Value,
    pub(crate) misfire: MisfirePolicy,
    pub(crate) overlap: OverlapPolicy,
    pub(crate) paused: bool,
    pub(crate) runs_left: Option<u32>,
    pub(crate) calendar: Option<String>,
    pub(crate) on_holiday: OnHoliday,
    pub(crate) deadline: Option<std::time::Duration>,
    pub(crate) retry: RetryPolicy,
    pub(crate) concurrency_key: Option<ConcurrencyKey>,
}

/// A [`NewRoutine`] being put together: every setting but the name, schedule, kind and payload
/// has the default `routine create` gives it (misfires fire once, overlap `forbid`, not paused,
/// no run limit). Nothing is checked until [`NewRoutineBuilder::build`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until built"]
pub struct NewRoutineBuilder {
    routine: NewRoutine,
    policy: Option<MissionPolicy>,
}

impl NewRoutine {
    /// A routine named `name` (trimmed when built), on `schedule`, of `kind`, carrying
    /// `payload` (`{"text": TEXT}` for a message, the mission file's JSON for a mission).
    pub fn builder(
        name: impl Into<String>,
        schedule: Schedule,
        kind: RoutineKind,
        payload: Value,
    ) -> NewRoutineBuilder {
        NewRoutineBuilder {
            routine: NewRoutine {
                name: name.into(),
                schedule,
                kind,
                payload,
                misfire: MisfirePolicy::default(),
                overlap: OverlapPolicy::default(),
                paused: false,
                runs_left: None,
                calendar: None,
                on_holiday: OnHoliday::Skip,
                deadline: None,
                retry: RetryPolicy::default(),
                concurrency_key: None,
            },
            policy: None,
        }
    }

    /// A message routine posting `text`.
    pub fn message(name: impl Into<String>, schedule: Schedule, text: &str) -> NewRoutineBuilder {
        Self::builder(
            name,
            schedule,
            RoutineKind::Message,
            serde_json::json!({ "text": text }),
        )
    }

    /// A mission routine launching `mission` (a mission file's JSON).
    pub fn mission(
        name: impl Into<String>,
        schedule: Schedule,
        mission: Value,
    ) -> NewRoutineBuilder {
        Self::builder(name, schedule, RoutineKind::Mission, mission)
    }

    /// Its name, as it is stored (trimmed).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When it runs.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// What it does.
    pub fn kind(&self) -> RoutineKind {
        self.kind
    }

    /// What the backend receives: the message, or the mission's description.
    pub fn payload(&self) -> &Value {
        &self.payload
    }

    /// What to do with occurrences found late.
    pub fn misfire(&self) -> MisfirePolicy {
        self.misfire
    }

    /// What a mission's occurrence does while an earlier run is still running (`forbid` for a
    /// message routine, which has no run).
    pub fn overlap(&self) -> OverlapPolicy {
        self.overlap
    }

    /// Whether it is created paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Its run limit: at most this many scheduled occurrences fire; `None` is no limit.
    pub fn runs_left(&self) -> Option<u32> {
        self.runs_left
    }

    /// The holiday calendar it is on, by name, if any ([`cm_domain::calendar`]).
    pub fn calendar(&self) -> Option<&str> {
        self.calendar.as_deref()
    }

    /// What an occurrence on a day off of its calendar does (`skip` without a calendar).
    pub fn on_holiday(&self) -> OnHoliday {
        self.on_holiday
    }

    /// Its deadline: an occurrence not succeeded this long after its planned instant raises
    /// `routine.deadline_missed`; `None` is no deadline.
    pub fn deadline(&self) -> Option<std::time::Duration> {
        self.deadline
    }

    /// Its retry policy: how often a failed occurrence is tried again, and after what wait.
    pub fn retry(&self) -> RetryPolicy {
        self.retry
    }

    /// The concurrency key whose limit it shares, if any.
    pub fn concurrency_key(&self) -> Option<&ConcurrencyKey> {
        self.concurrency_key.as_ref()
    }

    /// This routine as a builder again, to change a setting (and be checked again).
    pub fn into_builder(self) -> NewRoutineBuilder {
        NewRoutineBuilder {
            routine: self,
            policy: None,
        }
    }
}

impl NewRoutineBuilder {
    /// What to do with occurrences found late (default: fire once).
    pub fn misfire(mut self, misfire: MisfirePolicy) -> Self {
        self.routine.misfire = misfire;
        self
    }

    /// What a mission's occurrence does while an earlier run is still running (default:
    /// `forbid`). A message routine may have only the default.
    pub fn overlap(mut self, overlap: OverlapPolicy) -> Self {
        self.routine.overlap = overlap;
        self
    }

    /// Created paused: never due until resumed (default: not paused).
    pub fn paused(mut self, paused: bool) -> Self {
        self.routine.paused = paused;
        self
    }

    /// At most `limit` scheduled occurrences fire, then the routine is finished; `None` (the
    /// default) is no limit. A limit is 1 to [`cm_domain::definition::MAX_RUN_LIMIT`].
    pub fn run_limit(mut self, limit: Option<u32>) -> Self {
        self.routine.runs_left = limit;
        self
    }

    /// On the holiday calendar named `calendar` (`None`: on none, the default), an occurrence
    /// on one of its days off treated by `on_holiday` ([`cm_domain::calendar`]). The calendar
    /// is read, and the schedule checked against the policy, when the routine is written: an
    /// unknown calendar is [`StoreError::CalendarNotFound`].
    pub fn calendar(mut self, calendar: Option<String>, on_holiday: OnHoliday) -> Self {
        self.routine.calendar = calendar;
        self.routine.on_holiday = on_holiday;
        self
    }

    /// An occurrence not succeeded `deadline` after its planned instant raises
    /// `routine.deadline_missed` (default: no deadline). Whole seconds, 1 s to 366 days.
    pub fn deadline(mut self, deadline: Option<std::time::Duration>) -> Self {
        self.routine.deadline = deadline;
        self
    }

    /// A failed outcome is tried again under `retry` (default: no retry). Checked when built.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.routine.retry = retry;
        self
    }

    /// Shares the limit of `key` with the other routines of that key (default: none, unlimited
    /// as a routine without a key is); see [`cm_domain::limit`].
    pub fn concurrency_key(mut self, key: Option<ConcurrencyKey>) -> Self {
        self.routine.concurrency_key = key;
        self
    }

    /// A mission must also be one the operator's `policy` allows (its env names, label keys
    /// and repository host), as `routine create --mission` checks it. Without one, only the
    /// mission's own fields are checked (and the policy again at every dispatch).
    pub fn mission_policy(mut self, policy: &MissionPolicy) -> Self {
        self.policy = Some(policy.clone());
        self
    }

    /// The routine, checked whole by `cm_domain::definition`: its name (stored trimmed), its
    /// payload for its kind, its overlap policy and its run limit. The first refusal is the
    /// error, in one line.
    pub fn build(self) -> Result<NewRoutine, DefinitionError> {
        let NewRoutineBuilder {
            mut routine,
            policy,
        } = self;
        routine.name = definition::checked_name(&routine.name)?.into_string();
        definition::check_payload(routine.kind, &routine.payload, policy.as_ref())?;
        definition::check_overlap(routine.kind, routine.overlap)?;
        definition::check_run_limit(routine.runs_left)?;
        definition::check_deadline(routine.deadline)?;
        routine
            .retry
            .check()
            .map_err(|e| DefinitionError::Retry(e.to_string()))?;
        definition::check_limited_schedule(routine.schedule.expression(), routine.runs_left)?;
        Ok(routine)
    }
}

/// A stored routine, its policies typed (the database's checks refuse any other value).
///
/// The schedule stays the text it was stored as, expression and zone: a routine whose stored
/// schedule the domain refuses (written by hand, or by an older version) is still read, so an
/// operator can see, fix or delete it; [`Routine::parsed_schedule`] parses it.
#[derive(Debug, Clone, PartialEq)]
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
    /// What it does when it fires.
    pub kind: RoutineKind,
    /// What the backend receives.
    pub payload: Value,
    /// What to do with occurrences found late.
    pub misfire_policy: MisfirePolicy,
    /// What a mission's occurrence does while an earlier run is still running (`forbid` by
    /// default). Meaningless for messages.
    pub overlap: OverlapPolicy,
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
    /// The file `routine import` wrote it from, which `--sync` keeps it in step with; `None`
    /// for a routine made by hand or imported without a source (from standard input without
    /// `--source`).
    pub source: Option<String>,
    /// How many more scheduled occurrences it may fire (`--limit-runs`); `None` is no limit.
    pub runs_left: Option<u32>,
    /// The holiday calendar it is on, by name ([`crate::CalendarStore`]); `None` for none.
    pub calendar: Option<String>,
    /// What an occurrence on a day off of its calendar does (`skip` without a calendar).
    pub on_holiday: OnHoliday,
    /// How long after its planned instant an occurrence must have succeeded (`--deadline`);
    /// `None` is no deadline.
    pub deadline: Option<std::time::Duration>,
    /// How a failed occurrence is tried again (`--retries`, `--retry-backoff`).
    pub retry: RetryPolicy,
    /// The concurrency key whose limit it shares (`--concurrency-key`); `None` for none.
    pub concurrency_key: Option<ConcurrencyKey>,
}

impl Routine {
    /// The parsed schedule.
    pub fn parsed_schedule(&self) -> Result<Schedule, StoreError> {
        Schedule::parse(&self.schedule, &self.timezone).map_err(|e| StoreError::CorruptRoutine {
            routine_id: self.id,
            reason: e.to_string(),
        })
    }

    /// Its schedule read as a person would say it, its calendar and on-holiday policy named
    /// ([`Schedule::in_words_on`]); `None` if the stored schedule does not parse.
    pub fn schedule_words(&self) -> Option<String> {
        let schedule = self.parsed_schedule().ok()?;
        Some(match &self.calendar {
            Some(calendar) => schedule.in_words_on(calendar, self.on_holiday),
            None => schedule.in_words(),
        })
    }

    /// Whether it is active, paused or finished at `now` ([`RoutineState::of`]).
    pub fn state(&self, now: DateTime<Utc>) -> RoutineState {
        RoutineState::of(
            self.paused,
            self.next_run_at,
            self.runs_left,
            self.parsed_schedule().ok().as_ref(),
            now,
        )
    }

    /// Whether it is [`RoutineState::Finished`] at `now`.
    pub fn is_finished(&self, now: DateTime<Utc>) -> bool {
        self.state(now) == RoutineState::Finished
    }
}

/// A routine as the store prints it in JSON: its policies by their names, as stored.
#[derive(serde::Serialize)]
struct RoutineJson<'a> {
    id: Uuid,
    group_id: i16,
    name: &'a str,
    schedule: &'a str,
    timezone: &'a str,
    kind: &'static str,
    payload: &'a Value,
    misfire_policy: &'static str,
    overlap: &'static str,
    paused: bool,
    paused_reason: Option<&'a str>,
    next_run_at: Option<DateTime<Utc>>,
    last_run_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    source: Option<&'a str>,
    runs_left: Option<u32>,
    calendar: Option<&'a str>,
    on_holiday: &'static str,
    deadline_secs: Option<u64>,
    retries: u32,
    retry_backoff_secs: u64,
    retry_backoff_max_secs: u64,
    concurrency_key: Option<&'a str>,
}

impl serde::Serialize for Routine {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RoutineJson {
            id: self.id,
            group_id: self.group_id,
            name: &self.name,
            schedule: &self.schedule,
            timezone: &self.timezone,
            kind: self.kind.as_str(),
            payload: &self.payload,
            misfire_policy: self.misfire_policy.as_str(),
            overlap: self.overlap.as_str(),
            paused: self.paused,
            paused_reason: self.paused_reason.as_deref(),
            next_run_at: self.next_run_at,
            last_run_at: self.last_run_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
            source: self.source.as_deref(),
            runs_left: self.runs_left,
            calendar: self.calendar.as_deref(),
            on_holiday: self.on_holiday.as_str(),
            deadline_secs: self.deadline.map(|d| d.as_secs()),
            retries: self.retry.retries,
            retry_backoff_secs: self.retry.backoff.base.as_secs(),
            retry_backoff_max_secs: self.retry.backoff.max.as_secs(),
            concurrency_key: self.concurrency_key.as_ref().map(ConcurrencyKey::as_str),
        }
        .serialize(serializer)
    }
}

/// A row of `routines` as PostgreSQL returns it (`SELECT *`), before its policies are read.
#[derive(sqlx::FromRow)]
pub(crate) struct RoutineRow {
    id: Uuid,
    group_id: i16,
    name: String,
    schedule: String,
    timezone: String,
    kind: String,
    payload: Value,
    misfire_policy: String,
    overlap: String,
    paused: bool,
    paused_reason: Option<String>,
    next_run_at: Option<DateTime<Utc>>,
    last_run_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    source: Option<String>,
    runs_left: Option<i32>,
    calendar: Option<String>,
    on_holiday: String,
    deadline_secs: Option<i32>,
    retries: i16,
    retry_backoff_secs: i32,
    retry_backoff_max_secs: i32,
    concurrency_key: Option<String>,
}

impl TryFrom<RoutineRow> for Routine {
    type Error = StoreError;

    /// The row's policies read; a value the domain does not know (the database's checks
    /// bypassed, or written by a newer version) is [`StoreError::CorruptRoutine`], naming the
    /// routine and the column.
    fn try_from(r: RoutineRow) -> Result<Routine, StoreError> {
        let corrupt = |column: &str, reason: String| StoreError::CorruptRoutine {
            routine_id: r.id,
            reason: format!("its {column}: {reason}"),
        };
        let kind = r.kind.parse().map_err(|e| corrupt("kind", e))?;
        let misfire_policy =
            r.misfire_policy
                .parse()
                .map_err(|e: cm_domain::ParseMisfirePolicyError| {
                    corrupt("misfire_policy", e.to_string())
                })?;
        let overlap = r
            .overlap
            .parse()
            .map_err(|e: cm_domain::ParseOverlapPolicyError| corrupt("overlap", e.to_string()))?;
        let runs_left = r
            .runs_left
            .map(u32::try_from)
            .transpose()
            .map_err(|e| corrupt("runs_left", e.to_string()))?;
        let on_holiday = r
            .on_holiday
            .parse()
            .map_err(|e: cm_domain::ParseOnHolidayError| corrupt("on_holiday", e.to_string()))?;
        let deadline = r
            .deadline_secs
            .map(u64::try_from)
            .transpose()
            .map_err(|e| corrupt("deadline_secs", e.to_string()))?
            .map(std::time::Duration::from_secs);
        let secs = |column: &str, value: i32| {
            u64::try_from(value)
                .map(std::time::Duration::from_secs)
                .map_err(|e| corrupt(column, e.to_string()))
        };
        let retry = RetryPolicy::new(
            u32::try_from(r.retries).map_err(|e| corrupt("retries", e.to_string()))?,
            secs("retry_backoff_secs", r.retry_backoff_secs)?,
            secs("retry_backoff_max_secs", r.retry_backoff_max_secs)?,
        )
        .map_err(|e| corrupt("retry policy", e.to_string()))?;
        let concurrency_key = r
            .concurrency_key
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e: cm_domain::LimitError| corrupt("concurrency_key", e.to_string()))?;
        Ok(Routine {
            id: r.id,
            group_id: r.group_id,
            name: r.name,
            schedule: r.schedule,
            timezone: r.timezone,
            kind,
            payload: r.payload,
            misfire_policy,
            overlap,
            paused: r.paused,
            paused_reason: r.paused_reason,
            next_run_at: r.next_run_at,
            last_run_at: r.last_run_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            source: r.source,
            runs_left,
            calendar: r.calendar,
            on_holiday,
            deadline,
            retry,
            concurrency_key,
        })
    }
}

/// Rows of `routines`, read (see [`RoutineRow`]).
pub(crate) fn routines_of(rows: Vec<RoutineRow>) -> Result<Vec<Routine>, StoreError> {
    rows.into_iter().map(Routine::try_from).collect()
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
    /// A new holiday calendar, by name: `Some(Some(name))` puts it on one, `Some(None)` takes
    /// it off its calendar. Its next run is computed again.
    pub calendar: Option<Option<String>>,
    /// A new policy for an occurrence on a day off. Its next run is computed again.
    pub on_holiday: Option<OnHoliday>,
    /// A new deadline: `Some(Some(d))` sets it, `Some(None)` removes it.
    pub deadline: Option<Option<std::time::Duration>>,
    /// A new number of retries; the backoff stays unless `retry_backoff` is given too.
    pub retries: Option<u32>,
    /// A new backoff between retries; the number of retries stays unless `retries` is given.
    pub retry_backoff: Option<cm_domain::Backoff>,
    /// A new concurrency key: `Some(Some(key))` sets it, `Some(None)` removes it.
    pub concurrency_key: Option<Option<ConcurrencyKey>>,
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
    /// A routine without a source (made by hand, or imported without one) that a line of the
    /// file names, or whose payload a line has under a name the source gave it: it joins the
    /// source (its settings made the line's, its history kept).
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
