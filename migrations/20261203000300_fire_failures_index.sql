-- A fire's outcome is its run's when it has one: a mission `fired` whose run exited non-zero
-- (or was lost) has failed, as has a failed dispatch. Everything that reads failures (the status
-- page's recent failures, `fires --status failed`, the automatic pause's recent failures) reads
-- this index, which holds the failures only: its predicate is the store's failure rule, written
-- exactly as the statements write it.
CREATE INDEX routine_fires_failures_idx ON routine_fires (scheduled_at, routine_id)
    WHERE status = 'failed' OR COALESCE(run_state IN ('failed', 'lost'), false);

-- Listing a mission outcome (`fires --status running|succeeded|lost`) reads the fires with a run
-- only, newest first, not every message fired.
CREATE INDEX routine_fires_runs_idx ON routine_fires (scheduled_at, routine_id)
    WHERE run_state IS NOT NULL;
