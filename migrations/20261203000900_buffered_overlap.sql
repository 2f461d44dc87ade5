-- Overlap that waits (`--overlap buffer-one`, `buffer-all`): while a buffering routine's run
-- lasts, the claim does not plan the routine at all; its clock stays at the first occurrence
-- due, so what is owed stays owed (nothing is claimed that a crash could lose), and once the
-- run is over the claim launches the newest owed occurrence (buffer-one, the older ones
-- recorded skipped) or the oldest (buffer-all, its clock kept at the next).
ALTER TABLE routines DROP CONSTRAINT routines_overlap_check;
ALTER TABLE routines ADD CONSTRAINT routines_overlap_check
    CHECK (overlap IN ('allow', 'forbid', 'replace', 'buffer-one', 'buffer-all'));

-- Whether a routine's run is busy: a fire of it being launched (claimed) or whose run is
-- running. The due walk asks this of buffering routines only, through this small index.
CREATE INDEX routine_fires_busy_idx ON routine_fires (routine_id, group_id)
    WHERE status = 'claimed' OR run_state = 'running';

-- Inserts an unplanned routine of `kind` with `payload` (already checked by the caller).
CREATE OR REPLACE FUNCTION cm.insert_unplanned(
    name TEXT, schedule TEXT, timezone TEXT, kind TEXT, payload JSONB, misfire TEXT,
    overlap TEXT, paused BOOLEAN
) RETURNS UUID
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    routine_id UUID := gen_random_uuid();
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    checked TEXT := cm.checked_name(name);
BEGIN
    IF schedule IS NULL OR btrim(schedule) = '' OR octet_length(schedule) > 1024 THEN
        RAISE EXCEPTION 'the schedule must be a cron expression of at most 1024 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF timezone IS NULL OR btrim(timezone) = '' OR octet_length(timezone) > 64 THEN
        RAISE EXCEPTION 'the time zone must be an IANA name (Europe/Berlin, UTC)'
            USING ERRCODE = '22023';
    END IF;
    IF misfire IS NULL OR misfire NOT IN ('fire-once', 'catch-up', 'skip') THEN
        RAISE EXCEPTION 'the misfire policy must be fire-once, catch-up or skip, not %',
            coalesce(quote_literal(misfire), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF overlap IS NULL
       OR overlap NOT IN ('allow', 'forbid', 'replace', 'buffer-one', 'buffer-all') THEN
        RAISE EXCEPTION
            'the overlap policy must be allow, forbid, replace, buffer-one or buffer-all, not %',
            coalesce(quote_literal(overlap), 'NULL') USING ERRCODE = '22023';
    END IF;
    BEGIN
        INSERT INTO routine_names (name, routine_id, group_id)
        VALUES (checked, routine_id, routine_group);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'a routine named % exists', quote_literal(checked)
            USING ERRCODE = '23505';
    END;
    INSERT INTO routines
        (id, name, schedule, timezone, kind, payload, misfire_policy, overlap, paused,
         next_run_at, planned, group_id)
    VALUES
        (routine_id, checked, btrim(schedule), btrim(timezone), kind, payload, misfire, overlap,
         coalesce(paused, false), NULL, false, routine_group);
    RETURN routine_id;
END
$$;
