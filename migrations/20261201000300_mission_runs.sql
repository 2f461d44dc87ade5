-- Mission runs watched to their end: each mission fire carries where its run is, as its runtime
-- last reported it. `fired` stays the ledger's terminal status of the occurrence (the runtime
-- accepted the launch); the run state is what happened after.

-- `running` is written in the transaction that lets a mission's launch go ahead, so a run is
-- watched even when its scheduler dies between the launch and the settle; the watch pass leaves
-- a row that is still `claimed` alone, and clears the state of one whose launch failed.
ALTER TABLE routine_fires
    ADD COLUMN run_state TEXT CHECK (run_state IN ('running', 'succeeded', 'failed', 'lost')),
    -- The process's exit code, when the runtime reported one.
    ADD COLUMN run_exit_code INTEGER,
    -- Why a run failed or was lost, in the runtime's words.
    ADD COLUMN run_reason TEXT CHECK (octet_length(run_reason) <= 4096),
    -- When the watch pass last asked the runtime about this run.
    ADD COLUMN run_checked_at TIMESTAMPTZ;

-- The watch pass reads only the runs not yet finished, least recently checked first: at a
-- million fires it reads the handful still running, never the ledger.
CREATE INDEX routine_fires_running_idx
    ON routine_fires (run_checked_at NULLS FIRST, routine_id, scheduled_at)
    WHERE run_state = 'running';

-- Overlap: what a mission routine's occurrence does while an earlier run of it is still running
-- (Kubernetes' concurrencyPolicy names; `forbid` by default, meaningless for messages). Under
-- `forbid` such an occurrence settles `skipped`, a terminal status, with the running fire named
-- in its error.
ALTER TABLE routines
    ADD COLUMN overlap TEXT NOT NULL DEFAULT 'forbid'
        CHECK (overlap IN ('allow', 'forbid', 'replace')),
    -- The occurrence (`scheduled_at`) of the fire that holds the routine's run: the last one
    -- let launch under `forbid` or `replace`. Taken under the routine's row lock, so two
    -- schedulers never both find the run free.
    ADD COLUMN run_holder TIMESTAMPTZ;

ALTER TABLE routine_fires
    DROP CONSTRAINT routine_fires_status_check,
    ADD CONSTRAINT routine_fires_status_check
        CHECK (status IN ('claimed', 'fired', 'failed', 'skipped')),
    ADD CONSTRAINT routine_fires_skipped_has_reason CHECK (status <> 'skipped' OR error IS NOT NULL);
