//! The events a claim's decisions make, written in the claim's transaction: a misfire policy
//! that skipped occurrences (`routine.misfired`, one per routine and claim, with the count),
//! and a routine left with no next run (`routine.finished`: its schedule ended, its run limit
//! was reached, or its one instant fired).

use std::collections::HashMap;

use cm_domain::{DueRoutine as PlannedRoutine, EventType, TickPlan};
use uuid::Uuid;

use super::due::DueRoutine;
use crate::events::RoutineNews;

/// The events of a claim that planned `plans` of the routines `due` into `tick` (its advances
/// in the order of `plans`).
pub(super) fn news(
    due: &[DueRoutine],
    plans: &[PlannedRoutine],
    tick: &TickPlan,
) -> Vec<RoutineNews> {
    if !tick
        .advances
        .iter()
        .any(|a| a.skipped > 0 || a.next_run_at.is_none())
    {
        return Vec::new();
    }
    let by_id: HashMap<Uuid, &DueRoutine> = due.iter().map(|r| (r.id, r)).collect();
    let mut news = Vec::new();
    for (plan, advance) in plans.iter().zip(&tick.advances) {
        let Some(routine) = by_id.get(&plan.routine_id) else {
            continue;
        };
        if advance.skipped > 0 {
            // The skipped occurrences run from the routine's owed one up to (not including)
            // the first it fires now, or its next run when it fires none.
            let until = plan
                .plan
                .occurrences
                .first()
                .copied()
                .or(advance.next_run_at);
            news.push(RoutineNews {
                routine_id: routine.id,
                event_type: EventType::Misfired,
                scheduled_at: Some(routine.next_run_at),
                data: serde_json::json!({
                    "policy": routine.misfire_policy,
                    "skipped": advance.skipped,
                    "first": routine.next_run_at,
                    "until": until,
                }),
            });
        }
        if advance.next_run_at.is_none() && advance.deferred == 0 && advance.held == 0 {
            let limit_spent = routine
                .runs_left
                .is_some_and(|left| i64::from(left) <= advance.claimed as i64);
            let reason = if limit_spent {
                "its run limit was reached"
            } else if routine
                .schedule
                .trim_start()
                .get(..3)
                .is_some_and(|word| word.eq_ignore_ascii_case("@at"))
            {
                "its one instant fired"
            } else {
                "its schedule has no more occurrences"
            };
            news.push(RoutineNews {
                routine_id: routine.id,
                event_type: EventType::Finished,
                scheduled_at: plan.plan.occurrences.last().copied(),
                data: serde_json::json!({ "reason": reason }),
            });
        }
    }
    news
}
