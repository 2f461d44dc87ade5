//! The W3C Trace Context (`traceparent`) of one attempt at one occurrence, so a fire can be
//! followed across systems: a webhook receiver, a NATS consumer and a mission each get it with
//! what cm sends them.
//!
//! Both identifiers are drawn from the occurrence by a hash, not by a random call:
//!
//! - the trace id from the routine and the occurrence's instant, so every attempt at one
//!   occurrence (a retry after a crash, on another scheduler) is one trace;
//! - the parent id (the span id of the attempt's dispatch) from the trace id and the attempt, so
//!   each attempt is its own span in it.
//!
//! Any process computes the same context from the ledger's row (routine, occurrence, attempt),
//! so the row names it without storing it, and `cm-scheduler fires` prints it. The mix is the
//! one jitter uses (SplitMix64, written here), so the context of a fire does not change when cm
//! is upgraded.

use std::fmt;

use crate::Occurrence;
use crate::jitter::mix;

/// A `traceparent` of version `00`, sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: u128,
    parent_id: u64,
}

impl TraceParent {
    /// The context of attempt `attempt` (1 for the first) at `occurrence`.
    pub fn for_attempt(occurrence: &Occurrence, attempt: u32) -> Self {
        let id = occurrence.routine_id.as_u128();
        let at = occurrence.scheduled_at.timestamp_micros() as u64;
        let high = mix(mix((id >> 64) as u64) ^ id as u64);
        let low = mix(high ^ at);
        let high = mix(low ^ high);
        // An all-zero identifier is invalid in W3C Trace Context; a mix lands there with a
        // chance of 2^-64, and is then moved to 1.
        let trace_id = ((u128::from(high) << 64) | u128::from(low)).max(1);
        let parent_id = mix(low ^ mix(u64::from(attempt))).max(1);
        TraceParent {
            trace_id,
            parent_id,
        }
    }

    /// The trace id: 32 lowercase hex digits, one for every attempt at the occurrence.
    pub fn trace_id(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The parent id: 16 lowercase hex digits, the attempt's own.
    pub fn parent_id(&self) -> String {
        format!("{:016x}", self.parent_id)
    }
}

impl fmt::Display for TraceParent {
    /// `00-<trace id>-<parent id>-01`: 55 characters, a valid HTTP header value, NATS header
    /// value, environment value, Docker label and Kubernetes label value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{:032x}-{:016x}-01", self.trace_id, self.parent_id)
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use uuid::Uuid;

    use super::*;

    fn occurrence(second: u32) -> Occurrence {
        Occurrence::new(
            Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001),
            Utc.with_ymd_and_hms(2026, 3, 8, 9, 30, second).unwrap(),
        )
    }

    /// The W3C Trace Context grammar for version 00.
    fn well_formed(text: &str) -> bool {
        let parts: Vec<&str> = text.split('-').collect();
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && parts[1] != "0".repeat(32)
            && hex(parts[2], 16)
            && parts[2] != "0".repeat(16)
            && parts[3] == "01"
    }

    #[test]
    fn one_trace_per_occurrence_one_span_per_attempt() {
        let first = TraceParent::for_attempt(&occurrence(0), 1);
        let again = TraceParent::for_attempt(&occurrence(0), 1);
        let retry = TraceParent::for_attempt(&occurrence(0), 2);
        let other = TraceParent::for_attempt(&occurrence(1), 1);
        assert_eq!(first, again);
        assert_eq!(first.trace_id(), retry.trace_id());
        assert_ne!(first.parent_id(), retry.parent_id());
        assert_ne!(first.trace_id(), other.trace_id());
        for t in [first, retry, other] {
            assert!(well_formed(&t.to_string()), "{t}");
            assert_eq!(t.to_string().len(), 55);
        }
    }

    #[test]
    fn the_context_does_not_change_between_versions() {
        assert_eq!(
            TraceParent::for_attempt(&occurrence(0), 1).to_string(),
            PINNED
        );
    }

    const PINNED: &str = "00-8200b5b12fade89140d03910bfc5104e-e3e6264c7cb3134b-01";
}
