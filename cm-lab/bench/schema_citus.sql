-- Raw-SQL baseline on Citus: the tables of schema.sql with a group, distributed by it as cm's
-- `migrate --citus` distributes its own (co-located, every key including the group), and :groups
-- groups of :per_group routines each (psql -v groups=N -v per_group=N), numbered within their
-- group by `ids` so a script picks a batch of consecutive routines of one group. The outbox's
-- `seq` has no default: a default from a sequence makes Citus pull an INSERT ... SELECT through
-- the coordinator, so the script numbers its messages itself. Run before each script: the tables
-- grow during a run, and a grown table is slower.
DROP TABLE IF EXISTS outbox_messages, routine_fires, routines, ids CASCADE;
CREATE TABLE routines (id UUID NOT NULL, group_id SMALLINT NOT NULL, name TEXT NOT NULL,
  payload JSONB NOT NULL, next_run_at TIMESTAMPTZ, last_run_at TIMESTAMPTZ,
  PRIMARY KEY (id, group_id));
CREATE INDEX ON routines (group_id, next_run_at);
CREATE TABLE routine_fires (
  routine_id UUID NOT NULL,
  scheduled_at TIMESTAMPTZ NOT NULL,
  claimed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ,
  status TEXT NOT NULL DEFAULT 'claimed' CHECK (status IN ('claimed','fired','failed')),
  error TEXT, claimant TEXT NOT NULL, claim_token UUID NOT NULL, attempt INT NOT NULL DEFAULT 1,
  lease_expires_at TIMESTAMPTZ NOT NULL, group_id SMALLINT NOT NULL,
  PRIMARY KEY (routine_id, scheduled_at, group_id));
CREATE INDEX ON routine_fires (group_id, lease_expires_at) WHERE status = 'claimed';
CREATE TABLE outbox_messages (seq BIGINT NOT NULL, routine_id UUID NOT NULL,
  scheduled_at TIMESTAMPTZ NOT NULL, idempotency_key TEXT NOT NULL, attempt INT NOT NULL,
  payload JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), group_id SMALLINT NOT NULL,
  PRIMARY KEY (routine_id, scheduled_at, group_id), UNIQUE (group_id, seq),
  UNIQUE (idempotency_key, group_id));
CREATE TABLE ids (group_id SMALLINT NOT NULL, n INT NOT NULL, id UUID NOT NULL,
  PRIMARY KEY (group_id, n));
SELECT create_distributed_table('routines', 'group_id');
SELECT create_distributed_table('routine_fires', 'group_id', colocate_with => 'routines');
SELECT create_distributed_table('outbox_messages', 'group_id', colocate_with => 'routines');
SELECT create_distributed_table('ids', 'group_id', colocate_with => 'routines');
INSERT INTO ids SELECT (i - 1) % :groups, (i - 1) / :groups + 1, gen_random_uuid()
  FROM generate_series(1, :groups * :per_group) i;
INSERT INTO routines SELECT id, group_id, 'r' || group_id || '-' || n, '{"text":"x"}', now(), NULL FROM ids;
VACUUM ANALYZE routines, routine_fires, outbox_messages, ids;
