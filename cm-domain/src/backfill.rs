//! Backfill: the occurrences of a schedule in a past window, asked for by hand.
//!
//! A backfill asks only for occurrences the ledger does not hold, so the ledger is what stops a
//! slot firing twice. Settled rows are pruned after the retention, and a pruned slot looks to a
//! backfill like one that never fired: a window reaching back past the retention (less a
//! margin for the time between asking and claiming) is refused.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::schedule::Schedule;

/// The most occurrences one backfill may ask for; a longer window is refused rather than
/// flooding the ledger (ask for it in parts).
pub const MAX_BACKFILL: usize = 1000;

/// How far inside the retention a backfill window must start: the asked-for occurrences are
/// claimed by a later tick, and a row pruned in between would let a slot fire again. An hour
/// covers a tick that is late by far more than any lease.
pub const RETENTION_MARGIN: Duration = Duration::from_secs(3600);

/// A backfill window that is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackfillError {
    /// The window ends before it starts.
    #[error("the backfill window ends ({}) before it starts ({})", rfc3339(.to), rfc3339(.from))]
    Reversed {
        /// The window's start.
        from: DateTime<Utc>,
        /// The window's end.
        to: DateTime<Utc>,
    },
    /// The window ends after `now`: future occurrences are the schedule's to fire.
    #[error("the backfill window ends in the future ({}); backfill only what is past", rfc3339(.to))]
    Future {
        /// The window's end.
        to: DateTime<Utc>,
    },
    /// The window holds more occurrences than [`MAX_BACKFILL`].
    #[error(
        "the backfill window holds more than {MAX_BACKFILL} occurrences; backfill a shorter window"
    )]
    TooMany,
    /// The window starts where settled fires may already have been pruned, so a slot that
    /// fired could fire again.
    #[error(
        "the backfill window starts ({}) past the ledger's retention: occurrences before {} may \
         have been pruned and would fire again; start the window at {} or later",
        rfc3339(.from), rfc3339(.earliest), rfc3339(.earliest)
    )]
    PastRetention {
        /// The window's start.
        from: DateTime<Utc>,
        /// The earliest start allowed: `now` less the retention, plus [`RETENTION_MARGIN`].
        earliest: DateTime<Utc>,
    },
}

/// An instant as the messages print it: RFC 3339 in UTC, so it can be pasted back into
/// `--from` and `--to`.
fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// The occurrences of `schedule` from `from` to `to`, both included, oldest first, for a window
/// that has passed by `now` and starts inside `retention` (how long the ledger keeps settled
/// fires), less [`RETENTION_MARGIN`].
pub fn backfill_occurrences(
    schedule: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<Vec<DateTime<Utc>>, BackfillError> {
    if to < from {
        return Err(BackfillError::Reversed { from, to });
    }
    if to > now {
        return Err(BackfillError::Future { to });
    }
    let kept =
        TimeDelta::from_std(retention.saturating_sub(RETENTION_MARGIN)).unwrap_or(TimeDelta::MAX);
    let earliest = now
        .checked_sub_signed(kept)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    if from < earliest {
        return Err(BackfillError::PastRetention { from, earliest });
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

    /// A retention longer than any window of these tests reaches back.
    const YEARS: Duration = Duration::from_secs(10 * 365 * 86_400);

    const DAY: Duration = Duration::from_secs(86_400);

    /// One case: expression and zone, window, the expected occurrences or error text.
    fn check(expr: &str, zone: &str, from: &str, to: &str, expected: Result<&[&str], &str>) {
        let schedule = Schedule::parse(expr, zone).unwrap();
        let got = backfill_occurrences(&schedule, t(from), t(to), t("2026-01-01T00:00:00Z"), YEARS);
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
            YEARS,
        );
        assert_eq!(all.map(|v| v.len()), Ok(MAX_BACKFILL));
    }

    #[test]
    fn a_window_reaching_past_the_retention_is_refused() {
        let hourly = Schedule::parse("0 * * * *", "UTC").unwrap();
        let now = t("2026-01-31T12:00:00Z");
        let check = |from: &str, retention: Duration, expected: Result<usize, &str>| {
            let got = backfill_occurrences(&hourly, t(from), now, now, retention);
            match (got, expected) {
                (Ok(got), Ok(n)) => assert_eq!(got.len(), n, "from {from}"),
                (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{e}"),
                (got, want) => panic!("from {from}: got {got:?}, want {want:?}"),
            }
        };
        // A day's retention less the hour's margin: the window may start 23 hours back.
        check("2026-01-30T13:00:00Z", DAY, Ok(24));
        check(
            "2026-01-30T12:59:59Z",
            DAY,
            Err("start the window at 2026-01-30T13:00:00Z or later"),
        );
        check(
            "2026-01-30T12:00:00Z",
            DAY,
            Err("past the ledger's retention"),
        );
        // Thirty days (the default retention).
        check("2026-01-01T13:00:00Z", 30 * DAY, Ok(30 * 24 - 1 + 1));
        check(
            "2026-01-01T12:00:00Z",
            30 * DAY,
            Err("past the ledger's retention"),
        );
        // A retention no longer than the margin allows no past window at all.
        check("2026-01-31T12:00:00Z", RETENTION_MARGIN, Ok(1));
        check(
            "2026-01-31T11:59:59Z",
            RETENTION_MARGIN,
            Err("past the ledger's retention"),
        );
    }
}
