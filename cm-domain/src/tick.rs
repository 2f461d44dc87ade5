//! Tick planning: which due occurrences one claim takes under the cap, and where each routine's
//! clock moves.
//!
//! The cap ([`FireCap`], 25 by default) bounds one claim transaction's fan-out, not the rate: a
//! scheduler whose claim came back full claims again at once. A claim takes routines in the
//! order of their oldest owed occurrence (then by id), each with everything it owes, oldest
//! first, until the cap is reached; the routine that reaches it is cut there. A routine caught
//! up in one claim costs one row write however many occurrences it owed, so a backlog drains at
//! the same rate whether it is spread over many routines or few. A routine with deferred
//! occurrences keeps its clock at the oldest one, so a deferred occurrence is still owed, never
//! lost: it comes due again on the next claim.
//!
//! When routines share concurrency keys, each due routine is given its **turn** among its key's
//! (0 for its key's oldest, 1 for the next, …): a claim takes turns before instants, so the
//! first turn of every key comes before the second of any, and one key's backlog cannot hold
//! another key's routines past a claim. Given turns all 0, the order is the instants' alone.
//!
//! Some routines may also be **limited** (missions, whose launches are bounded by a rate):
//! together they take at most the limited room, and what does not fit is **held**, owed like a
//! deferred occurrence but not a reason to claim again before the room comes back.

use chrono::{DateTime, Utc};

use crate::config::FireCap;
use crate::misfire::DuePlan;
use crate::occurrence::{Occurrence, RoutineId};

/// What one tick does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TickPlan {
    /// The occurrences to claim and dispatch, oldest first; never more than the cap.
    pub claims: Vec<Occurrence>,
    /// How many due occurrences the cap deferred to a later claim.
    pub deferred: usize,
    /// How many due occurrences of limited routines the limited room held back.
    pub held: usize,
    /// Where each due routine's clock moves, in the order the routines were given.
    pub advances: Vec<RoutineAdvance>,
}

/// The new clock of one routine after a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutineAdvance {
    /// The routine.
    pub routine_id: RoutineId,
    /// Its new `next_run_at`: the oldest deferred (or held) occurrence if any, else the plan's
    /// next run.
    pub next_run_at: Option<DateTime<Utc>>,
    /// Misfires its policy skipped (counted and logged, never fired).
    pub skipped: u64,
    /// How many of its occurrences this tick claims.
    pub claimed: usize,
    /// How many of its occurrences the cap deferred.
    pub deferred: usize,
    /// How many of its occurrences the limited room held back.
    pub held: usize,
}

/// One due routine as [`plan_claim`] takes it: its misfire plan, its turn among its key's, and
/// whether it counts against the limited room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueRoutine {
    /// The routine.
    pub routine_id: RoutineId,
    /// What its misfire policy owes.
    pub plan: DuePlan,
    /// Whether its occurrences take the limited room (a mission under a launch rate).
    pub limited: bool,
    /// Its place among the due routines of its concurrency key, oldest first from 0 (routines
    /// without a key count as one key): lower turns are taken first, then older instants.
    pub turn: u32,
}

/// Plans a tick over due routines and their misfire plans, under `cap`, with no routine limited.
pub fn plan_tick(due: &[(RoutineId, DuePlan)], cap: FireCap) -> TickPlan {
    let due: Vec<DueRoutine> = due
        .iter()
        .map(|(routine_id, plan)| DueRoutine {
            routine_id: *routine_id,
            plan: plan.clone(),
            limited: false,
            turn: 0,
        })
        .collect();
    plan_claim(&due, cap, 0)
}

