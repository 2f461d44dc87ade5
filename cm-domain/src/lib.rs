//! The pure domain of cm: schedules and daylight-saving rules, misfire policies, the claim state
//! machine and tick planning.
//!
//! Nothing in this crate does I/O, reads a clock or depends on a runtime or database crate. Every
//! function that needs the time takes `now` as an argument and returns a decision, which is what
//! lets the rules be property-tested and lets other services import them cheaply (an API service
//! validates a schedule with [`Schedule::parse`] before it stores a routine).
//!
//! # The pieces
//!
//! - [`schedule`]: a cron expression in an IANA zone, parsed once into a [`Schedule`], and
//!   [`Schedule::next_after`], which follows the Vixie-cron daylight-saving rule.
//! - [`misfire`]: what to do with occurrences found late ([`MisfirePolicy`], [`plan_due`]).
//! - [`claim`]: the claim state machine: the row a claim statement returns is turned into a
//!   [`ClaimOutcome`] (Fresh, Retry, InFlight or Settled), and a dispatch result into a
//!   [`Settlement`].
//! - [`tick`]: which of the due occurrences one tick fires under the cap, and where each routine's
//!   clock moves to ([`plan_claim`]; [`plan_tick`] is it with no
//!   routine limited).
//! - [`config`]: validated scheduler settings ([`SchedulerConfig`]), so a dispatch can never
//!   outlive its lease.
//! - [`occurrence`]: one scheduled instant of a routine and its [`IdempotencyKey`].
//! - [`backfill`]: the occurrences of a past window, asked for by hand.
//! - [`name`]: routine names ([`RoutineName`]): unique handles people type, safe to print.
//! - [`definition`]: the checks every path that writes a routine makes: its name, its payload
//!   for its kind, its overlap policy and its run limit ([`DefinitionError`]).
//! - [`mission`]: the mission file of a mission routine, validated field by field ([`Mission`]),
//!   and what the operator allows a routine to ask for ([`MissionPolicy`]).
//! - [`repository`]: a mission's repository split once whatever its form, its host read as a
//!   name or an address, and the addresses a mission may never reach.
//! - [`event`]: the changes a person must hear about ([`EventType`]), one per decision.
//! - [`outcome`]: what a fire's effect did ([`FireOutcome`]): its dispatch, or its mission's
//!   run; what every count of failures counts.
//! - [`routine`]: what a routine does when it fires ([`RoutineKind`]) and whether it still
//!   runs ([`RoutineState`]).
//! - [`run`]: a mission's run watched after its launch ([`RunState`]), and the routine's
//!   [`OverlapPolicy`] when runs would overlap ([`decide_overlap`]).
//!
//! # Example
//!
//! ```
//! use cm_domain::Schedule;
//! use chrono::{TimeZone, Utc};
//!
//! let daily = Schedule::parse("30 2 * * *", "America/New_York").unwrap();
//! // 02:30 does not exist on 2025-03-09 in New York: a fixed-time job runs at 03:00 EDT.
//! let after = Utc.with_ymd_and_hms(2025, 3, 8, 12, 0, 0).unwrap();
//! assert_eq!(
//!     daily.next_after(after).unwrap(),
//!     Utc.with_ymd_and_hms(2025, 3, 9, 7, 0, 0).unwrap(),
//! );
//! ```

/// The crate's README, whose example is compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The most bytes of a message routine's text (it is copied into every fire's message).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

pub mod backfill;
pub mod calendar;
pub mod claim;
pub mod config;
pub mod definition;
pub mod event;
pub mod jitter;
pub mod limit;
pub mod misfire;
pub mod mission;
pub mod name;
pub mod occurrence;
pub mod outcome;
pub mod repository;
pub mod retry;
pub mod routine;
pub mod rules;
pub mod run;
pub mod schedule;
pub mod tick;
pub mod trace;

pub use backfill::{BackfillError, MAX_BACKFILL, RETENTION_MARGIN, backfill_occurrences};
pub use calendar::{Calendar, CalendarError, OnHoliday, ParseOnHolidayError};
pub use claim::{
    ClaimAction, ClaimOutcome, ClaimRow, ClaimToken, ErrorText, FireStatus, ParseFireStatusError,
    SettleError, Settlement,
};
pub use config::{ConfigError, FireCap, Lease, SchedulerConfig};
pub use definition::DefinitionError;
pub use event::{EventType, UnknownEventType};
pub use limit::{ConcurrencyKey, LimitError};
pub use misfire::{
    DuePlan, MisfirePolicy, MisfireRules, ParseMisfirePolicyError, plan_due, plan_routine_due,
};
pub use mission::{Mission, MissionError, MissionPolicy};
pub use name::{MAX_NAME_CHARS, RoutineName, RoutineNameError};
pub use occurrence::{FireOrigin, IdempotencyKey, Occurrence, ParseFireOriginError, RoutineId};
pub use outcome::{FireOutcome, ParseFireOutcomeError};
pub use retry::{Backoff, RetryDecision, RetryError, RetryPolicy};
pub use routine::{RoutineKind, RoutineState};
pub use rules::{MAX_EVERY_SECONDS, ScheduleText, duration_text, parse_duration, parse_time};
pub use run::{
    BufferPlan, OverlapDecision, OverlapPolicy, ParseOverlapPolicyError, ParseRunStateError,
    RunHolder, RunState, RunStateName, buffer_plan, decide_overlap,
};
pub use schedule::{
    Field, MAX_EXPRESSION_CHARS, MAX_RRULE_COUNT, MAX_SCHEDULE_CHARS, Occurrences, Schedule,
    ScheduleError, Zone, ZoneError, rrule_needs_start,
};
pub use tick::{DueRoutine, RoutineAdvance, TickPlan, plan_claim, plan_tick};
