-- Quartz's `L`, `W` and `#` in cron lines, checked at insert as cm_domain checks them: the day
-- fields take `L` (the month's last day), `LW` (its last weekday) and `15W` (the weekday nearest
-- the 15th) in day-of-month, `5L` (the last Friday) and `5#3` (the third Friday, `#1` to `#5`)
-- in day-of-week, each alone in its list item (no range, no step), upper or lower case, with
-- weekday numbers and names as elsewhere (`FRIL`, `FRI#3`; 0 and 7 are Sunday). `W` in
-- day-of-week, `#` in day-of-month, `#0`, `#6`, `0W`, `32W`, `L-3`, `L/2` and `L` with `LW` in
-- one list are refused, one line naming the field. When a day must match both day fields (one
-- of them starts with `*`), day fields that never meet are refused as never firing: a day of
-- the month no selected month has (`31W` in February), or one that never falls on a weekday the
-- other field selects (`LW` on a Saturday or Sunday).
--
-- `cm.cron_field` and `cm.checked_cron` are replaced with the same signatures: CREATE OR REPLACE
-- keeps their owner and their privileges (EXECUTE revoked from PUBLIC, granted to no one), and
-- they are made SECURITY DEFINER on the pinned path again below, as
-- 20261205000600_least_privilege.sql made every function of the schema.

