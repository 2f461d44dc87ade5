//! The statements that settle, reap, prune and list fires.

use cm_domain::FireOutcome;

/// Listing fires. `$1` the routine or NULL, `$2`/`$3` the cursor's instant and routine or NULL,
/// `$4` the limit; `outcome:` is the condition on the outcome (`outcome_condition_sql!`), or
/// `true`. The order (scheduled_at, routine_id) descending is an index's backward scan:
/// `routine_fires_scheduled_idx` without a filter, `routine_fires_failures_idx` for failures,
/// `routine_fires_runs_idx` for a run's state, `routine_fires_status_scheduled_idx` for the rest, the primary key with a routine. The
/// cursor's row comparison resumes the scan; the redundant `scheduled_at <= $2` lets it start
/// there on the primary key too, whose columns are in the other order.
macro_rules! list_fires_sql {
    (outcome: $outcome:expr) => {
        concat!(
            "
SELECT routine_id, scheduled_at, status, origin, claimant, attempt, claimed_at,
       lease_expires_at, completed_at, error, receipt, run_state, run_exit_code, run_reason,
       run_started_at, run_finished_at
FROM cm.routine_fires
WHERE ($1::uuid IS NULL OR routine_id = $1)
  AND (",
            $outcome,
            ")
  AND ($2::timestamptz IS NULL
       OR ((scheduled_at, routine_id) < ($2, $3::uuid) AND scheduled_at <= $2))
ORDER BY scheduled_at DESC, routine_id DESC
LIMIT $4"
        )
    };
}

/// Listing fires of every outcome (see `list_fires_sql!`).
pub(crate) const LIST_FIRES_SQL: &str = list_fires_sql!(outcome: "true");

/// The listing statement for fires of `outcome`, or of every outcome (see `list_fires_sql!`).
pub(crate) fn list_fires_statement(outcome: Option<FireOutcome>) -> &'static str {
    match outcome {
        None => LIST_FIRES_SQL,
        Some(FireOutcome::Claimed) => list_fires_sql!(outcome: outcome_condition_sql!(claimed)),
        Some(FireOutcome::Fired) => list_fires_sql!(outcome: outcome_condition_sql!(fired)),
        Some(FireOutcome::Skipped) => list_fires_sql!(outcome: outcome_condition_sql!(skipped)),
        Some(FireOutcome::Running) => list_fires_sql!(outcome: outcome_condition_sql!(running)),
        Some(FireOutcome::Succeeded) => list_fires_sql!(outcome: outcome_condition_sql!(succeeded)),
        Some(FireOutcome::Failed) => list_fires_sql!(outcome: outcome_condition_sql!(failed)),
        Some(FireOutcome::Lost) => list_fires_sql!(outcome: outcome_condition_sql!(lost)),
    }
}

/// [`FireLedger::settle_fires`](super::FireLedger::settle_fires)'s fenced update of a batch:
/// `$1` to `$7` the occurrences, their claims' tokens and attempts, and each one's status, error
/// and receipt; `group:` keeps it in one group, or is empty. Returns the rows it settled.
///
/// The rows are picked and locked first, `FOR UPDATE SKIP LOCKED`, and only those are updated:
/// a row another transaction holds (a caller's open `cm.delete_routine`, say) is left out of
/// the batch instead of making the whole statement wait on it and fail on `lock_timeout`. The
/// caller finds it still held by its claim ([`PRESENT_FIRES_SQL`]) and settles it later.
macro_rules! settle_fires_sql {
    (group: $tail:literal) => {
        concat!(
            "WITH held AS (
                 SELECT f.routine_id, f.scheduled_at, f.group_id, t.status, t.error, t.receipt
                 FROM cm.routine_fires AS f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::uuid[], $4::int[], $5::text[],
                             $6::text[], $7::text[])
                      AS t(routine_id, scheduled_at, claim_token, attempt, status, error, receipt)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
                 WHERE f.claim_token = t.claim_token AND f.attempt = t.attempt
                   AND f.status = 'claimed'",
            $tail,
            "
                 FOR UPDATE OF f SKIP LOCKED
             )
             UPDATE cm.routine_fires AS f
             SET status = h.status, error = h.error, receipt = h.receipt, completed_at = now()
             FROM held AS h
             WHERE f.routine_id = h.routine_id AND f.scheduled_at = h.scheduled_at
               AND f.group_id = h.group_id",
            $tail,
            " RETURNING f.routine_id, f.scheduled_at"
        )
    };
}

/// [`settle_fires_sql!`] over every group.
pub(crate) const SETTLE_FIRES_SQL: &str = settle_fires_sql!(group: "");

/// [`settle_fires_sql!`] within the group `$8`.
pub(crate) const SETTLE_GROUP_FIRES_SQL: &str = settle_fires_sql!(group: " AND f.group_id = $8");

/// The fenced settle of one claim that waits for its row's lock (up to the transaction's
/// `lock_timeout`) instead of skipping it: `$1` to `$7` as in [`settle_fires_sql!`], one element
/// each, `$8` the group. A settle that found its row locked comes back through this one, so
/// that, queued on the lock, it takes the row before any reaper can (the reaper skips locked
/// rows rather than queue).
pub(crate) const SETTLE_WAITING_SQL: &str = "UPDATE cm.routine_fires AS f
             SET status = t.status, error = t.error, receipt = t.receipt, completed_at = now()
             FROM UNNEST($1::uuid[], $2::timestamptz[], $3::uuid[], $4::int[], $5::text[],
                         $6::text[], $7::text[])
                  AS t(routine_id, scheduled_at, claim_token, attempt, status, error, receipt)
             WHERE f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
               AND f.claim_token = t.claim_token AND f.attempt = t.attempt
               AND f.status = 'claimed' AND f.group_id = $8
             RETURNING f.routine_id, f.scheduled_at";

