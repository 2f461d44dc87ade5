-- `cm.create_routines` nearer the speed of the insert. What a call of many routines paid for was
-- mostly calls, not checks: each element went through eight or nine checking functions, each a
-- SECURITY DEFINER call on a pinned path (a configuration change and its undo per call), and
-- fourteen arrays were each sorted into the array's order. Now:
--
-- - An element of the common fields (`name`, `schedule`, `timezone`, `misfire`, `message`,
--   `paused`, `overlap`, `calendar`, `on_holiday`, `deadline`), each of its JSON type, passes
--   the field check in one expression; any other element (a mission, a run limit, a retry
--   policy, an unknown field, a wrong type) is checked by `cm.checked_routine_fields` as
--   before.
-- - A name of printable ASCII, not blank at either end and not shaped like an id, is taken as
--   it is; a message text of at most 256 KiB is wrapped at once; common policies pass at once.
--   Anything else goes through the check it always went through, which refuses it.
-- - A deadline and a retry backoff are read only when given; the group is computed in place.
-- - The checked rows are kept as one array of rows, written without sorting; only the ids are
--   put in the array's order.
--
-- The fast paths only ever pass what the full checks pass: each is a narrower test, and what it
-- does not pass goes to the full check. The refusals and their wording are unchanged; the search
-- for the failing element is the same, now a function of its own (`cm.refuse_routines`) that a
-- later `cm.create_routines` calls instead of copying it.

-- One checked routine, as `cm.checked_routines` returns it.
CREATE TYPE cm.checked_routine AS (
    ord BIGINT, id UUID, name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB,
    misfire TEXT, overlap TEXT, paused BOOLEAN, runs_left INT, calendar TEXT, on_holiday TEXT,
    deadline_secs INT, group_id SMALLINT, retries SMALLINT, backoff INT, backoff_max INT
);

-- Replaced with its retry policy in its rows (they were read in a second pass).
DROP FUNCTION cm.checked_routines(JSONB, INT);

