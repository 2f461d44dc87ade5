-- Retry policies in `cm.create_routines`: an element may carry `retries` (0 to 100) and
-- `retry_backoff` (`BASE..MAX` or `BASE`, whole seconds from 1 s to a day, such as `"30s..10m"`),
-- as a `routine import` JSON line does; checked as `cm.set_routine_retries` checks them, and
-- written in the same insert. `cm.checked_routine_fields` and `cm.create_routines` are replaced
-- with the same signatures (so their owners and privileges stay) and pinned again below.

-- A backoff as a JSON line writes it: `{base, cap}` in seconds; the default (10 s to 10 min)
-- for NULL. Refused when it is not whole seconds from 1 s to a day, or its base passes its cap.
CREATE FUNCTION cm.checked_backoff(backoff TEXT) RETURNS INT[]
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
AS $$
DECLARE
    base NUMERIC;
    cap NUMERIC;
BEGIN
    IF backoff IS NULL THEN
        RETURN ARRAY[10, 600];
    END IF;
    IF position('..' IN backoff) > 0 THEN
        base := cm.schedule_seconds(split_part(backoff, '..', 1));
        cap := cm.schedule_seconds(split_part(backoff, '..', 2));
    ELSE
        base := cm.schedule_seconds(backoff);
        cap := base;
    END IF;
    IF base IS NULL OR cap IS NULL OR base <> trunc(base) OR cap <> trunc(cap) OR base < 1
       OR cap < 1 OR base > 86400 OR cap > 86400 THEN
        PERFORM cm.refuse(format('a retry backoff is BASE..MAX or BASE, whole seconds from 1s '
            'to 1d, such as 10s..10m (it was %s)', quote_literal(backoff)));
    END IF;
    IF base > cap THEN
        PERFORM cm.refuse(format('a retry backoff''s first wait must not be longer than its '
            'cap (it was %s)', quote_literal(backoff)));
    END IF;
    RETURN ARRAY[base::INT, cap::INT];
END
$$;

CREATE OR REPLACE FUNCTION cm.checked_routine_fields(routine JSONB) RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
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
                    'paused', 'limit_runs', 'calendar', 'on_holiday', 'deadline', 'retries',
                    'retry_backoff')
    LIMIT 1;
    IF unknown IS NOT NULL THEN
        PERFORM cm.refuse(format('unknown field %s (allowed: name, schedule, timezone, misfire, '
            'message, mission, overlap, paused, limit_runs, calendar, on_holiday, deadline, '
            'retries, retry_backoff)',
            to_json(unknown)::text));
    END IF;
    SELECT f.k INTO wrong
    FROM (VALUES ('name', 'string'), ('schedule', 'string'), ('timezone', 'string'),
                 ('misfire', 'string'), ('message', 'string'), ('mission', 'object'),
                 ('overlap', 'string'), ('paused', 'boolean'), ('limit_runs', 'number'),
                 ('calendar', 'string'), ('on_holiday', 'string'), ('deadline', 'string'),
                 ('retries', 'number'), ('retry_backoff', 'string'))
         AS f(k, t)
    WHERE routine ? f.k AND jsonb_typeof(routine -> f.k) <> f.t
      AND NOT (f.t = 'string' AND f.k IN ('calendar', 'deadline', 'overlap')
               AND jsonb_typeof(routine -> f.k) = 'null')
    LIMIT 1;
    IF wrong IS NOT NULL THEN
        PERFORM cm.refuse(format('field %s must be a %s', to_json(wrong)::text,
            CASE WHEN wrong = 'mission' THEN 'JSON object'
                 WHEN wrong = 'paused' THEN 'boolean'
                 WHEN wrong IN ('limit_runs', 'retries') THEN 'number'
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
    IF routine ? 'retries'
       AND ((routine ->> 'retries')::NUMERIC <> trunc((routine ->> 'retries')::NUMERIC)
            OR (routine ->> 'retries')::NUMERIC NOT BETWEEN 0 AND 100) THEN
        PERFORM cm.refuse(format('retries must be 0 to 100 (it was %s)', routine ->> 'retries'));
    END IF;
    PERFORM cm.checked_backoff(routine ->> 'retry_backoff');
END
$$;

CREATE OR REPLACE FUNCTION cm.create_routines(routines JSONB) RETURNS UUID[]
LANGUAGE plpgsql
SECURITY DEFINER
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
    retry_counts SMALLINT[];
    backoffs INT[];
    backoff_caps INT[];
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
        -- The retry policies, checked with the other fields, read in the array's order.
        SELECT array_agg(coalesce((e.v ->> 'retries')::SMALLINT, 0) ORDER BY e.ord),
               array_agg((cm.checked_backoff(e.v ->> 'retry_backoff'))[1] ORDER BY e.ord),
               array_agg((cm.checked_backoff(e.v ->> 'retry_backoff'))[2] ORDER BY e.ord)
        INTO retry_counts, backoffs, backoff_caps
        FROM jsonb_array_elements(routines) WITH ORDINALITY AS e(v, ord);
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
             next_run_at, planned, group_id, runs_left, calendar, on_holiday, deadline_secs,
             retries, retry_backoff_secs, retry_backoff_max_secs)
        SELECT u.id, u.name, u.schedule, u.timezone, u.kind, u.payload, u.misfire, u.overlap,
               u.paused, NULL, false, u.group_id, u.runs::INT, u.calendar, u.on_holiday,
               u.deadline, u.retries, u.backoff, u.backoff_max
        FROM unnest(ids, names, schedules, zones, kinds, payloads, misfires, overlap_policies, pauses,
                    runs, calendar_names, holidays, deadlines, group_ids, retry_counts, backoffs,
                    backoff_caps)
             AS u(id, name, schedule, timezone, kind, payload, misfire, overlap, paused, runs,
                  calendar, on_holiday, deadline, group_id, retries, backoff, backoff_max);
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

REVOKE ALL ON FUNCTION cm.checked_backoff(TEXT) FROM PUBLIC;

-- Pinned as 20261205000600_least_privilege.sql pins every function.
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.checked_backoff(TEXT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.checked_routine_fields(JSONB) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.create_routines(JSONB) SET search_path TO %s', path);
END
$$;