/// Sets the transaction's `lock_timeout` to `$1` (text, such as `250ms`).
pub(crate) const LOCAL_LOCK_TIMEOUT_SQL: &str = "SELECT set_config('lock_timeout', $1, true)";

/// Which of the occurrences `$1`/`$2` (routines and instants) a batch settle did not settle are
/// still in the ledger, and whether each is still held by its claim (`$3`/`$4` the tokens and
/// attempts): such a row was skipped because another transaction held its lock. A row present
/// but not held was taken over by another claimant (or settled) rather than gone with its
/// routine.
pub(crate) const PRESENT_FIRES_SQL: &str = "SELECT f.routine_id, f.scheduled_at,
                        (f.claim_token = t.claim_token AND f.attempt = t.attempt
                         AND f.status = 'claimed') AS held
                 FROM cm.routine_fires f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::uuid[], $4::int[])
                      AS t(routine_id, scheduled_at, claim_token, attempt)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at";

/// [`PRESENT_FIRES_SQL`] within the group `$5`.
pub(crate) const PRESENT_GROUP_FIRES_SQL: &str = "SELECT f.routine_id, f.scheduled_at,
                        (f.claim_token = t.claim_token AND f.attempt = t.attempt
                         AND f.status = 'claimed') AS held
                 FROM cm.routine_fires f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::uuid[], $4::int[])
                      AS t(routine_id, scheduled_at, claim_token, attempt)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
                 WHERE f.group_id = $5";

/// Records on a claim still held (`$1`/`$2` the occurrence, `$3`/`$4` the claim's token and
/// attempt) the error `$5` its attempt met.
pub(crate) const NOTE_UNSETTLED_SQL: &str = "UPDATE cm.routine_fires SET error = $5
             WHERE routine_id = $1 AND scheduled_at = $2
               AND claim_token = $3 AND attempt = $4 AND status = 'claimed'";

/// Deletes settled fires past the retention (`$1` seconds), at most `$2`, oldest settled first;
/// `group:` keeps it in one group, or is empty.
macro_rules! prune_sql {
    (group: $group:literal) => {
        concat!(
            "
DELETE FROM cm.routine_fires
WHERE (routine_id, scheduled_at) IN (
    SELECT routine_id, scheduled_at FROM cm.routine_fires
    WHERE status <> 'claimed'
      AND completed_at < now() - make_interval(secs => $1)
      AND scheduled_at < now() - make_interval(secs => $1)",
            $group,
            "
    ORDER BY completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED)",
            $group
        )
    };
}

/// Prunes settled fires of every group.
pub(crate) const PRUNE_SQL: &str = prune_sql!(group: "");

/// Prunes settled fires of the group `$3`.
pub(crate) const PRUNE_GROUP_SQL: &str = prune_sql!(group: " AND group_id = $3");

/// The reaper's statement; `expired:` and `taken:` keep the rows it finds and the rows it
/// updates in one group, or are empty.
macro_rules! reap_sql {
    (expired: $expired:literal, taken: $update:literal) => {
        concat!(
            "
WITH expired AS (
    SELECT routine_id, scheduled_at, group_id
    FROM cm.routine_fires
    WHERE status = 'claimed' AND lease_expires_at <= now()",
            $expired,
            "
    ORDER BY claimed_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE cm.routine_fires AS f
SET claimant = $2, claim_token = $3, attempt = f.attempt + 1, claimed_at = now(),
    lease_expires_at = now() + make_interval(secs => $4)
FROM expired e, cm.routines r
WHERE f.routine_id = e.routine_id AND f.scheduled_at = e.scheduled_at
  AND f.group_id = e.group_id AND r.id = f.routine_id AND r.group_id = f.group_id",
            $update,
            "
RETURNING false AS inserted, f.routine_id, f.scheduled_at, f.status, f.claimant,
          f.claim_token, f.attempt, f.lease_expires_at, r.name, r.kind, f.origin, r.payload,
          NULL::text AS receipt, NULL::bigint AS written, f.error, f.first_claimed_at,
          f.planned_at"
        )
    };
}

/// The reaper. `$1` is the most rows to take, `$2` the claimant, `$3` the claim token, `$4`
/// the lease in seconds. The expired rows are found through `routine_fires_lease_idx` (the lease
/// of `claimed` rows), so a pass reads the expired claims only, never the live ones; they are
/// taken oldest claim first and locked with `SKIP LOCKED`, so two reapers never take the same
/// row, and a row a claim statement holds is left to it.
pub(crate) const REAP_SQL: &str = reap_sql!(expired: "", taken: "");

/// [`REAP_SQL`] within the group `$5`: on Citus the expired claims are found through
/// `routine_fires_group_lease_idx` `(group_id, lease_expires_at)` (created by `migrate --citus`).
pub(crate) const REAP_GROUP_SQL: &str =
    reap_sql!(expired: " AND group_id = $5", taken: " AND f.group_id = $5");

/// The database's clock, fixed for the whole transaction.
pub(crate) const CLOCK_SQL: &str = "SELECT now()";