-- The rows `cm.create_routines` writes for `routines`, each element checked (in no particular
-- order: the first failing check refuses). Each row is its element's place in the array
-- (from 1) and the routine's columns; a fresh id, and its group among `group_count`.
CREATE FUNCTION cm.checked_routines(routines JSONB, group_count INT)
RETURNS SETOF cm.checked_routine
LANGUAGE sql
SECURITY DEFINER
AS $$
    WITH e AS MATERIALIZED (
        SELECT t.ord, t.v, coalesce(t.v ->> 'timezone', 'UTC') AS zone,
               gen_random_uuid() AS id
        FROM jsonb_array_elements(routines) WITH ORDINALITY AS t(v, ord)
        -- Checked before any field is read: the common shape at once, the rest by the full
        -- check (which refuses what is wrong).
        WHERE CASE WHEN jsonb_typeof(t.v) = 'object'
                        AND (t.v - ARRAY['name', 'schedule', 'timezone', 'misfire', 'message',
                                         'paused', 'overlap', 'calendar', 'on_holiday',
                                         'deadline']) = '{}'::JSONB
                   THEN jsonb_typeof(t.v -> 'name') = 'string'
                        AND jsonb_typeof(t.v -> 'schedule') = 'string'
                        AND jsonb_typeof(t.v -> 'message') = 'string'
                        AND coalesce(jsonb_typeof(t.v -> 'timezone'), 'string') = 'string'
                        AND coalesce(jsonb_typeof(t.v -> 'misfire'), 'string') = 'string'
                        AND coalesce(jsonb_typeof(t.v -> 'on_holiday'), 'string') = 'string'
                        AND coalesce(jsonb_typeof(t.v -> 'paused'), 'boolean') = 'boolean'
                        AND coalesce(jsonb_typeof(t.v -> 'overlap'), 'null') IN ('string', 'null')
                        AND coalesce(jsonb_typeof(t.v -> 'calendar'), 'null') IN ('string', 'null')
                        AND coalesce(jsonb_typeof(t.v -> 'deadline'), 'null') IN ('string', 'null')
                   ELSE false END
           OR cm.checked_routine_fields(t.v) IS NOT NULL
    ),
    zones AS MATERIALIZED (
        SELECT z.zone, cm.checked_zone(z.zone) AS checked
        FROM (SELECT DISTINCT e.zone FROM e) z
    ),
    schedules AS MATERIALIZED (
        SELECT s.written, s.zone,
               CASE WHEN s.written ~ cm.plain_cron() THEN s.written
                    ELSE cm.checked_schedule(s.written, s.zone) END AS stored
        FROM (SELECT DISTINCT e.v ->> 'schedule' AS written, zones.checked AS zone
              FROM e JOIN zones ON zones.zone = e.zone) s
    ),
    r AS (
        SELECT e.ord, e.id, e.v, zones.checked AS zone, schedules.stored,
               CASE WHEN e.v ? 'message' THEN 'message' ELSE 'mission' END AS kind,
               coalesce(e.v ->> 'misfire', 'fire-once') AS misfire,
               coalesce(e.v ->> 'overlap', 'forbid') AS overlap,
               e.v ->> 'name' AS name,
               e.v ->> 'message' AS message,
               e.v ->> 'retry_backoff' AS backoff
        FROM e
        JOIN zones ON zones.zone = e.zone
        JOIN schedules ON schedules.written = e.v ->> 'schedule'
                      AND schedules.zone = zones.checked
    )
    SELECT r.ord, r.id,
           -- cm.checked_name's rules, at once for a name they leave as it is.
           -- (Printable ASCII, so its bytes are its characters.)
           CASE WHEN r.name ~ '^[!-~]([ -~]*[!-~])?$' AND octet_length(r.name) <= 200
                     AND (octet_length(r.name) NOT BETWEEN 32 AND 45
                          OR r.name ~ '[^0-9a-fA-F{}:urnid-]')
                THEN r.name
                ELSE cm.checked_name(r.name) END,
           r.stored, r.zone, r.kind,
           CASE WHEN r.kind = 'mission' THEN cm.checked_mission(r.v -> 'mission')
                WHEN r.message <> '' AND octet_length(r.message) <= 262144
                THEN jsonb_build_object('text', r.message)
                ELSE cm.checked_message(r.message) END,
           r.misfire, r.overlap, coalesce((r.v ->> 'paused')::BOOLEAN, false),
           (r.v ->> 'limit_runs')::INT,
           r.v ->> 'calendar',
           coalesce(r.v ->> 'on_holiday', 'skip'),
           CASE WHEN r.v ->> 'deadline' IS NOT NULL
                THEN cm.checked_deadline(r.v ->> 'deadline') END,
           -- cm_group_of(r.id, group_count), written out (a function on a pinned path is
           -- called, never inlined); an id's last 8 characters are hex digits, no hyphen.
           (('x' || right(r.id::TEXT, 8))::BIT(32)::BIGINT
               % group_count)::SMALLINT,
           coalesce((r.v ->> 'retries')::SMALLINT, 0),
           CASE WHEN r.backoff IS NULL THEN 10 ELSE (cm.checked_backoff(r.backoff))[1] END,
           CASE WHEN r.backoff IS NULL THEN 600 ELSE (cm.checked_backoff(r.backoff))[2] END
    FROM r
    -- Checks that return nothing (VOID, never NULL), made in the filter so that they run for
    -- every row.
    WHERE CASE WHEN r.misfire IN ('fire-once', 'catch-up', 'skip')
                    AND r.overlap IN ('allow', 'forbid', 'replace', 'buffer-one', 'buffer-all')
                    AND (r.kind = 'mission' OR r.overlap = 'forbid')
               THEN true
               ELSE cm.checked_policies(r.kind, r.misfire, r.overlap) IS NOT NULL END
      AND CASE WHEN coalesce(r.v ->> 'on_holiday', 'skip') IN ('skip', 'next', 'previous')
               THEN true
               ELSE cm.refuse(format('the on-holiday policy must be skip, next or previous, '
                   'not %s', quote_literal(r.v ->> 'on_holiday'))) IS NOT NULL END
$$;

