-- One batch of :batch occurrences through the outbox path as the engine sends it before the outbox
-- joins the claim, as raw SQL: claim + advance (one transaction), then the outbox rows and the fenced
-- settle (a second transaction). pgbench -D batch=N; tps x batch = occurrences/s.
-- Each of the two clients (-c 2) takes its batches from its own :per_client routines (pgbench -D per_client=N,
-- half the 20,000), as SKIP LOCKED keeps the engine's schedulers apart: two clients never lock the same
-- routines in different orders.
\set n 1 + :client_id * :per_client + random(0, :per_client - :batch)
\set last :n + :batch - 1
\set k random(1, 2000000000)
BEGIN;
INSERT INTO routine_fires (routine_id, scheduled_at, claimant, claim_token, lease_expires_at)
  SELECT id, to_timestamp(:k), 'bench', '00000000-0000-0000-0000-000000000001', now() + interval '60 s'
  FROM ids WHERE n BETWEEN :n AND :last
  ON CONFLICT (routine_id, scheduled_at) DO UPDATE SET claimant = routine_fires.claimant
  RETURNING (xmax = 0) AS fresh, status;
UPDATE routines SET next_run_at = now() + interval '1 minute', last_run_at = now()
  WHERE id IN (SELECT id FROM ids WHERE n BETWEEN :n AND :last);
COMMIT;
BEGIN;
INSERT INTO outbox_messages (routine_id, scheduled_at, idempotency_key, attempt, payload)
  SELECT r.id, to_timestamp(:k), r.id || '/' || :k, 1, r.payload
  FROM ids JOIN routines r ON r.id = ids.id WHERE n BETWEEN :n AND :last
  ON CONFLICT DO NOTHING;
UPDATE routine_fires SET status = 'fired', completed_at = now()
  WHERE routine_id IN (SELECT id FROM ids WHERE n BETWEEN :n AND :last) AND scheduled_at = to_timestamp(:k)
    AND claim_token = '00000000-0000-0000-0000-000000000001' AND attempt = 1 AND status = 'claimed';
COMMIT;
