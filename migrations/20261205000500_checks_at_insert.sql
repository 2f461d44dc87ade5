-- Checks at insert: the SQL functions refuse, in the caller's transaction, what cm's Rust
-- refuses on the command line, as far as SQL can read it, each refusal one line naming what is
-- wrong with SQLSTATE 22023 (invalid_parameter_value):
--
-- - the name, trimmed of the whitespace Rust's `str::trim` trims (a no-break space, an
--   ideographic space, …), with no control, invisible or bidirectional formatting character
--   (cm_domain::name), 1 to 200 characters, not shaped like a UUID;
-- - the zone, an IANA name the server knows (`pg_timezone_names`), never an offset, an
--   abbreviation or a POSIX rule string (cm_domain::Zone takes names only);
-- - the schedule, as cm_domain reads it: a cron expression (5 or 6 fields, `*`, lists, ranges,
--   steps, JAN-DEC and SUN-SAT, the `@yearly` … `@hourly` macros, no `@reboot`, day and month
--   fields that meet), `@every D [offset O]` or `@at T`, then `except CRON`, `jitter D`,
--   `from T` and `until T` in that order; a refusal names the field (`minute field "61": 61
--   is out of range 0-59`). A schedule with no occurrence after now (`@at` in the past, an
--   `until` that has passed) is refused, as `routine create` refuses it;
-- - the message (1 byte to 256 KiB) and the mission (a JSON object of at most 256 KiB with only
--   the fields a mission file has, `task` at most 64 KiB).
--
-- What SQL cannot read the planning pass still checks (a jitter longer than the schedule's
-- shortest interval, exclusions that leave nothing, a mission's repository and the operator's
-- policy): a routine written here stays `planned = false`, never due, until a scheduler plans
-- it or pauses it with the reason.
--
-- `cm.update_routine` changes a routine's name, schedule, zone, message or mission and
-- policies with the same checks; a new schedule, zone or mission is planned again by the next
-- pass (its next run from the new schedule and the clock then), as `routine update` computes
-- it at once. `cm.get_routine` reads one back.
--
-- Functions are pinned to the path this migration runs under, with `pg_temp` last (see
-- 20261205000600_least_privilege.sql for why and how).

DO $$
DECLARE
    path TEXT := current_setting('search_path');
    tables TEXT := (SELECT relnamespace::regnamespace::text FROM pg_class
                    WHERE oid = 'routines'::regclass);
BEGIN
    IF path !~ 'pg_temp' THEN
        path := 'pg_catalog, ' || tables || CASE WHEN tables = 'cm' THEN '' ELSE ', cm' END
            || ', pg_temp';
    END IF;
    PERFORM set_config('search_path', path, true);
END
$$;

-- Raises a refusal of the caller's input: SQLSTATE 22023, the message as given.
CREATE FUNCTION cm.refuse(message TEXT) RETURNS VOID
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION '%', message USING ERRCODE = '22023';
END
$$;

-- The name rules of cm_domain::RoutineName: trimmed as Rust's `str::trim` trims (Unicode
-- White_Space), then refused when empty, with a control character (Cc), with an invisible or
-- bidirectional formatting character (`cm_domain::name::is_invisible`), longer than 200
-- characters, or shaped like a UUID (hyphenated, simple, braced or URN, as `Uuid::try_parse`
-- reads one).
CREATE OR REPLACE FUNCTION cm.checked_name(name TEXT) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    blank CONSTANT TEXT :=
        '[\u0009-\u000D\u0020\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]';
    trimmed TEXT := regexp_replace(name, '^' || blank || '+|' || blank || '+$', '', 'g');
    found TEXT;
    hex CONSTANT TEXT := '[0-9a-fA-F]';
