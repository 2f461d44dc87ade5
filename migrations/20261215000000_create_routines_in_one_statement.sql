-- `cm.create_routines` spent about half its time checking the elements of a batch: for 100,000
-- per-user schedules, longer than writing the rows. Three costs of that, each paid for every
-- element, are gone; what is checked, stored, written and refused is unchanged.
--
-- - A schedule that is a plain cron line (five fields of numbers, the common shape) is stored as
--   written, without a parse, but every element's schedule went through a set of the distinct
--   (schedule, zone) pairs, grouped and joined back to the elements, so that each other text is
--   parsed once however many routines share it. A batch of per-user schedules is mostly
--   distinct lines: the set was as large as the batch, for nothing. Whether a schedule is plain
--   is now read once with its element, and only the others are grouped, parsed and joined.
-- - The optional fields' types (misfire, on_holiday, paused, overlap, calendar, deadline) were
--   read one by one on every element; they are now read only on an element that has one.
-- - The checked rows were gathered into an array and unnested four times: for the names, the
--   routines, the calendars and the ids. One statement now writes the names and the routines
--   from the checked rows and returns the ids and the calendars named. Those calendars are then
--   share-locked and read (before, ahead of the writes); a calendar that does not exist refuses
--   the call, and the refusal rolls the rows back. A delete of a calendar either waits for the
--   lock and then sees the routines on it, or deletes it first, and the read after the lock
--   finds it gone.

-- As in 20261214000000_time_ordered_routine_ids.sql, with the plain schedules set aside and the
-- optional fields read where they are.
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
                -- (the last 16 digits of a random UUID, with the hyphen before its last 12)
                || right(gen_random_uuid()::text, 17))::uuid AS id,
               -- A five-field cron line of plain numbers is stored as written: read once here.
               coalesce(t.v ->> 'schedule' ~ cm.plain_cron(), false) AS plain
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
                        -- The optional fields each read only when some is there.
                        AND (NOT t.v ?| ARRAY['misfire', 'on_holiday', 'paused', 'overlap',
                                              'calendar', 'deadline']
                             OR coalesce(jsonb_typeof(t.v -> 'misfire'), 'string') = 'string'
                                AND coalesce(jsonb_typeof(t.v -> 'on_holiday'), 'string') = 'string'
                                AND coalesce(jsonb_typeof(t.v -> 'paused'), 'boolean') = 'boolean'
                                AND coalesce(jsonb_typeof(t.v -> 'overlap'), 'null')
                                    IN ('string', 'null')
                                AND coalesce(jsonb_typeof(t.v -> 'calendar'), 'null')
                                    IN ('string', 'null')
                                AND coalesce(jsonb_typeof(t.v -> 'deadline'), 'null')
                                    IN ('string', 'null'))
                   ELSE false END
           OR cm.checked_routine_fields(t.v) IS NOT NULL
    ),
    zones AS MATERIALIZED (
        SELECT z.zone, cm.checked_zone(z.zone) AS checked
        FROM (SELECT DISTINCT e.zone FROM e) z
    ),
    -- The other schedules, each distinct text in its zone checked (and stored as it parses)
    -- once: usually none, so a plain schedule is never grouped or joined.
    schedules AS MATERIALIZED (
        SELECT s.written, s.zone, cm.checked_schedule(s.written, s.zone) AS stored
        FROM (SELECT DISTINCT e.v ->> 'schedule' AS written, zones.checked AS zone
              FROM e JOIN zones ON zones.zone = e.zone
              WHERE NOT e.plain) s
    ),
    r AS (
        SELECT e.ord, e.id, e.v, zones.checked AS zone,
               CASE WHEN e.plain THEN e.v ->> 'schedule' ELSE schedules.stored END AS stored,
               CASE WHEN e.v ? 'message' THEN 'message' ELSE 'mission' END AS kind,
               coalesce(e.v ->> 'misfire', 'fire-once') AS misfire,
               coalesce(e.v ->> 'overlap', 'forbid') AS overlap,
               e.v ->> 'name' AS name,
               e.v ->> 'message' AS message,
               e.v ->> 'retry_backoff' AS backoff
        FROM e
        JOIN zones ON zones.zone = e.zone
        LEFT JOIN schedules ON NOT e.plain
                           AND schedules.written = e.v ->> 'schedule'
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

-- As in 20261212000000_create_routines_fast.sql, in one statement.
CREATE OR REPLACE FUNCTION cm.create_routines(routines JSONB) RETURNS UUID[]
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    groups INT := (SELECT s.group_count FROM cm_settings s);
    failure TEXT;
    missing TEXT;
    ids UUID[];
    named TEXT[];
BEGIN
    IF jsonb_typeof(routines) IS DISTINCT FROM 'array' THEN
        PERFORM cm.refuse('cm.create_routines takes a JSON array of routine objects');
    END IF;
    BEGIN
        -- Every element checked, its name taken (a name already taken is a unique violation)
        -- and its routine written, in one statement.
        WITH c AS MATERIALIZED (
            SELECT * FROM cm.checked_routines(routines, groups)
        ),
        names_taken AS (
            INSERT INTO routine_names (name, routine_id, group_id)
            SELECT c.name, c.id, c.group_id FROM c
        ),
        written AS (
            INSERT INTO routines
                (id, name, schedule, timezone, kind, payload, misfire_policy, overlap, paused,
                 next_run_at, planned, group_id, runs_left, calendar, on_holiday, deadline_secs,
                 retries, retry_backoff_secs, retry_backoff_max_secs)
            SELECT c.id, c.name, c.schedule, c.timezone, c.kind, c.payload, c.misfire, c.overlap,
                   c.paused, NULL, false, c.group_id, c.runs_left, c.calendar, c.on_holiday,
                   c.deadline_secs, c.retries, c.backoff, c.backoff_max
            FROM c
        )
        SELECT coalesce(array_agg(c.id ORDER BY c.ord), '{}'),
               array_agg(DISTINCT c.calendar) FILTER (WHERE c.calendar IS NOT NULL)
        INTO ids, named
        FROM c;
        IF named IS NOT NULL THEN
            -- The calendars named, read under a share lock, as `cm.set_routine_calendar` reads
            -- one: a delete of one waits for this write and then finds its routines. Whether
            -- each exists is read after the lock, in a statement of its own: a delete the lock
            -- waited for is seen only by a later snapshot.
            PERFORM 1 FROM calendars k WHERE k.name = ANY (named) ORDER BY k.name FOR SHARE;
            SELECT n INTO missing FROM unnest(named) n
            WHERE NOT EXISTS (SELECT 1 FROM calendars k WHERE k.name = n)
            ORDER BY n LIMIT 1;
            IF missing IS NOT NULL THEN
                PERFORM cm.refuse(format('no calendar is named %s', quote_literal(missing)));
            END IF;
        END IF;
        RETURN ids;
    EXCEPTION WHEN SQLSTATE '22023' OR unique_violation THEN
        GET STACKED DIAGNOSTICS failure = MESSAGE_TEXT;
    END;
    PERFORM cm.refuse_routines(routines, groups, failure);
    RETURN NULL;
END
$$;

-- Pinned as 20261205000600_least_privilege.sql pins every function.
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.checked_routines(JSONB, INT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.create_routines(JSONB) SET search_path TO %s', path);
END
$$;
