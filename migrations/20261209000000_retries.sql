-- Retry policies: a routine's failed outcome (a message's failed dispatch, a mission's failed or
-- lost run) is tried again as a new attempt of the same occurrence, after a backoff that
-- doubles from `retry_backoff_secs` up to `retry_backoff_max_secs`, at most `retries` times,
-- never at or past the routine's next occurrence nor the occurrence's deadline.
--
-- The decision is the statement's that records the failure: a fire to be retried stays
-- `claimed`, its lease running out at the retry's instant, so the reaper takes it over then
-- as the next attempt, and nothing counts it failed meanwhile (auto-pause, events, listings).

ALTER TABLE cm.routines
    ADD COLUMN retries SMALLINT NOT NULL DEFAULT 0 CHECK (retries BETWEEN 0 AND 100),
    ADD COLUMN retry_backoff_secs INTEGER NOT NULL DEFAULT 10
        CHECK (retry_backoff_secs BETWEEN 1 AND 86400),
    ADD COLUMN retry_backoff_max_secs INTEGER NOT NULL DEFAULT 600
        CHECK (retry_backoff_max_secs BETWEEN 1 AND 86400);
ALTER TABLE cm.routines
    ADD CONSTRAINT routines_retry_backoff_order CHECK (retry_backoff_secs <= retry_backoff_max_secs);

-- `retry`: how many retries of the occurrence have begun (0 while its first attempt runs); a
-- mission's run of retry N is named `<key>-r<N>`. `tries`: what each earlier retried attempt
-- met, oldest first (NULL when none was retried): a JSON object per attempt with its
-- `attempt`, `outcome` (`failed` or `lost`), `error`, a mission's `exit_code`, `reason`,
-- `output`, `started_at` and `finished_at`, when it `ended_at` and when the retry is `retry_at`.
ALTER TABLE cm.routine_fires
    ADD COLUMN retry SMALLINT NOT NULL DEFAULT 0 CHECK (retry >= 0),
    ADD COLUMN tries JSONB;

-- Sets a routine's retry policy from SQL, checked as cm-scheduler checks `--retries` and
-- `--retry-backoff`: 0 to 100 retries, waits of whole seconds from 1 s to a day, the first no
-- longer than the cap. A NULL leaves that part as it is. Whether the routine exists.
CREATE FUNCTION cm.set_routine_retries(routine_id UUID, retries INTEGER, backoff INTERVAL,
                                       backoff_max INTERVAL) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    base NUMERIC := extract(epoch FROM backoff);
    cap NUMERIC := extract(epoch FROM backoff_max);
BEGIN
    IF retries IS NOT NULL AND (retries < 0 OR retries > 100) THEN
        PERFORM cm.refuse(format('retries must be 0 to 100 (it was %s)', retries));
    END IF;
    IF (base IS NOT NULL AND (base <> trunc(base) OR base < 1 OR base > 86400))
       OR (cap IS NOT NULL AND (cap <> trunc(cap) OR cap < 1 OR cap > 86400)) THEN
        PERFORM cm.refuse(format('a retry backoff must be whole seconds, 1s to 1d (it was %s)',
                                 coalesce(backoff::TEXT, '') || '..' || coalesce(backoff_max::TEXT, '')));
    END IF;
    UPDATE routines r
    SET retries = coalesce(set_routine_retries.retries, r.retries),
        retry_backoff_secs = coalesce(base::INTEGER, r.retry_backoff_secs),
        retry_backoff_max_secs = coalesce(cap::INTEGER, r.retry_backoff_max_secs),
        updated_at = now()
    WHERE r.id = routine_id AND r.group_id = routine_group;
    RETURN FOUND;
EXCEPTION WHEN check_violation THEN
    PERFORM cm.refuse(format('a retry backoff''s first wait must not be longer than its cap (%s..%s)',
                             backoff, backoff_max));
    RETURN FALSE;
END
$$;
REVOKE ALL ON FUNCTION cm.set_routine_retries(UUID, INTEGER, INTERVAL, INTERVAL) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cm.set_routine_retries(UUID, INTEGER, INTERVAL, INTERVAL) TO cm_writer;

-- Pinned as 20261205000600_least_privilege.sql pins every function.
DO $$
DECLARE
    path TEXT := current_setting('search_path');
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', current_schema());
    END IF;
    EXECUTE format('ALTER FUNCTION cm.set_routine_retries(UUID, INTEGER, INTERVAL, INTERVAL) '
                   'SET search_path TO %s', path);
END
$$;
