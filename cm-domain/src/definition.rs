//! What a routine may be defined as, apart from its schedule (which [`crate::Schedule`] checks):
//! its name, its payload for its kind, its overlap policy and its run limit. Every path that
//! writes a routine (the command line, the status page, the imports, `cm_store::tx` and the
//! planning of routines written through SQL) checks with these functions, so each refuses the
//! same input with the same words.
//!
//! A message routine's payload is an object with a `"text"` string (`{"text": TEXT}`): what `routine create --message TEXT` and
//! `cm.create_routine(…, message, …)` store, what the command line shows, and what a message
//! backend delivers (the webhook's `data.payload`, the outbox row, the NATS body). A mission
//! routine's payload is its mission file's JSON ([`Mission::from_value`]).
//!
//! ```
//! use cm_domain::RoutineKind;
//! use cm_domain::definition::{check_payload, message_payload};
//!
//! let payload = message_payload("standup in 5").unwrap();
//! assert!(check_payload(RoutineKind::Message, &payload, None).is_ok());
//! let refused = check_payload(RoutineKind::Message, &serde_json::json!({ "nope": 1 }), None);
//! assert_eq!(
//!     refused.unwrap_err().to_string(),
//!     "a message routine's payload must be a JSON object with a \"text\" string"
//! );
//! ```

use serde_json::Value;

use crate::mission::{MAX_MISSION_BYTES, Mission, MissionError, MissionPolicy};
use crate::name::{RoutineName, RoutineNameError};
use crate::routine::RoutineKind;
use crate::run::OverlapPolicy;

/// The largest run limit (the store keeps it in a 32-bit column).
pub const MAX_RUN_LIMIT: u32 = i32::MAX as u32;

/// The longest deadline: 366 days, in seconds.
pub const MAX_DEADLINE_SECS: u64 = 366 * 86_400;

/// Why a routine's definition is refused. Each message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The name is refused ([`RoutineName::parse`]).
    #[error(transparent)]
    Name(#[from] RoutineNameError),
    /// A retry policy is refused ([`crate::RetryPolicy::new`]).
    #[error("{0}")]
    Retry(String),
    /// A message routine's payload is not an object with a `"text"` string.
    #[error("a message routine's payload must be a JSON object with a \"text\" string")]
    NotAMessage,
    /// A message's text is empty.
    #[error("the message must not be empty")]
    EmptyMessage,
    /// A message's text is longer than [`crate::MAX_MESSAGE_BYTES`] (its length in bytes).
    #[error(
        "the message is {0} bytes; at most {max} are allowed",
        max = crate::MAX_MESSAGE_BYTES
    )]
    MessageTooLong(usize),
    /// A mission routine's payload is not a mission the domain reads, or one the operator's
    /// [`MissionPolicy`] does not allow.
    #[error(transparent)]
    Mission(#[from] MissionError),
    /// An overlap policy other than the default, for a message routine.
    #[error("an overlap policy is for mission routines (a message routine has no run to overlap)")]
    OverlapOfMessage,
    /// A run limit of 0 (it would never fire) or over [`MAX_RUN_LIMIT`].
    #[error("a run limit must be 1 to {MAX_RUN_LIMIT} (it was {0})")]
    RunLimit(u32),
    /// A run limit on a one-shot (`@at`), which fires once whatever the limit.
    #[error("a run limit is for a recurring schedule: a one-shot (--at) fires once")]
    RunLimitOfOneShot,
    /// A deadline under a second, not in whole seconds, or over [`MAX_DEADLINE_SECS`].
    #[error("a deadline must be whole seconds, 1s to 366d (it was {0})")]
    Deadline(String),
}

/// The name as stored: [`RoutineName::parse`] of `text` (trimmed, checked).
pub fn checked_name(text: &str) -> Result<RoutineName, DefinitionError> {
    Ok(RoutineName::parse(text)?)
}

/// A message routine's payload, `{"text": text}`, its text checked.
pub fn message_payload(text: &str) -> Result<Value, DefinitionError> {
    check_message_text(text)?;
    Ok(serde_json::json!({ "text": text }))
}

fn check_message_text(text: &str) -> Result<(), DefinitionError> {
    if text.is_empty() {
        return Err(DefinitionError::EmptyMessage);
    }
    if text.len() > crate::MAX_MESSAGE_BYTES {
        return Err(DefinitionError::MessageTooLong(text.len()));
    }
    Ok(())
}

/// Checks a payload for a routine of `kind`: a message's is an object whose `"text"` is a string of 1
/// to [`crate::MAX_MESSAGE_BYTES`] bytes; a mission's is a mission of at most
/// [`MAX_MISSION_BYTES`] as JSON that [`Mission::from_value`] reads. With a `policy`, a mission
/// must also be one the operator allows ([`MissionPolicy::check`]).
pub fn check_payload(
    kind: RoutineKind,
    payload: &Value,
    policy: Option<&MissionPolicy>,
) -> Result<(), DefinitionError> {
    match kind {
        RoutineKind::Message => {
            let text = payload
                .as_object()
                .and_then(|o| o.get("text"))
                .and_then(Value::as_str)
                .ok_or(DefinitionError::NotAMessage)?;
            check_message_text(text)
        }
        RoutineKind::Mission => {
            let size = serde_json::to_string(payload).map_or(usize::MAX, |text| text.len());
            if size > MAX_MISSION_BYTES {
                return Err(MissionError::TooLarge(size).into());
            }
            let mission = Mission::from_value(payload)?;
            if let Some(policy) = policy {
                policy.check(&mission)?;
            }
            Ok(())
        }
    }
}

