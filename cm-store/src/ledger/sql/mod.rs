//! The ledger's SQL: every statement the claim, the settle, the reaper, the pruning and the
//! listing send, kept apart from the code that binds them so a reviewer reads them together.
//!
//! Statements that differ by a filter (kept in one group, resumed after a cursor) are built
//! once, at compile time, by `macro_rules!` templates whose slots are named at each use
//! (`due_sql!(resume: …, routines: …)`), so each constant's parameters can be read off its
//! definition.

mod claim;
mod fires;

pub(crate) use claim::*;
pub(crate) use fires::*;
pub(crate) use fires::{
    given_up_error_sql, next_occurrence_sql, reason_instant_sql, retry_decision_sql, retry_wait_sql,
};
