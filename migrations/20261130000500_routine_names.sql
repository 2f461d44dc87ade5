-- Routine names become handles people type: unique, free of control characters, and listed in
-- pages by creation.

-- Control characters (a newline, an escape sequence) in names written before this rule become
-- spaces, so listings can print every name safely.
UPDATE routines
SET name = regexp_replace(name, '[\u0001-\u001f\u007f-\u009f]', ' ', 'g'), updated_at = now()
WHERE name ~ '[\u0001-\u001f\u007f-\u009f]';

-- Names shared by several routines stay with the oldest; each later one gets its id appended
-- (its name cut to 160 characters so the result fits in 200). The id is unique, so the new names
-- are too, and running this on the same rows always gives the same names.
UPDATE routines AS r
SET name = left(r.name, 160) || ' (' || r.id::text || ')', updated_at = now()
FROM (
    SELECT id, row_number() OVER (PARTITION BY name ORDER BY created_at, id) AS n
    FROM routines
) AS d
WHERE r.id = d.id AND d.n > 1;

ALTER TABLE routines ADD CONSTRAINT routines_name_key UNIQUE (name);
ALTER TABLE routines ADD CONSTRAINT routines_name_printable
    CHECK (name !~ '[\u0001-\u001f\u007f-\u009f]');

-- `routine list` reads routines a page at a time in (created_at, id) order.
CREATE INDEX routines_created_idx ON routines (created_at, id);
