-- Concurrency keys: routines that share a key (a tenant, a cluster, a GPU pool) share a limit
-- set at run time, at most `max_running` of their runs at once across every scheduler. A run
-- holds its place while its fire is `claimed` (being dispatched, or waiting for a retry, or
-- left by a crashed scheduler for the reaper to take over) or its mission's run is `running`:
-- the same rows `routine_fires_busy_idx` holds, so the places are counted from the ledger
-- itself and a crashed holder's place is neither lost nor counted twice.
--
-- A routine whose key is full keeps its clock at its first occurrence waiting (owed, never
-- skipped for the limit) with `key_wait` set, so the occurrences that come due while it waits
-- are planned as owed too (catch-up) rather than by its misfire policy. A key without a limit
-- is unlimited.

ALTER TABLE cm.routines
    ADD COLUMN concurrency_key TEXT
        CHECK (concurrency_key ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$'),
    ADD COLUMN key_wait BOOLEAN NOT NULL DEFAULT false;

-- The claim counts a key's places over its routines through this index, then each routine's
-- busy fires through routine_fires_busy_idx.
CREATE INDEX routines_concurrency_key_idx ON cm.routines (concurrency_key)
    WHERE concurrency_key IS NOT NULL;

CREATE TABLE cm.concurrency_limits (
    key TEXT PRIMARY KEY CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$'),
    max_running INTEGER NOT NULL CHECK (max_running BETWEEN 0 AND 1000000),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Sets a key's limit from SQL, as `cm-scheduler limit set KEY N` does; returns whether it was
-- new.
CREATE FUNCTION cm.set_concurrency_limit(key TEXT, max_running INTEGER) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    inserted BOOLEAN;
BEGIN
    IF key IS NULL OR key !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$' THEN
        PERFORM cm.refuse(format('a concurrency key is 1 to 100 letters, digits and . _ : / -, '
            'starting with a letter or digit (it was %s)', coalesce(quote_literal(key), 'NULL')));
    END IF;
    IF max_running IS NULL OR max_running < 0 OR max_running > 1000000 THEN
        PERFORM cm.refuse(format('a concurrency limit must be 0 to 1000000 (it was %s)',
            coalesce(max_running::TEXT, 'NULL')));
    END IF;
    INSERT INTO concurrency_limits AS l (key, max_running)
    VALUES (set_concurrency_limit.key, set_concurrency_limit.max_running)
    ON CONFLICT ON CONSTRAINT concurrency_limits_pkey DO UPDATE
        SET max_running = excluded.max_running, updated_at = now()
    RETURNING (l.xmax = 0) INTO inserted;
    RETURN inserted;
END
$$;

-- Deletes a key's limit (its routines become unlimited); returns whether there was one.
CREATE FUNCTION cm.delete_concurrency_limit(key TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
BEGIN
    DELETE FROM concurrency_limits l WHERE l.key = delete_concurrency_limit.key;
    RETURN FOUND;
END
$$;

-- Sets or clears (NULL) a routine's concurrency key from SQL; returns whether it exists.
CREATE FUNCTION cm.set_routine_concurrency_key(routine_id UUID, key TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
BEGIN
    IF key IS NOT NULL AND key !~ '^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$' THEN
        PERFORM cm.refuse(format('a concurrency key is 1 to 100 letters, digits and . _ : / -, '
            'starting with a letter or digit (it was %s)', quote_literal(key)));
    END IF;
    UPDATE routines r
    SET concurrency_key = key, updated_at = now()
    WHERE r.id = routine_id AND r.group_id = routine_group;
    RETURN FOUND;
END
$$;

REVOKE ALL ON FUNCTION cm.set_concurrency_limit(TEXT, INTEGER) FROM PUBLIC;
REVOKE ALL ON FUNCTION cm.delete_concurrency_limit(TEXT) FROM PUBLIC;
REVOKE ALL ON FUNCTION cm.set_routine_concurrency_key(UUID, TEXT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cm.set_concurrency_limit(TEXT, INTEGER) TO cm_writer;
GRANT EXECUTE ON FUNCTION cm.delete_concurrency_limit(TEXT) TO cm_writer;
GRANT EXECUTE ON FUNCTION cm.set_routine_concurrency_key(UUID, TEXT) TO cm_writer;

-- Pinned as 20261205000600_least_privilege.sql pins every function.
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.set_concurrency_limit(TEXT, INTEGER) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.delete_concurrency_limit(TEXT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.set_routine_concurrency_key(UUID, TEXT) SET search_path TO %s', path);
END
$$;
