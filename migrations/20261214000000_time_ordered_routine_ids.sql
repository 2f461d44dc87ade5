-- Routines written through SQL get time-ordered ids, as those written through the library and the
-- command line always have (a UUIDv7: `Uuid::now_v7`). A routine's id leads the indexes the claim
-- reads routines through, and routines due at one instant are claimed in id order; with random
-- ids a burst of them visited the table's pages in random order, each page many times over,
-- which is far slower once the table no longer fits the server's shared buffers. Routines
-- created one after another are written one after another, and their ids now ascend the same
-- way. Routines already written keep their ids.

-- A fresh time-ordered id (RFC 9562 version 7): the current millisecond in the first 48 bits,
-- then the microseconds within it (12 bits, the standard's method 3), so the ids of one
-- statement's rows ascend with the clock; the rest random, as in `gen_random_uuid()`, where a
-- routine's group is read from.
CREATE FUNCTION cm.new_routine_id() RETURNS UUID
LANGUAGE sql
VOLATILE
SECURITY DEFINER
AS $$
    SELECT (lpad(to_hex(t.us / 1000), 12, '0') || '7'
            || lpad(to_hex((t.us % 1000) * 4096 / 1000), 3, '0')
            || substr(replace(gen_random_uuid()::text, '-', ''), 17, 16))::uuid
    FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) t
$$;

REVOKE ALL ON FUNCTION cm.new_routine_id() FROM PUBLIC;

-- As in 20261205000500_checks_at_insert.sql, with a time-ordered id.
CREATE OR REPLACE FUNCTION cm.insert_unplanned(
    name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB, misfire TEXT,
    overlap TEXT, paused BOOLEAN, run_limit INT
) RETURNS UUID
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_id UUID := cm.new_routine_id();
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    checked TEXT := cm.checked_name(name);
    zone TEXT := cm.checked_zone(timezone);
    stored TEXT := cm.checked_schedule(schedule, zone);
    runs_left INT := cm.checked_run_limit(run_limit);
BEGIN
    PERFORM cm.checked_policies(kind, misfire, overlap);
    PERFORM cm.take_name(checked, routine_id, routine_group);
    INSERT INTO routines
        (id, name, schedule, timezone, kind, payload, misfire_policy, overlap, paused,
         next_run_at, planned, group_id, runs_left)
    VALUES
        (routine_id, checked, stored, zone, kind, payload, misfire, overlap,
         coalesce(paused, false), NULL, false, routine_group, runs_left);
    RETURN routine_id;
END
$$;

-- As in 20261212000000_create_routines_fast.sql, with time-ordered ids.
CREATE OR REPLACE FUNCTION cm.checked_routines(routines JSONB, group_count INT)
RETURNS SETOF cm.checked_routine
LANGUAGE sql
SECURITY DEFINER
AS $$
    WITH e AS MATERIALIZED (
        SELECT t.ord, t.v, coalesce(t.v ->> 'timezone', 'UTC') AS zone,
               -- `cm.new_routine_id()` written out (a call a row would cost a change of
               -- the path and its undo each), of the clock read for each element.
               (lpad(to_hex(t.us / 1000), 12, '0') || '7'
                || lpad(to_hex((t.us % 1000) * 4096 / 1000), 3, '0')
                || substr(replace(gen_random_uuid()::text, '-', ''), 17, 16))::uuid AS id
        FROM (SELECT a.v, a.ord,
                     floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us
              FROM jsonb_array_elements(routines) WITH ORDINALITY AS a(v, ord)) t
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

-- Pinned as 20261205000600_least_privilege.sql pins every function.
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.new_routine_id() SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.insert_unplanned(TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TEXT,
        BOOLEAN, INT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.checked_routines(JSONB, INT) SET search_path TO %s', path);
END
$$;