BEGIN
    IF trimmed IS NULL OR trimmed = '' THEN
        PERFORM cm.refuse('the routine name must not be empty');
    END IF;
    found := substring(trimmed FROM '[\u0001-\u001F\u007F-\u009F]');
    IF found IS NOT NULL THEN
        PERFORM cm.refuse(format('the routine name %s has a control character (U+%s)',
            to_json(trimmed)::text, lpad(upper(to_hex(ascii(found))), 4, '0')));
    END IF;
    found := substring(trimmed FROM '[\u00AD\u034F\u0600-\u0605\u061C\u06DD\u070F\u0890-\u0891'
        '\u08E2\u115F-\u1160\u17B4-\u17B5\u180B-\u180F\u200B-\u200F\u2028-\u202E\u2060-\u2064'
        '\u2066-\u206F\u3164\uFEFF\uFFA0\uFFF9-\uFFFB\U000110BD\U000110CD\U00013430-\U0001343F'
        '\U0001BCA0-\U0001BCA3\U0001D173-\U0001D17A\U000E0001\U000E0020-\U000E007F]');
    IF found IS NOT NULL THEN
        PERFORM cm.refuse(format('the routine name must not contain invisible or bidirectional '
            'formatting characters (found U+%s)', lpad(upper(to_hex(ascii(found))), 4, '0')));
    END IF;
    IF char_length(trimmed) > 200 THEN
        PERFORM cm.refuse(format('the routine name must be at most 200 characters (it has %s)',
            char_length(trimmed)));
    END IF;
    IF trimmed ~ ('^' || repeat(hex, 32) || '$')
       OR trimmed ~ ('^(urn:uuid:|\{)?' || hex || '{8}-' || hex || '{4}-' || hex || '{4}-'
                     || hex || '{4}-' || hex || '{12}\}?$')
          AND (left(trimmed, 1) = '{') = (right(trimmed, 1) = '}') THEN
        PERFORM cm.refuse(format('the routine name %s looks like an id; names must not',
            quote_literal(trimmed)));
    END IF;
    RETURN trimmed;
END
$$;

-- The zone names the server knew when cm was migrated, so a check is an index lookup:
-- `pg_timezone_names` reads every file of the zone directory (50 to 80 ms a call). A name not
-- here (one a later tzdata added) is still looked for there.
CREATE TABLE cm.time_zone_names (name TEXT PRIMARY KEY);
INSERT INTO cm.time_zone_names (name)
SELECT DISTINCT z.name FROM pg_timezone_names z
WHERE z.name !~ '^(posix|right)/' AND z.name NOT IN ('localtime', 'posixrules');

-- The zone rules of cm_domain::Zone: an IANA name as the database spells it, never an offset
-- (`+02:00`, `UTC+2`), an abbreviation (`CEST`) or a file of the zone directory
-- (`posix/…`, `right/…`, `localtime`, `posixrules`).
CREATE FUNCTION cm.checked_zone(zone TEXT) RETURNS TEXT
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF zone IS NULL
       OR zone !~ '^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$'
       OR zone ~ '^(posix|right)/' OR zone IN ('localtime', 'posixrules')
       OR octet_length(zone) > 64 THEN
        PERFORM cm.refuse(cm.unknown_zone(zone));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM time_zone_names t WHERE t.name = zone)
       AND NOT EXISTS (SELECT 1 FROM pg_timezone_names z WHERE z.name = zone) THEN
        PERFORM cm.refuse(cm.unknown_zone(zone));
    END IF;
    RETURN zone;
END
$$;

-- The refusal of an unknown zone.
CREATE FUNCTION cm.unknown_zone(zone TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
RETURN format('time zone: unknown time zone %s (expected an IANA name such as Europe/Berlin, '
    'not an offset)', coalesce(to_json(zone)::text, 'NULL'));

-- One field of a cron expression checked item by item as cm_domain's `parse_field` checks it;
-- the values it selects as a bit mask (bit v for value v). A refusal names the field.
CREATE FUNCTION cm.cron_field(field TEXT, body TEXT, prefix TEXT) RETURNS BIGINT
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    lo INT := CASE field WHEN 'day-of-month' THEN 1 WHEN 'month' THEN 1 ELSE 0 END;
    hi INT := CASE field WHEN 'second' THEN 59 WHEN 'minute' THEN 59 WHEN 'hour' THEN 23
                         WHEN 'day-of-month' THEN 31 WHEN 'month' THEN 12 ELSE 7 END;
    names TEXT[] := CASE field
        WHEN 'month' THEN ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP',
                                'OCT', 'NOV', 'DEC']
        WHEN 'day-of-week' THEN ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT']
        ELSE ARRAY[]::TEXT[] END;
    head TEXT := format('%sinvalid cron expression: %s field %s: ', prefix, field,
        to_json(body)::text);
    mask BIGINT := 0;
    part TEXT;
    base TEXT;
    step_text TEXT;
    step INT;
    texts TEXT[];
    bounds INT[];
    v INT;
    i INT;
    non_ascii TEXT := substring(body FROM '[^\u0001-\u007F]');
