//! Misfire policies: what a routine does with occurrences found late (the scheduler was down,
//! the clock jumped, the fleet was overloaded).
//!
//! Lateness is judged once per routine, by its oldest owed occurrence (its `next_run_at`):
//!
//! - if that is no more than the grace period late, nothing has misfired: everything owed fires
//!   as usual;
//! - if it is later, the routine has misfired, and its [`MisfirePolicy`] decides for everything
//!   it owes (every occurrence up to now, including those that are themselves within the grace):
//!
//! | policy | what fires | the rest |
//! |---|---|---|
//! | `fire-once` (default) | the latest owed occurrence, once | skipped, counted |
//! | `catch-up` | all, oldest first, up to `max_backlog` (the latest ones) | older ones coalesce: skipped, counted |
//! | `skip` | none | skipped, counted |
//!
//! So `fire-once` means at most one catch-up fire, as users of Quartz's "fire once now" and
//! Kubernetes' CronJob read it: a 3-second routine back from a minute's outage fires once, not
//! twenty times.
//!
//! [`plan_due`] walks a routine's occurrences from its due instant, computing each next one from
//! the exact previous instant (so a walk through a fall-back overlap stays on the right pass).
//! The walk is bounded by [`MisfireRules::max_scan`]: a routine that missed more occurrences
//! than that (an every-second schedule after a week's outage) is walked over several ticks,
//! each moving its clock forward past misfires that are certainly skipped, and fires once the
//! walk reaches the end of the backlog. Nothing is dropped without being counted. Each of those
//! ticks judges the oldest occurrence still owed, so once the walk has reached occurrences that
//! are within the grace, the rest of the walk is on time and fires: a backlog that the walk
//! bound splits can fire more than once under `fire-once`, at most what falls within one grace
//! period (keep `max_scan` above the occurrences a grace period holds to avoid it).

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

impl DuePlan {
    /// This plan under a run limit: a routine with `runs_left` occurrences left to fire owes at
    /// most that many, oldest first, and once they are claimed it has no next run (it is
    /// finished). `None` is no limit. Misfires the policy skipped are not runs and do not count.
    /// The claim decrements the routine's count by what it claims, in the same transaction that
    /// holds the routine's row, so two schedulers never fire one more than the limit.
    pub fn limited_to(mut self, runs_left: Option<u32>) -> DuePlan {
        if let Some(left) = runs_left.map(|n| n as usize)
            && self.occurrences.len() >= left
        {
            self.occurrences.truncate(left);
            self.next_run_at = None;
        }
        self
    }
}

/// Plans a routine whose `next_run_at` is `due`, at `now`, under `policy`, for a schedule
/// without jitter (with one, see [`plan_routine_due`]).
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
    plan_walk(due, schedule, now, policy, rules, &|o| o)
}

/// Plans routine `routine`, whose clock (`next_run_at`) is `next_run_at`, at `now`, under
/// `policy`: [`plan_due`] for any schedule, a `jitter` clause's and a calendar's included.
///
/// With jitter the clock is the *planned* instant of the routine's next occurrence
/// ([`Schedule::planned`]); the occurrence it stands for is
/// [`Schedule::occurrence_planned_at`]. An occurrence is owed once its planned instant has
/// passed, lateness is judged from the planned instant, the plan's occurrences are the nominal
/// ones (each one's key), and its `next_run_at` is the planned instant of the next.
pub fn plan_routine_due(
    routine: crate::RoutineId,
    next_run_at: DateTime<Utc>,
    schedule: &Schedule,
    now: DateTime<Utc>,
    policy: MisfirePolicy,
    rules: &MisfireRules,
) -> DuePlan {
    if !schedule.moves_occurrences() {
        return plan_due(next_run_at, schedule, now, policy, rules);
    }
    let Some(due) = schedule.occurrence_planned_at(routine, next_run_at) else {
        // No occurrence is left for the clock to stand for: the routine is finished.
        return DuePlan::default();
    };
    plan_walk(due, schedule, now, policy, rules, &|o| {
        schedule.planned(routine, o)
    })
}

