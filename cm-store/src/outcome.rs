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

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeDelta, Utc};
    use cm_domain::{FireOutcome, FireStatus, RunStateName};
    use sqlx::PgPool;

    /// A row's outcome, over its unqualified columns.
    const FIRE_OUTCOME_SQL: &str = outcome_sql!("");

    /// Whether a row's outcome is a failure, over its unqualified columns.
    const FIRE_FAILURE_SQL: &str = failure_sql!("");

    /// Every pair of a status and a run state (or none) reads in SQL as the domain derives it.
    #[sqlx::test(migrator = "crate::MIGRATOR")]
    async fn the_outcome_in_sql_is_the_domain_rule(pool: PgPool) {
        let routine = uuid::Uuid::new_v4();
        let base: DateTime<Utc> = crate::schema::query_scalar("SELECT date_trunc('minute', now())")
            .fetch_one(&pool)
            .await
            .unwrap();
        let runs = std::iter::once(None).chain(RunStateName::ALL.map(Some));
        let mut expected = Vec::new();
        for status in [
            FireStatus::Claimed,
            FireStatus::Fired,
            FireStatus::Failed,
            FireStatus::Skipped,
        ] {
            for run in runs.clone() {
                let at = base + TimeDelta::minutes(expected.len() as i64);
                crate::schema::query(
                    "INSERT INTO cm.routine_fires
                         (routine_id, scheduled_at, status, completed_at, error, run_state,
                          claimant, claim_token, attempt, claimed_at, lease_expires_at)
                     VALUES ($1, $2, $3::text,
                             CASE WHEN $3::text = 'claimed' THEN NULL ELSE now() END,
                             CASE WHEN $3::text IN ('failed', 'skipped') THEN 'why' END, $4,
                             'other', gen_random_uuid(), 1, now(), now() + interval '1 minute')",
                )
                .bind(routine)
                .bind(at)
                .bind(status.as_str())
                .bind(run.map(RunStateName::as_str))
                .execute(&pool)
                .await
                .unwrap();
                expected.push((at, FireOutcome::of(status, run)));
            }
        }
        let rows: Vec<(DateTime<Utc>, String, bool)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT scheduled_at, {FIRE_OUTCOME_SQL}, {FIRE_FAILURE_SQL}
                 FROM cm.routine_fires ORDER BY scheduled_at"
            )))
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(rows.len(), expected.len());
        for ((at, outcome, failure), (want_at, want)) in rows.iter().zip(&expected) {
            assert_eq!(at, want_at);
            assert_eq!(outcome, want.as_str(), "the SQL outcome at {at}");
            assert_eq!(*failure, want.is_failure(), "the SQL failure at {at}");
        }
    }
}