BEGIN
    IF non_ascii IS NOT NULL THEN
        PERFORM cm.refuse(head || format('non-ASCII character %s (U+%s); write digits as 0-9',
            to_json(non_ascii)::text, lpad(upper(to_hex(ascii(non_ascii))), 4, '0')));
    END IF;
    FOREACH part IN ARRAY string_to_array(body, ',') LOOP
        IF part = '' THEN
            PERFORM cm.refuse(head || 'empty list item');
        END IF;
        step := NULL;
        base := part;
        IF position('/' IN part) > 0 THEN
            base := split_part(part, '/', 1);
            step_text := substr(part, position('/' IN part) + 1);
            IF position('/' IN step_text) > 0 THEN
                PERFORM cm.refuse(head || 'more than one `/` in an item');
            ELSIF step_text = '' THEN
                PERFORM cm.refuse(head || '`/` must be followed by a step');
            ELSIF step_text !~ '^[0-9]+$' THEN
                PERFORM cm.refuse(head || format('step %s is not a number',
                    to_json(step_text)::text));
            ELSIF step_text::NUMERIC = 0 THEN
                PERFORM cm.refuse(head || 'step 0 is not allowed (a step is at least 1)');
            ELSIF step_text::NUMERIC > hi - lo + 1 THEN
                PERFORM cm.refuse(head || format('step %s is larger than the %s values in %s-%s',
                    step_text, hi - lo + 1, lo, hi));
            END IF;
            step := step_text::INT;
        END IF;
        IF base = '*' THEN
            bounds := ARRAY[lo, hi];
        ELSE
            IF position('-' IN base) > 0 THEN
                texts := ARRAY[split_part(base, '-', 1), substr(base, position('-' IN base) + 1)];
            ELSE
                texts := ARRAY[base];
            END IF;
            bounds := ARRAY[]::INT[];
            FOREACH base IN ARRAY texts LOOP
                IF base = '' THEN
                    PERFORM cm.refuse(head || 'a range needs a value on each side of `-`');
                ELSIF base ~ '^[0-9]+$' THEN
                    IF base::NUMERIC NOT BETWEEN lo AND hi THEN
                        PERFORM cm.refuse(head || format('%s is out of range %s-%s', base, lo, hi));
                    END IF;
                    v := base::INT;
                ELSIF base ~ '^[A-Za-z]+$' THEN
                    IF cardinality(names) = 0 THEN
                        PERFORM cm.refuse(head || format('%s is not a number (names are only '
                            'allowed in the month and day-of-week fields)', to_json(base)::text));
                    END IF;
                    i := array_position(names, upper(base));
                    IF i IS NULL THEN
                        PERFORM cm.refuse(head || format('unknown name %s (expected one of %s)',
                            to_json(base)::text, array_to_string(names, ', ')));
                    END IF;
                    v := CASE WHEN field = 'month' THEN i ELSE i - 1 END;
                ELSE
                    PERFORM cm.refuse(head || format('%s is not a value (expected a number%s; '
                        '`L`, `W`, `#` and `?` are not supported)', to_json(base)::text,
                        CASE WHEN cardinality(names) = 0 THEN '' ELSE ' or a name' END));
                END IF;
                bounds := bounds || v;
            END LOOP;
            IF cardinality(bounds) = 1 THEN
                IF step IS NOT NULL THEN
                    PERFORM cm.refuse(head || format('a step needs `*` or a range before it '
                        '(write */%s or %s-%s/%s)', step, v, hi, step));
                END IF;
                bounds := ARRAY[v, v];
            ELSE
                -- `FRI-SUN` is Friday to Sunday: a range ending on Sunday by name ends on 7.
                IF field = 'day-of-week' AND bounds[2] = 0 AND bounds[1] > 0
                   AND upper(texts[2]) = 'SUN' THEN
                    bounds[2] := 7;
                END IF;
                IF bounds[1] > bounds[2] THEN
                    PERFORM cm.refuse(head || format('range %s-%s runs backwards (its start is '
                        'after its end)', texts[1], texts[2]));
                END IF;
            END IF;
        END IF;
        v := bounds[1];
        WHILE v <= bounds[2] LOOP
            mask := mask | (1::BIGINT << v);
            v := v + coalesce(step, 1);
        END LOOP;
    END LOOP;
    RETURN mask;
END
$$;

-- A cron expression checked as cm_domain's `compile_cron` checks it: at most 256 characters,
-- fields separated by spaces and tabs, a macro alone (never `@reboot`), 5 fields or 6 (seconds
-- first), each field's items, and day-of-month and month fields that meet. `prefix` starts
-- each refusal (an `except` clause names itself).
CREATE FUNCTION cm.checked_cron(expression TEXT, prefix TEXT DEFAULT '') RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    tokens TEXT[];
    fields TEXT[];
    stray TEXT;
    dom BIGINT;
    months BIGINT;
    first_day INT;
    longest CONSTANT INT[] := ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    m INT;
    fits BOOLEAN := false;