/// Checks that a routine of `kind` may have `overlap`: a message routine has only the default.
pub fn check_overlap(kind: RoutineKind, overlap: OverlapPolicy) -> Result<(), DefinitionError> {
    if kind != RoutineKind::Mission && overlap != OverlapPolicy::default() {
        return Err(DefinitionError::OverlapOfMessage);
    }
    Ok(())
}

/// Checks a run limit: `None` (no limit), or 1 to [`MAX_RUN_LIMIT`].
pub fn check_run_limit(limit: Option<u32>) -> Result<(), DefinitionError> {
    match limit {
        Some(n) if n == 0 || n > MAX_RUN_LIMIT => Err(DefinitionError::RunLimit(n)),
        _ => Ok(()),
    }
}

/// Checks a deadline: `None` (none), or whole seconds from 1 s to [`MAX_DEADLINE_SECS`].
pub fn check_deadline(deadline: Option<std::time::Duration>) -> Result<(), DefinitionError> {
    match deadline {
        Some(d) if d.subsec_nanos() != 0 || d.as_secs() == 0 || d.as_secs() > MAX_DEADLINE_SECS => {
            Err(DefinitionError::Deadline(crate::duration_text(
                chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX),
            )))
        }
        _ => Ok(()),
    }
}

/// Checks that a run limit, if any, limits a recurring schedule: on a one-shot (`@at`, the
/// schedule's first word) it would be stored and never mean anything, so it is refused.
pub fn check_limited_schedule(schedule: &str, limit: Option<u32>) -> Result<(), DefinitionError> {
    let one_shot = schedule
        .split_whitespace()
        .next()
        .is_some_and(|word| word.eq_ignore_ascii_case("@at"));
    if one_shot && limit.is_some() {
        return Err(DefinitionError::RunLimitOfOneShot);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(kind: RoutineKind, payload: Value, expected: Result<(), &str>) {
        assert_eq!(
            check_payload(kind, &payload, None).map_err(|e| e.to_string()),
            expected.map_err(str::to_owned),
            "{payload}"
        );
    }

    #[test]
    fn a_payload_is_what_its_kind_needs() {
        use RoutineKind::{Message, Mission};
        check(Message, json!({ "text": "hello" }), Ok(()));
        let not_a_message =
            Err("a message routine's payload must be a JSON object with a \"text\" string");
        check(Message, json!({ "nope": 1 }), not_a_message);
        // A service may carry more beside the text; every backend delivers the payload whole.
        check(Message, json!({ "text": "hi", "extra": 1 }), Ok(()));
        check(Message, json!({ "text": 1 }), not_a_message);
        check(Message, json!("hello"), not_a_message);
        check(
            Message,
            json!({ "text": "" }),
            Err("the message must not be empty"),
        );
        let long = "x".repeat(crate::MAX_MESSAGE_BYTES + 1);
        check(
            Message,
            json!({ "text": long }),
            Err("the message is 262145 bytes; at most 262144 are allowed"),
        );
        let mission = json!({ "repository": "https://git.example.com/a.git", "task": "t" });
        check(Mission, mission, Ok(()));
        assert!(
            check_payload(Mission, &json!({ "nope": 1 }), None)
                .unwrap_err()
                .to_string()
                .starts_with("mission field \"nope\": unknown field")
        );
        let huge = json!({ "repository": "https://git.example.com/a.git",
            "task": "x".repeat(MAX_MISSION_BYTES) });
        assert!(matches!(
            check_payload(Mission, &huge, None),
            Err(DefinitionError::Mission(MissionError::TooLarge(_)))
        ));
    }

    #[test]
    fn overlap_and_run_limits() {
        assert!(check_overlap(RoutineKind::Message, OverlapPolicy::Forbid).is_ok());
        assert_eq!(
            check_overlap(RoutineKind::Message, OverlapPolicy::Allow),
            Err(DefinitionError::OverlapOfMessage)
        );
        assert!(check_overlap(RoutineKind::Mission, OverlapPolicy::Replace).is_ok());
        assert!(check_run_limit(None).is_ok());
        assert!(check_run_limit(Some(1)).is_ok());
        assert_eq!(
            check_run_limit(Some(0)).unwrap_err().to_string(),
            "a run limit must be 1 to 2147483647 (it was 0)"
        );
        assert!(check_run_limit(Some(MAX_RUN_LIMIT + 1)).is_err());
        let secs = std::time::Duration::from_secs;
        assert!(check_deadline(None).is_ok());
        assert!(check_deadline(Some(secs(1))).is_ok());
        assert!(check_deadline(Some(secs(MAX_DEADLINE_SECS))).is_ok());
        assert!(check_deadline(Some(secs(0))).is_err());
        assert!(check_deadline(Some(secs(MAX_DEADLINE_SECS + 1))).is_err());
        assert_eq!(
            check_deadline(Some(std::time::Duration::from_millis(1500)))
                .unwrap_err()
                .to_string(),
            "a deadline must be whole seconds, 1s to 366d (it was 1s500ms)"
        );
        assert!(check_limited_schedule("@at 2027-01-01T00:00:00Z", None).is_ok());
        assert!(check_limited_schedule("0 9 * * *", Some(3)).is_ok());
        assert!(check_limited_schedule("@every 5m", Some(3)).is_ok());
        assert_eq!(
            check_limited_schedule("  @AT 2027-01-01T00:00:00Z until 2027-02-01", Some(3))
                .unwrap_err()
                .to_string(),
            "a run limit is for a recurring schedule: a one-shot (--at) fires once"
        );
    }
}
