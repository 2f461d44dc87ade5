-- A fire settled `fired` is most of the ledger and was an entry in five of its indexes: the
-- primary key, `routine_fires_scheduled_idx`, `routine_fires_status_scheduled_idx`,
-- `routine_fires_claimed_idx` and `routine_fires_completed_idx`. Two of those entries served
-- readers that another index serves as well, so a fired fire now enters three.
--
-- - `fires --status claimed|skipped` (and the status page's hour of fires) read a status in
--   occurrence order. Fired fires are the bulk of every ledger, so `fires --status fired` reads
--   `routine_fires_scheduled_idx` newest first and meets a fired row almost every row; the
--   (status, scheduled_at) index now holds the other statuses only.
-- - Retention deleted the oldest settled fires through `routine_fires_completed_idx`. A fire is
--   settled after its occurrence, so a fire settled before the retention's cutoff was scheduled
--   before it too: retention now walks `routine_fires_scheduled_idx` from its oldest occurrence
--   and deletes those settled before the cutoff. What it passes over on the way are the fires
--   scheduled before the cutoff and settled after it (a backfill of old occurrences, a claim still
--   in flight), few and gone one retention later.

DROP INDEX cm.routine_fires_status_scheduled_idx;
CREATE INDEX routine_fires_status_scheduled_idx ON cm.routine_fires (status, scheduled_at, routine_id)
    WHERE status <> 'fired';

DROP INDEX cm.routine_fires_completed_idx;