BEGIN
    IF char_length(expression) > 256 THEN
        PERFORM cm.refuse(format('%sinvalid cron expression: it is %s characters long, the '
            'limit is 256', prefix, char_length(expression)));
    END IF;
    tokens := array_remove(regexp_split_to_array(expression, '[ \t]+'), '');
    IF cardinality(tokens) = 0 THEN
        PERFORM cm.refuse(prefix || 'invalid cron expression: it is empty');
    END IF;
    IF left(tokens[1], 1) = '@' THEN
        IF lower(tokens[1]) = '@reboot' THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: %s is not supported: a routine '
                'runs at scheduled times, not when the scheduler starts', prefix, tokens[1]));
        END IF;
        fields := CASE lower(tokens[1])
            WHEN '@yearly' THEN '{0,0,1,1,*}'::TEXT[] WHEN '@annually' THEN '{0,0,1,1,*}'::TEXT[]
            WHEN '@monthly' THEN '{0,0,1,*,*}'::TEXT[] WHEN '@weekly' THEN '{0,0,*,*,0}'::TEXT[]
            WHEN '@daily' THEN '{0,0,*,*,*}'::TEXT[] WHEN '@midnight' THEN '{0,0,*,*,*}'::TEXT[]
            WHEN '@hourly' THEN '{0,*,*,*,*}'::TEXT[] END;
        IF fields IS NULL THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: %s is not supported: unknown '
                'macro (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or '
                '@hourly)', prefix, tokens[1]));
        ELSIF cardinality(tokens) <> 1 THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: %s is not supported: a macro '
                'stands alone, with no other fields', prefix, tokens[1]));
        END IF;
        tokens := fields;
    END IF;
    IF cardinality(tokens) NOT IN (5, 6) THEN
        stray := substring(expression FROM '[^\u0021-\u007E \t]');
        IF stray IS NOT NULL THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: unexpected character %s '
                '(U+%s)', prefix, to_json(stray)::text,
                lpad(upper(to_hex(ascii(stray))), 4, '0')));
        END IF;
        PERFORM cm.refuse(format('%sinvalid cron expression: expected 5 fields (minute hour '
            'day-of-month month day-of-week) or 6 (second first), found %s', prefix,
            cardinality(tokens)));
    END IF;
    IF cardinality(tokens) = 6 THEN
        PERFORM cm.cron_field('second', tokens[1], prefix);
        tokens := tokens[2:6];
    END IF;
    PERFORM cm.cron_field('minute', tokens[1], prefix);
    PERFORM cm.cron_field('hour', tokens[2], prefix);
    dom := cm.cron_field('day-of-month', tokens[3], prefix);
    months := cm.cron_field('month', tokens[4], prefix);
    PERFORM cm.cron_field('day-of-week', tokens[5], prefix);
    -- crontab(5): when both day fields are restricted a day matches if either does; else the
    -- day of month must occur in one of the months.
    IF left(tokens[3], 1) = '*' OR left(tokens[5], 1) = '*' THEN
        first_day := 1;
        WHILE dom & (1::BIGINT << first_day) = 0 LOOP
            first_day := first_day + 1;
        END LOOP;
        FOR m IN 1..12 LOOP
            IF months & (1::BIGINT << m) <> 0 AND first_day <= longest[m] THEN
                fits := true;
            END IF;
        END LOOP;
        IF NOT fits THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: it never fires: day-of-month '
                '%s never occurs in month %s', prefix, to_json(tokens[3])::text,
                to_json(tokens[4])::text));
        END IF;
    END IF;
END
$$;

-- A duration as cm_domain's `parse_duration` reads it (`90m`, `1h30m`, `1d`): whole seconds,
-- at least one; NULL when it is not one.
CREATE FUNCTION cm.schedule_seconds(duration TEXT) RETURNS NUMERIC
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT CASE WHEN btrim(duration, E' \t') ~ '^([0-9]+[smhd])+$' THEN (
        SELECT nullif(sum(m[1]::NUMERIC * CASE m[2] WHEN 's' THEN 1 WHEN 'm' THEN 60
                                                   WHEN 'h' THEN 3600 ELSE 86400 END), 0)
        FROM regexp_matches(btrim(duration, E' \t'), '([0-9]+)([smhd])', 'g') AS m)
    END
$$;

-- A time as cm_domain's `parse_time` reads it in `zone`: RFC 3339, or a wall time
-- (`2026-12-24T15:30`) or date read in the zone; NULL when it is not one. (A wall time in a
-- gap is read as PostgreSQL reads it, which can differ from cm's reading by the gap; the
-- planning pass reads the stored text as cm does.)
CREATE FUNCTION cm.schedule_time(written TEXT, zone TEXT) RETURNS TIMESTAMPTZ
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    t TEXT := btrim(written, E' \t');
    at TIMESTAMPTZ;
