//! The statements that settle, reap, prune and list fires.

use cm_domain::FireOutcome;

/// Listing fires. `$1` the routine or NULL, `$2`/`$3` the cursor's instant and routine or NULL,
/// `$4` the limit; `outcome:` is the condition on the outcome (`outcome_condition_sql!`), or
/// `true`. The order (scheduled_at, routine_id) descending is an index's backward scan:
/// `routine_fires_scheduled_idx` without a filter, `routine_fires_failures_idx` for failures,
/// `routine_fires_runs_idx` for a run's state, `routine_fires_status_scheduled_idx` for a status
/// other than `fired` (it holds no fired fire), `routine_fires_scheduled_idx` with a filter for
/// `fired` (the bulk of the ledger, so nearly every row it reads is one), the primary key with a
/// routine. The cursor's row comparison resumes the scan; the redundant `scheduled_at <= $2` lets
/// it start there on the primary key too, whose columns are in the other order.
macro_rules! list_fires_sql {
    (outcome: $outcome:expr) => {
        concat!(
            "
SELECT routine_id, scheduled_at, status, origin, claimant, attempt, claimed_at,
       lease_expires_at, completed_at, error, receipt, run_state, run_exit_code, run_reason,
       run_started_at, run_finished_at, retry, tries
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

/// The wait before the retry a failed attempt of the fire `f` of the routine `r` would begin:
/// the routine's backoff doubled once per retry already begun, at most its cap
/// ([`cm_domain::RetryPolicy::delay`]).
macro_rules! retry_wait_sql {
    () => {
        "make_interval(secs => least(r.retry_backoff_secs * power(2::float8, f.retry),
                                   r.retry_backoff_max_secs))"
    };
}

/// An instant as a retry's reason writes it (RFC 3339, UTC, whole seconds), of `$at`.
macro_rules! reason_instant_sql {
    ($at:expr) => {
        concat!(
            "to_char((",
            $at,
            ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        )
    };
}

/// The planned instant of the occurrence after the fire `f` of the routine `r`: the earliest of
/// the routine's later fires in the ledger (occurrences are claimed in order, so the next one is
/// there once claimed) and its next run (`least` passes over a NULL). Read through the primary
/// key, within the fire's group, `$group` (the fire's column, or on Citus the statement's group
/// parameter, so the subquery is on the same shard).
macro_rules! next_occurrence_sql {
    ($group:expr) => {
        concat!(
            "least(r.next_run_at,
               (SELECT coalesce(n.planned_at, n.scheduled_at) FROM cm.routine_fires AS n
                WHERE n.routine_id = f.routine_id AND n.group_id = ",
            $group,
            "
                  AND n.scheduled_at > f.scheduled_at
                ORDER BY n.scheduled_at LIMIT 1))"
        )
    };
}