/// The plan of [`plan_routine_due`]: `due` is the routine's next occurrence, `planned` when
/// each occurrence comes due.
fn plan_walk(
    due: DateTime<Utc>,
    schedule: &Schedule,
    now: DateTime<Utc>,
    policy: MisfirePolicy,
    rules: &MisfireRules,
    planned: &dyn Fn(DateTime<Utc>) -> DateTime<Utc>,
) -> DuePlan {
    let due_at = planned(due);
    if due_at > now {
        return DuePlan {
            occurrences: Vec::new(),
            skipped: 0,
            // A clock that stood for the occurrence without being its planned instant (written
            // before the jitter was) moves there, so the routine is not read again until due.
            next_run_at: Some(due_at),
        };
    }
    let grace = TimeDelta::from_std(rules.grace).unwrap_or(TimeDelta::MAX);
    let on_time_from = now
        .checked_sub_signed(grace)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    if due_at >= on_time_from {
        return plan_on_time(due, schedule, now, rules.max_scan, planned);
    }
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
    let mut kept: VecDeque<DateTime<Utc>> = VecDeque::new();
    let mut skipped = 0u64;
    let mut cursor = Some(due);
    let mut scanned = 0usize;
    while let Some(occurrence) = cursor.filter(|o| planned(*o) <= now) {
        if scanned == bound {
            // Still inside the backlog: the kept occurrences may yet be pushed out by later
            // ones, so nothing fires; the clock moves to the oldest one still undecided.
            return DuePlan {
                occurrences: Vec::new(),
                skipped,
                next_run_at: kept.front().copied().or(Some(occurrence)).map(planned),
            };
        }
        scanned += 1;
        kept.push_back(occurrence);
        if kept.len() > keep {
            kept.pop_front();
            skipped += 1;
        }
        cursor = schedule.next_after(occurrence);
    }
    DuePlan {
        occurrences: kept.into(),
        skipped,
        next_run_at: cursor.map(planned),
    }
}