-- One field of a cron expression checked item by item as cm_domain's `parse_field` checks it;
-- what it selects as a bit mask. A refusal names the field. Bit v is value v (day-of-week 7
-- kept as 7); the day fields add Quartz's items:
--
-- - day-of-month: bit 0 `L`, bit 32 `LW`, bit 32 + d `dW` (d 1 to 31);
-- - day-of-week: bit 8 + 6 w + (n - 1) `w#n`, bit 8 + 6 w + 5 `wL` (w 0 to 6, Sunday 0).
CREATE OR REPLACE FUNCTION cm.cron_field(field TEXT, body TEXT, prefix TEXT) RETURNS BIGINT
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
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
    quartz TEXT;
    weekday_text TEXT;
    nth_text TEXT;
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
        -- Quartz's items: in day-of-month any `L`, `W` or `#` (the field has no names); in
        -- day-of-week a `#` or a last `L` or `W` (no weekday name holds one).
        quartz := upper(split_part(part, '/', 1));
        IF (field = 'day-of-month' AND quartz ~ '[LW#]')
           OR (field = 'day-of-week' AND quartz ~ '(#|L$|W$)') THEN
            IF field = 'day-of-month' AND position('#' IN quartz) > 0 THEN
                PERFORM cm.refuse(head || '`#` belongs in the day-of-week field (5#3 is the third '
                    'Friday)');
            ELSIF part ~ '[/-]' THEN
                IF field = 'day-of-month' AND left(quartz, 2) = 'L-' AND position('/' IN part) = 0
                THEN
                    PERFORM cm.refuse(head || format('L-%s: an offset from the last day is not '
                        'supported (write L, LW or a day with W such as 15W)', substr(quartz, 3)));
                END IF;
                PERFORM cm.refuse(head || '`L`, `W` and `#` stand alone in a list item, with no '
                    'range or step');
            ELSIF field = 'day-of-month' THEN
                IF quartz = 'L' THEN
                    mask := mask | 1;
                ELSIF quartz = 'LW' THEN
                    mask := mask | (1::BIGINT << 32);
                ELSIF quartz = 'W' THEN
                    PERFORM cm.refuse(head || '`W` needs a day before it (15W is the weekday '
                        'nearest the 15th, LW the last weekday)');
                ELSIF quartz ~ '^[0-9]+W$' THEN
                    IF left(quartz, -1)::NUMERIC NOT BETWEEN 1 AND 31 THEN
                        PERFORM cm.refuse(head || format('%s: the day before `W` must be 1-31',
                            quartz));
                    END IF;
                    mask := mask | (1::BIGINT << (32 + left(quartz, -1)::INT));
                ELSE
                    PERFORM cm.refuse(head || format('%s is not a day-of-month item (expected a '
                        'number, L, LW or a day with W such as 15W)', to_json(quartz)::text));
                END IF;
            ELSE
                IF right(quartz, 1) = 'W' THEN
                    PERFORM cm.refuse(head || '`W` belongs in the day-of-month field (15W is the '
                        'weekday nearest the 15th)');
                END IF;
                IF position('#' IN quartz) > 0 THEN
                    weekday_text := split_part(quartz, '#', 1);
                    nth_text := substr(quartz, position('#' IN quartz) + 1);
                    IF weekday_text = '' THEN
                        PERFORM cm.refuse(head || '`#` needs a weekday before it (5#3 is the '
                            'third Friday)');
                    END IF;
                ELSE
                    weekday_text := left(quartz, -1);
                    nth_text := NULL;
                    IF weekday_text = '' THEN
                        PERFORM cm.refuse(head || '`L` in day-of-week needs a weekday before it '
                            '(5L is the last Friday; the last day of the month is L in '
                            'day-of-month)');
                    END IF;
                END IF;
                -- The weekday, as a value of the field is read below.
                IF weekday_text ~ '^[0-9]+$' THEN
                    IF weekday_text::NUMERIC NOT BETWEEN lo AND hi THEN
                        PERFORM cm.refuse(head || format('%s is out of range %s-%s',
                            weekday_text, lo, hi));
                    END IF;
                    v := weekday_text::INT % 7;
                ELSIF weekday_text ~ '^[A-Z]+$' THEN
                    i := array_position(names, weekday_text);
                    IF i IS NULL THEN
                        PERFORM cm.refuse(head || format('unknown name %s (expected one of %s)',
                            to_json(weekday_text)::text, array_to_string(names, ', ')));
                    END IF;
                    v := i - 1;
                ELSIF weekday_text = '?' THEN
                    PERFORM cm.refuse(head || '`?` is not supported: write `*` (the day fields '
                        'combine as in crontab(5))');
                ELSE
                    PERFORM cm.refuse(head || format('%s is not a value (expected a number or a '
                        'name)', to_json(weekday_text)::text));
                END IF;
                IF nth_text IS NULL THEN
                    mask := mask | (1::BIGINT << (8 + 6 * v + 5));
                ELSIF nth_text !~ '^[0-9]+$' THEN
                    PERFORM cm.refuse(head || format('`#` must be followed by 1 to 5, not %s '
                        '(5#3 is the third Friday)', to_json(nth_text)::text));
                ELSIF nth_text::NUMERIC NOT BETWEEN 1 AND 5 THEN
                    PERFORM cm.refuse(head || format('#%s: a weekday occurs 1 to 5 times in a '
                        'month (write #1 to #5)', nth_text));
                ELSE
                    mask := mask | (1::BIGINT << (8 + 6 * v + nth_text::INT - 1));
                END IF;
            END IF;
            CONTINUE;
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
                ELSIF base = '?' AND field IN ('day-of-month', 'day-of-week') THEN
                    PERFORM cm.refuse(head || '`?` is not supported: write `*` (the day fields '
                        'combine as in crontab(5))');
                ELSE
                    PERFORM cm.refuse(head || format('%s is not a value (expected a number%s)',
                        to_json(base)::text,
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
    IF field = 'day-of-month' AND mask & 1 <> 0 AND mask & (1::BIGINT << 32) <> 0 THEN
        PERFORM cm.refuse(head || '`L` and `LW` cannot share a list (the cron engine would read '
            'both as LW)');
    END IF;
    RETURN mask;
END
$$;

-- A cron expression checked as cm_domain's `compile_cron` checks it: at most 256 characters,
-- fields separated by spaces and tabs, a macro alone (never `@reboot`), 5 fields or 6 (seconds
-- first), each field's items, and day and month fields that meet. `prefix` starts each refusal
-- (an `except` clause names itself).
CREATE OR REPLACE FUNCTION cm.checked_cron(expression TEXT, prefix TEXT DEFAULT '') RETURNS VOID
LANGUAGE plpgsql IMMUTABLE
SECURITY DEFINER
AS $$
DECLARE
    tokens TEXT[];
    fields TEXT[];
    stray TEXT;
    dom BIGINT;
    months BIGINT;
    dow BIGINT;
    lengths INT[] := ARRAY[]::INT[];
    len INT;
    first_weekday INT;
    d INT;
    p INT;
    wd INT;
    pw INT;
    m INT;
    hit BOOLEAN;
    dom_meets BOOLEAN := false;
    days_meet BOOLEAN := false;
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
    dow := cm.cron_field('day-of-week', tokens[5], prefix);
    -- crontab(5): when both day fields are restricted a day matches if either does; else a day
    -- must match both, and some day of a selected month must. Every month starts on every
    -- weekday over the years (February in leap years and in others), so trying each length a
    -- selected month can have, starting on each weekday, is exact.
    IF left(tokens[3], 1) = '*' OR left(tokens[5], 1) = '*' THEN
        FOR m IN 1..12 LOOP
            IF months & (1::BIGINT << m) <> 0 THEN
                lengths := lengths || CASE WHEN m = 2 THEN ARRAY[28, 29]
                                           WHEN m IN (4, 6, 9, 11) THEN ARRAY[30]
                                           ELSE ARRAY[31] END;
            END IF;
        END LOOP;
        <<lengths_loop>>
        FOREACH len IN ARRAY lengths LOOP
            FOR first_weekday IN 0..6 LOOP
                FOR d IN 1..len LOOP
                    wd := (first_weekday + d - 1) % 7;
                    -- Day-of-month: the day, `L`, or a `dW` (or `LW`, the weekday nearest the
                    -- last day) that resolves to it, from at most two days away.
                    hit := dom & (1::BIGINT << d) <> 0 OR (dom & 1 <> 0 AND d = len);
                    FOR p IN greatest(d - 2, 1)..least(d + 2, len) LOOP
                        EXIT WHEN hit;
                        IF dom & (1::BIGINT << (32 + p)) <> 0
                           OR (p = len AND dom & (1::BIGINT << 32) <> 0) THEN
                            pw := (wd + 35 + p - d) % 7;
                            hit := d = CASE pw WHEN 6 THEN CASE WHEN p = 1 THEN 3 ELSE p - 1 END
                                               WHEN 0 THEN CASE WHEN p = len THEN p - 2
                                                                ELSE p + 1 END
                                               ELSE p END;
                        END IF;
                    END LOOP;
                    CONTINUE WHEN NOT hit;
                    dom_meets := true;
                    -- Day-of-week: the weekday, its `w#n`, or its `wL` in the last seven days.
                    IF dow & (1::BIGINT << wd) <> 0 OR (wd = 0 AND dow & 128 <> 0)
                       OR dow & (1::BIGINT << (8 + 6 * wd + (d - 1) / 7)) <> 0
                       OR (d + 7 > len AND dow & (1::BIGINT << (8 + 6 * wd + 5)) <> 0) THEN
                        days_meet := true;
                        EXIT lengths_loop;
                    END IF;
                END LOOP;
            END LOOP;
        END LOOP;
        IF NOT dom_meets THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: it never fires: day-of-month '
                '%s never occurs in month %s', prefix, to_json(tokens[3])::text,
                to_json(tokens[4])::text));
        ELSIF NOT days_meet THEN
            PERFORM cm.refuse(format('%sinvalid cron expression: it never fires: day-of-month '
                '%s never falls on day-of-week %s in month %s', prefix, to_json(tokens[3])::text,
                to_json(tokens[5])::text, to_json(tokens[4])::text));
        END IF;
    END IF;
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
    EXECUTE format('ALTER FUNCTION cm.cron_field(TEXT, TEXT, TEXT) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.checked_cron(TEXT, TEXT) SET search_path TO %s', path);
END
$$;
