-- Events: every change a person must hear about, one row each, written in the same transaction
-- as the change, so an event exists exactly when its change happened and never for a change
-- that rolled back. The delivery loop posts each to the operator's sinks (at least once, with
-- `id` as the webhook id) and marks it delivered; `cm-scheduler events` lists them.
--
-- One event per decision, never one per skipped occurrence: a misfire that skips a thousand
-- occurrences is one `routine.misfired` with the count.
CREATE TABLE routine_events (
    -- The order events were written in; the delivery loop sends a routine's events in it, and
    -- `cm-scheduler events --cursor` pages by it.
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    -- The stable id a receiver deduplicates by (the Standard Webhooks `webhook-id`).
    id UUID NOT NULL DEFAULT gen_random_uuid(),
    group_id SMALLINT NOT NULL,
    -- No foreign key: a routine's events outlive it (a deleted routine's history stays readable
    -- until retention removes it), and name it as it was.
    routine_id UUID NOT NULL,
    routine_name TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN (
        'routine.failed', 'routine.paused', 'routine.resumed', 'routine.recovered',
        'routine.deadline_missed', 'routine.misfired', 'routine.finished',
        'routine.planning_refused')),
    -- The occurrence the event is about, if one (a failure, a missed deadline).
    scheduled_at TIMESTAMPTZ,
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    data JSONB NOT NULL DEFAULT '{}' CHECK (octet_length(data::text) <= 16384),
    -- Delivery: when a sink took it; how many posts were tried; when the next may be; why the
    -- last failed.
    delivered_at TIMESTAMPTZ,
    delivery_attempts INTEGER NOT NULL DEFAULT 0 CHECK (delivery_attempts >= 0),
    retry_at TIMESTAMPTZ,
    delivery_error TEXT CHECK (octet_length(delivery_error) <= 1024),
    PRIMARY KEY (group_id, seq)
);

-- The delivery loop's walk: a group's undelivered events in order.
CREATE INDEX routine_events_pending_idx ON routine_events (group_id, seq)
    WHERE delivered_at IS NULL;
-- A routine's events, newest first (`events --routine`, the page, and whether a success is a
-- recovery: the routine's newest failed-or-recovered event).
CREATE INDEX routine_events_routine_idx ON routine_events (routine_id, seq);
-- Retention, and the latest events across routines.
CREATE INDEX routine_events_occurred_idx ON routine_events (occurred_at);
-- A missed deadline is raised once per occurrence, however many schedulers look.
CREATE UNIQUE INDEX routine_events_deadline_once_idx
    ON routine_events (group_id, routine_id, scheduled_at)
    WHERE type = 'routine.deadline_missed';

-- A deadline per routine: an occurrence whose outcome is not succeeded within this long of its
-- planned instant raises `routine.deadline_missed`. NULL: none.
ALTER TABLE routines ADD COLUMN deadline_secs INTEGER
    CHECK (deadline_secs IS NULL OR deadline_secs BETWEEN 1 AND 31622400);
CREATE INDEX routines_deadline_idx ON routines (group_id, next_run_at)
    WHERE deadline_secs IS NOT NULL;

-- A person's pause and resume through SQL raise their events, as cm-scheduler's do.
CREATE OR REPLACE FUNCTION cm.set_routine_paused(routine_id UUID, paused BOOLEAN) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    found_id UUID;
    found_name TEXT;
BEGIN
    UPDATE routines r
    SET paused = set_routine_paused.paused,
        next_run_at = NULL,
        planned = CASE WHEN set_routine_paused.paused THEN r.planned ELSE false END,
        paused_reason = CASE WHEN set_routine_paused.paused THEN r.paused_reason ELSE NULL END,
        updated_at = now()
    WHERE r.id = routine_id AND r.group_id = routine_group
      AND r.paused IS DISTINCT FROM set_routine_paused.paused
    RETURNING r.id, r.name INTO found_id, found_name;
    IF found_id IS NOT NULL THEN
        INSERT INTO routine_events (group_id, routine_id, routine_name, type, data)
        VALUES (routine_group, found_id, found_name,
                CASE WHEN set_routine_paused.paused THEN 'routine.paused' ELSE 'routine.resumed' END,
                CASE WHEN set_routine_paused.paused
                     THEN jsonb_build_object('by', 'person', 'reason', 'paused through SQL')
                     ELSE jsonb_build_object('by', 'person') END);
        RETURN true;
    END IF;
    RETURN EXISTS (SELECT 1 FROM routines WHERE id = routine_id AND group_id = routine_group);
END
$$;

-- Sets (or, with NULL, removes) a routine's deadline from SQL, checked as cm-scheduler checks
-- `--deadline`: whole seconds, 1 s to 366 days. Whether the routine exists.
CREATE FUNCTION cm.set_routine_deadline(routine_id UUID, deadline INTERVAL) RETURNS BOOLEAN
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    routine_group SMALLINT := cm_group_of(routine_id, (SELECT group_count FROM cm_settings));
    secs NUMERIC := extract(epoch FROM deadline);
BEGIN
    IF deadline IS NOT NULL AND (secs <> trunc(secs) OR secs < 1 OR secs > 31622400) THEN
        PERFORM cm.refuse(format('a deadline must be whole seconds, 1s to 366d (it was %s)',
                                 deadline));
    END IF;
    UPDATE routines r SET deadline_secs = secs::INTEGER, updated_at = now()
    WHERE r.id = routine_id AND r.group_id = routine_group;
    RETURN FOUND;
END
$$;
REVOKE ALL ON FUNCTION cm.set_routine_deadline(UUID, INTERVAL) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cm.set_routine_deadline(UUID, INTERVAL) TO cm_writer;

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
    EXECUTE format('ALTER FUNCTION cm.set_routine_paused(UUID, BOOLEAN) SET search_path TO %s', path);
    EXECUTE format('ALTER FUNCTION cm.set_routine_deadline(UUID, INTERVAL) SET search_path TO %s',
                   path);
END
$$;
