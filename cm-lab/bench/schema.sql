-- Raw-SQL baseline of the outbox path: the tables the product uses (simplified), 20,000 routines,
-- and `ids` numbering them so a script picks a batch of consecutive routines. Run before each script:
-- the tables grow during a run, and a grown table is slower. As in the product, the ledger has no foreign key
-- to its routine (migration 20261202000400: the claim's lock on the routine is what keeps a fire from outliving it).
DROP TABLE IF EXISTS outbox_messages, routine_fires, routines, ids CASCADE;
CREATE TABLE routines (id UUID PRIMARY KEY, name TEXT NOT NULL, payload JSONB NOT NULL,
  next_run_at TIMESTAMPTZ, last_run_at TIMESTAMPTZ);
INSERT INTO routines SELECT gen_random_uuid(), 'r' || i, '{"text":"x"}', now(), NULL FROM generate_series(1, 20000) i;
CREATE INDEX ON routines (next_run_at);
CREATE TABLE routine_fires (
  routine_id UUID NOT NULL,
  scheduled_at TIMESTAMPTZ NOT NULL,
  claimed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ,
  status TEXT NOT NULL DEFAULT 'claimed' CHECK (status IN ('claimed','fired','failed')),
  error TEXT, claimant TEXT NOT NULL, claim_token UUID NOT NULL, attempt INT NOT NULL DEFAULT 1,
  lease_expires_at TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (routine_id, scheduled_at));
CREATE INDEX ON routine_fires (status, claimed_at) WHERE status = 'claimed';
CREATE TABLE outbox_messages (seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE, routine_id UUID NOT NULL,
  scheduled_at TIMESTAMPTZ NOT NULL, idempotency_key TEXT NOT NULL UNIQUE, attempt INT NOT NULL,
  payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (routine_id, scheduled_at));
CREATE TABLE ids AS SELECT row_number() OVER () AS n, id FROM routines;
CREATE UNIQUE INDEX ON ids (n);
VACUUM ANALYZE;