/// Plans one claim over due routines under `cap`; limited routines together take at most
/// `limited_room` occurrences (see the module documentation for the order).
pub fn plan_claim(due: &[DueRoutine], cap: FireCap, limited_room: usize) -> TickPlan {
    // Each routine's owed occurrences, oldest first and without repeats.
    let owed: Vec<Vec<DateTime<Utc>>> = due
        .iter()
        .map(|r| {
            let mut at = r.plan.occurrences.clone();
            at.sort_unstable();
            at.dedup();
            at
        })
        .collect();
    // Routines by their turn, then their oldest owed occurrence; the id breaks ties so the
    // plan does not depend on input order.
    let mut order: Vec<usize> = (0..due.len()).filter(|i| !owed[*i].is_empty()).collect();
    order.sort_unstable_by_key(|i| (due[*i].turn, owed[*i][0], due[*i].routine_id));

    // How many of each routine's occurrences are claimed, and whether the limited room (not
    // the cap) is what stopped it.
    let mut taken = vec![(0usize, false); due.len()];
    let mut left = cap.get();
    let mut limited_left = limited_room;
    for i in order {
        let mut n = owed[i].len().min(left);
        let mut held = false;
        if due[i].limited {
            held = limited_left < n;
            n = n.min(limited_left);
            limited_left -= n;
        }
        taken[i] = (n, held);
        left -= n;
    }

    let mut plan = TickPlan::default();
    for ((routine, at), (n, by_room)) in due.iter().zip(&owed).zip(&taken) {
        let claimed = &at[..*n];
        let rest = &at[*n..];
        plan.claims.extend(
            claimed
                .iter()
                .map(|t| Occurrence::new(routine.routine_id, *t)),
        );
        let held = if *by_room { rest.len() } else { 0 };
        let deferred = rest.len() - held;
        plan.deferred += deferred;
        plan.held += held;
        plan.advances.push(RoutineAdvance {
            routine_id: routine.routine_id,
            next_run_at: rest.first().copied().or(routine.plan.next_run_at),
            skipped: routine.plan.skipped,
            claimed: claimed.len(),
            deferred,
            held,
        });
    }
    plan.claims.sort_unstable();
    plan
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

    #[test]
    fn a_routine_is_taken_whole_before_the_next() {
        // Two routines owing three each, cap 4: the first (oldest, then lower id) is caught up
        // in one claim, the second gets the one left; its other two are deferred.
        check(
            &[(&[1, 2, 3], 4, 0), (&[1, 2, 3], 4, 0)],
            4,
            &[(0, 1), (1, 1), (0, 2), (0, 3)],
            2,
            &[4, 2],
        );
    }

    #[test]
    fn limited_routines_share_their_room_and_the_rest_is_held() {
        let r = |i: u128, minutes: &[u32], limited: bool| DueRoutine {
            routine_id: Uuid::from_u128(i),
            plan: plan(minutes, 9, 0),
            limited,
            turn: 0,
        };
        let due = [r(0, &[1, 2], true), r(1, &[1], false), r(2, &[2], true)];
        let got = plan_claim(&due, FireCap::new(10).unwrap(), 1);
        let claimed: Vec<_> = got.claims.iter().map(|o| o.routine_id.as_u128()).collect();
        assert_eq!(claimed, [0, 1]);
        assert_eq!((got.deferred, got.held), (0, 2));
        let held: Vec<_> = got
            .advances
            .iter()
            .map(|a| (a.held, a.next_run_at))
            .collect();
        assert_eq!(held, [(1, Some(at(2))), (0, Some(at(9))), (1, Some(at(2)))]);
        // The cap, not the room, stops a limited routine: deferred, not held.
        let got = plan_claim(&due[..1], FireCap::new(1).unwrap(), 5);
        assert_eq!((got.deferred, got.held), (1, 0));
    }

    #[test]
    fn turns_come_before_instants() {
        // Key A's two routines are older than key B's one; cap 2: A's first and B's first.
        let r = |i: u128, minute: u32, turn: u32| DueRoutine {
            routine_id: Uuid::from_u128(i),
            plan: plan(&[minute], 9, 0),
            limited: false,
            turn,
        };
        let due = [r(0, 1, 0), r(1, 2, 1), r(2, 5, 0)];
        let got = plan_claim(&due, FireCap::new(2).unwrap(), 0);
        let claimed: Vec<_> = got.claims.iter().map(|o| o.routine_id.as_u128()).collect();
        assert_eq!(claimed, [0, 2]);
        assert_eq!(got.deferred, 1);
        assert_eq!(got.advances[1].next_run_at, Some(at(2)));
    }

    proptest::proptest! {
        /// Under any cap, a routine with occurrences left unclaimed by the cap means no routine
        /// of a later turn claimed anything; and nothing is lost: each routine's occurrences
        /// are claimed or deferred, its oldest deferred one its new clock.
        #[test]
        fn a_later_turn_never_goes_before_an_earlier_one(
            routines in proptest::collection::vec((1u32..4, 0u32..50, 0u32..4), 1..12),
            cap in 1usize..12,
        ) {
            let due: Vec<DueRoutine> = routines
                .iter()
                .enumerate()
                .map(|(i, (n, first, turn))| DueRoutine {
                    routine_id: Uuid::from_u128(i as u128),
                    plan: plan(&(*first..first + n).collect::<Vec<_>>(), 59, 0),
                    limited: false,
                    turn: *turn,
                })
                .collect();
            let got = plan_claim(&due, FireCap::new(cap).unwrap(), 0);
            proptest::prop_assert!(got.claims.len() <= cap);
            for (cut, advance) in due.iter().zip(&got.advances) {
                proptest::prop_assert_eq!(
                    advance.claimed + advance.deferred,
                    cut.plan.occurrences.len()
                );
                if advance.deferred == 0 {
                    continue;
                }
                proptest::prop_assert_eq!(
                    advance.next_run_at,
                    Some(cut.plan.occurrences[advance.claimed])
                );
                for (other, taken) in due.iter().zip(&got.advances) {
                    proptest::prop_assert!(
                        other.turn <= cut.turn || taken.claimed == 0,
                        "turn {} claimed {} while turn {} was cut",
                        other.turn,
                        taken.claimed,
                        cut.turn
                    );
                }
            }
        }
    }
}
