//! A change to a routine's settings as an operator gives it, in text: from `routine update`'s
//! flags or from the status page's form. Both go through [`Edit::checked`], and read a number of
//! retries, a retry backoff and a concurrency key with the same [`retries`], [`backoff`] and
//! [`concurrency_key`] (the flags' parsers), so the page refuses exactly what the command line
//! refuses, with the same words, before anything is written; the store then applies the change
//! in one transaction with the routine's row locked.

use cm_domain::retry::MAX_RETRIES;
use cm_domain::{
    Backoff, ConcurrencyKey, MisfirePolicy, OverlapPolicy, RoutineName, Schedule, Zone,
};
use cm_store::{RoutineAction, RoutineKind, RoutineUpdate};

/// The settings an edit gives; `None` leaves one as it is. A mission's description is not
/// here: it is a file (`routine update --mission`), read and checked against the operator's
/// mission policy by the command line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Edit<'a> {
    /// A new name.
    pub name: Option<&'a str>,
    /// A new cron expression.
    pub schedule: Option<&'a str>,
    /// A new IANA zone.
    pub timezone: Option<&'a str>,
    /// A new misfire policy (`fire-once`, `catch-up`, `skip`).
    pub misfire: Option<&'a str>,
    /// A new message text (the routine becomes, or stays, a message routine).
    pub message: Option<&'a str>,
    /// A new overlap policy (`allow`, `forbid`, `replace`, `buffer-one`, `buffer-all`), of a
    /// mission routine only.
    pub overlap: Option<&'a str>,
}

impl Edit<'_> {
    /// The change, checked: a name, an expression read in the (new or current) zone, a zone, a
    /// policy, a message within its size, an overlap policy only for a routine that is a
    /// mission after the change (`kind`, the routine's kind now, becomes a message's when the
    /// edit gives a message). `overlap_field` names where the overlap came from in a refusal
    /// (`--overlap`). An edit that changes nothing is refused.
    pub fn checked(
        &self,
        kind: RoutineKind,
        current_zone: Option<Zone>,
        overlap_field: &str,
    ) -> Result<RoutineUpdate, String> {
        let zone = self
            .timezone
            .map(Zone::parse)
            .transpose()
            .map_err(|e| e.to_string())?;
        if let Some(expression) = self.schedule {
            // In the new zone, else the routine's (UTC when not known): a field error does not
            // depend on the zone, and the store reads it again in the routine's own under its
            // lock.
            Schedule::new(expression, zone.or(current_zone).unwrap_or(Zone::UTC))
                .map_err(|e| e.to_string())?;
        }
        let action = self.message.map(message).transpose()?;
        let kind = action.as_ref().map_or(kind, |a| a.kind);
        let update = RoutineUpdate {
            name: self.name.map(name).transpose()?,
            expression: self.schedule.map(str::to_owned),
            zone,
            misfire: self.misfire.map(misfire).transpose()?,
            action,
            overlap: overlap(overlap_field, kind, self.overlap)?,
            // `routine update --limit-runs` sets it after the check, and `--calendar` and
            // `--on-holiday` these.
            runs_left: None,
            calendar: None,
            on_holiday: None,
            deadline: None,
            retries: None,
            retry_backoff: None,
            concurrency_key: None,
        };
        if update == RoutineUpdate::default() {
            return Err(NOTHING_TO_CHANGE.into());
        }
        Ok(update)
    }
}

/// The refusal of an edit that changes nothing.
pub const NOTHING_TO_CHANGE: &str = "nothing to change: give at least one of --name, --schedule, \
     --every, --at, --rrule, --except, --start, --end, --timezone, --misfire, --message, --mission, \
     --overlap, --limit-runs, --deadline, --retries, --retry-backoff, --calendar, --on-holiday, \
     --concurrency-key and --no-concurrency-key";

/// A routine's name, checked.
pub fn name(text: &str) -> Result<String, String> {
    RoutineName::parse(text)
        .map(RoutineName::into_string)
        .map_err(|e| e.to_string())
}

/// A misfire policy by its name.
pub fn misfire(text: &str) -> Result<MisfirePolicy, String> {
    text.parse()
        .map_err(|e: cm_domain::ParseMisfirePolicyError| e.to_string())
}

