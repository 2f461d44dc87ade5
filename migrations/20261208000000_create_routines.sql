-- Creating many routines at once from SQL: `cm.create_routines(routines JSONB)`, a JSON array
-- of routine objects with the fields of a `routine import` JSON line, written in a few
-- set-based statements instead of one call per routine.
--
-- Each element is checked as `cm.create_routine` (a `message`) or `cm.create_mission_routine`
-- (a `mission`, here a mission object, not a file's path) checks one routine; `calendar`,
-- `on_holiday` and `deadline` as `cm.set_routine_calendar` and `cm.set_routine_deadline` check
-- them. The schedule is written whole in `schedule` (`0 3 * * *`, `@every 90m offset 15m`,
-- `@at 2027-01-01T09:00`, with its clauses), as `cm.create_routine` takes it. A zone and a
-- schedule shared by many elements are checked once. The routines are unplanned, as every
-- write from SQL leaves them: the next planning pass gives each its first run.
--
-- All or nothing: a bad element, or a name that exists already (or twice in the array),
-- refuses the whole call with one line naming the element (counted from 1) and nothing is
-- written. Finding which element is bad is only done once a check has failed: the call that
-- passes pays for no search.

-- A routine element's fields and their JSON types, as the import reads a JSON line: refused
-- when it is not an object, names a field no routine has, or gives a field the wrong type.
CREATE FUNCTION cm.checked_routine_fields(routine JSONB) RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    unknown TEXT;
    wrong TEXT;
BEGIN
    IF jsonb_typeof(routine) IS DISTINCT FROM 'object' THEN
        PERFORM cm.refuse('a routine must be a JSON object');
    END IF;
    SELECT k INTO unknown FROM jsonb_object_keys(routine) AS k
    WHERE k NOT IN ('name', 'schedule', 'timezone', 'misfire', 'message', 'mission', 'overlap',
                    'paused', 'limit_runs', 'calendar', 'on_holiday', 'deadline')
    LIMIT 1;
    IF unknown IS NOT NULL THEN
        PERFORM cm.refuse(format('unknown field %s (allowed: name, schedule, timezone, misfire, '
            'message, mission, overlap, paused, limit_runs, calendar, on_holiday, deadline)',
            to_json(unknown)::text));
    END IF;
    SELECT f.k INTO wrong
    FROM (VALUES ('name', 'string'), ('schedule', 'string'), ('timezone', 'string'),
                 ('misfire', 'string'), ('message', 'string'), ('mission', 'object'),
                 ('overlap', 'string'), ('paused', 'boolean'), ('limit_runs', 'number'),
                 ('calendar', 'string'), ('on_holiday', 'string'), ('deadline', 'string'))
         AS f(k, t)
    WHERE routine ? f.k AND jsonb_typeof(routine -> f.k) <> f.t
      AND NOT (f.t = 'string' AND f.k IN ('calendar', 'deadline', 'overlap')
               AND jsonb_typeof(routine -> f.k) = 'null')
    LIMIT 1;
    IF wrong IS NOT NULL THEN
        PERFORM cm.refuse(format('field %s must be a %s', to_json(wrong)::text,
            CASE WHEN wrong = 'mission' THEN 'JSON object'
                 WHEN wrong = 'paused' THEN 'boolean'
                 WHEN wrong = 'limit_runs' THEN 'number'
                 ELSE 'string' END));
    END IF;
    IF NOT routine ? 'name' THEN
        PERFORM cm.refuse('field "name" is missing');
    END IF;
    IF NOT routine ? 'schedule' THEN
        PERFORM cm.refuse('field "schedule" is missing');
    END IF;
    IF (routine ? 'message') = (routine ? 'mission') THEN
        PERFORM cm.refuse('give one of message and mission');
    END IF;
    IF routine ? 'limit_runs'
       AND ((routine ->> 'limit_runs')::NUMERIC <> trunc((routine ->> 'limit_runs')::NUMERIC)
            OR (routine ->> 'limit_runs')::NUMERIC NOT BETWEEN 1 AND 2147483647) THEN
        PERFORM cm.refuse(format('a run limit must be 1 to 2147483647 (it was %s)',
            routine ->> 'limit_runs'));
    END IF;
END
$$;

-- A deadline as `cm.set_routine_deadline` takes it, written as a JSON line writes it (`90s`,
-- `5m`, `1h30m`): its seconds, or NULL for none.
CREATE FUNCTION cm.checked_deadline(deadline TEXT) RETURNS INT
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    secs NUMERIC := cm.schedule_seconds(deadline);
BEGIN
    IF deadline IS NULL THEN
        RETURN NULL;
    END IF;
    IF secs IS NULL OR secs < 1 OR secs > 31622400 THEN
        PERFORM cm.refuse(format('a deadline must be whole seconds, 1s to 366d (it was %s)',
            quote_literal(deadline)));
    END IF;
    RETURN secs::INT;
END
$$;

-- A cron expression `cm.checked_schedule` always takes, matched by a regular expression
-- instead of read field by field (about a hundred times faster): five fields, each `*` or one
-- number in range, the day of the month at most 28 (a day every month has) and the day of the
-- week 0 to 6, with no clause. Anything else is read by `cm.checked_schedule`.
CREATE FUNCTION cm.plain_cron() RETURNS TEXT
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT '^([0-9]|[1-5][0-9]|\*) ([0-9]|1[0-9]|2[0-3]|\*) ([1-9]|1[0-9]|2[0-8]|\*) '
           '([1-9]|1[0-2]|\*) ([0-6]|\*)$'
$$;

-- The rows `cm.create_routines` writes for `routines`, each element checked (in no particular
-- order: the first failing check refuses). Each row is its element's place in the array
-- (from 1) and the routine's columns; a fresh id, and its group among `group_count`.
CREATE FUNCTION cm.checked_routines(routines JSONB, group_count INT)
RETURNS TABLE (
    ord BIGINT, id UUID, name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB,
    misfire TEXT, overlap TEXT, paused BOOLEAN, runs_left INT, calendar TEXT, on_holiday TEXT,
    deadline_secs INT, group_id SMALLINT
)
LANGUAGE sql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    WITH e AS MATERIALIZED (
        SELECT t.ord, t.v, coalesce(t.v ->> 'timezone', 'UTC') AS zone,
               gen_random_uuid() AS id
        FROM jsonb_array_elements(routines) WITH ORDINALITY AS t(v, ord)
        -- Checked before any field is read.
        WHERE cm.checked_routine_fields(t.v) IS NOT NULL
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
               coalesce(e.v ->> 'overlap', 'forbid') AS overlap
        FROM e
        JOIN zones ON zones.zone = e.zone
        JOIN schedules ON schedules.written = e.v ->> 'schedule'
                      AND schedules.zone = zones.checked
    )
    SELECT r.ord, r.id, cm.checked_name(r.v ->> 'name'), r.stored, r.zone, r.kind,
           CASE r.kind WHEN 'message' THEN cm.checked_message(r.v ->> 'message')
                       ELSE cm.checked_mission(r.v -> 'mission') END,
           r.misfire, r.overlap, coalesce((r.v ->> 'paused')::BOOLEAN, false),
           (r.v ->> 'limit_runs')::INT,
           r.v ->> 'calendar',
           coalesce(r.v ->> 'on_holiday', 'skip'),
           cm.checked_deadline(r.v ->> 'deadline'),
           cm_group_of(r.id, group_count)
    FROM r
    -- Checks that return nothing (VOID, never NULL), made in the filter so that they run for
    -- every row.
    WHERE cm.checked_policies(r.kind, r.misfire, r.overlap) IS NOT NULL
      AND CASE WHEN coalesce(r.v ->> 'on_holiday', 'skip') IN ('skip', 'next', 'previous')
               THEN true
               ELSE cm.refuse(format('the on-holiday policy must be skip, next or previous, '
                   'not %s', quote_literal(r.v ->> 'on_holiday'))) IS NOT NULL END
$$;

-- Creates the routines of `routines`, a JSON array of routine objects (the fields of a
-- `routine import` JSON line: `name`, `schedule`, `timezone` (UTC), `misfire` (fire-once),
-- `message` or `mission` (an object), `overlap` (a mission's; forbid), `paused`,
-- `limit_runs`, `calendar`, `on_holiday` (skip), `deadline` (`90s`)), all or none; their ids,
-- in the array's order. Each is planned (its first run from the schedule) by the next pass.
CREATE FUNCTION cm.create_routines(routines JSONB) RETURNS UUID[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    groups INT := (SELECT s.group_count FROM cm_settings s);
    n INT;
    i INT;
    failure TEXT;
    taken TEXT;
    missing TEXT;
    ids UUID[];
    names TEXT[];
    schedules TEXT[];
    zones TEXT[];
    kinds TEXT[];
    payloads JSONB[];
    misfires TEXT[];
    overlap_policies TEXT[];
    pauses BOOLEAN[];
    runs TEXT[];
    calendar_names TEXT[];
    holidays TEXT[];
    deadlines INT[];
    group_ids SMALLINT[];
BEGIN
    IF jsonb_typeof(routines) IS DISTINCT FROM 'array' THEN
        PERFORM cm.refuse('cm.create_routines takes a JSON array of routine objects');
    END IF;
    n := jsonb_array_length(routines);
    BEGIN
        SELECT coalesce(array_agg(c.id ORDER BY c.ord), '{}'),
               array_agg(c.name ORDER BY c.ord), array_agg(c.schedule ORDER BY c.ord),
               array_agg(c.timezone ORDER BY c.ord), array_agg(c.kind ORDER BY c.ord),
               array_agg(c.payload ORDER BY c.ord), array_agg(c.misfire ORDER BY c.ord),
               array_agg(c.overlap ORDER BY c.ord), array_agg(c.paused ORDER BY c.ord),
               array_agg(c.runs_left::TEXT ORDER BY c.ord),
               array_agg(c.calendar ORDER BY c.ord), array_agg(c.on_holiday ORDER BY c.ord),
               array_agg(c.deadline_secs ORDER BY c.ord), array_agg(c.group_id ORDER BY c.ord)
        INTO ids, names, schedules, zones, kinds, payloads, misfires, overlap_policies, pauses, runs,
             calendar_names, holidays, deadlines, group_ids
        FROM cm.checked_routines(routines, groups) c;
        -- The calendars named are read under a share lock, as `cm.set_routine_calendar` reads
        -- one: a delete of a calendar waits for this write and then finds its routines.
        PERFORM 1 FROM calendars c
        WHERE c.name IN (SELECT DISTINCT u FROM unnest(calendar_names) u WHERE u IS NOT NULL)
        ORDER BY c.name FOR SHARE;
        SELECT u INTO missing FROM unnest(calendar_names) u
        WHERE u IS NOT NULL AND NOT EXISTS (SELECT 1 FROM calendars c WHERE c.name = u)
        LIMIT 1;
        IF missing IS NOT NULL THEN
            PERFORM cm.refuse(format('no calendar is named %s', quote_literal(missing)));
        END IF;
        INSERT INTO routine_names (name, routine_id, group_id)
        SELECT * FROM unnest(names, ids, group_ids);
        INSERT INTO routines
            (id, name, schedule, timezone, kind, payload, misfire_policy, overlap, paused,
             next_run_at, planned, group_id, runs_left, calendar, on_holiday, deadline_secs)
        SELECT u.id, u.name, u.schedule, u.timezone, u.kind, u.payload, u.misfire, u.overlap,
               u.paused, NULL, false, u.group_id, u.runs::INT, u.calendar, u.on_holiday,
               u.deadline
        FROM unnest(ids, names, schedules, zones, kinds, payloads, misfires, overlap_policies, pauses,
                    runs, calendar_names, holidays, deadlines, group_ids)
             AS u(id, name, schedule, timezone, kind, payload, misfire, overlap, paused, runs,
                  calendar, on_holiday, deadline, group_id);
        RETURN ids;
    EXCEPTION WHEN SQLSTATE '22023' OR unique_violation THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
    END;
    -- A check failed and nothing is written: find the first element that fails alone.
    i := 0;
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
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
        RAISE EXCEPTION 'routine % of %: %', i + 1, n, failure USING ERRCODE = '22023';
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

REVOKE ALL ON FUNCTION
    cm.checked_routine_fields(JSONB),
    cm.checked_deadline(TEXT),
    cm.plain_cron(),
    cm.checked_routines(JSONB, INT),
    cm.create_routines(JSONB)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cm.create_routines(JSONB) TO cm_writer;

-- Pinned as 20261205000600_least_privilege.sql pins every function: the path these migrations
-- run under, written as a constant (not `FROM CURRENT`, which Citus refuses for a distributed
-- function).
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.checked_routine_fields(JSONB) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.checked_deadline(TEXT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.plain_cron() SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.checked_routines(JSONB, INT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.create_routines(JSONB) SET search_path TO %s', path);
END
$$;
