-- Every routine belongs to a group: a hash bucket of its id, from a count fixed here, once.
-- Every per-routine table carries the group, and every key and foreign key includes it, so the
-- schema can be distributed by `group_id` (co-located) on Citus, and a claim that names one
-- group touches one shard. On plain PostgreSQL this is the same schema.
--
-- The count is chosen when this migration runs: `cm.group_count` if set (for example
-- `PGOPTIONS='-c cm.group_count=256' cm-scheduler migrate`), else 64. It is recorded in
-- `cm_settings` and never changes afterwards (every row's group is derived from it).

CREATE TABLE cm_settings (
    singleton BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    group_count SMALLINT NOT NULL CHECK (group_count BETWEEN 1 AND 4096)
);

INSERT INTO cm_settings (group_count)
VALUES (coalesce(nullif(current_setting('cm.group_count', true), '')::smallint, 64));

-- A routine's group: the last four bytes of its id (random in version 4 and version 7 UUIDs
-- alike), read as an unsigned big-endian integer, modulo the count. cm computes the same in
-- Rust (`cm_store::group_of`) when it writes a routine; this function is for the rows that
-- existed before and for operators' queries.
CREATE FUNCTION cm_group_of(id UUID, group_count INTEGER) RETURNS SMALLINT
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT (('x' || right(replace(id::text, '-', ''), 8))::bit(32)::bigint % group_count)::smallint $$;

ALTER TABLE routines ADD COLUMN group_id SMALLINT;
ALTER TABLE routine_fires ADD COLUMN group_id SMALLINT;
ALTER TABLE routine_requests ADD COLUMN group_id SMALLINT;
ALTER TABLE outbox_messages ADD COLUMN group_id SMALLINT;

UPDATE routines SET group_id = cm_group_of(id, (SELECT group_count FROM cm_settings));
UPDATE routine_fires SET group_id = cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
UPDATE routine_requests
SET group_id = cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
UPDATE outbox_messages
SET group_id = cm_group_of(routine_id, (SELECT group_count FROM cm_settings));

-- cm writes every row's group itself. For rows written by hand (an operator's SQL, an older
-- tool) a trigger fills in a missing group with the same function; it fires only when the
-- group is NULL. `cm-scheduler migrate --citus` drops these triggers before it distributes the
-- tables: there the group must be known when the row is routed, before any trigger runs.
CREATE FUNCTION cm_fill_group_id() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_TABLE_NAME = 'routines' THEN
        NEW.group_id := cm_group_of(NEW.id, (SELECT group_count FROM cm_settings));
    ELSE
        NEW.group_id := cm_group_of(NEW.routine_id, (SELECT group_count FROM cm_settings));
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER routines_fill_group_id BEFORE INSERT ON routines
    FOR EACH ROW WHEN (NEW.group_id IS NULL) EXECUTE FUNCTION cm_fill_group_id();
CREATE TRIGGER routine_fires_fill_group_id BEFORE INSERT ON routine_fires
    FOR EACH ROW WHEN (NEW.group_id IS NULL) EXECUTE FUNCTION cm_fill_group_id();
CREATE TRIGGER routine_requests_fill_group_id BEFORE INSERT ON routine_requests
    FOR EACH ROW WHEN (NEW.group_id IS NULL) EXECUTE FUNCTION cm_fill_group_id();
CREATE TRIGGER outbox_messages_fill_group_id BEFORE INSERT ON outbox_messages
    FOR EACH ROW WHEN (NEW.group_id IS NULL) EXECUTE FUNCTION cm_fill_group_id();

ALTER TABLE routines ALTER COLUMN group_id SET NOT NULL;
ALTER TABLE routine_fires ALTER COLUMN group_id SET NOT NULL;
ALTER TABLE routine_requests ALTER COLUMN group_id SET NOT NULL;
ALTER TABLE outbox_messages ALTER COLUMN group_id SET NOT NULL;

-- Keys. The group is a function of the routine, so a key with it is as unique as the key
-- without it; it comes last in the keys the store looks rows up by (`id`,
-- `(routine_id, scheduled_at)`), so those lookups keep their index without naming the group,
-- and first in the indexes the per-group passes walk.
ALTER TABLE routine_fires DROP CONSTRAINT routine_fires_routine_id_fkey;
ALTER TABLE routine_requests DROP CONSTRAINT routine_requests_routine_id_fkey;
ALTER TABLE routines DROP CONSTRAINT routines_pkey;
ALTER TABLE routines ADD CONSTRAINT routines_pkey PRIMARY KEY (id, group_id);

ALTER TABLE routine_fires DROP CONSTRAINT routine_fires_pkey;
ALTER TABLE routine_fires ADD CONSTRAINT routine_fires_pkey
    PRIMARY KEY (routine_id, scheduled_at, group_id);
ALTER TABLE routine_fires ADD CONSTRAINT routine_fires_routine_fkey
    FOREIGN KEY (routine_id, group_id) REFERENCES routines (id, group_id) ON DELETE CASCADE;

ALTER TABLE routine_requests DROP CONSTRAINT routine_requests_pkey;
ALTER TABLE routine_requests ADD CONSTRAINT routine_requests_pkey
    PRIMARY KEY (routine_id, scheduled_at, group_id);
ALTER TABLE routine_requests ADD CONSTRAINT routine_requests_routine_fkey
    FOREIGN KEY (routine_id, group_id) REFERENCES routines (id, group_id) ON DELETE CASCADE;

ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_pkey;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_pkey
    PRIMARY KEY (routine_id, scheduled_at, group_id);
-- Sequence numbers are unique within a group: the consumer's order is `(group_id, seq)`.
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_seq_key;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_group_seq_key UNIQUE (group_id, seq);

-- The per-group walks: due routines, due requests, expired leases, pending messages.
CREATE INDEX routines_group_due_idx ON routines (group_id, next_run_at, id)
    WHERE next_run_at IS NOT NULL;
CREATE INDEX routine_requests_group_scheduled_idx ON routine_requests (group_id, scheduled_at);
CREATE INDEX routine_fires_group_lease_idx ON routine_fires (group_id, lease_expires_at)
    WHERE status = 'claimed';
CREATE INDEX outbox_messages_group_pending_idx ON outbox_messages (group_id, seq)
    WHERE acked_at IS NULL;

-- Name uniqueness moves to a table keyed by name (a distributed table can only be unique on
-- its distribution column), written by the store in the transaction that creates, renames or
-- deletes the routine.
CREATE TABLE routine_names (
    name TEXT PRIMARY KEY,
    routine_id UUID NOT NULL,
    group_id SMALLINT NOT NULL
);
CREATE INDEX routine_names_routine_idx ON routine_names (routine_id);
INSERT INTO routine_names (name, routine_id, group_id) SELECT name, id, group_id FROM routines;
ALTER TABLE routines DROP CONSTRAINT routines_name_key;
CREATE INDEX routines_name_idx ON routines (name);

-- Which scheduler leases which group: the schedulers divide the groups among themselves so two
-- rarely claim in one (`SKIP LOCKED` inside a group keeps a shared group correct; the leases
-- are for efficiency only). One row per group, written as schedulers take and renew leases.
CREATE TABLE group_leases (
    group_id SMALLINT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);

-- The schedulers taking part, each renewed with its leases: a scheduler that holds no group yet
-- is counted too, so the others give it its share.
CREATE TABLE group_holders (
    holder TEXT PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL
);
