//! Events: the changes a person must hear about, one per decision.
//!
//! An event is written in the same transaction as its change (by the store), delivered at least
//! once to the operator's sinks with a stable id, and listed by `cm-scheduler events`. This
//! module names them; what each carries is documented on its variant.

use std::fmt;
use std::str::FromStr;

/// What an event says happened to a routine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// An occurrence's outcome was a failure: a message's failed dispatch, a mission's run that
    /// failed or was lost. Data: `scheduled_at`, `attempt`, `error`, and for a mission
    /// `run_state`, `exit_code` and the scrubbed `output_tail`.
    Failed,
    /// The routine was paused, by cm (`by: "cm"`, after its Nth failure in a row) or by a
    /// person (`by: "person"`). Data: `by`, `reason`.
    Paused,
    /// The routine was resumed. Data: `by`.
    Resumed,
    /// The first succeeded outcome after one or more failures. Data: `scheduled_at`.
    Recovered,
    /// An occurrence had not succeeded by its deadline: still running, failed, waiting, or never
    /// claimed. Raised once per occurrence. Data: `scheduled_at`, `planned_at`, `deadline`,
    /// `state`.
    DeadlineMissed,
    /// A misfire policy skipped occurrences. Data: `policy`, `skipped`, `first`, `last`.
    Misfired,
    /// The routine has no more occurrences: its schedule ended, its run limit was reached or
    /// its one instant fired. Data: `reason`.
    Finished,
    /// A routine written through SQL could not be planned. Data: `error`.
    PlanningRefused,
}

impl EventType {
    /// Every type, in the order the documentation lists them.
    pub const ALL: [EventType; 8] = [
        EventType::Failed,
        EventType::Paused,
        EventType::Resumed,
        EventType::Recovered,
        EventType::DeadlineMissed,
        EventType::Misfired,
        EventType::Finished,
        EventType::PlanningRefused,
    ];

    /// The type's name as stored and sent (`routine.failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Failed => "routine.failed",
            EventType::Paused => "routine.paused",
            EventType::Resumed => "routine.resumed",
            EventType::Recovered => "routine.recovered",
            EventType::DeadlineMissed => "routine.deadline_missed",
            EventType::Misfired => "routine.misfired",
            EventType::Finished => "routine.finished",
            EventType::PlanningRefused => "routine.planning_refused",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no event type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownEventType(pub String);

impl fmt::Display for UnknownEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        write!(
            f,
            "unknown event type {:?}: expected one of {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownEventType {}

impl FromStr for EventType {
    type Err = UnknownEventType;

    /// Reads a type by its name, with or without the `routine.` prefix (`failed`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        EventType::ALL
            .into_iter()
            .find(|t| t.as_str() == name || t.as_str().strip_prefix("routine.") == Some(name))
            .ok_or_else(|| UnknownEventType(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_reads_back_from_its_name_and_its_short_name() {
        for t in EventType::ALL {
            assert_eq!(t.as_str().parse::<EventType>(), Ok(t));
            let short = t.as_str().strip_prefix("routine.").unwrap();
            assert_eq!(short.parse::<EventType>(), Ok(t));
        }
        let err = "routine.exploded".parse::<EventType>().unwrap_err();
        assert!(err.to_string().contains("routine.failed"), "{err}");
    }
}