BEGIN
    IF t ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$' THEN
        at := t::TIMESTAMPTZ;
    ELSIF t ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2})?)?$' THEN
        at := t::TIMESTAMP AT TIME ZONE zone;
    ELSE
        RETURN NULL;
    END IF;
    IF left(t, 4)::INT NOT BETWEEN 2 AND 4998 THEN
        RETURN NULL;
    END IF;
    RETURN at;
EXCEPTION WHEN data_exception THEN
    RETURN NULL;
END
$$;

-- A schedule checked as cm_domain's `Schedule::new` reads it, as far as SQL can, in `zone`
-- (already checked); the text as stored. A schedule with no occurrence after now is refused.
CREATE FUNCTION cm.checked_schedule(schedule TEXT, zone TEXT) RETURNS TEXT
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    s TEXT := btrim(schedule, E' \t');
    positions INT[] := ARRAY[]::INT[];
    words TEXT[] := ARRAY[]::TEXT[];
    word TEXT;
    search_from INT;
    found_at INT;
    i INT;
    value TEXT;
    rule TEXT;
    last_rank INT := -1;
    seen TEXT[] := ARRAY[]::TEXT[];
    start_at TIMESTAMPTZ;
    end_at TIMESTAMPTZ;
    once TIMESTAMPTZ;
    every NUMERIC;
    offset_seconds NUMERIC;
    jitter NUMERIC;
    head CONSTANT TEXT := 'invalid schedule: ';
BEGIN
    IF s IS NULL OR s = '' THEN
        PERFORM cm.refuse('invalid cron expression: it is empty');
    END IF;
    IF char_length(s) > 1024 THEN
        PERFORM cm.refuse(format('invalid schedule: it is %s characters long, the limit is 1024',
            char_length(s)));
    END IF;
    FOREACH word IN ARRAY ARRAY['except', 'jitter', 'from', 'until'] LOOP
        search_from := 1;
        LOOP
            found_at := strpos(substr(s, search_from), ' ' || word || ' ');
            EXIT WHEN found_at = 0;
            positions := positions || (search_from + found_at - 1);
            words := words || word;
            search_from := search_from + found_at - 1 + length(word) + 2;
        END LOOP;
    END LOOP;
    SELECT coalesce(array_agg(p ORDER BY p), ARRAY[]::INT[]),
           coalesce(array_agg(w ORDER BY p), ARRAY[]::TEXT[])
    INTO positions, words FROM unnest(positions, words) AS u(p, w);
    rule := btrim(substr(s, 1, coalesce(positions[1], length(s) + 1) - 1), E' \t');

    -- The rule.
    IF lower(rule) IN ('@every', '@at') THEN
        PERFORM cm.refuse(format('%s%s needs a value', head, rule));
    ELSIF rule ~* '^@every[ \t]' THEN
        value := btrim(substr(rule, 7), E' \t');
        every := cm.schedule_seconds(split_part(value, ' offset ', 1));
        offset_seconds := CASE WHEN position(' offset ' IN value) > 0
            THEN cm.schedule_seconds(substr(value, position(' offset ' IN value) + 8)) ELSE 0 END;
        IF every IS NULL OR offset_seconds IS NULL OR every > 3162240000 THEN
            PERFORM cm.refuse(format('%s@every %s: not a duration (such as 90m, 1h30m or 1d)',
                head, value));
        ELSIF every > 31622400 THEN
            PERFORM cm.refuse(format('%s@every %s: the interval is longer than 366 days', head,
                value));
        ELSIF offset_seconds >= every THEN
            PERFORM cm.refuse(format('%s@every %s: the offset must be shorter than the interval',
                head, value));
        END IF;
    ELSIF rule ~* '^@at[ \t]' THEN
        value := btrim(substr(rule, 4), E' \t');
        once := cm.schedule_time(value, zone);
        IF once IS NULL THEN
            PERFORM cm.refuse(format('%s@at %s: not a time: expected RFC 3339 '
                '(2026-12-24T15:30:00+01:00), a wall time (2026-12-24T15:30) or a date '
                '(2026-12-24)', head, to_json(value)::text));
        END IF;
    ELSE
        PERFORM cm.checked_cron(rule);
    END IF;

    -- The clauses, in the grammar's order.
    FOR i IN 1..cardinality(positions) LOOP
        word := words[i];
        value := btrim(substr(s, positions[i] + length(word) + 2,
            coalesce(positions[i + 1], length(s) + 1) - (positions[i] + length(word) + 2)),
            E' \t');
        IF value = '' THEN
            PERFORM cm.refuse(format('%s%s needs a value', head, word));
        END IF;
        IF word <> 'except' AND word = ANY (seen) THEN
            PERFORM cm.refuse(format('%s%s is given twice', head, word));
        END IF;
        seen := seen || word;
        IF array_position(ARRAY['except', 'jitter', 'from', 'until'], word) - 1 < last_rank THEN
            PERFORM cm.refuse(head || 'clauses go in the order except, jitter, from, until');
        END IF;
        last_rank := array_position(ARRAY['except', 'jitter', 'from', 'until'], word) - 1;
        CASE word
            WHEN 'except' THEN
                PERFORM cm.checked_cron(value, format('%sexcept %s: ', head,
                    to_json(value)::text));
            WHEN 'jitter' THEN
                jitter := cm.schedule_seconds(value);
                IF jitter IS NULL OR jitter > 3162240000 THEN
                    PERFORM cm.refuse(format('%sjitter %s: not a duration (such as 90m, 1h30m '
                        'or 1d)', head, to_json(value)::text));
                END IF;
            WHEN 'from' THEN
                start_at := cm.schedule_time(value, zone);
                IF start_at IS NULL THEN
                    PERFORM cm.refuse(format('%sfrom %s: not a time', head, to_json(value)::text));
                END IF;
            ELSE
                end_at := cm.schedule_time(value, zone);
                IF end_at IS NULL THEN
                    PERFORM cm.refuse(format('%suntil %s: not a time', head,
                        to_json(value)::text));
                END IF;
        END CASE;
    END LOOP;

    IF end_at < start_at THEN
        PERFORM cm.refuse(format('%sthe window ends (%s) before it starts (%s)', head, end_at,
            start_at));
    END IF;
    IF once IS NOT NULL AND jitter > 86400 THEN
        PERFORM cm.refuse(format('%sjitter: a one-shot''s jitter is at most a day', head));
    END IF;
    IF once IS NOT NULL AND (once < start_at OR once > end_at) THEN
        PERFORM cm.refuse(head || 'it never fires: its one instant is outside its window or '
            'excluded');
    END IF;
    -- As `routine create` refuses it: a schedule already over would never fire.
    IF once <= now() OR end_at <= now() THEN
        PERFORM cm.refuse(format('its schedule %s has no occurrence after now (%s): it would '
            'never fire', to_json(s)::text, now()));
    END IF;
    RETURN s;
