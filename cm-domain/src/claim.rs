//! The claim state machine: how the row a claim statement returns becomes a decision, and how a
//! dispatch's result settles it.
//!
//! Every occurrence has one row in `routine_fires`. Its life:
//!
//! ```text
//!             claim (insert)                 dispatch ok
//!   (none) ────────────────▶ claimed ──────────────────────▶ fired   (terminal)
//!                             │   ▲  │
//!            lease ran out,   │   │  │ dispatch error, or too many crashed attempts
//!            taken over       └───┘  └─────────────────────▶ failed  (terminal)
//!            (attempt + 1)
//! ```
//!
//! A claim statement (`INSERT … ON CONFLICT … DO UPDATE … RETURNING (xmax = 0) AS inserted, …`)
//! always returns the row, whether or not this claimant inserted it. [`ClaimOutcome::classify`]
//! reads that row:
//!
//! | row returned | outcome |
//! |---|---|
//! | inserted by this statement | [`ClaimOutcome::Fresh`]: fire it |
//! | `claimed`, now carrying this claimant's token (the statement took over an expired lease) | [`ClaimOutcome::Retry`]: fire again |
//! | `claimed` by another claimant | [`ClaimOutcome::InFlight`]: another scheduler is dispatching it |
//! | `fired` or `failed` | [`ClaimOutcome::Settled`]: never fire it again |
//! | inserted by this statement already `fired` (a database-local backend wrote its effect in the claim's own transaction) | [`ClaimOutcome::SettledInClaim`]: done |
//!
//! A claim statement takes a row over only when its lease has run out by the tick's clock
//! ([`lease_expired`]), so two live schedulers never both read one row as a crash.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The largest error text kept on a row, in bytes. Longer errors are cut on a character boundary.
pub const MAX_ERROR_BYTES: usize = 4096;

/// The status column of `routine_fires`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FireStatus {
    /// Taken by a claimant; its dispatch is not yet known to have finished. A row left here
    /// after its lease ran out is a crash mid-fire and is safe to retry.
    Claimed,
    /// The dispatch completed. Terminal: this occurrence never fires again.
    Fired,
    /// The dispatch returned an error, or its claimants crashed too many times. Terminal: the
    /// error is kept on the row and the occurrence is not retried on later ticks.
    Failed,
    /// A mission not launched because an earlier run of its routine was still running under
    /// the overlap policy `forbid`. Terminal: the reason, naming the running fire, is kept in
    /// the row's error.
    Skipped,
}

impl FireStatus {
    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            FireStatus::Claimed => "claimed",
            FireStatus::Fired => "fired",
            FireStatus::Failed => "failed",
            FireStatus::Skipped => "skipped",
        }
    }

    /// Whether the status is terminal (`fired`, `failed` or `skipped`).
    pub fn is_settled(self) -> bool {
        !matches!(self, FireStatus::Claimed)
    }

    /// The status after settling with `settlement`. Only a `claimed` row can be settled; a
    /// settled row stays as it is.
    pub fn settle(self, settlement: &Settlement) -> Result<FireStatus, SettleError> {
        match self {
            FireStatus::Claimed => Ok(settlement.status()),
            settled => Err(SettleError::AlreadySettled(settled)),
        }
    }
}

