//! Creating a routine: its fields checked as `routine create` and each import line are, then
//! written, its overlap policy with it, in one insert.

use std::path::{Path, PathBuf};

use cm_domain::{MissionPolicy, Schedule, Zone};
use cm_store::{NewRoutine, PgStore, Routine, RoutineAction, RoutineKind, RoutineStore};

use super::{OperationError, refused};
use crate::bounded;
use crate::flags::routine::CreateArgs;
use crate::import::RoutineFields;

/// A routine to create, checked as `routine create` checks it: its name, schedule, zone, misfire
/// policy, action, overlap policy (`overlap_field` names where it was given), run limit,
/// deadline, retries and concurrency key. An import's mission paths are read inside its mission
/// `root`; `routine create`'s (`None`) as the operator gave it.
pub(crate) fn new_routine(
    fields: &RoutineFields,
    root: Option<&Path>,
    policy: &MissionPolicy,
    overlap_field: &str,
) -> Result<NewRoutine, OperationError> {
    // The name first, as the builder would, so a line with a bad name and a bad zone is
    // refused for its name.
    cm_domain::definition::checked_name(&fields.name).map_err(|e| refused(e.to_string()))?;
    let zone = Zone::parse(&fields.timezone).map_err(|e| refused(e.to_string()))?;
    let schedule = Schedule::new(&fields.schedule, zone).map_err(|e| refused(e.to_string()))?;
    let misfire = crate::edit::misfire(&fields.misfire).map_err(refused)?;
    let action = action(
        fields.message.as_deref(),
        fields.mission.as_ref(),
        root,
        policy,
    )?;
    let overlap = crate::edit::overlap(overlap_field, action.kind, fields.overlap.as_deref())
        .map_err(refused)?
        .unwrap_or_default();
    let (calendar, on_holiday) =
        calendar(fields.calendar.as_deref(), fields.on_holiday.as_deref()).map_err(refused)?;
    // The same checks as every other path that writes a routine (`cm_domain::definition`).
    NewRoutine::builder(&*fields.name, schedule, action.kind, action.payload)
        .calendar(calendar, on_holiday)
        .misfire(misfire)
        .overlap(overlap)
        .paused(fields.paused)
        .run_limit(fields.runs_left)
        .deadline(fields.deadline)
        .retry(fields.retry)
        .concurrency_key(fields.concurrency_key.clone())
        .mission_policy(policy)
        .build()
        .map_err(|e| refused(e.to_string()))
}

/// A routine's calendar and policy as given (`--calendar`, `--on-holiday`, or an import
/// line's `calendar` and `on_holiday`): a policy needs a calendar, and `none` is no calendar.
pub(crate) fn calendar(
    name: Option<&str>,
    policy: Option<&str>,
) -> Result<(Option<String>, cm_domain::OnHoliday), String> {
    let name = name.filter(|n| !n.eq_ignore_ascii_case("none"));
    let on_holiday = policy
        .map(|p| {
            p.parse()
                .map_err(|e: cm_domain::ParseOnHolidayError| format!("--on-holiday: {e}"))
        })
        .transpose()?;
    if let (None, Some(_)) = (name, on_holiday) {
        return Err(
            "--on-holiday goes with --calendar NAME (a routine on no calendar has no \
                    days off)"
                .into(),
        );
    }
    if let Some(name) = name {
        cm_domain::calendar::check_calendar_name(name).map_err(|e| e.to_string())?;
    }
    Ok((name.map(str::to_owned), on_holiday.unwrap_or_default()))
}

/// What a routine does, from `--message` or `--mission` (read inside `root` when an import's
/// line names it).
pub(super) fn action(
    message: Option<&str>,
    mission: Option<&PathBuf>,
    root: Option<&Path>,
    policy: &MissionPolicy,
) -> Result<RoutineAction, OperationError> {
    match (message, mission) {
        (Some(text), None) => crate::edit::message(text).map_err(refused),
        (None, Some(path)) => Ok(RoutineAction {
            kind: RoutineKind::Mission,
            payload: mission_payload(path, root, policy)?,
        }),
        _ => Err(refused("give exactly one of --message and --mission")),
    }
}

/// Reads and validates a mission file (`cm_domain::Mission`): every field is checked, and a
/// refusal names the field; then the operator's `policy`. Images, endpoints and credentials are
/// operator configuration, never part of a routine. The file is read no further than its limit,
/// and only if it is a regular file. With a `root` (an import's mission root) `path` is
/// relative to it and may not leave it ([`bounded::open_inside`]); without one it is the
/// operator's own (`--mission`), absolute or relative to the current directory.
pub fn mission_payload(
    path: &Path,
    root: Option<&Path>,
    policy: &MissionPolicy,
) -> Result<serde_json::Value, OperationError> {
    let shown = path.display();
    let opened = match root {
        Some(root) => bounded::open_inside(root, path).map(|(file, _)| file),
        None => bounded::open_regular(path),
    };
    let text = opened
        .and_then(|file| bounded::read_to(file, bounded::MISSION_FILE))
        .map_err(|e| refused(format!("cannot read mission file {shown}: {e}")))?;
    let mission = cm_domain::Mission::from_json(&text)
        .map_err(|e| refused(format!("mission file {shown}: {e}")))?;
    policy
        .check(&mission)
        .map_err(|e| refused(format!("mission file {shown}: {e}")))?;
    // Validation passed, so the text is a JSON object; it is stored as written.
    serde_json::from_str(&text).map_err(|e| refused(format!("mission file {shown}: {e}")))
}

/// `routine create`'s flags checked, before the database is touched: the routine to create,
/// with the overlap policy a mission names (`forbid` when it names none).
pub fn prepare(args: &CreateArgs) -> Result<NewRoutine, OperationError> {
    let policy = args
        .policy
        .policy(args.mission_config.as_deref())
        .map_err(refused)?;
    let fields = RoutineFields::try_from(args).map_err(refused)?;
    new_routine(&fields, None, &policy, "--overlap")
}

/// Creates `new`, its overlap policy with it, in one insert: the routine exists whole or not
/// at all.
pub async fn create(store: &PgStore, new: NewRoutine) -> Result<Routine, OperationError> {
    Ok(store.create_routine(new).await?)
}
