-- Writes from SQL, for services in any language: functions in the `cm` schema that a caller
-- runs in its own transaction, so its rows and its routines commit or roll back together.
--
-- SQL checks what it can at insert: the name (trimmed, 1 to 200 characters, no control
-- character, not a UUID), the kind and its payload's shape and size (a message's text, not
-- empty, at most 256 KiB; a mission's description, a JSON object of at most 64 KiB), the misfire
-- and overlap policies' names, and a name another routine has (an error, SQLSTATE 23505). What
-- only cm's Rust can read (the cron expression, the IANA zone, the name's invisible characters,
-- the mission's fields) is checked when the routine is planned: a row written here is
-- `planned = false` with no next run, and the next scheduler pass plans it (its first
-- `next_run_at` from the schedule) or, refused, pauses it with the reason (`paused_reason`),
-- which `routine show`, `routine list` and the status page show. An unplanned routine is never
-- due, so it fires nothing until it is planned.

ALTER TABLE routines ADD COLUMN planned BOOLEAN NOT NULL DEFAULT true;

-- The planning pass reads this: empty, but for rows written through SQL and not yet planned.
CREATE INDEX routines_unplanned_idx ON routines (group_id) WHERE NOT planned;

CREATE SCHEMA IF NOT EXISTS cm;

-- The name rules SQL can check (cm_domain::RoutineName checks the rest when planning).
CREATE FUNCTION cm.checked_name(name TEXT) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    trimmed TEXT := btrim(name, E' \t\n\r\f\v');
BEGIN
    IF trimmed IS NULL OR trimmed = '' THEN
        RAISE EXCEPTION 'the routine name must not be empty' USING ERRCODE = '22023';
    END IF;
    IF trimmed ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'the routine name % has a control character', quote_literal(trimmed)
            USING ERRCODE = '22023';
    END IF;
    IF char_length(trimmed) > 200 THEN
        RAISE EXCEPTION 'the routine name must be at most 200 characters (it has %)',
            char_length(trimmed) USING ERRCODE = '22023';
    END IF;
    IF trimmed ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
        RAISE EXCEPTION 'the routine name % looks like an id; names must not', quote_literal(trimmed)
            USING ERRCODE = '22023';
    END IF;
    RETURN trimmed;
END
$$;

