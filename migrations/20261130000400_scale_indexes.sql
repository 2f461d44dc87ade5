-- Indexes that keep the scheduler's hot queries reading on the order of what they return, not
-- on the order of the table, at a million routines and a ledger of tens of millions of rows.

-- The tick's due query orders by (next_run_at, id) and stops at its LIMIT. An index on
-- next_run_at alone makes PostgreSQL read and sort every routine sharing the oldest instant (a
-- million routines on `0 * * * *` are one group) before the LIMIT applies; with the tie-breaker
-- in the index the scan stops after LIMIT rows.
DROP INDEX routines_due_idx;
CREATE INDEX routines_due_idx ON routines (next_run_at, id) WHERE next_run_at IS NOT NULL;

-- The reaper looks for `claimed` rows whose lease has run out. Indexed by claimed_at it walked
-- every live claim to find them; indexed by the lease, it reads only the expired ones (then
-- sorts those few oldest claim first).
DROP INDEX routine_fires_stuck_idx;
CREATE INDEX routine_fires_lease_idx ON routine_fires (lease_expires_at) WHERE status = 'claimed';

-- `fires` lists newest occurrence first, (scheduled_at, routine_id) descending, a page at a
-- time from a cursor. Without a filter this index serves the order (scanned backwards); with
-- --status the next one does. With --routine the primary key (routine_id, scheduled_at) does.
CREATE INDEX routine_fires_scheduled_idx ON routine_fires (scheduled_at, routine_id);
CREATE INDEX routine_fires_status_scheduled_idx ON routine_fires (status, scheduled_at, routine_id);