/// Plans a routine that has not misfired: every owed occurrence fires, at most `max_scan` (and
/// at least one) of them this tick; the rest come due on the next.
fn plan_on_time(
    due: DateTime<Utc>,
    schedule: &Schedule,
    now: DateTime<Utc>,
    max_scan: usize,
    planned: &dyn Fn(DateTime<Utc>) -> DateTime<Utc>,
) -> DuePlan {
    let mut occurrences = Vec::new();
    let mut cursor = Some(due);
    while let Some(occurrence) = cursor.filter(|o| planned(*o) <= now) {
        if occurrences.len() == max_scan.max(1) {
            break;
        }
        occurrences.push(occurrence);
        cursor = schedule.next_after(occurrence);
    }
    DuePlan {
        occurrences,
        skipped: 0,
        next_run_at: cursor.map(planned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instant: `HH:MM:SS` on 2026-01-01 UTC, or a full RFC 3339 instant.
    fn t(text: &str) -> DateTime<Utc> {
        let full = if text.len() == 8 {
            format!("2026-01-01T{text}Z")
        } else {
            text.to_owned()
        };
        full.parse().unwrap()
    }

    /// Rules with a grace of `grace` seconds.
    fn rules(grace: u64, max_backlog: usize, max_scan: usize) -> MisfireRules {
        MisfireRules {
            grace: Duration::from_secs(grace),
            max_backlog,
            max_scan,
        }
    }

    /// The default rules of these tests: a minute of grace, a backlog of 5, an ample scan.
    const R: MisfireRules = MisfireRules {
        grace: Duration::from_secs(60),
        max_backlog: 5,
        max_scan: MisfireRules::DEFAULT_MAX_SCAN,
    };

    /// Plans `due` at `now` for `expr` in `zone` under `policy` and checks what fires, how many
    /// are skipped and where the clock moves.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    fn check(
        expr: &str,
        zone: &str,
        due: &str,
        now: &str,
        policy: &str,
        rules: MisfireRules,
        fired: &[&str],
        skipped: u64,
        next: &str,
    ) {
        let schedule = Schedule::parse(expr, zone).unwrap();
        let policy: MisfirePolicy = policy.parse().unwrap();
        let plan = plan_due(t(due), &schedule, t(now), policy, &rules);
        let expected = DuePlan {
            occurrences: fired.iter().map(|f| t(f)).collect(),
            skipped,
            next_run_at: Some(t(next)),
        };
        assert_eq!(plan, expected, "{expr:?} due {due} at {now} under {policy}");
    }

    /// `check` for an every-ten-minutes UTC schedule under the default rules.
    #[track_caller]
    fn ten(due: &str, now: &str, policy: &str, fired: &[&str], skipped: u64, next: &str) {
        check(
            "*/10 * * * *",
            "UTC",
            due,
            now,
            policy,
            R,
            fired,
            skipped,
            next,
        );
    }

    #[test]
    fn on_time_occurrences_fire_under_every_policy() {
        for policy in ["fire-once", "catch-up", "skip"] {
            ten("12:00:00", "12:00:00", policy, &["12:00:00"], 0, "12:10:00");
            ten("12:00:00", "12:00:30", policy, &["12:00:00"], 0, "12:10:00");
            // Exactly the grace period late is still on time.
            ten("12:00:00", "12:01:00", policy, &["12:00:00"], 0, "12:10:00");
        }
    }

    #[test]
    fn a_clock_in_the_future_owes_nothing() {
        for policy in ["fire-once", "catch-up", "skip"] {
            ten("12:10:00", "12:05:00", policy, &[], 0, "12:10:00");
            ten("12:10:00", "12:09:59", policy, &[], 0, "12:10:00");
        }
    }

    #[test]
    fn one_second_past_grace_is_a_misfire() {
        ten(
            "12:00:00",
            "12:01:01",
            "fire-once",
            &["12:00:00"],
            0,
            "12:10:00",
        );
        ten(
            "12:00:00",
            "12:01:01",
            "catch-up",
            &["12:00:00"],
            0,
            "12:10:00",
        );
        ten("12:00:00", "12:01:01", "skip", &[], 1, "12:10:00");
    }

    #[test]
    fn fire_once_fires_the_latest_misfire_and_counts_the_rest() {
        // Down from before 12:00 to 12:35: 12:00, 12:10, 12:20 and 12:30 were missed.
        ten(
            "12:00:00",
            "12:35:00",
            "fire-once",
            &["12:30:00"],
            3,
            "12:40:00",
        );
        // 12:30 is itself on time at 12:30:30, but the routine misfired (its oldest owed
        // occurrence, 12:00, is past the grace): the policy decides for all it owes, and only
        // the latest fires.
        ten(
            "12:00:00",
            "12:30:30",
            "fire-once",
            &["12:30:00"],
            3,
            "12:40:00",
        );
        // A week down: 1008 occurrences, one fires.
        ten(
            "12:00:00",
            "2026-01-08T11:55:00Z",
            "fire-once",
            &["2026-01-08T11:50:00Z"],
            1007,
            "2026-01-08T12:00:00Z",
        );
    }

    #[test]
    fn lateness_is_judged_once_by_the_oldest_owed_occurrence() {
        // A 3-second routine after a minute's outage owes 21 occurrences, most of them within
        // the grace. Its oldest is a minute and a half late, so it has misfired: fire-once fires
        // once (the latest), skip none, catch-up all (under its backlog of 100).
        let owed: Vec<_> = (0..=20)
            .map(|i| t("12:00:00") + TimeDelta::seconds(3 * i))
            .collect();
        let owed: Vec<String> = owed.iter().map(|o| o.to_rfc3339()).collect();
        let owed: Vec<&str> = owed.iter().map(String::as_str).collect();
        let every_3s = |policy, backlog, fired: &[&str], skipped| {
            check(
                "*/3 * * * * *",
                "UTC",
                "12:00:00",
                "12:01:00",
                policy,
                rules(30, backlog, MisfireRules::DEFAULT_MAX_SCAN),
                fired,
                skipped,
                "12:01:03",
            )
        };
        every_3s("fire-once", 100, &owed[20..], 20);
        every_3s("skip", 100, &[], 21);
        every_3s("catch-up", 100, &owed, 0);
        every_3s("catch-up", 5, &owed[16..], 16);
        // Within the grace (a minute) nothing has misfired: all 21 fire under every policy.
        for policy in ["fire-once", "catch-up", "skip"] {
            check(
                "*/3 * * * * *",
                "UTC",
                "12:00:00",
                "12:01:00",
                policy,
                R,
                &owed,
                0,
                "12:01:03",
            );
        }
    }

    #[test]
    fn catch_up_fires_every_misfire_within_the_backlog() {
        let all = ["12:00:00", "12:10:00", "12:20:00", "12:30:00"];
        ten("12:00:00", "12:35:00", "catch-up", &all, 0, "12:40:00");
        // Exactly the backlog (5) still fires everything.
        let five = ["12:00:00", "12:10:00", "12:20:00", "12:30:00", "12:40:00"];
        ten("12:00:00", "12:45:00", "catch-up", &five, 0, "12:50:00");
    }

    #[test]
    fn catch_up_beyond_the_backlog_coalesces_the_oldest() {
        let latest = ["12:20:00", "12:30:00", "12:40:00", "12:50:00", "13:00:00"];
        ten("12:00:00", "13:05:00", "catch-up", &latest, 2, "13:10:00");
        // The backlog bounds everything owed, the on-time 12:40 included.
        let two = rules(60, 2, MisfireRules::DEFAULT_MAX_SCAN);
        let fired = ["12:30:00", "12:40:00"];
        check(
            "*/10 * * * *",
            "UTC",
            "12:00:00",
            "12:40:30",
            "catch-up",
            two,
            &fired,
            3,
            "12:50:00",
        );
        // A backlog of zero fires nothing of a routine that misfired, like skip.
        let none = rules(60, 0, MisfireRules::DEFAULT_MAX_SCAN);
        check(
            "*/10 * * * *",
            "UTC",
            "12:00:00",
            "12:30:30",
            "catch-up",
            none,
            &[],
            4,
            "12:40:00",
        );
    }

    #[test]
    fn skip_fires_no_misfire() {
        ten("12:00:00", "12:35:00", "skip", &[], 4, "12:40:00");
        // 12:30 is within the grace, but the routine misfired: skip fires none of what it owes.
        ten("12:00:00", "12:30:30", "skip", &[], 4, "12:40:00");
    }

    #[test]
    fn a_long_grace_keeps_everything_on_time() {
        let fired = ["12:00:00", "12:10:00", "12:20:00", "12:30:00"];
        let day = rules(86_400, 1, MisfireRules::DEFAULT_MAX_SCAN);
        check(
            "*/10 * * * *",
            "UTC",
            "12:00:00",
            "12:35:00",
            "skip",
            day,
            &fired,
            0,
            "12:40:00",
        );
    }

    #[test]
    fn misfires_across_a_spring_forward_gap() {
        // 02:30 New York: the run of 2025-03-09 moved to 03:00 EDT (07:00Z).
        let (due, now) = ("2025-03-08T07:30:00Z", "2025-03-10T12:00:00Z");
        let all = [
            "2025-03-08T07:30:00Z",
            "2025-03-09T07:00:00Z",
            "2025-03-10T06:30:00Z",
        ];
        let ny = "America/New_York";
        check(
            "30 2 * * *",
            ny,
            due,
            now,
            "catch-up",
            R,
            &all,
            0,
            "2025-03-11T06:30:00Z",
        );
        check(
            "30 2 * * *",
            ny,
            due,
            now,
            "fire-once",
            R,
            &all[2..],
            2,
            "2025-03-11T06:30:00Z",
        );
        check(
            "30 2 * * *",
            ny,
            due,
            now,
            "skip",
            R,
            &[],
            3,
            "2025-03-11T06:30:00Z",
        );
    }

    #[test]
    fn misfires_across_a_fall_back_overlap_walk_both_passes() {
        // 01:00 and 01:30 happen twice in New York on 2025-11-02 (05:00Z-06:00Z is EDT,
        // 06:00Z-07:00Z is EST); an interval schedule owes both passes.
        let (due, now) = ("2025-11-02T05:00:00Z", "2025-11-02T07:00:30Z");
        let passes = [
            "2025-11-02T05:00:00Z",
            "2025-11-02T05:30:00Z",
            "2025-11-02T06:00:00Z",
            "2025-11-02T06:30:00Z",
            "2025-11-02T07:00:00Z",
        ];
        let ny = "America/New_York";
        check(
            "*/30 * * * *",
            ny,
            due,
            now,
            "catch-up",
            R,
            &passes,
            0,
            "2025-11-02T07:30:00Z",
        );
        check(
            "*/30 * * * *",
            ny,
            due,
            now,
            "fire-once",
            R,
            &passes[4..],
            4,
            "2025-11-02T07:30:00Z",
        );
        // Starting on the second pass does not go back to the first.
        let (due, now) = ("2025-11-02T06:00:00Z", "2025-11-02T06:45:00Z");
        check(
            "*/30 * * * *",
            ny,
            due,
            now,
            "catch-up",
            R,
            &passes[2..4],
            0,
            "2025-11-02T07:00:00Z",
        );
    }

    /// What a run of ticks did with one routine's backlog.
    struct Walk {
        fired: Vec<DateTime<Utc>>,
        skipped: u64,
        calls: usize,
        next: Option<DateTime<Utc>>,
    }

    /// Plans a routine tick after tick at the same `now`, feeding each plan's `next_run_at` back
    /// as the due instant, until it owes nothing; gives up after `limit` ticks.
    fn walk(
        expr: &str,
        due: &str,
        now: &str,
        policy: MisfirePolicy,
        rules: MisfireRules,
        limit: usize,
    ) -> Walk {
        let schedule = Schedule::parse(expr, "UTC").unwrap();
        let now = t(now);
        let mut walk = Walk {
            fired: Vec::new(),
            skipped: 0,
            calls: 0,
            next: Some(t(due)),
        };
        while let Some(due) = walk.next.filter(|d| *d <= now) {
            assert!(
                walk.calls < limit,
                "{expr:?} under {policy}: no end after {limit} ticks (due {due})"
            );
            let plan = plan_due(due, &schedule, now, policy, &rules);
            walk.calls += 1;
            walk.fired.extend(&plan.occurrences);
            walk.skipped += plan.skipped;
            walk.next = plan.next_run_at;
        }
        walk
    }

    #[test]
    fn a_backlog_longer_than_max_scan_is_walked_over_several_ticks() {
        // Every second from 12:00:00 to 12:01:00 with no grace: 60 misfires and one on time.
        let every_second = "* * * * * *";
        let total = 61;
        let seconds = |from: u32, to: u32| {
            (from..=to)
                .map(|s| t("12:00:00") + TimeDelta::seconds(s.into()))
                .collect::<Vec<_>>()
        };
        for (policy, backlog, max_scan, fired) in [
            (MisfirePolicy::CatchUp, 3, 10, seconds(58, 60)),
            (MisfirePolicy::CatchUp, 9, 10, seconds(52, 60)),
            (MisfirePolicy::FireOnce, 3, 10, seconds(60, 60)),
            (MisfirePolicy::Skip, 3, 10, seconds(60, 60)),
            (MisfirePolicy::Skip, 3, 1, seconds(60, 60)),
            (MisfirePolicy::CatchUp, 100, 10_000, seconds(0, 60)),
        ] {
            let rules = rules(0, backlog, max_scan);
            let w = walk(every_second, "12:00:00", "12:01:00", policy, rules, 1_000);
            assert_eq!(w.fired, fired, "{policy} backlog {backlog} scan {max_scan}");
            assert_eq!(
                w.skipped + w.fired.len() as u64,
                total,
                "{policy} backlog {backlog} scan {max_scan}"
            );
            assert_eq!(w.next, Some(t("12:01:01")));
            if max_scan < total as usize {
                assert!(w.calls > 1, "{policy}: the walk took one tick");
            }
        }
    }

    #[test]
    fn a_scan_no_longer_than_the_backlog_still_makes_progress() {
        // With max_scan at or below what the policy keeps, a tick that stops inside the backlog
        // must still move the clock, or the routine would never fire again.
        let seconds = |from: u32, to: u32| {
            (from..=to)
                .map(|s| t("12:00:00") + TimeDelta::seconds(s.into()))
                .collect::<Vec<_>>()
        };
        for (policy, backlog, max_scan, fired) in [
            (MisfirePolicy::FireOnce, 3, 1, seconds(60, 60)),
            (MisfirePolicy::CatchUp, 3, 3, seconds(58, 60)),
            (MisfirePolicy::CatchUp, 20, 10, seconds(41, 60)),
        ] {
            let rules = rules(0, backlog, max_scan);
            let w = walk("* * * * * *", "12:00:00", "12:01:00", policy, rules, 1_000);
            assert_eq!(w.fired, fired, "{policy} backlog {backlog} scan {max_scan}");
            assert_eq!(w.skipped + w.fired.len() as u64, 61);
        }
    }

    #[test]
    fn the_on_time_tail_past_max_scan_comes_due_next_tick() {
        // A long grace makes everything on time; a scan of 3 fires three per tick.
        let rules = rules(3_600, 5, 3);
        let schedule = Schedule::parse("*/10 * * * *", "UTC").unwrap();
        let plan = plan_due(
            t("12:00:00"),
            &schedule,
            t("12:45:00"),
            MisfirePolicy::Skip,
            &rules,
        );
        assert_eq!(
            plan.occurrences,
            [t("12:00:00"), t("12:10:00"), t("12:20:00")]
        );
        assert_eq!(plan.skipped, 0);
        assert_eq!(plan.next_run_at, Some(t("12:30:00")));
        let w = walk(
            "*/10 * * * *",
            "12:00:00",
            "12:45:00",
            MisfirePolicy::Skip,
            rules,
            10,
        );
        assert_eq!(w.fired.len(), 5);
        assert_eq!(w.calls, 2);
    }

    #[test]
    fn policy_names_round_trip() {
        for (name, policy) in [
            ("fire-once", MisfirePolicy::FireOnce),
            ("catch-up", MisfirePolicy::CatchUp),
            ("skip", MisfirePolicy::Skip),
        ] {
            assert_eq!(name.parse::<MisfirePolicy>(), Ok(policy));
            assert_eq!(policy.as_str(), name);
            assert_eq!(policy.to_string(), name);
        }
        assert_eq!(MisfirePolicy::default(), MisfirePolicy::FireOnce);
    }

    #[test]
    fn unknown_policy_names_are_refused() {
        for name in [
            "",
            "Fire-Once",
            "fire_once",
            "fireonce",
            "catchup",
            "catch_up",
            " skip",
            "skip ",
            "none",
        ] {
            let err = name.parse::<MisfirePolicy>().unwrap_err();
            assert_eq!(err, ParseMisfirePolicyError(name.to_owned()));
            assert!(
                err.to_string()
                    .contains("expected fire-once, catch-up or skip"),
                "{err}"
            );
        }
    }

    #[test]
    fn default_rules_follow_the_scheduler_config() {
        let config = SchedulerConfig::default();
        let rules = MisfireRules::default();
        assert_eq!(rules.grace, config.misfire_grace);
        assert_eq!(rules.max_backlog, config.max_backlog);
        assert_eq!(rules.max_scan, MisfireRules::DEFAULT_MAX_SCAN);
    }

    #[test]
    fn a_run_limit_keeps_the_oldest_occurrences_and_ends_the_clock_when_spent() {
        let at = |s: u32| chrono::TimeZone::with_ymd_and_hms(&Utc, 2026, 1, 1, 0, 0, s).unwrap();
        let plan = DuePlan {
            occurrences: vec![at(1), at(2), at(3)],
            skipped: 4,
            next_run_at: Some(at(4)),
        };
        assert_eq!(plan.clone().limited_to(None), plan);
        assert_eq!(plan.clone().limited_to(Some(5)), plan);
        let two = plan.clone().limited_to(Some(2));
        assert_eq!(
            (two.occurrences, two.next_run_at, two.skipped),
            (vec![at(1), at(2)], None, 4)
        );
        let three = plan.clone().limited_to(Some(3));
        assert_eq!((three.occurrences.len(), three.next_run_at), (3, None));
        let none = plan.limited_to(Some(0));
        assert_eq!((none.occurrences.len(), none.next_run_at), (0, None));
    }
}
