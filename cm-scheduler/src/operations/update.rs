//! Updating a routine's settings: the change checked by [`crate::edit::Edit::checked`] (the
//! page's form and `routine update`'s flags alike), then written with the routine's row locked.

use cm_domain::{Backoff, ConcurrencyKey, Zone};
use cm_store::{Routine, RoutineAction, RoutineKind, RoutineStore, RoutineUpdate};

use super::{OperationError, refused};
use crate::edit::{Edit, NOTHING_TO_CHANGE};

/// A change to a routine: the settings an operator gives in text, and what only the command
/// line gives (a mission file, read and checked already, and a run limit).
#[derive(Debug, Clone, Default)]
pub struct Change<'a> {
    /// The settings given in text.
    pub edit: Edit<'a>,
    /// A new mission (the routine becomes, or stays, a mission routine).
    pub mission: Option<RoutineAction>,
    /// A new run limit: `Some(None)` removes it.
    pub runs_left: Option<Option<u32>>,
    /// A new deadline: `Some(None)` removes it.
    pub deadline: Option<Option<std::time::Duration>>,
    /// A new number of retries; the backoff is kept unless `retry_backoff` is given too.
    pub retries: Option<u32>,
    /// A new backoff between retries; the number of retries is kept unless `retries` is given
    /// too.
    pub retry_backoff: Option<Backoff>,
    /// Where the overlap policy came from, for a refusal (`--overlap`, `overlap`).
    pub overlap_field: &'a str,
    /// A new calendar (`none`: off its calendar), as `--calendar` gives it.
    pub calendar: Option<&'a str>,
    /// A new policy for an occurrence on a day off, as `--on-holiday` gives it.
    pub on_holiday: Option<&'a str>,
    /// A new concurrency key: `Some(None)` removes it.
    pub concurrency_key: Option<Option<ConcurrencyKey>>,
}

impl Change<'_> {
    /// The change checked against a routine of `kind` whose schedule is read in `zone` (when
    /// known); `None` when it changes nothing. A new number of retries or backoff alone
    /// replaces that part of the routine's retry policy, merged by the store under the
    /// routine's lock.
    pub fn checked(
        &self,
        kind: RoutineKind,
        zone: Option<Zone>,
    ) -> Result<Option<RoutineUpdate>, String> {
        let kind = self.mission.as_ref().map_or(kind, |m| m.kind);
        let mut update = match self.edit.checked(kind, zone, self.overlap_field) {
            Ok(update) => update,
            // A mission file alone is a change too, and so is a run limit.
            Err(e) if e == NOTHING_TO_CHANGE => RoutineUpdate::default(),
            Err(e) => return Err(e),
        };
        if self.mission.is_some() {
            update.action = self.mission.clone();
        }
        update.runs_left = self.runs_left;
        if let Some(name) = self.calendar {
            let (calendar, _) = super::create::calendar(Some(name), None)?;
            update.calendar = Some(calendar);
        }
        if let Some(policy) = self.on_holiday {
            update.on_holiday = Some(
                policy
                    .parse()
                    .map_err(|e: cm_domain::ParseOnHolidayError| format!("--on-holiday: {e}"))?,
            );
        }
        update.deadline = self.deadline;
        if let Some(retries) = self.retries {
            cm_domain::RetryPolicy::new(retries, Backoff::default().base, Backoff::default().max)
                .map_err(|e| e.to_string())?;
        }
        update.retries = self.retries;
        update.retry_backoff = self.retry_backoff;
        update.concurrency_key = self.concurrency_key.clone();
        Ok((update != RoutineUpdate::default()).then_some(update))
    }
}

/// What an update did.
#[derive(Debug, Clone)]
pub enum Updated {
    /// The routine as changed.
    Changed(Routine),
    /// The change asked for nothing new; the routine as it is.
    Unchanged(Routine),
}

/// Applies `change` to `routine`, checked first against the routine's kind and zone; a
/// refusal writes nothing.
pub async fn update(
    routines: &dyn RoutineStore,
    routine: Routine,
    change: &Change<'_>,
) -> Result<Updated, OperationError> {
    let zone = Zone::parse(&routine.timezone).ok();
    match change.checked(routine.kind, zone).map_err(refused)? {
        Some(update) => Ok(Updated::Changed(
            routines.update_routine(routine.id, &update).await?,
        )),
        None => Ok(Updated::Unchanged(routine)),
    }
}