/// A message routine's action: a text, not empty, of at most
/// [`cm_domain::MAX_MESSAGE_BYTES`] ([`cm_domain::definition::message_payload`]).
pub fn message(text: &str) -> Result<RoutineAction, String> {
    Ok(RoutineAction {
        kind: RoutineKind::Message,
        payload: cm_domain::definition::message_payload(text).map_err(|e| e.to_string())?,
    })
}

/// A number of retries (`--retries`, the page's "Retries"): 0 to [`MAX_RETRIES`], as
/// [`cm_domain::RetryPolicy::new`] checks it.
pub fn retries(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if (0..=i64::from(MAX_RETRIES)).contains(&n) => Ok(n as u32),
        Ok(n) => Err(format!("retries must be 0 to {MAX_RETRIES} (it was {n})")),
        Err(_) => Err(format!(
            "{text:?} is not a number of retries (0 to {MAX_RETRIES})"
        )),
    }
}

/// A retry backoff (`--retry-backoff`, the page's "Retry backoff"): `BASE..MAX` or `BASE`
/// ([`Backoff`]).
pub fn backoff(text: &str) -> Result<Backoff, String> {
    text.parse()
        .map_err(|e: cm_domain::RetryError| e.to_string())
}

/// A concurrency key (`--concurrency-key`, `limit set KEY`, the page's "Concurrency key")
/// ([`ConcurrencyKey`]).
pub fn concurrency_key(text: &str) -> Result<ConcurrencyKey, String> {
    text.parse()
        .map_err(|e: cm_domain::LimitError| e.to_string())
}

/// The one rule for an overlap policy, whether `routine create --overlap`, `routine update
/// --overlap`, an import line's `"overlap"` or the page gives it: only a mission routine has one
/// (a message is posted, never running while the next comes due), and it must be a policy's
/// name. `kind` is what the routine is (after the change); `field` names where the policy was
/// given, for the refusal. `None` when none is given.
pub fn overlap(
    field: &str,
    kind: RoutineKind,
    given: Option<&str>,
) -> Result<Option<OverlapPolicy>, String> {
    let Some(text) = given else {
        return Ok(None);
    };
    if kind != RoutineKind::Mission {
        return Err(format!(
            "{field} is for mission routines (a message routine has no run to overlap)"
        ));
    }
    text.parse()
        .map(Some)
        .map_err(|e: cm_domain::ParseOverlapPolicyError| format!("{field}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_is_checked_before_anything_is_written() {
        let mission = RoutineKind::Mission;
        let edit = |e: Edit<'_>| e.checked(mission, None, "--overlap");
        assert_eq!(edit(Edit::default()).unwrap_err(), NOTHING_TO_CHANGE);
        assert!(
            edit(Edit {
                schedule: Some("61 * * * *"),
                ..Edit::default()
            })
            .is_err()
        );
        assert!(
            edit(Edit {
                timezone: Some("Mars/Olympus"),
                ..Edit::default()
            })
            .is_err()
        );
        assert!(
            edit(Edit {
                message: Some(""),
                ..Edit::default()
            })
            .unwrap_err()
            .contains("must not be empty")
        );
        // A message makes it a message routine, which has no overlap.
        assert!(
            edit(Edit {
                message: Some("hi"),
                overlap: Some("forbid"),
                ..Edit::default()
            })
            .unwrap_err()
            .starts_with("--overlap is for mission routines")
        );
        let update = edit(Edit {
            schedule: Some("0 9 * * *"),
            timezone: Some("Europe/Berlin"),
            misfire: Some("skip"),
            overlap: Some("replace"),
            ..Edit::default()
        })
        .unwrap();
        assert_eq!(update.expression.as_deref(), Some("0 9 * * *"));
        assert_eq!(update.zone.map(|z| z.name()), Some("Europe/Berlin"));
        assert_eq!(update.misfire, Some(MisfirePolicy::Skip));
        assert_eq!(update.overlap, Some(OverlapPolicy::Replace));
        assert_eq!(update.action, None);
    }
}
