-- Jitter (a schedule's `jitter D` clause): an occurrence keeps its nominal instant as its key
-- (`scheduled_at`, the idempotency key) and comes due at its planned instant, the nominal one
-- plus an offset drawn from the routine and the occurrence. The claim records that instant
-- here; NULL is the occurrence itself (no jitter, a trigger, a backfill). Lateness is measured
-- from it. A routine's `next_run_at` is the planned instant of its next occurrence, so the due
-- walk reads the same index as before.
ALTER TABLE routine_fires ADD COLUMN planned_at TIMESTAMPTZ;
