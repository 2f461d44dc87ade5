//! Keyset pagination of the ledger: a [`FireCursor`] names the last fire of a page, and the next
//! page starts strictly after it, so paging costs the same on the thousandth page as on the first
//! (no `OFFSET` that reads and throws away every earlier row).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

use crate::ledger::Fire;

/// Where a listing of fires resumes: the position of the last fire already shown in the listing's
/// order (newest occurrence first, then routine id descending). The next page holds the fires
/// strictly after it in that order.
///
/// Written as `<scheduled_at, RFC 3339 with microseconds>/<routine id>`, for example
/// `2026-01-01T00:00:00.000000Z/7f2c0e4a-5d7b-4a8e-9c1e-2b8f6d0a3c11`: what `cm-scheduler fires`
/// prints after a full page and reads back with `--cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FireCursor {
    /// The occurrence instant of the last fire shown.
    pub scheduled_at: DateTime<Utc>,
    /// The routine of the last fire shown.
    pub routine_id: Uuid,
}

impl FireCursor {
    /// The cursor that resumes a listing after `fire`.
    pub fn after(fire: &Fire) -> Self {
        FireCursor {
            scheduled_at: fire.scheduled_at,
            routine_id: fire.routine_id,
        }
    }
}

impl fmt::Display for FireCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Microseconds: PostgreSQL's precision, so the cursor names the row exactly.
        write!(
            f,
            "{}/{}",
            self.scheduled_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
            self.routine_id
        )
    }
}

/// A cursor that is not `<RFC 3339 instant>/<uuid>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid cursor {0:?} (expected <RFC 3339 instant>/<routine id>, as a page of fires prints it)"
)]
pub struct ParseFireCursorError(pub String);

impl FromStr for FireCursor {
    type Err = ParseFireCursorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseFireCursorError(s.to_owned());
        let (at, id) = s.split_once('/').ok_or_else(invalid)?;
        let scheduled_at = DateTime::parse_from_rfc3339(at)
            .map_err(|_| invalid())?
            .with_timezone(&Utc);
        let routine_id = Uuid::parse_str(id).map_err(|_| invalid())?;
        Ok(FireCursor {
            scheduled_at,
            routine_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(text: &str, expected: Option<&str>) {
        match (text.parse::<FireCursor>(), expected) {
            (Ok(cursor), Some(shown)) => assert_eq!(cursor.to_string(), shown),
            (Err(e), None) => assert_eq!(e, ParseFireCursorError(text.into())),
            (got, want) => panic!("{text:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let id = "7f2c0e4a-5d7b-4a8e-9c1e-2b8f6d0a3c11";
        let micros = format!("2026-01-01T00:00:00.123456Z/{id}");
        check(&micros, Some(&micros));
        check(
            &format!("2026-01-01T01:00:00+01:00/{id}"),
            Some(&format!("2026-01-01T00:00:00.000000Z/{id}")),
        );
        for bad in [
            "",
            "/",
            id,
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Z/",
            "2026-01-01T00:00:00Z/not-a-uuid",
            &format!("yesterday/{id}"),
            &format!("2026-01-01 00:00:00/{id}"),
        ] {
            check(bad, None);
        }
    }
}