-- Refuses a call of `cm.create_routines` whose write failed with `failure`, in one line naming
-- the element: the first element that fails alone (its check's words), else the first whose
-- name is taken (before the call or earlier in the array). Only called once a check has failed,
-- so a call that passes pays for no search. Always raises.
CREATE FUNCTION cm.refuse_routines(routines JSONB, groups INT, failure TEXT) RETURNS VOID
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    n INT := jsonb_array_length(routines);
    i INT := 0;
    taken TEXT;
    refused TEXT;
BEGIN
    BEGIN
        WHILE i < n LOOP
            PERFORM count(*) FROM cm.checked_routines(jsonb_build_array(routines -> i), groups) c
            WHERE CASE WHEN c.calendar IS NULL
                            OR EXISTS (SELECT 1 FROM calendars k WHERE k.name = c.calendar)
                       THEN false
                       ELSE cm.refuse(format('no calendar is named %s',
                           quote_literal(c.calendar))) IS NOT NULL END;
            i := i + 1;
        END LOOP;
    EXCEPTION WHEN SQLSTATE '22023' THEN
        GET STACKED DIAGNOSTICS refused = MESSAGE_TEXT;
        RAISE EXCEPTION 'routine % of %: %', i + 1, n, refused USING ERRCODE = '22023';
    END;
    -- Every element passes alone: a name is taken, before the call or earlier in the array.
    SELECT t.ord, t.name INTO i, taken
    FROM (SELECT e.ord, cm.checked_name(e.v ->> 'name') AS name
          FROM jsonb_array_elements(routines) WITH ORDINALITY AS e(v, ord)) t
    WHERE EXISTS (SELECT 1 FROM routine_names r WHERE r.name = t.name)
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(routines) WITH ORDINALITY AS o(v, ord)
                  WHERE o.ord < t.ord AND cm.checked_name(o.v ->> 'name') = t.name)
    ORDER BY t.ord LIMIT 1;
    IF taken IS NOT NULL THEN
        RAISE EXCEPTION 'routine % of %: a routine named % exists', i, n, quote_literal(taken)
            USING ERRCODE = '23505';
    END IF;
    RAISE EXCEPTION 'routines not created: %', failure USING ERRCODE = '22023';
END
$$;

CREATE OR REPLACE FUNCTION cm.create_routines(routines JSONB) RETURNS UUID[]
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    groups INT := (SELECT s.group_count FROM cm_settings s);
    failure TEXT;
    missing TEXT;
    ids UUID[];
    checked cm.checked_routine[];
BEGIN
    IF jsonb_typeof(routines) IS DISTINCT FROM 'array' THEN
        PERFORM cm.refuse('cm.create_routines takes a JSON array of routine objects');
    END IF;
    BEGIN
        SELECT coalesce(array_agg(c), '{}') INTO checked
        FROM cm.checked_routines(routines, groups) c;
        -- The calendars named are read under a share lock, as `cm.set_routine_calendar` reads
        -- one: a delete of a calendar waits for this write and then finds its routines.
        IF EXISTS (SELECT 1 FROM unnest(checked) u WHERE u.calendar IS NOT NULL) THEN
            PERFORM 1 FROM calendars c
            WHERE c.name IN (SELECT DISTINCT u.calendar FROM unnest(checked) u
                             WHERE u.calendar IS NOT NULL)
            ORDER BY c.name FOR SHARE;
            SELECT u.calendar INTO missing FROM unnest(checked) u
            WHERE u.calendar IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM calendars c WHERE c.name = u.calendar)
            LIMIT 1;
            IF missing IS NOT NULL THEN
                PERFORM cm.refuse(format('no calendar is named %s', quote_literal(missing)));
            END IF;
        END IF;
        INSERT INTO routine_names (name, routine_id, group_id)
        SELECT u.name, u.id, u.group_id FROM unnest(checked) u;
        INSERT INTO routines
            (id, name, schedule, timezone, kind, payload, misfire_policy, overlap, paused,
             next_run_at, planned, group_id, runs_left, calendar, on_holiday, deadline_secs,
             retries, retry_backoff_secs, retry_backoff_max_secs)
        SELECT u.id, u.name, u.schedule, u.timezone, u.kind, u.payload, u.misfire, u.overlap,
               u.paused, NULL, false, u.group_id, u.runs_left, u.calendar, u.on_holiday,
               u.deadline_secs, u.retries, u.backoff, u.backoff_max
        FROM unnest(checked) u;
        SELECT coalesce(array_agg(u.id ORDER BY u.ord), '{}') INTO ids FROM unnest(checked) u;
        RETURN ids;
    EXCEPTION WHEN SQLSTATE '22023' OR unique_violation THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
    END;
    PERFORM cm.refuse_routines(routines, groups, failure);
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION cm.checked_routines(JSONB, INT), cm.refuse_routines(JSONB, INT, TEXT)
FROM PUBLIC;

-- Pinned as 20261205000600_least_privilege.sql pins every function.
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.checked_routines(JSONB, INT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.refuse_routines(JSONB, INT, TEXT) SET search_path TO %s',
        path);
    EXECUTE format('ALTER FUNCTION cm.create_routines(JSONB) SET search_path TO %s', path);
END
$$;
