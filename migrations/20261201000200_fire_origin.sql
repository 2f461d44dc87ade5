-- Where each fire came from: its routine's schedule, a manual trigger, or a backfill. Lateness is
-- judged for scheduled fires only, and the listing shows the origin. Rows written before this
-- migration are taken as scheduled (constant defaults: no table rewrite).
ALTER TABLE routine_fires
    ADD COLUMN origin TEXT NOT NULL DEFAULT 'schedule'
        CHECK (origin IN ('schedule', 'trigger', 'backfill'));

-- A request remembers whether it was a trigger or a backfill, for the fire it becomes.
ALTER TABLE routine_requests
    ADD COLUMN origin TEXT NOT NULL DEFAULT 'trigger'
        CHECK (origin IN ('trigger', 'backfill'));