impl fmt::Display for FireStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status text that is not `claimed`, `fired` or `failed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fire status {0:?} (expected claimed, fired, failed or skipped)")]
pub struct ParseFireStatusError(pub String);

impl FromStr for FireStatus {
    type Err = ParseFireStatusError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "claimed" => Ok(FireStatus::Claimed),
            "fired" => Ok(FireStatus::Fired),
            "failed" => Ok(FireStatus::Failed),
            "skipped" => Ok(FireStatus::Skipped),
            other => Err(ParseFireStatusError(other.to_owned())),
        }
    }
}

/// A settle that the state machine refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// The row is already `fired` or `failed`; settling is terminal.
    #[error("the occurrence is already {0}")]
    AlreadySettled(FireStatus),
}

/// Identifies one claim: the claimant that holds a row and which claim of theirs it is.
///
/// Every claim statement runs with a fresh token, so "the row carries my token" means exactly
/// "my statement inserted or took over this row". Settling is fenced on the token and the
/// attempt, so a late settle from a claimant whose lease ran out matches nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub Uuid);

impl ClaimToken {
    /// A token from a random UUID.
    pub fn new_v4() -> Self {
        ClaimToken(Uuid::new_v4())
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Whether a lease that runs until `lease_expires_at` has run out at `now`.
///
/// A lease is live strictly before its expiry and over from that instant on. The claim and
/// reaper statements use the same comparison (`lease_expires_at <= now`).
pub fn lease_expired(lease_expires_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    lease_expires_at <= now
}

/// The row a claim (or reaper) statement returns for one occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRow {
    /// `xmax = 0`: this statement inserted the row (it did not exist before).
    pub inserted: bool,
    /// The row's status after the statement.
    pub status: FireStatus,
    /// Who holds the row (an instance id), for logs and the InFlight outcome.
    pub claimant: String,
    /// The token of the claim that holds the row.
    pub token: ClaimToken,
    /// How many claims the occurrence has had, 1 for the first.
    pub attempt: u32,
    /// When the holder's lease runs out.
    pub lease_expires_at: DateTime<Utc>,
    /// What the latest earlier attempt met when it ended without settling (a backend that
    /// panicked, a settle that could not be written), if it could say: an abandon keeps it.
    pub last_error: Option<String>,
}

/// What a claim statement's row means for the claimant that ran it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Nobody had this occurrence; this claimant inserted it. Fire it.
    Fresh,
    /// The occurrence was claimed but its claimant's lease ran out (it crashed mid-fire, no
    /// completion was recorded), and this claimant took it over. Fire it again as `attempt`.
    Retry {
        /// The attempt this claimant now holds (2 or more).
        attempt: u32,
    },
    /// Another claimant holds a live lease: it is dispatching the occurrence now. Do not fire,
    /// and do not treat it as a crash.
    InFlight {
        /// The instance that holds the claim.
        claimant: String,
        /// When its lease runs out.
        lease_expires_at: DateTime<Utc>,
    },
    /// The occurrence is `fired` or `failed`. Never fire it again; the clock moves on.
    Settled(FireStatus),
    /// Nobody had this occurrence; this claimant inserted it already settled, because its
    /// backend is database-local and wrote the effect (an outbox row) in the claim's own
    /// transaction. The fire and its effect exist together or not at all: nothing is left to
    /// dispatch or settle.
    SettledInClaim(FireStatus),
}

impl ClaimOutcome {
    /// Classifies the row a claim statement returned to the claimant holding `mine`.
    ///
    /// The statement itself decides takeovers, atomically, by [`lease_expired`] against the
    /// tick's clock; the token on the returned row says whether it did. A `claimed` row carrying
    /// another token is therefore [`ClaimOutcome::InFlight`], whatever its lease says by a later
    /// clock: leaving it alone is the safe reading, and the reaper retries it once its lease has
    /// run out.
    pub fn classify(row: &ClaimRow, mine: ClaimToken) -> ClaimOutcome {
        match row.status {
            FireStatus::Fired | FireStatus::Failed | FireStatus::Skipped
                if row.token == mine && row.inserted =>
            {
                ClaimOutcome::SettledInClaim(row.status)
            }
            FireStatus::Fired | FireStatus::Failed | FireStatus::Skipped => {
                ClaimOutcome::Settled(row.status)
            }
            FireStatus::Claimed if row.token == mine && row.inserted => ClaimOutcome::Fresh,
            FireStatus::Claimed if row.token == mine => ClaimOutcome::Retry {
                attempt: row.attempt,
            },
            FireStatus::Claimed => ClaimOutcome::InFlight {
                claimant: row.claimant.clone(),
                lease_expires_at: row.lease_expires_at,
            },
        }
    }

    /// What the claimant does next, given how many attempts an occurrence may have.
    ///
    /// An occurrence whose claimants crashed `max_attempts` times is not dispatched again: it
    /// is settled `failed` so a poison routine cannot crash-loop the fleet.
    pub fn action(&self, max_attempts: u32) -> ClaimAction {
        self.action_after_retries(max_attempts, 0)
    }

    /// [`ClaimOutcome::action`] for an occurrence of which `retries` retries (after failed
    /// outcomes, by its routine's [`crate::RetryPolicy`]) have begun: each retry is an attempt
    /// too, so only the attempts that ended without settling count toward `max_attempts`.
    pub fn action_after_retries(&self, max_attempts: u32, retries: u32) -> ClaimAction {
        match self {
            ClaimOutcome::Fresh => ClaimAction::Dispatch { attempt: 1 },
            ClaimOutcome::Retry { attempt } if attempt.saturating_sub(retries) > max_attempts => {
                ClaimAction::Abandon {
                    reason: ErrorText::new(format!(
                        "abandoned: {} earlier attempts ended without settling (crashed or timed \
                         out); the limit is {max_attempts}",
                        attempt.saturating_sub(retries) - 1
                    )),
                }
            }
            ClaimOutcome::Retry { attempt } => ClaimAction::Dispatch { attempt: *attempt },
            ClaimOutcome::InFlight { .. }
            | ClaimOutcome::Settled(_)
            | ClaimOutcome::SettledInClaim(_) => ClaimAction::Leave,
        }
    }
}

/// What a claimant does with an occurrence after classifying its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAction {
    /// Dispatch it as `attempt`, then settle it.
    Dispatch {
        /// The attempt number the dispatch carries (1 for the first).
        attempt: u32,
    },
    /// Settle it `failed` with `reason` without dispatching: too many attempts crashed.
    Abandon {
        /// Why, kept on the row.
        reason: ErrorText,
    },
    /// Leave it: someone else holds it, it is already settled, or this claim settled it with
    /// its own writes.
    Leave,
}

impl ClaimAction {
    /// This action, with an abandon's reason naming what the latest earlier attempt met, so an
    /// occurrence abandoned after repeated unsettled attempts keeps the error that explains them.
    pub fn with_last_error(self, last_error: Option<&str>) -> ClaimAction {
        match (self, last_error) {
            (ClaimAction::Abandon { reason }, Some(last)) => ClaimAction::Abandon {
                reason: ErrorText::new(format!("{}; the last attempt: {last}", reason.as_str())),
            },
            (action, _) => action,
        }
    }
}

/// How a dispatch ended, as recorded on the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// The dispatch completed.
    Fired,
    /// The dispatch failed; the error is kept.
    Failed(ErrorText),
    /// The mission was not launched: an earlier run of its routine holds it (overlap
    /// `forbid`); the reason is kept.
    Skipped(ErrorText),
}

impl Settlement {
    /// The status this settlement writes.
    pub fn status(&self) -> FireStatus {
        match self {
            Settlement::Fired => FireStatus::Fired,
            Settlement::Failed(_) => FireStatus::Failed,
            Settlement::Skipped(_) => FireStatus::Skipped,
        }
    }

    /// The error text this settlement writes, if any.
    pub fn error(&self) -> Option<&str> {
        match self {
            Settlement::Fired => None,
            Settlement::Failed(e) | Settlement::Skipped(e) => Some(e.as_str()),
        }
    }
}

/// Error text PostgreSQL stores: bounded to [`MAX_ERROR_BYTES`] bytes, cut on a character
/// boundary, so one runaway error message cannot bloat the ledger; and free of NUL, the one
/// character a PostgreSQL `text` value refuses, so a backend's error (a C library's message, a
/// peer's binary reply) can never make the settle itself fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorText(String);

impl ErrorText {
    /// What a NUL in an error becomes: its escape, so the stored text still shows it was there.
    const NUL_REPLACEMENT: &str = "\\0";

    /// Replaces each NUL with `\0`, then bounds the text, marking a cut with a trailing `…`.
    pub fn new(text: impl Into<String>) -> Self {
        let mut text = text.into();
        if text.contains('\0') {
            text = text.replace('\0', Self::NUL_REPLACEMENT);
        }
        if text.len() > MAX_ERROR_BYTES {
            const MARK: &str = "…";
            let mut end = MAX_ERROR_BYTES - MARK.len();
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push_str(MARK);
        }
        ErrorText(text)
    }

    /// The bounded text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ErrorText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Duration, TimeZone};

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap()
    }

    const ME: ClaimToken = ClaimToken(Uuid::from_u128(1));
    const OTHER: ClaimToken = ClaimToken(Uuid::from_u128(2));

    /// One case: a returned row (inserted, status, token, attempt, lease seconds from now).
    fn check(
        inserted: bool,
        status: FireStatus,
        token: ClaimToken,
        attempt: u32,
        lease: i64,
        expected: &str,
    ) {
        let row = ClaimRow {
            inserted,
            status,
            claimant: "other".into(),
            token,
            attempt,
            lease_expires_at: now() + Duration::seconds(lease),
            last_error: None,
        };
        let got = match ClaimOutcome::classify(&row, ME) {
            ClaimOutcome::Fresh => "fresh".to_string(),
            ClaimOutcome::Retry { attempt } => format!("retry {attempt}"),
            ClaimOutcome::InFlight { .. } => "in-flight".to_string(),
            ClaimOutcome::Settled(s) => format!("settled {s}"),
            ClaimOutcome::SettledInClaim(s) => format!("settled in claim {s}"),
        };
        assert_eq!(got, expected, "{row:?}");
    }

    #[test]
    fn classify() {
        use FireStatus::*;
        check(true, Claimed, ME, 1, 30, "fresh");
        check(false, Claimed, ME, 2, 30, "retry 2");
        check(false, Claimed, ME, 7, 30, "retry 7");
        check(false, Claimed, OTHER, 1, 30, "in-flight");
        check(false, Claimed, OTHER, 3, 1, "in-flight");
        // Expired by a later clock but not taken over by the statement: left for the reaper.
        check(false, Claimed, OTHER, 1, -5, "in-flight");
        check(false, Fired, OTHER, 1, 30, "settled fired");
        check(false, Failed, OTHER, 2, -30, "settled failed");
        check(false, Skipped, OTHER, 1, 30, "settled skipped");
        check(false, Fired, ME, 2, 30, "settled fired");
        // Inserted already settled by this claim (a database-local backend's transaction).
        check(true, Fired, ME, 1, 30, "settled in claim fired");
        // Inserted settled by another claim's statement is never this claimant's.
        check(true, Fired, OTHER, 1, 30, "settled fired");
    }

    #[test]
    fn actions() {
        let abandon = |a| {
            matches!(
                ClaimOutcome::Retry { attempt: a }.action(3),
                ClaimAction::Abandon { .. }
            )
        };
        assert_eq!(
            ClaimOutcome::Fresh.action(3),
            ClaimAction::Dispatch { attempt: 1 }
        );
        assert_eq!(
            ClaimOutcome::Retry { attempt: 3 }.action(3),
            ClaimAction::Dispatch { attempt: 3 }
        );
        assert!(!abandon(3));
        assert!(abandon(4));
        assert_eq!(
            ClaimOutcome::Settled(FireStatus::Fired).action(3),
            ClaimAction::Leave
        );
        let in_flight = ClaimOutcome::InFlight {
            claimant: "b".into(),
            lease_expires_at: now(),
        };
        assert_eq!(in_flight.action(3), ClaimAction::Leave);
        // An abandon keeps what the last attempt met; other actions are left as they are.
        let kept = ClaimOutcome::Retry { attempt: 4 }
            .action(3)
            .with_last_error(Some("the dispatch panicked: boom"));
        let ClaimAction::Abandon { reason } = kept else {
            panic!("{kept:?}")
        };
        assert!(
            reason.as_str().starts_with("abandoned: 3 earlier attempts"),
            "{reason:?}"
        );
        assert!(
            reason
                .as_str()
                .ends_with("; the last attempt: the dispatch panicked: boom")
        );
        assert_eq!(
            ClaimOutcome::Fresh.action(3).with_last_error(Some("x")),
            ClaimAction::Dispatch { attempt: 1 }
        );
    }

    #[test]
    fn lease_boundary() {
        assert!(!lease_expired(now() + Duration::milliseconds(1), now()));
        assert!(lease_expired(now(), now()));
        assert!(lease_expired(now() - Duration::seconds(1), now()));
    }

    #[test]
    fn settle_transitions() {
        use FireStatus::*;
        let failed = Settlement::Failed(ErrorText::new("boom"));
        assert_eq!(Claimed.settle(&Settlement::Fired), Ok(Fired));
        assert_eq!(Claimed.settle(&failed), Ok(Failed));
        assert_eq!(
            Fired.settle(&failed),
            Err(SettleError::AlreadySettled(Fired))
        );
        assert_eq!(
            Failed.settle(&Settlement::Fired),
            Err(SettleError::AlreadySettled(Failed))
        );
        assert_eq!(failed.error(), Some("boom"));
    }

    #[test]
    fn status_round_trips() {
        for s in [
            FireStatus::Claimed,
            FireStatus::Fired,
            FireStatus::Failed,
            FireStatus::Skipped,
        ] {
            assert_eq!(s.as_str().parse::<FireStatus>(), Ok(s));
        }
        assert!("done".parse::<FireStatus>().is_err());
    }

    #[test]
    fn error_text_is_bounded_on_a_char_boundary() {
        fn check(input: &str, len: usize, ends_with_mark: bool) {
            let e = ErrorText::new(input);
            assert_eq!(e.as_str().len(), len, "{input:.20}");
            assert_eq!(e.as_str().ends_with('…'), ends_with_mark);
        }
        check("short", 5, false);
        check(&"\0".repeat(MAX_ERROR_BYTES), MAX_ERROR_BYTES, true);
        check(&"a".repeat(MAX_ERROR_BYTES), MAX_ERROR_BYTES, false);
        check(&"a".repeat(MAX_ERROR_BYTES + 1), MAX_ERROR_BYTES, true);
        // 'é' is two bytes; the cut lands inside one and must step back.
        check(&"é".repeat(MAX_ERROR_BYTES), MAX_ERROR_BYTES - 1, true);
        check(&"😀".repeat(MAX_ERROR_BYTES), MAX_ERROR_BYTES - 1, true);
    }

    #[test]
    fn error_text_holds_no_nul() {
        fn check(input: &str, stored: &str) {
            assert_eq!(ErrorText::new(input).as_str(), stored, "{input:?}");
        }
        check("\0", "\\0");
        check("bad reply \0\0 from peer", "bad reply \\0\\0 from peer");
        check("no nul here", "no nul here");
        // Other control characters are valid PostgreSQL text and are kept as they are.
        check("tab\there\u{1}", "tab\there\u{1}");
    }
}