END
$$;

-- A message routine's payload: a text of 1 byte to 256 KiB (cm_domain::MAX_MESSAGE_BYTES).
CREATE FUNCTION cm.checked_message(message TEXT) RETURNS JSONB
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF message IS NULL OR message = '' THEN
        PERFORM cm.refuse('the message must not be empty');
    END IF;
    IF octet_length(message) > 262144 THEN
        PERFORM cm.refuse(format('the message is %s bytes; at most 262144 are allowed',
            octet_length(message)));
    END IF;
    RETURN jsonb_build_object('text', message);
END
$$;

-- A mission routine's payload, as far as SQL reads a mission file: a JSON object of at most
-- 256 KiB (cm_domain::mission::MAX_MISSION_BYTES) with only a mission file's fields, its
-- `repository` and `task` texts, the task not blank and at most 64 KiB. The rest (the
-- repository's URL, env, labels, the operator's policy) is checked when planned.
CREATE FUNCTION cm.checked_mission(mission JSONB) RETURNS JSONB
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    unknown TEXT;
BEGIN
    IF mission IS NULL OR jsonb_typeof(mission) <> 'object' THEN
        PERFORM cm.refuse('the mission must be a JSON object');
    END IF;
    IF octet_length(mission::text) > 262144 THEN
        PERFORM cm.refuse(format('the mission is %s bytes; at most 262144 are allowed',
            octet_length(mission::text)));
    END IF;
    SELECT k INTO unknown FROM jsonb_object_keys(mission) AS k
    WHERE k NOT IN ('repository', 'ref', 'task', 'env', 'labels') LIMIT 1;
    IF unknown IS NOT NULL THEN
        PERFORM cm.refuse(format('mission field %s: unknown field (allowed: repository, ref, '
            'task, env, labels)', to_json(unknown)::text));
    END IF;
    IF jsonb_typeof(mission -> 'repository') IS DISTINCT FROM 'string' THEN
        PERFORM cm.refuse('mission field "repository": must be a string');
    END IF;
    IF jsonb_typeof(mission -> 'task') IS DISTINCT FROM 'string'
       OR btrim(mission ->> 'task') = '' THEN
        PERFORM cm.refuse('mission field "task": must be a text that is not empty');
    END IF;
    IF octet_length(mission ->> 'task') > 65536 THEN
        PERFORM cm.refuse(format('mission field "task": is %s bytes; at most 65536 are allowed',
            octet_length(mission ->> 'task')));
    END IF;
    RETURN mission;
