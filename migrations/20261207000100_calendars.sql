-- Holiday calendars, shared by routines (cm_domain::calendar).
--
-- A calendar is a zone, a set of dates off and its weekly days off (`sat,sun` unless told
-- otherwise). It is small, rarely written and read by every claim that plans a routine on it:
-- on Citus it is a reference table (cm-store's `CITUS_TABLES`), a copy on every node.
--
-- A routine names its calendar in `routines.calendar` and its policy for an occurrence on a
-- day off in `routines.on_holiday` (`skip`, `next`, `previous`). They are columns, not clauses
-- of the schedule's text: the text is read by cm_domain without the database, and means the
-- same wherever it is read (`schedule next`, an import, a crontab), while a calendar is a row
-- that changes under the routines that share it. No foreign key names the calendar: on a
-- schema already distributed, `routines` could not take one to a table made here, and cm's
-- writes check the name under the calendar's row lock instead (a routine written names a
-- calendar it read `FOR SHARE`; a calendar is deleted `FOR UPDATE`, only when no routine
-- names it).

CREATE TABLE calendars (
    name TEXT PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    -- An IANA zone name: the days are read there.
    timezone TEXT NOT NULL CHECK (length(timezone) BETWEEN 1 AND 64),
    -- Weekly days off, as cm_domain writes them: `sat,sun`, or `none`.
    days_off TEXT NOT NULL DEFAULT 'sat,sun' CHECK (length(days_off) BETWEEN 1 AND 64),
    -- Dates off, ascending, each once.
    dates DATE[] NOT NULL DEFAULT '{}' CHECK (cardinality(dates) <= 10000),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

ALTER TABLE routines
    ADD COLUMN calendar TEXT,
    ADD COLUMN on_holiday TEXT NOT NULL DEFAULT 'skip'
        CHECK (on_holiday IN ('skip', 'next', 'previous'));

-- The routines an edit of a calendar re-plans, and the check before a delete.
CREATE INDEX routines_calendar_idx ON routines (calendar) WHERE calendar IS NOT NULL;

-- An edit of a calendar from SQL cannot plan (only cm's Rust reads a schedule): it leaves each
-- routine on the calendar unplanned, with the clock it had and the calendar that clock was
-- planned with, and the next planning pass moves the clock from the occurrence it stood for, as
-- an edit through cm does in its own transaction. A routine already waiting for the pass keeps
-- the clock and calendar it waits with, whatever edits follow.
ALTER TABLE routines
    ADD COLUMN replan_clock TIMESTAMPTZ,
    ADD COLUMN replan_calendar JSONB;

-- A calendar from SQL: `dates` off, `days_off` weekly (day names, `sat,sun`, or `none`). SQL
-- checks the name, the dates' count and the days' names; the zone is read by cm when a routine
-- on the calendar is planned (a routine on a calendar with a zone cm refuses is paused with
-- the reason). Its name.
CREATE FUNCTION cm.create_calendar(
    name TEXT, timezone TEXT, dates DATE[] DEFAULT '{}', days_off TEXT DEFAULT 'sat,sun'
) RETURNS TEXT
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    days TEXT := lower(btrim(coalesce(days_off, 'sat,sun')));
    day TEXT;
BEGIN
    IF name IS NULL OR name !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$' THEN
        PERFORM cm.refuse(format('invalid calendar name %s: 1 to 63 letters, digits, ''-'', '
            '''_'' or ''.'', starting with a letter or digit', coalesce(quote_literal(name), 'NULL')));
    END IF;
    IF timezone IS NULL OR btrim(timezone) = '' OR octet_length(timezone) > 64 THEN
        PERFORM cm.refuse('the time zone must be an IANA name (Europe/Berlin, UTC)');
    END IF;
    IF days <> 'none' THEN
        FOREACH day IN ARRAY string_to_array(days, ',') LOOP
            IF btrim(day) NOT IN ('mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun') THEN
                PERFORM cm.refuse(format('invalid day off %s: expected day names such as sat,sun',
                    quote_literal(btrim(day))));
            END IF;
        END LOOP;
        IF (SELECT count(DISTINCT btrim(d)) FROM unnest(string_to_array(days, ',')) d) = 7 THEN
            PERFORM cm.refuse('every day of the week is a day off: a calendar needs at least '
                'one business day');
        END IF;
    END IF;
    IF cardinality(coalesce(dates, '{}')) > 10000 THEN
        PERFORM cm.refuse('a calendar holds at most 10000 dates');
    END IF;
    BEGIN
        INSERT INTO calendars (name, timezone, days_off, dates)
        VALUES (name, btrim(timezone), CASE WHEN days = 'none' THEN 'none' ELSE
                    (SELECT string_agg(d, ',' ORDER BY array_position(
                        ARRAY['mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun'], d))
                     FROM (SELECT DISTINCT btrim(x) AS d FROM unnest(string_to_array(days, ',')) x) s)
                END,
                (SELECT coalesce(array_agg(DISTINCT d ORDER BY d), '{}')
                 FROM unnest(coalesce(dates, '{}')) d WHERE d IS NOT NULL));
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'a calendar named % exists', quote_literal(name) USING ERRCODE = '23505';
    END;
    RETURN name;
END
$$;

-- The calendar `name`: its zone, weekly days off and dates; no row when there is none.
CREATE FUNCTION cm.get_calendar(name TEXT)
RETURNS TABLE (timezone TEXT, days_off TEXT, dates DATE[])
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT c.timezone, c.days_off, c.dates FROM calendars c WHERE c.name = get_calendar.name
$$;

-- Deletes the calendar `name`, refused (SQLSTATE 22023) while a routine names it; whether it
-- existed.
CREATE FUNCTION cm.delete_calendar(name TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    users BIGINT;
BEGIN
    PERFORM 1 FROM calendars c WHERE c.name = delete_calendar.name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT count(*) INTO users FROM routines r WHERE r.calendar = delete_calendar.name;
    IF users > 0 THEN
        PERFORM cm.refuse(format('the calendar %s is used by %s routine(s): move them off it first',
            quote_literal(name), users));
    END IF;
    DELETE FROM calendars c WHERE c.name = delete_calendar.name;
    RETURN true;
END
$$;

-- Puts the routine on `calendar` (NULL: on none) with `on_holiday` (`skip`, `next` or
-- `previous`); whether the routine exists. Like every write from SQL, the routine is planned
-- again by the next pass (its next run from the clock then, on the calendar), and a policy the
-- schedule cannot take (`next` on an hourly routine) pauses it with the reason.
CREATE FUNCTION cm.set_routine_calendar(
    routine_id UUID, calendar TEXT, on_holiday TEXT DEFAULT 'skip'
) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
BEGIN
    IF on_holiday IS NULL OR on_holiday NOT IN ('skip', 'next', 'previous') THEN
        PERFORM cm.refuse(format('the on-holiday policy must be skip, next or previous, not %s',
            coalesce(quote_literal(on_holiday), 'NULL')));
    END IF;
    IF calendar IS NOT NULL THEN
        PERFORM 1 FROM calendars c WHERE c.name = set_routine_calendar.calendar FOR SHARE;
        IF NOT FOUND THEN
            PERFORM cm.refuse(format('no calendar is named %s', quote_literal(calendar)));
        END IF;
    END IF;
    UPDATE routines r
    SET calendar = set_routine_calendar.calendar,
        on_holiday = set_routine_calendar.on_holiday,
        next_run_at = NULL,
        planned = false,
        replan_clock = NULL,
        replan_calendar = NULL,
        updated_at = now()
    WHERE r.id = routine_id AND r.group_id = routine_group;
    RETURN FOUND;
END
$$;

-- Adds `dates` to the calendar's days off (`add`) or takes them off it; how many routines on it
-- the next planning pass plans again (see `replan_clock` above). Refused (SQLSTATE 22023) for
-- a calendar that does not exist or would hold more than 10000 dates.
CREATE FUNCTION cm.edit_calendar_dates(name TEXT, dates DATE[], add BOOLEAN) RETURNS INTEGER
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    old calendars%ROWTYPE;
    edited DATE[];
    marked INTEGER;
BEGIN
    SELECT * INTO old FROM calendars c WHERE c.name = edit_calendar_dates.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM cm.refuse(format('no calendar is named %s', coalesce(quote_literal(name), 'NULL')));
    END IF;
    IF add THEN
        SELECT coalesce(array_agg(DISTINCT d ORDER BY d), '{}') INTO edited
        FROM unnest(old.dates || coalesce(dates, '{}')) d WHERE d IS NOT NULL;
    ELSE
        SELECT coalesce(array_agg(d ORDER BY d), '{}') INTO edited
        FROM unnest(old.dates) d WHERE d <> ALL (coalesce(dates, '{}'));
    END IF;
    IF edited = old.dates THEN
        RETURN 0;
    END IF;
    IF cardinality(edited) > 10000 THEN
        PERFORM cm.refuse('a calendar holds at most 10000 dates');
    END IF;
    UPDATE calendars c SET dates = edited, updated_at = now()
    WHERE c.name = edit_calendar_dates.name;
    UPDATE routines r
    SET replan_clock = r.next_run_at,
        replan_calendar = jsonb_build_object('timezone', old.timezone, 'days_off', old.days_off,
                                             'dates', to_jsonb(old.dates)),
        next_run_at = NULL,
        planned = false,
        updated_at = now()
    WHERE r.calendar = edit_calendar_dates.name AND r.planned AND NOT r.paused
      AND r.next_run_at IS NOT NULL;
    GET DIAGNOSTICS marked = ROW_COUNT;
    RETURN marked;
END
$$;

REVOKE ALL ON FUNCTION
    cm.create_calendar(TEXT, TEXT, DATE[], TEXT),
    cm.get_calendar(TEXT),
    cm.delete_calendar(TEXT),
    cm.set_routine_calendar(UUID, TEXT, TEXT),
    cm.edit_calendar_dates(TEXT, DATE[], BOOLEAN)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    cm.create_calendar(TEXT, TEXT, DATE[], TEXT),
    cm.get_calendar(TEXT),
    cm.delete_calendar(TEXT),
    cm.set_routine_calendar(UUID, TEXT, TEXT),
    cm.edit_calendar_dates(TEXT, DATE[], BOOLEAN)
TO cm_writer;
