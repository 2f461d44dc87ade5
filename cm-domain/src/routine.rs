//! What a routine is, apart from its schedule: what it does when it fires ([`RoutineKind`]),
//! and whether it still runs ([`RoutineState`]).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use crate::schedule::Schedule;

/// What a routine does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// Whether a routine still runs, as the command line and the status page show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoutineState {
    /// Not paused, and its schedule owes occurrences.
    Active,
    /// Paused (by a person, or by cm after its last fires all failed): never due until resumed.
    Paused,
    /// Not paused, and its schedule owes nothing more: its window closed, its one instant
    /// fired, or its run limit is spent. It fires no more unless an edit gives it occurrences
    /// again.
    Finished,
}

impl RoutineState {
    /// The state of a routine that is `paused` or not, whose next run is `next_run_at`, with
    /// `runs_left` scheduled occurrences left (`None`: no limit), on `schedule` (`None` when
    /// its stored schedule cannot be read, which is never taken as over), at `now`.
    pub fn of(
        paused: bool,
        next_run_at: Option<DateTime<Utc>>,
        runs_left: Option<u32>,
        schedule: Option<&Schedule>,
        now: DateTime<Utc>,
    ) -> RoutineState {
        if paused {
            RoutineState::Paused
        } else if next_run_at.is_none()
            && (runs_left == Some(0) || schedule.is_some_and(|s| s.is_over_after(now)))
        {
            RoutineState::Finished
        } else {
            RoutineState::Active
        }
    }

    /// `active`, `paused` or `finished`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutineState::Active => "active",
            RoutineState::Paused => "paused",
            RoutineState::Finished => "finished",
        }
    }
}

impl fmt::Display for RoutineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn a_routine_is_finished_only_unpaused_with_nothing_owed() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let daily = Schedule::parse("0 9 * * *", "UTC").unwrap();
        let check = |paused, next: Option<DateTime<Utc>>, runs_left, schedule, want| {
            assert_eq!(
                RoutineState::of(paused, next, runs_left, schedule, now),
                want,
                "paused {paused}, next {next:?}, runs left {runs_left:?}"
            );
        };
        check(true, None, Some(0), Some(&daily), RoutineState::Paused);
        check(false, Some(now), None, Some(&daily), RoutineState::Active);
        check(false, None, Some(0), Some(&daily), RoutineState::Finished);
        check(false, None, Some(0), None, RoutineState::Finished);
        // Owed occurrences, no next run (written by hand): not finished.
        check(false, None, None, Some(&daily), RoutineState::Active);
        check(false, None, Some(3), None, RoutineState::Active);
    }
}
