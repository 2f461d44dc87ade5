-- RFC 5545 recurrence rules (`@rrule FREQ=…;BYDAY=…`) in a schedule's text, checked at insert
-- as far as SQL reads them: `@rrule` needs a value, its parts are NAME=VALUE with the RFC's
-- names, each once, a FREQ among the RFC's seven, a COUNT of at most 1000, and no DTSTART,
-- RDATE, EXDATE or EXRULE (the start is the schedule's `from` clause; exclusions are `except`
-- clauses). The rest (values, the rule's start, its first occurrence) is checked by cm_domain
-- when the routine is planned, as every schedule's occurrences are.
--
-- `cm.checked_schedule` is replaced with the same signature: CREATE OR REPLACE keeps its owner
-- and its privileges, and it is pinned to the path these migrations run under again below, as
-- 20261205000600_least_privilege.sql pinned every function of the schema.

CREATE OR REPLACE FUNCTION cm.checked_schedule(schedule TEXT, zone TEXT) RETURNS TEXT
LANGUAGE plpgsql STABLE
SECURITY DEFINER
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
    part TEXT;
    part_name TEXT;
    names TEXT[] := ARRAY[]::TEXT[];
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
    IF lower(rule) IN ('@every', '@at', '@rrule') THEN
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
    ELSIF rule ~* '^@rrule[ \t]' THEN
        value := upper(btrim(substr(rule, 7), E' \t'));
        IF value LIKE 'RRULE:%' THEN
            value := substr(value, 7);
        END IF;
        FOREACH part IN ARRAY string_to_array(value, ';') LOOP
            part_name := split_part(part, '=', 1);
            IF position('=' IN part) = 0 THEN
                PERFORM cm.refuse(format('%s@rrule %s: %s is not NAME=VALUE', head,
                    btrim(substr(rule, 7), E' \t'), to_json(part)::text));
            ELSIF part_name IN ('DTSTART', 'RDATE', 'EXDATE', 'EXRULE') THEN
                PERFORM cm.refuse(format('%s@rrule %s: %s is not part of a rule here: the start '
                    'is the schedule''s from clause (--start) and exclusions are except clauses',
                    head, btrim(substr(rule, 7), E' \t'), part_name));
            ELSIF part_name NOT IN ('FREQ', 'INTERVAL', 'COUNT', 'UNTIL', 'BYSECOND', 'BYMINUTE',
                    'BYHOUR', 'BYDAY', 'BYMONTHDAY', 'BYYEARDAY', 'BYWEEKNO', 'BYMONTH',
                    'BYSETPOS', 'WKST') THEN
                PERFORM cm.refuse(format('%s@rrule %s: %s is not a part of an RFC 5545 rule',
                    head, btrim(substr(rule, 7), E' \t'), to_json(part_name)::text));
            ELSIF part_name = ANY (names) THEN
                PERFORM cm.refuse(format('%s@rrule %s: %s is given twice', head,
                    btrim(substr(rule, 7), E' \t'), part_name));
            END IF;
            names := names || part_name;
        END LOOP;
        IF NOT value ~ '(^|;)FREQ=(YEARLY|MONTHLY|WEEKLY|DAILY|HOURLY|MINUTELY|SECONDLY)(;|$)' THEN
            PERFORM cm.refuse(format('%s@rrule %s: it needs FREQ=YEARLY, MONTHLY, WEEKLY, DAILY, '
                'HOURLY, MINUTELY or SECONDLY', head, btrim(substr(rule, 7), E' \t')));
        END IF;
        IF value ~ '(^|;)COUNT=' AND NOT value ~ '(^|;)COUNT=0*([1-9][0-9]{0,2}|1000)(;|$)' THEN
            PERFORM cm.refuse(format('%s@rrule %s: COUNT is at most 1000; for more, leave it '
                'out and end the schedule with until (--end) or a run limit (--limit-runs)',
                head, btrim(substr(rule, 7), E' \t')));
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
    EXECUTE format('ALTER FUNCTION cm.checked_schedule(TEXT, TEXT) SET search_path TO %s', path);
END
$$;
