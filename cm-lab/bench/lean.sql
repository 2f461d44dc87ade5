-- The leanest correct shape for a database-local backend: in ONE transaction, each occurrence is inserted
-- into the ledger already settled (xmax = 0 still tells a fresh insert from an existing row), its outbox
-- row written only if fresh, and the routines advanced. One row write per table per occurrence.
-- One transaction is one batch of :batch occurrences (pgbench -D batch=N); tps x batch = occurrences/s.
-- Each of the two clients (-c 2) takes its batches from its own :per_client routines (pgbench -D per_client=N,
-- half the 20,000), as SKIP LOCKED keeps the engine's schedulers apart: two clients never lock the same
-- routines in different orders.
\set n 1 + :client_id * :per_client + random(0, :per_client - :batch)
\set last :n + :batch - 1
\set k random(1, 2000000000)
BEGIN;
WITH c AS (
  INSERT INTO routine_fires (routine_id, scheduled_at, claimant, claim_token, lease_expires_at, status, completed_at)
  SELECT id, to_timestamp(:k), 'bench', '00000000-0000-0000-0000-000000000001', now() + interval '60 s', 'fired', now()
  FROM ids WHERE n BETWEEN :n AND :last
  ON CONFLICT (routine_id, scheduled_at) DO UPDATE SET claimant = routine_fires.claimant
  RETURNING (xmax = 0) AS fresh, routine_id, scheduled_at)
INSERT INTO outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
  SELECT c.routine_id, c.scheduled_at, c.routine_id || '/' || :k, 1, r.payload
  FROM c JOIN routines r ON r.id = c.routine_id WHERE c.fresh
  ON CONFLICT DO NOTHING;
UPDATE routines SET next_run_at = now() + interval '1 minute', last_run_at = now()
  WHERE id IN (SELECT id FROM ids WHERE n BETWEEN :n AND :last);
COMMIT;
