//! Tick planning: which due occurrences one tick claims under the cap, and where each routine's
//! clock moves.
//!
//! The cap ([`FireCap`], 25 by default) is a safety bound against clock jumps and runaway
//! schedules: a tick claims the oldest occurrences first, across all due routines, and defers
//! the rest. A routine with deferred occurrences keeps its clock at the oldest one, so a
//! deferred occurrence is still owed, never lost: it comes due again on the next tick.

use chrono::{DateTime, Utc};

use crate::config::FireCap;
use crate::misfire::DuePlan;
use crate::occurrence::{Occurrence, RoutineId};

/// What one tick does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickPlan {
    /// The occurrences to claim and dispatch, oldest first; never more than the cap.
    pub claims: Vec<Occurrence>,
    /// How many due occurrences the cap deferred to a later tick.
    pub deferred: usize,
    /// Where each due routine's clock moves, in the order the routines were given.
    pub advances: Vec<RoutineAdvance>,
}

/// The new clock of one routine after a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutineAdvance {
    /// The routine.
    pub routine_id: RoutineId,
    /// Its new `next_run_at`: the oldest deferred occurrence if any, else the plan's next run.
    pub next_run_at: Option<DateTime<Utc>>,
    /// Misfires its policy skipped (counted and logged, never fired).
    pub skipped: u64,
    /// How many of its occurrences this tick claims.
    pub claimed: usize,
    /// How many of its occurrences the cap deferred.
    pub deferred: usize,
}

/// Plans a tick over due routines and their misfire plans, under `cap`.
pub fn plan_tick(due: &[(RoutineId, DuePlan)], cap: FireCap) -> TickPlan {
    let mut all: Vec<Occurrence> = due
        .iter()
        .flat_map(|(id, plan)| plan.occurrences.iter().map(|at| Occurrence::new(*id, *at)))
        .collect();
    // Oldest first; the routine id breaks ties so the plan does not depend on input order.
    all.sort_unstable();
    all.dedup();
    let deferred_from = all.len().min(cap.get());
    let deferred = all.split_off(deferred_from);

    let advances = due
        .iter()
        .map(|(id, plan)| {
            let mine = |o: &&Occurrence| o.routine_id == *id;
            let oldest_deferred = deferred.iter().find(mine).map(|o| o.scheduled_at);
            RoutineAdvance {
                routine_id: *id,
                next_run_at: oldest_deferred.or(plan.next_run_at),
                skipped: plan.skipped,
                claimed: all.iter().filter(mine).count(),
                deferred: deferred.iter().filter(mine).count(),
            }
        })
        .collect();
    TickPlan {
        claims: all,
        deferred: deferred.len(),
        advances,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use uuid::Uuid;

    fn at(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, minute, 0).unwrap()
    }

    fn plan(minutes: &[u32], next: u32, skipped: u64) -> DuePlan {
        DuePlan {
            occurrences: minutes.iter().map(|m| at(*m)).collect(),
            skipped,
            next_run_at: Some(at(next)),
        }
    }

    /// One case: routines given as (occurrence minutes, next minute, skipped); the cap; the
    /// claimed (routine index, minute) pairs; the deferred count; each routine's new clock.
    fn check(
        routines: &[(&[u32], u32, u64)],
        cap: usize,
        claims: &[(u128, u32)],
        deferred: usize,
        clocks: &[u32],
    ) {
        let due: Vec<_> = routines
            .iter()
            .enumerate()
            .map(|(i, (m, next, skipped))| (Uuid::from_u128(i as u128), plan(m, *next, *skipped)))
            .collect();
        let got = plan_tick(&due, FireCap::new(cap).unwrap());
        let want: Vec<_> = claims
            .iter()
            .map(|(r, m)| Occurrence::new(Uuid::from_u128(*r), at(*m)))
            .collect();
        assert_eq!(got.claims, want);
        assert_eq!(got.deferred, deferred);
        let got_clocks: Vec<_> = got.advances.iter().map(|a| a.next_run_at).collect();
        let want_clocks: Vec<_> = clocks.iter().map(|m| Some(at(*m))).collect();
        assert_eq!(got_clocks, want_clocks);
        for (advance, (_, _, skipped)) in got.advances.iter().zip(routines) {
            assert_eq!(advance.skipped, *skipped);
        }
    }

    #[test]
    fn cap_and_deferral() {
        check(&[(&[1, 2], 3, 0)], 25, &[(0, 1), (0, 2)], 0, &[3]);
        check(&[(&[1, 2, 3], 4, 0)], 2, &[(0, 1), (0, 2)], 1, &[3]);
        check(&[(&[1, 2, 3], 4, 5)], 1, &[(0, 1)], 2, &[2]);
        // Oldest first across routines; ties broken by routine id.
        check(
            &[(&[2, 4], 5, 0), (&[1, 2], 3, 0)],
            3,
            &[(1, 1), (0, 2), (1, 2)],
            1,
            &[4, 3],
        );
        // A routine entirely deferred keeps its clock at its oldest occurrence.
        check(&[(&[1], 2, 0), (&[9], 10, 0)], 1, &[(0, 1)], 1, &[2, 9]);
        check(&[(&[], 7, 4)], 1, &[], 0, &[7]);
    }
}