/// What becomes of the attempt of the fire `f` of the routine `r` (NULL when the routine was
/// deleted; `$group` its group, as in `next_occurrence_sql!`) whose outcome is failed when
/// `$failed` holds: NULL (not failed, or the routine asks
/// for no retry), `'retry'`, or the reason no retry is made: the rule of
/// [`cm_domain::RetryPolicy::decide`], written in SQL so the statement recording the failure
/// decides it.
macro_rules! retry_decision_sql {
    ($failed:expr, group: $group:expr) => {
        concat!(
            "CASE
                WHEN NOT coalesce(",
            $failed,
            ", false) OR coalesce(r.retries, 0) = 0 THEN NULL
                WHEN f.retry >= r.retries
                     THEN format('retries spent (%s of %s)', f.retry, r.retries)
                WHEN r.paused THEN 'not retried: the routine is paused'
                WHEN now() + ",
            retry_wait_sql!(),
            " >= ",
            next_occurrence_sql!($group),
            "
                     THEN format('not retried: retry %s would be due at %s, not before the next occurrence at %s',
                                 f.retry + 1, ",
            reason_instant_sql!(concat!("now() + ", retry_wait_sql!())),
            ", ",
            reason_instant_sql!(next_occurrence_sql!($group)),
            ")
                WHEN r.deadline_secs IS NOT NULL
                     AND now() + ",
            retry_wait_sql!(),
            " >= coalesce(f.planned_at, f.scheduled_at) + make_interval(secs => r.deadline_secs)
                     THEN format('not retried: retry %s would be due at %s, past the deadline at %s',
                                 f.retry + 1, ",
            reason_instant_sql!(concat!("now() + ", retry_wait_sql!())),
            ", ",
            reason_instant_sql!(
                "coalesce(f.planned_at, f.scheduled_at) + make_interval(secs => r.deadline_secs)"
            ),
            ")
                ELSE 'retry'
             END"
        )
    };
}

/// A failed attempt's error with the reason no retry was made (`$decision`, see
/// `retry_decision_sql!`) after it, within the column's 4096 bytes.
macro_rules! given_up_error_sql {
    ($error:expr, $decision:expr) => {
        concat!(
            "CASE WHEN ",
            $decision,
            " IS NULL OR ",
            $decision,
            " = 'retry' THEN ",
            $error,
            "
                  WHEN octet_length(",
            $error,
            ") + octet_length(",
            $decision,
            ") <= 4000 THEN ",
            $error,
            " || '; ' || ",
            $decision,
            "
                  ELSE ",
            $decision,
            " || ': ' || left(",
            $error,
            ", 700) END"
        )
    };
}

/// [`FireLedger::settle_fires`](super::FireLedger::settle_fires)'s fenced update of a batch:
/// `$1` to `$7` the occurrences, their claims' tokens and attempts, and each one's status, error
/// and receipt; `group:` keeps it in one group, or is empty; `lock:` is how the rows are locked
/// (`SKIP LOCKED` for a batch, or nothing to wait). Returns the rows it wrote, each with the
/// instant of its retry when the failure is tried again.
///
/// The rows are picked and locked first, `FOR UPDATE SKIP LOCKED`, and only those are updated:
/// a row another transaction holds (a caller's open `cm.delete_routine`, say) is left out of
/// the batch instead of making the whole statement wait on it and fail on `lock_timeout`. The
/// caller finds it still held by its claim ([`PRESENT_FIRES_SQL`]) and settles it later.
///
/// A failed attempt whose routine asks for retries (`retry_decision_sql!`) is not settled: the
/// row stays `claimed`, its lease running out at the retry's instant, so the reaper takes it
/// over then as the next attempt; the attempt's error is kept on it and in its `tries`. A
/// mission whose run was begun is not retried here, whatever its launch's error: its container
/// may exist, so its retry is decided when the watch pass finds its run ended or never
/// launched (`cm_store::MissionRuns::record_runs`), never while a run may still be going.
macro_rules! settle_fires_sql {
    (group: $tail:literal, in: $group:literal, lock: $lock:literal) => {
        concat!(
            "WITH held AS (
                 SELECT f.routine_id, f.scheduled_at, f.group_id, t.status, t.error, t.receipt,
                        now() AS now_at, now() + ",
            retry_wait_sql!(),
            " AS retry_at, ",
            retry_decision_sql!("t.status = 'failed' AND f.run_state IS NULL", group: $group),
            " AS decision,
                        CASE WHEN t.status = 'failed' THEN jsonb_build_array(jsonb_build_object(
                            'attempt', f.attempt, 'outcome', 'failed', 'error', t.error,
                            'ended_at', now(), 'retry_at', now() + ",
            retry_wait_sql!(),
            ")) END AS try
                 FROM cm.routine_fires AS f
                 JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::uuid[], $4::int[], $5::text[],
                             $6::text[], $7::text[])
                      AS t(routine_id, scheduled_at, claim_token, attempt, status, error, receipt)
                   ON f.routine_id = t.routine_id AND f.scheduled_at = t.scheduled_at
                 LEFT JOIN cm.routines AS r ON r.id = f.routine_id AND r.group_id = ",
            $group,
            "
                 WHERE f.claim_token = t.claim_token AND f.attempt = t.attempt
                   AND f.status = 'claimed'",
            $tail,
            "
                 FOR UPDATE OF f",
            $lock,
            "
             )
             UPDATE cm.routine_fires AS f
             SET status = CASE WHEN h.decision = 'retry' THEN 'claimed' ELSE h.status END,
                 error = ",
            given_up_error_sql!("h.error", "h.decision"),
            ",
                 receipt = h.receipt,
                 completed_at = CASE WHEN h.decision = 'retry' THEN NULL ELSE h.now_at END,
                 lease_expires_at = CASE WHEN h.decision = 'retry' THEN h.retry_at
                                         ELSE f.lease_expires_at END,
                 retry = f.retry + CASE WHEN h.decision = 'retry' THEN 1 ELSE 0 END,
                 tries = CASE WHEN h.decision = 'retry' THEN coalesce(f.tries, '[]'::jsonb) || h.try
                              ELSE f.tries END
             FROM held AS h
             WHERE f.routine_id = h.routine_id AND f.scheduled_at = h.scheduled_at
               AND f.group_id = h.group_id",
            $tail,
            " RETURNING f.routine_id, f.scheduled_at,
                         CASE WHEN h.decision = 'retry' THEN h.retry_at END AS retry_at"
        )
    };
}

/// [`settle_fires_sql!`] over every group.
pub(crate) const SETTLE_FIRES_SQL: &str =
    settle_fires_sql!(group: "", in: "f.group_id", lock: " SKIP LOCKED");

/// [`settle_fires_sql!`] within the group `$8`.
pub(crate) const SETTLE_GROUP_FIRES_SQL: &str =
    settle_fires_sql!(group: " AND f.group_id = $8", in: "$8", lock: " SKIP LOCKED");

/// The fenced settle of one claim that waits for its row's lock (up to the transaction's
/// `lock_timeout`) instead of skipping it: `$1` to `$7` as in [`settle_fires_sql!`], one element
/// each, `$8` the group. A settle that found its row locked comes back through this one, so
/// that, queued on the lock, it takes the row before any reaper can (the reaper skips locked
/// rows rather than queue).
pub(crate) const SETTLE_WAITING_SQL: &str =
    settle_fires_sql!(group: " AND f.group_id = $8", in: "$8", lock: "");

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

/// Deletes settled fires past the retention (`$1` seconds), at most `$2`, oldest occurrence
/// first; `group:` keeps it in one group, or is empty.
///
/// A fire settles after its occurrence, so every fire settled before the cutoff was scheduled
/// before it: the walk is `routine_fires_scheduled_idx` from its oldest occurrence, which a fired
/// fire enters anyway (the ledger keeps no index of settlement times for retention alone). The
/// rows it passes over are the fires scheduled before the cutoff and not settled before it (a
/// backfill of old occurrences, a claim in flight), few, and gone within a retention.
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
    ORDER BY scheduled_at, routine_id
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
          f.planned_at, f.retry, coalesce((f.tries -> -1 ->> 'attempt')::int + 1, 1) AS retry_began"
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

pub(crate) use {
    given_up_error_sql, next_occurrence_sql, reason_instant_sql, retry_decision_sql, retry_wait_sql,
};
