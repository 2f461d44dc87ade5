//! The routines' clocks a claim moves (each routine's `next_run_at`, last run and run limit, in
//! the claim's own statement), and where a drain's next claim resumes the due walk.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use cm_domain::TickPlan;
use sqlx::Postgres;
use uuid::Uuid;

use super::DueCursor;
use super::due::{DueRoutine, Request};

/// Where a following claim may resume the due walk: after the last of the locked routines
/// (in the walk's order) before the first one the cap deferred occurrences of, which the next
/// claim must see again.
pub(super) fn resume_after(due: &[DueRoutine], tick: &TickPlan) -> Option<DueCursor> {
    let deferred: HashSet<Uuid> = tick
        .advances
        .iter()
        .filter(|a| a.deferred > 0)
        .map(|a| a.routine_id)
        .collect();
    // The keys' heads lie past the walk's frontier: the cursor moves over the walk alone.
    due.iter()
        .filter(|r| r.walked)
        .take_while(|r| !deferred.contains(&r.id))
        .last()
        .map(|r| DueCursor {
            next_run_at: r.next_run_at,
            routine_id: r.id,
        })
}

/// The routine rows a claim writes: each routine whose clock moved or that fired (a requested
/// occurrence counts as a run too). Routines whose occurrences were all deferred keep their
/// row as it was.
pub(super) struct Advance {
    pub(super) ids: Vec<Uuid>,
    pub(super) next_run_at: Vec<Option<DateTime<Utc>>>,
    pub(super) moves: Vec<bool>,
    pub(super) ran: Vec<bool>,
    /// How many scheduled occurrences of each the claim claims: a run limit is lowered by it.
    pub(super) claimed: Vec<i32>,
}

impl Advance {
    pub(super) fn new(due: &[DueRoutine], tick: &TickPlan, requested: &[Request]) -> Advance {
        let was: HashMap<Uuid, DateTime<Utc>> = due.iter().map(|r| (r.id, r.next_run_at)).collect();
        let mut advance = Advance {
            ids: Vec::new(),
            next_run_at: Vec::new(),
            moves: Vec::new(),
            ran: Vec::new(),
            claimed: Vec::new(),
        };
        for a in &tick.advances {
            let moves = a.next_run_at != was.get(&a.routine_id).copied();
            if a.claimed > 0 || moves {
                advance.ids.push(a.routine_id);
                advance.next_run_at.push(a.next_run_at);
                advance.moves.push(moves);
                advance.ran.push(a.claimed > 0);
                advance
                    .claimed
                    .push(i32::try_from(a.claimed).unwrap_or(i32::MAX));
            }
        }
        let mut requested_only: Vec<Uuid> = requested
            .iter()
            .map(|r| r.routine_id)
            .filter(|id| !advance.ids.contains(id))
            .collect();
        requested_only.sort_unstable();
        requested_only.dedup();
        for id in requested_only {
            advance.ids.push(id);
            advance.next_run_at.push(None);
            advance.moves.push(false);
            advance.ran.push(true);
            advance.claimed.push(0);
        }
        advance
    }

    /// Binds the four arrays of the advance (`advance_cte!`, [`ADVANCE_SQL`](super::sql::ADVANCE_SQL)), which come
    /// before the statement's clock; the fifth, the claimed counts, is bound last of all
    /// ([`Advance::bind_claimed`]).
    pub(super) fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.next_run_at)
            .bind(&self.moves)
            .bind(&self.ran)
    }

    /// Binds the claimed counts, the statement's last parameter (after its group, if any).
    pub(super) fn bind_claimed<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        query.bind(&self.claimed)
    }
}
