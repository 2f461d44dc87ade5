-- The fire that holds a mission routine's run is marked on the fire itself, not on the routine:
-- deciding an occurrence's overlap then never locks or writes the routine's row, so the claims'
-- `FOR UPDATE SKIP LOCKED` walk never skips a routine because one of its runs is being decided
-- or replaced. The deciders of one routine take turns on a transaction-scoped advisory lock.
ALTER TABLE routine_fires ADD COLUMN holds_run BOOLEAN NOT NULL DEFAULT false;

UPDATE routine_fires f SET holds_run = true
FROM routines r
WHERE r.run_holder IS NOT NULL
  AND f.routine_id = r.id AND f.group_id = r.group_id AND f.scheduled_at = r.run_holder;

ALTER TABLE routines DROP COLUMN run_holder;

-- The holder of a routine's run is found by this index: at most one row a routine.
CREATE INDEX routine_fires_run_holder_idx
    ON routine_fires (routine_id, group_id, scheduled_at DESC)
    WHERE holds_run;
