//! One scheduled instant of one routine, and the idempotency key every backend uses for it.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The identifier of a routine (the primary key of `routines`).
pub type RoutineId = Uuid;

/// One scheduled instant of a routine: the unit the ledger (`routine_fires`) accounts for.
///
/// `scheduled_at` is the instant the schedule named, never the time it was claimed or
/// dispatched, so every attempt at the same occurrence names the same row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Occurrence {
    /// When the schedule said the routine should run.
    pub scheduled_at: DateTime<Utc>,
    /// The routine the occurrence belongs to.
    pub routine_id: RoutineId,
}

impl Occurrence {
    /// The occurrence of `routine_id` at `scheduled_at`.
    pub fn new(routine_id: RoutineId, scheduled_at: DateTime<Utc>) -> Self {
        Occurrence {
            scheduled_at,
            routine_id,
        }
    }

    /// The key a backend uses to make a repeated dispatch of this occurrence a no-op.
    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::for_occurrence(self)
    }

    /// The name of a mission's run of this occurrence: its idempotency key for the first
    /// attempt's run (`retry` 0), and `<key>-r<retry>` for the run of a retry after a failed
    /// outcome. Every takeover of one attempt (a crashed scheduler's) names the same run, so
    /// it finds the container or Job already launched instead of starting a second; a retry
    /// names a new one. At most 60 characters: a valid container and Kubernetes Job name.
    ///
    /// ```
    /// # use cm_domain::Occurrence;
    /// # use chrono::{TimeZone, Utc};
    /// let o = Occurrence::new(uuid::Uuid::nil(), Utc.timestamp_opt(60, 0).unwrap());
    /// assert_eq!(o.run_name(0), o.idempotency_key().to_string());
    /// assert_eq!(o.run_name(2), format!("{}-r2", o.idempotency_key()));
    /// ```
    pub fn run_name(&self, retry: u32) -> String {
        match retry {
            0 => self.idempotency_key().to_string(),
            n => format!("{}-r{n}", self.idempotency_key()),
        }
    }
}

/// A key derived from `(routine_id, scheduled_at)`: the same for every attempt at one occurrence
/// and different for any other.
///
/// It has the form `cm-<routine id, 32 hex digits>-<scheduled_at in unix microseconds>`: at most
/// 56 characters of lowercase ASCII letters, digits and `-`, so it is a valid container name, a
/// valid Kubernetes object name (63 characters at most) and a valid HTTP header value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of `occurrence`.
    pub fn for_occurrence(occurrence: &Occurrence) -> Self {
        let micros = occurrence.scheduled_at.timestamp_micros();
        // A negative instant (before 1970) keeps the key in the allowed alphabet.
        let sign = if micros < 0 { "n" } else { "" };
        IdempotencyKey(format!(
            "cm-{}-{sign}{}",
            occurrence.routine_id.simple(),
            micros.unsigned_abs()
        ))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The occurrence a key names: the inverse of [`IdempotencyKey::for_occurrence`], for a
    /// key read back from a target (a message header, a container's name). `None` for text that
    /// is not such a key.
    pub fn parse_occurrence(text: &str) -> Option<Occurrence> {
        let rest = text.strip_prefix("cm-")?;
        let (id, micros) = rest.split_once('-')?;
        if id.len() != 32
            || !id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return None;
        }
        let routine_id = Uuid::parse_str(id).ok()?;
        let (negative, digits) = match micros.strip_prefix('n') {
            Some(digits) => (true, digits),
            None => (false, micros),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let magnitude: i64 = digits.parse().ok()?;
        let micros = if negative { -magnitude } else { magnitude };
        let scheduled_at = DateTime::<Utc>::from_timestamp_micros(micros)?;
        let occurrence = Occurrence::new(routine_id, scheduled_at);
        // Only the canonical spelling names the occurrence (no "n0", no leading zeros).
        (occurrence.idempotency_key().as_str() == text).then_some(occurrence)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a fire came from: its routine's schedule, a manual trigger, or a backfill of a past
/// window. Lateness is judged for scheduled fires only: a backfill of last week is not late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FireOrigin {
    /// The routine's schedule named the occurrence.
    #[default]
    Schedule,
    /// An operator asked for it now (`routine trigger`).
    Trigger,
    /// An operator asked for a past window (`routine backfill`).
    Backfill,
}

impl FireOrigin {
    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            FireOrigin::Schedule => "schedule",
            FireOrigin::Trigger => "trigger",
            FireOrigin::Backfill => "backfill",
        }
    }
}

impl fmt::Display for FireOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An origin text that is not `schedule`, `trigger` or `backfill`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fire origin {0:?} (expected schedule, trigger or backfill)")]
pub struct ParseFireOriginError(pub String);

impl std::str::FromStr for FireOrigin {
    type Err = ParseFireOriginError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "schedule" => Ok(FireOrigin::Schedule),
            "trigger" => Ok(FireOrigin::Trigger),
            "backfill" => Ok(FireOrigin::Backfill),
            other => Err(ParseFireOriginError(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn key(id: u128, secs: i64, micros: u32) -> String {
        let at = Utc.timestamp_opt(secs, micros * 1000).unwrap();
        Occurrence::new(Uuid::from_u128(id), at)
            .idempotency_key()
            .to_string()
    }

    #[test]
    fn keys_name_the_occurrence_and_nothing_else() {
        assert_eq!(
            key(1, 1_700_000_000, 0),
            "cm-00000000000000000000000000000001-1700000000000000"
        );
        assert_eq!(key(1, 1_700_000_000, 0), key(1, 1_700_000_000, 0));
        assert_ne!(key(1, 1_700_000_000, 0), key(2, 1_700_000_000, 0));
        assert_ne!(key(1, 1_700_000_000, 0), key(1, 1_700_000_000, 1));
        assert_eq!(
            key(1, -1, 0),
            "cm-00000000000000000000000000000001-n1000000"
        );
    }

    #[test]
    fn keys_parse_back_to_their_occurrence() {
        fn check(text: &str, expected: Option<(u128, i64)>) {
            let got = IdempotencyKey::parse_occurrence(text)
                .map(|o| (o.routine_id.as_u128(), o.scheduled_at.timestamp_micros()));
            assert_eq!(got, expected, "{text}");
        }
        check(
            "cm-00000000000000000000000000000001-1700000000000000",
            Some((1, 1_700_000_000_000_000)),
        );
        check(
            "cm-00000000000000000000000000000001-n1000000",
            Some((1, -1_000_000)),
        );
        check("cm-00000000000000000000000000000001-0", Some((1, 0)));
        check("cm-00000000000000000000000000000001-n0", None);
        check("cm-00000000000000000000000000000001-01", None);
        check("cm-0000000000000000000000000000000G-1", None);
        check("cm-00000000-0000-0000-0000-000000000001-1", None);
        check("cm-00000000000000000000000000000001-", None);
        check("xx-00000000000000000000000000000001-1", None);
        check("", None);
    }

    #[test]
    fn keys_fit_a_kubernetes_name() {
        let k = key(u128::MAX, 253_402_300_799, 999_999);
        assert!(k.len() <= 63, "{k} is {} characters", k.len());
        assert!(
            k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
    }
}
