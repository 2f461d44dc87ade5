//! Backfill: the occurrences of a schedule in a past window, asked for by hand.

use chrono::{DateTime, TimeDelta, Utc};

use crate::schedule::Schedule;

/// The most occurrences one backfill may ask for; a longer window is refused rather than
/// flooding the ledger (ask for it in parts).
pub const MAX_BACKFILL: usize = 1000;

/// A backfill window that is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackfillError {
    /// The window ends before it starts.
    #[error("the backfill window ends ({to}) before it starts ({from})")]
    Reversed {
        /// The window's start.
        from: DateTime<Utc>,
        /// The window's end.
        to: DateTime<Utc>,
    },
    /// The window ends after `now`: future occurrences are the schedule's to fire.
    #[error("the backfill window ends in the future ({to}); backfill only what is past")]
    Future {
        /// The window's end.
        to: DateTime<Utc>,
    },
    /// The window holds more occurrences than [`MAX_BACKFILL`].
    #[error(
        "the backfill window holds more than {MAX_BACKFILL} occurrences; backfill a shorter window"
    )]
    TooMany,
}

/// The occurrences of `schedule` from `from` to `to`, both included, oldest first, for a window
/// that has passed by `now`.
pub fn backfill_occurrences(
    schedule: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, BackfillError> {
    if to < from {
        return Err(BackfillError::Reversed { from, to });
    }
    if to > now {
        return Err(BackfillError::Future { to });
    }
    // `next_after` is strictly after its argument; starting a nanosecond early includes `from`.
    let start = from - TimeDelta::nanoseconds(1);
    let mut occurrences = Vec::new();
    for at in schedule.occurrences_after(start).take_while(|at| *at <= to) {
        if occurrences.len() == MAX_BACKFILL {
            return Err(BackfillError::TooMany);
        }
        occurrences.push(at);
    }
    Ok(occurrences)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    /// One case: expression and zone, window, the expected occurrences or error text.
    fn check(expr: &str, zone: &str, from: &str, to: &str, expected: Result<&[&str], &str>) {
        let schedule = Schedule::parse(expr, zone).unwrap();
        let got = backfill_occurrences(&schedule, t(from), t(to), t("2026-01-01T00:00:00Z"));
        match (got, expected) {
            (Ok(got), Ok(want)) => {
                let want: Vec<_> = want.iter().map(|s| t(s)).collect();
                assert_eq!(got, want, "{expr} {from}..{to}");
            }
            (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{e}"),
            (got, want) => panic!("{expr}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn windows() {
        let hourly: &[&str] = &[
            "2025-06-01T10:00:00Z",
            "2025-06-01T11:00:00Z",
            "2025-06-01T12:00:00Z",
        ];
        check(
            "0 * * * *",
            "UTC",
            "2025-06-01T10:00:00Z",
            "2025-06-01T12:00:00Z",
            Ok(hourly),
        );
        check(
            "0 * * * *",
            "UTC",
            "2025-06-01T09:59:59.5Z",
            "2025-06-01T12:00:00Z",
            Ok(hourly),
        );
        check(
            "0 * * * *",
            "UTC",
            "2025-06-01T10:00:00.5Z",
            "2025-06-01T10:59:59Z",
            Ok(&[]),
        );
        check(
            "0 * * * *",
            "UTC",
            "2025-06-01T10:00:00Z",
            "2025-06-01T10:00:00Z",
            Ok(&["2025-06-01T10:00:00Z"]),
        );
        // The spring-forward gap in New York: the fixed-time job runs once, at 03:00 EDT.
        check(
            "30 2 * * *",
            "America/New_York",
            "2025-03-08T00:00:00Z",
            "2025-03-10T00:00:00Z",
            Ok(&["2025-03-08T07:30:00Z", "2025-03-09T07:00:00Z"]),
        );
        check(
            "0 * * * *",
            "UTC",
            "2025-06-01T12:00:00Z",
            "2025-06-01T10:00:00Z",
            Err("before it starts"),
        );
        check(
            "0 * * * *",
            "UTC",
            "2025-12-31T00:00:00Z",
            "2026-02-01T00:00:00Z",
            Err("in the future"),
        );
        check(
            "* * * * *",
            "UTC",
            "2025-06-01T00:00:00Z",
            "2025-06-02T00:00:00Z",
            Err("more than 1000"),
        );
        // Exactly the limit is allowed: 1000 minutes.
        let schedule = Schedule::parse("* * * * *", "UTC").unwrap();
        let all = backfill_occurrences(
            &schedule,
            t("2025-06-01T00:00:00Z"),
            t("2025-06-01T16:39:00Z"),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(all.map(|v| v.len()), Ok(MAX_BACKFILL));
    }
}