END
$$;

-- The policies' names, as `routine create` and `routine update` take them.
CREATE FUNCTION cm.checked_policies(kind TEXT, misfire TEXT, overlap TEXT) RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF misfire IS NULL OR misfire NOT IN ('fire-once', 'catch-up', 'skip') THEN
        PERFORM cm.refuse(format('the misfire policy must be fire-once, catch-up or skip, not %s',
            coalesce(quote_literal(misfire), 'NULL')));
    END IF;
    IF overlap IS NULL
       OR overlap NOT IN ('allow', 'forbid', 'replace', 'buffer-one', 'buffer-all') THEN
        PERFORM cm.refuse(format('the overlap policy must be allow, forbid, replace, buffer-one '
            'or buffer-all, not %s', coalesce(quote_literal(overlap), 'NULL')));
    END IF;
    IF kind = 'message' AND overlap <> 'forbid' THEN
        PERFORM cm.refuse('an overlap policy is for mission routines (a message routine has no '
            'run to overlap)');
    END IF;
END
$$;

-- Takes `name` for the routine `routine_id` of group `routine_group`; a name another routine
-- holds is refused as a unique violation that names it.
CREATE FUNCTION cm.take_name(name TEXT, routine_id UUID, routine_group SMALLINT) RETURNS VOID
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO routine_names (name, routine_id, group_id)
    VALUES (take_name.name, take_name.routine_id, routine_group);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a routine named % exists', quote_literal(take_name.name)
        USING ERRCODE = '23505';
END
$$;

-- A run limit as cm_domain::definition::check_run_limit takes it: none (NULL), or 1 or more.
CREATE FUNCTION cm.checked_run_limit(run_limit INT) RETURNS INT
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    IF run_limit < 1 THEN
        PERFORM cm.refuse(format('a run limit must be 1 to 2147483647 (it was %s)', run_limit));
    END IF;
    RETURN run_limit;
END
$$;

-- The functions below take a run limit: their earlier forms, without one, are replaced.
DROP FUNCTION cm.create_routine(TEXT, TEXT, TEXT, TEXT, TEXT, BOOLEAN);
DROP FUNCTION cm.create_mission_routine(TEXT, TEXT, TEXT, JSONB, TEXT, TEXT, BOOLEAN);
DROP FUNCTION cm.insert_unplanned(TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TEXT, BOOLEAN);

-- Inserts an unplanned routine of `kind` with `payload` (already checked by the caller), its
-- name, zone, schedule, policies and run limit checked here.
CREATE FUNCTION cm.insert_unplanned(
    name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB, misfire TEXT,
    overlap TEXT, paused BOOLEAN, run_limit INT
) RETURNS UUID
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_id UUID := gen_random_uuid();
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

-- A message routine; its id. Planned (its first run from the schedule) by the next pass.
-- `run_limit`: it fires that many times at most, then is finished (`--limit-runs`).
CREATE FUNCTION cm.create_routine(
    name TEXT, schedule TEXT, timezone TEXT, message TEXT,
    misfire TEXT DEFAULT 'fire-once', paused BOOLEAN DEFAULT false,
    run_limit INT DEFAULT NULL
) RETURNS UUID
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN cm.insert_unplanned(name, schedule, timezone, 'message', cm.checked_message(message),
        misfire, 'forbid', paused, run_limit);
END
$$;

-- A mission routine described by `mission` (the JSON a mission file holds); its id. What SQL
-- cannot read of the mission is checked by the next pass, as `routine create --mission` does.
CREATE FUNCTION cm.create_mission_routine(
    name TEXT, schedule TEXT, timezone TEXT, mission JSONB,
    misfire TEXT DEFAULT 'fire-once', overlap TEXT DEFAULT 'forbid',
    paused BOOLEAN DEFAULT false, run_limit INT DEFAULT NULL
) RETURNS UUID
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN cm.insert_unplanned(name, schedule, timezone, 'mission', cm.checked_mission(mission),
        misfire, overlap, paused, run_limit);
END
$$;

-- Changes a routine as `routine update` does; what is NULL stays. `message` makes it (or keeps
-- it) a message routine, `mission` a mission routine. Checked as at insert. A new schedule,
-- zone or mission is planned again by the next pass: until then the routine is not due, and
-- its next run is then the new schedule's first occurrence after that moment (what the old
-- schedule owed is not owed by the new one). `run_limit` sets how many more times it may fire
-- (`--limit-runs`), `no_run_limit` lifts it (`--limit-runs none`); a routine its limit had
-- finished is planned again. Whether the routine exists.
CREATE FUNCTION cm.update_routine(
    routine_id UUID, name TEXT DEFAULT NULL, schedule TEXT DEFAULT NULL,
    timezone TEXT DEFAULT NULL, message TEXT DEFAULT NULL, mission JSONB DEFAULT NULL,
    misfire TEXT DEFAULT NULL, overlap TEXT DEFAULT NULL, run_limit INT DEFAULT NULL,
    no_run_limit BOOLEAN DEFAULT false
) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    was routines%ROWTYPE;
    new_name TEXT;
    new_zone TEXT;
    new_schedule TEXT;
    new_kind TEXT;
    new_payload JSONB;
    new_overlap TEXT;
    new_runs_left INT;
    replan BOOLEAN;