-- Inserts an unplanned routine of `kind` with `payload` (already checked by the caller).
CREATE FUNCTION cm.insert_unplanned(
    name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB, misfire TEXT,
    overlap TEXT, paused BOOLEAN
) RETURNS UUID
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_id UUID := gen_random_uuid();
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    checked TEXT := cm.checked_name(name);
BEGIN
    IF schedule IS NULL OR btrim(schedule) = '' OR octet_length(schedule) > 1024 THEN
        RAISE EXCEPTION 'the schedule must be a cron expression of at most 1024 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF timezone IS NULL OR btrim(timezone) = '' OR octet_length(timezone) > 64 THEN
        RAISE EXCEPTION 'the time zone must be an IANA name (Europe/Berlin, UTC)'
            USING ERRCODE = '22023';
    END IF;
    IF misfire IS NULL OR misfire NOT IN ('fire-once', 'catch-up', 'skip') THEN
        RAISE EXCEPTION 'the misfire policy must be fire-once, catch-up or skip, not %',
            coalesce(quote_literal(misfire), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF overlap IS NULL OR overlap NOT IN ('allow', 'forbid', 'replace') THEN
        RAISE EXCEPTION 'the overlap policy must be allow, forbid or replace, not %',
            coalesce(quote_literal(overlap), 'NULL') USING ERRCODE = '22023';
    END IF;
    BEGIN
        INSERT INTO routine_names (name, routine_id, group_id)
        VALUES (checked, routine_id, routine_group);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'a routine named % exists', quote_literal(checked)
            USING ERRCODE = '23505';
    END;
    INSERT INTO routines
        (id, name, schedule, timezone, kind, payload, misfire_policy, overlap, paused,
         next_run_at, planned, group_id)
    VALUES
        (routine_id, checked, btrim(schedule), btrim(timezone), kind, payload, misfire, overlap,
         coalesce(paused, false), NULL, false, routine_group);
    RETURN routine_id;
END
$$;

-- A message routine; its id. Planned (its cron expression and zone read) by the next pass.
CREATE FUNCTION cm.create_routine(
    name TEXT, schedule TEXT, timezone TEXT, message TEXT,
    misfire TEXT DEFAULT 'fire-once', paused BOOLEAN DEFAULT false
) RETURNS UUID
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF message IS NULL OR message = '' THEN
        RAISE EXCEPTION 'the message must not be empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(message) > 262144 THEN
        RAISE EXCEPTION 'the message is % bytes; at most 262144 are allowed', octet_length(message)
            USING ERRCODE = '22023';
    END IF;
    RETURN cm.insert_unplanned(name, schedule, timezone, 'message',
        jsonb_build_object('text', message), misfire, 'forbid', paused);
END
$$;

-- A mission routine described by `mission` (the JSON a mission file holds); its id. The
-- mission's fields are checked by the next pass, as `routine create --mission` checks them.
CREATE FUNCTION cm.create_mission_routine(
    name TEXT, schedule TEXT, timezone TEXT, mission JSONB,
    misfire TEXT DEFAULT 'fire-once', overlap TEXT DEFAULT 'forbid',
    paused BOOLEAN DEFAULT false
) RETURNS UUID
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF mission IS NULL OR jsonb_typeof(mission) <> 'object' THEN
        RAISE EXCEPTION 'the mission must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF octet_length(mission::text) > 65536 THEN
        RAISE EXCEPTION 'the mission is % bytes; at most 65536 are allowed',
            octet_length(mission::text) USING ERRCODE = '22023';
    END IF;
    RETURN cm.insert_unplanned(name, schedule, timezone, 'mission', mission, misfire, overlap,
        paused);
END
$$;

-- Pauses (true) or resumes (false) the routine; whether it exists. A resume is planned by the
-- next pass (its next run from the schedule and the clock then), as a new routine is.
CREATE FUNCTION cm.set_routine_paused(routine_id UUID, paused BOOLEAN) RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    found_id UUID;
BEGIN
    UPDATE routines r
    SET paused = set_routine_paused.paused,
        next_run_at = NULL,
        planned = CASE WHEN set_routine_paused.paused THEN r.planned ELSE false END,
        paused_reason = CASE WHEN set_routine_paused.paused THEN r.paused_reason ELSE NULL END,
        updated_at = now()
    WHERE r.id = routine_id AND r.group_id = routine_group
      AND r.paused IS DISTINCT FROM set_routine_paused.paused
    RETURNING r.id INTO found_id;
    RETURN found_id IS NOT NULL
        OR EXISTS (SELECT 1 FROM routines WHERE id = routine_id AND group_id = routine_group);
END
$$;

-- Asks for an occurrence now (a manual trigger), fired by the next tick after the caller
-- commits, paused or not; its instant, NULL when there is no such routine.
CREATE FUNCTION cm.trigger_routine(routine_id UUID) RETURNS TIMESTAMPTZ
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
BEGIN
    PERFORM 1 FROM routines WHERE id = routine_id AND group_id = routine_group FOR SHARE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO routine_requests (routine_id, scheduled_at, origin, group_id)
    VALUES (routine_id, now(), 'trigger', routine_group)
    ON CONFLICT DO NOTHING;
    RETURN now();
END
$$;

-- Deletes the routine with its requests and fires, locking the routine first as cm does;
-- whether it existed.
CREATE FUNCTION cm.delete_routine(routine_id UUID) RETURNS BOOLEAN
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
BEGIN
    PERFORM 1 FROM routines WHERE id = routine_id AND group_id = routine_group FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM routine_requests WHERE routine_requests.routine_id = delete_routine.routine_id
        AND group_id = routine_group;
    DELETE FROM routine_fires WHERE routine_fires.routine_id = delete_routine.routine_id
        AND group_id = routine_group;
    DELETE FROM routines WHERE id = routine_id AND group_id = routine_group;
    DELETE FROM routine_names WHERE routine_names.routine_id = delete_routine.routine_id
        AND group_id = routine_group;
    RETURN true;
END
$$;
