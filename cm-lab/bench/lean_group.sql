-- lean.sql kept in one group, as cm claims on Citus: a transaction takes :batch consecutive
-- routines of one group, and every statement names that group, so each is a router statement on the
-- group's shard and the transaction commits on one worker with a plain COMMIT. lean.sql's one
-- statement, whose CTE writes two tables, would run through intermediate results on the coordinator
-- and commit in two phases; here its parts are three statements, as cm's claim on Citus splits its
-- own: the ledger rows inserted settled (their rows come back, as cm reads them), the outbox rows,
-- the routines advanced. The messages are numbered in the statement, :k × 1000 + the routine's
-- number in its group (unique as the occurrence is), where cm draws its numbers from a sequence on
-- the coordinator, one round trip before the claim's writes: a number from a sequence default would
-- make Citus pull the INSERT ... SELECT through the coordinator. The outbox statement writes a row
-- for every occurrence of the batch, ON CONFLICT DO NOTHING: with :k drawn from two billion
-- instants, an occurrence the ledger already had (the only one not fresh) is one whose message is
-- there too.
-- Each of the two clients (-c 2) takes its groups from its own half (pgbench -D
-- groups_per_client=N, -D per_group=N the routines of a group), so they never lock one row.
\set g :client_id * :groups_per_client + random(0, :groups_per_client - 1)
\set n random(1, :per_group - :batch + 1)
\set last :n + :batch - 1
\set k random(1, 2000000000)
BEGIN;
INSERT INTO routine_fires (routine_id, scheduled_at, claimant, claim_token, lease_expires_at, status, completed_at, group_id)
  SELECT id, to_timestamp(:k), 'bench', '00000000-0000-0000-0000-000000000001', now() + interval '60 s', 'fired', now(), group_id
  FROM ids WHERE group_id = :g AND n BETWEEN :n AND :last
  ON CONFLICT (routine_id, scheduled_at, group_id) DO UPDATE SET claimant = routine_fires.claimant
  RETURNING (xmax = 0) AS fresh, routine_id, scheduled_at;
INSERT INTO outbox_messages (seq, routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
  SELECT :k::bigint * 1000 + i.n, r.id, to_timestamp(:k), r.id || '/' || :k, 1, r.payload, r.group_id
  FROM ids i JOIN routines r ON r.group_id = i.group_id AND r.id = i.id
  WHERE i.group_id = :g AND r.group_id = :g AND i.n BETWEEN :n AND :last
  ON CONFLICT DO NOTHING;
UPDATE routines SET next_run_at = now() + interval '1 minute', last_run_at = now()
  WHERE group_id = :g AND id IN (SELECT id FROM ids WHERE group_id = :g AND n BETWEEN :n AND :last);
COMMIT;