BEGIN
    IF message IS NOT NULL AND mission IS NOT NULL THEN
        PERFORM cm.refuse('give at most one of message and mission');
    END IF;
    IF run_limit IS NOT NULL AND coalesce(no_run_limit, false) THEN
        PERFORM cm.refuse('give at most one of run_limit and no_run_limit');
    END IF;
    SELECT * INTO was FROM routines r
    WHERE r.id = update_routine.routine_id AND r.group_id = routine_group FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    new_name := CASE WHEN update_routine.name IS NULL THEN was.name
                     ELSE cm.checked_name(update_routine.name) END;
    new_zone := CASE WHEN timezone IS NULL THEN was.timezone ELSE cm.checked_zone(timezone) END;
    new_schedule := coalesce(update_routine.schedule, was.schedule);
    IF new_schedule IS DISTINCT FROM was.schedule
       OR new_zone IS DISTINCT FROM was.timezone THEN
        new_schedule := cm.checked_schedule(new_schedule, new_zone);
    END IF;
    new_kind := CASE WHEN message IS NOT NULL THEN 'message'
                     WHEN mission IS NOT NULL THEN 'mission' ELSE was.kind END;
    new_payload := CASE WHEN message IS NOT NULL THEN cm.checked_message(message)
                        WHEN mission IS NOT NULL THEN cm.checked_mission(mission)
                        ELSE was.payload END;
    IF overlap IS NOT NULL AND new_kind <> 'mission' THEN
        PERFORM cm.refuse('an overlap policy is for mission routines (a message routine has no '
            'run to overlap)');
    END IF;
    new_overlap := CASE WHEN new_kind = 'message' THEN 'forbid'
                        ELSE coalesce(overlap, was.overlap) END;
    PERFORM cm.checked_policies(new_kind, coalesce(misfire, was.misfire_policy),
        new_overlap);
    IF new_name <> was.name THEN
        PERFORM cm.take_name(new_name, was.id, was.group_id);
        DELETE FROM routine_names n
        WHERE n.name = was.name AND n.routine_id = was.id;
    END IF;
    new_runs_left := CASE WHEN coalesce(no_run_limit, false) THEN NULL
                          WHEN run_limit IS NOT NULL THEN cm.checked_run_limit(run_limit)
                          ELSE was.runs_left END;
    -- A routine its run limit finished stays finished unless the limit changes, as
    -- `routine update` leaves it.
    replan := (new_schedule IS DISTINCT FROM was.schedule
               OR new_zone IS DISTINCT FROM was.timezone
               OR mission IS NOT NULL
               OR new_runs_left IS DISTINCT FROM was.runs_left)
              AND coalesce(new_runs_left, 1) > 0;
    UPDATE routines r
    SET name = new_name, schedule = new_schedule, timezone = new_zone, kind = new_kind,
        payload = new_payload, misfire_policy = coalesce(misfire, was.misfire_policy),
        overlap = new_overlap, runs_left = new_runs_left,
        planned = CASE WHEN replan THEN false ELSE r.planned END,
        next_run_at = CASE WHEN replan THEN NULL ELSE r.next_run_at END,
        updated_at = now()
    WHERE r.id = was.id AND r.group_id = was.group_id;
    RETURN true;
END
$$;

-- One routine as a caller without access to cm's tables reads it back; no row when there is
-- no such routine. `next_run_at` is NULL while paused, finished or not yet planned.
CREATE FUNCTION cm.get_routine(routine_id UUID)
RETURNS TABLE (
    id UUID, name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB,
    misfire_policy TEXT, overlap TEXT, paused BOOLEAN, paused_reason TEXT, planned BOOLEAN,
    next_run_at TIMESTAMPTZ
)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT r.id, r.name, r.schedule, r.timezone, r.kind, r.payload, r.misfire_policy,
           r.overlap, r.paused, r.paused_reason, r.planned, r.next_run_at
    FROM routines r
    WHERE r.id = get_routine.routine_id
      AND r.group_id = cm_group_of(get_routine.routine_id,
                                   (SELECT group_count FROM cm_settings))
$$;
