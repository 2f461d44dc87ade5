//! Misfire policies: what a routine does with occurrences found late (the scheduler was down,
//! the clock jumped, the fleet was overloaded).
//!
//! An occurrence found no more than the grace period late is on time and always fires. Older
//! ones are *misfires*, and the routine's [`MisfirePolicy`] decides which of them fire:
//!
//! | policy | misfires that fire | the rest |
//! |---|---|---|
//! | `fire-once` (default) | the latest | skipped, counted |
//! | `catch-up` | all, oldest first, up to `max_backlog` (the latest ones) | older ones coalesce: skipped, counted |
//! | `skip` | none | skipped, counted |
//!
//! [`plan_due`] walks a routine's occurrences from its due instant, computing each next one from
//! the exact previous instant (so a walk through a fall-back overlap stays on the right pass).
//! The walk is bounded by [`MisfireRules::max_scan`]: a routine that missed more occurrences
//! than that (an every-second schedule after a week's outage) is walked over several ticks,
//! each moving its clock forward past misfires that are certainly skipped, and fires once the
//! walk reaches the end of the backlog. Nothing is dropped without being counted.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::config::SchedulerConfig;
use crate::schedule::Schedule;

/// What a routine does with occurrences found more than the grace period late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MisfirePolicy {
    /// The latest missed occurrence fires; older ones are counted as skipped.
    #[default]
    FireOnce,
    /// Every missed occurrence fires, oldest first, up to the maximum backlog (the latest
    /// ones); older ones coalesce and are counted as skipped.
    CatchUp,
    /// No missed occurrence fires; the routine waits for its next on-time occurrence.
    Skip,
}

impl MisfirePolicy {
    /// The policy's name as stored and typed: `fire-once`, `catch-up` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            MisfirePolicy::FireOnce => "fire-once",
            MisfirePolicy::CatchUp => "catch-up",
            MisfirePolicy::Skip => "skip",
        }
    }
}

impl fmt::Display for MisfirePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not `fire-once`, `catch-up` or `skip`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown misfire policy {0:?} (expected fire-once, catch-up or skip)")]
pub struct ParseMisfirePolicyError(pub String);

impl FromStr for MisfirePolicy {
    type Err = ParseMisfirePolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fire-once" => Ok(MisfirePolicy::FireOnce),
            "catch-up" => Ok(MisfirePolicy::CatchUp),
            "skip" => Ok(MisfirePolicy::Skip),
            other => Err(ParseMisfirePolicyError(other.to_owned())),
        }
    }
}

/// The limits misfire planning works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MisfireRules {
    /// An occurrence at most this late is on time, not a misfire.
    pub grace: Duration,
    /// Under `catch-up`, the most misfires that fire.
    pub max_backlog: usize,
    /// The most occurrences one plan walks; see the module documentation. The walk always
    /// covers at least one more occurrence than the policy keeps (`max_backlog + 1` under
    /// `catch-up`), or a routine with a longer backlog could never move on.
    pub max_scan: usize,
}

impl MisfireRules {
    /// The default walk bound: ten thousand occurrences per routine per tick.
    pub const DEFAULT_MAX_SCAN: usize = 10_000;
}

impl Default for MisfireRules {
    fn default() -> Self {
        MisfireRules::from(&SchedulerConfig::default())
    }
}

impl From<&SchedulerConfig> for MisfireRules {
    fn from(config: &SchedulerConfig) -> Self {
        MisfireRules {
            grace: config.misfire_grace,
            max_backlog: config.max_backlog,
            max_scan: MisfireRules::DEFAULT_MAX_SCAN,
        }
    }
}

/// What one routine owes now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DuePlan {
    /// The occurrences to claim now, oldest first.
    pub occurrences: Vec<DateTime<Utc>>,
    /// How many misfires the policy skipped (they will never fire).
    pub skipped: u64,
    /// The routine's next `next_run_at` once these occurrences are claimed: its first occurrence
    /// not covered by this plan. `None` when the schedule has no later occurrence.
    pub next_run_at: Option<DateTime<Utc>>,
}

/// Plans a routine whose `next_run_at` is `due`, at `now`, under `policy`.
///
/// `due` must be an occurrence of `schedule` (the stored `next_run_at`). If it is later than
/// `now` the routine owes nothing and keeps its clock.
pub fn plan_due(
    due: DateTime<Utc>,
    schedule: &Schedule,
    now: DateTime<Utc>,
    policy: MisfirePolicy,
    rules: &MisfireRules,
) -> DuePlan {
    if due > now {
        return DuePlan {
            occurrences: Vec::new(),
            skipped: 0,
            next_run_at: Some(due),
        };
    }
    let grace = TimeDelta::from_std(rules.grace).unwrap_or(TimeDelta::MAX);
    let on_time_from = now.checked_sub_signed(grace).unwrap_or(DateTime::<Utc>::MIN_UTC);
    let keep = match policy {
        MisfirePolicy::FireOnce => 1,
        MisfirePolicy::CatchUp => rules.max_backlog,
        MisfirePolicy::Skip => 0,
    };

    // The walk covers at least one more occurrence than the policy keeps: a walk that stops
    // inside the backlog has then skipped at least one misfire, so the routine's clock moves on.
    // With a smaller bound (say `catch-up` keeping 100 and a scan of 50) every tick would stop
    // before anything is decided and leave the clock where it was, and the routine would never
    // fire again.
    let bound = rules.max_scan.max(keep.saturating_add(1));
    let mut late: VecDeque<DateTime<Utc>> = VecDeque::new();
    let mut on_time = Vec::new();
    let mut skipped = 0u64;
    let mut cursor = Some(due);
    let mut scanned = 0usize;
    while let Some(occurrence) = cursor.filter(|o| *o <= now) {
        if scanned == bound {
            if on_time.is_empty() {
                // Still inside the backlog: the kept misfires may yet be pushed out by later
                // ones, so nothing fires; the clock moves to the oldest one still undecided.
                return DuePlan {
                    occurrences: Vec::new(),
                    skipped,
                    next_run_at: late.front().copied().or(Some(occurrence)),
                };
            }
            // The backlog is decided; the remaining on-time occurrences come due next tick.
            break;
        }
        scanned += 1;
        if occurrence < on_time_from {
            late.push_back(occurrence);
            if late.len() > keep {
                late.pop_front();
                skipped += 1;
            }
        } else {
            on_time.push(occurrence);
        }
        cursor = schedule.next_after(occurrence);
    }
    let mut occurrences: Vec<_> = late.into();
    occurrences.extend(on_time);
    DuePlan {
        occurrences,
        skipped,
        next_run_at: cursor,
    }
}
