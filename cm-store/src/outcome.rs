//! A fire's outcome in SQL: the statements' form of [`cm_domain::FireOutcome::of`], so every
//! query that counts, lists or pauses on failures reads one rule, derived from `status` and
//! `run_state` and never stored as a second truth.

/// The outcome of the `routine_fires` row whose columns carry the prefix (`""` or `"f."`): the
/// run's state for a fire with a run, `failed` for a failed dispatch whatever its run, else the
/// status.
macro_rules! outcome_sql {
    ($p:literal) => {
        concat!(
            "(CASE WHEN ",
            $p,
            "status = 'failed' THEN 'failed' WHEN ",
            $p,
            "run_state IS NOT NULL THEN ",
            $p,
            "run_state ELSE ",
            $p,
            "status END)"
        )
    };
}

/// Whether the row's outcome is a failure (`failed` or `lost`), never NULL (a message has no
/// run state): the predicate of `routine_fires_failures_idx`, written exactly so, which lets
/// the planner use that index.
macro_rules! failure_sql {
    ($p:literal) => {
        concat!(
            "(",
            $p,
            "status = 'failed' OR COALESCE(",
            $p,
            "run_state IN ('failed', 'lost'), false))"
        )
    };
}

/// Why a failed row failed: the dispatch's error, or the run's reason (`exit code 3`).
macro_rules! failure_reason_sql {
    ($p:literal) => {
        concat!(
            "(CASE WHEN ",
            $p,
            "status = 'failed' THEN ",
            $p,
            "error ELSE ",
            $p,
            "run_reason END)"
        )
    };
}

/// The condition on a `routine_fires` row (unprefixed columns) that its outcome is the one
/// named (`failed` takes every failure, `lost` runs too: what an operator asking for the
/// failures wants), written for the ledger's indexes: failures through `routine_fires_failures_idx`, runs
/// through `routine_fires_running_idx`, the rest through the status index.
macro_rules! outcome_condition_sql {
    (claimed) => {
        "status = 'claimed' AND run_state IS NULL"
    };
    (fired) => {
        "status = 'fired' AND run_state IS NULL"
    };
    (skipped) => {
        "status = 'skipped' AND run_state IS NULL"
    };
    (running) => {
        "run_state = 'running' AND status <> 'failed'"
    };
    (succeeded) => {
        "run_state = 'succeeded' AND status <> 'failed'"
    };
    (failed) => {
        failure_sql!("")
    };
    (lost) => {
        concat!(
            failure_sql!(""),
            " AND status <> 'failed' AND run_state = 'lost'"
        )
    };
}

/// A `routine_fires` row's outcome as an SQL expression over its unqualified columns, for a
/// caller's own queries (a report, a dashboard): `claimed`, `fired`, `failed`, `skipped`,
/// `running`, `succeeded` or `lost`, as [`cm_domain::FireOutcome::of`] derives it.
pub const FIRE_OUTCOME_SQL: &str = outcome_sql!("");

/// Whether a `routine_fires` row's outcome is a failure (`failed` or `lost`), as an SQL condition
/// over its unqualified columns; written so, it is the predicate of the ledger's index of
/// failures, which a query with it can use.
pub const FIRE_FAILURE_SQL: &str = failure_sql!("");
