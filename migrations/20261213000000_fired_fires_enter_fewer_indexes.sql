-- A fire settled `fired` is most of the ledger and was an entry in five of its indexes: the
-- primary key, `routine_fires_scheduled_idx`, `routine_fires_status_scheduled_idx`,
-- `routine_fires_claimed_idx` and `routine_fires_completed_idx`. Two of those entries served
-- readers that another index serves as well, so a fired fire now enters three.
--
-- - The (status, scheduled_at) index served `fires --status` for a status in occurrence order,
--   and the status page's hour of fires. It now holds every status but `fired`, which it still
--   serves. Fired fires are the bulk of every ledger, so `fires --status fired` reads
--   `routine_fires_scheduled_idx` newest first and nearly every row it meets is one; the status
--   page reads its hour there too.
-- - Retention deleted the oldest settled fires through `routine_fires_completed_idx`. A fire is
--   settled after its occurrence, so a fire settled before the retention's cutoff was scheduled
--   before it too: retention now walks `routine_fires_scheduled_idx` from its oldest occurrence
--   and deletes those settled before the cutoff. What it passes over on the way are the fires
--   scheduled before the cutoff and settled after it (a backfill of old occurrences, a claim still
--   in flight), few, and gone within a retention.

DROP INDEX cm.routine_fires_status_scheduled_idx;
CREATE INDEX routine_fires_status_scheduled_idx ON cm.routine_fires (status, scheduled_at, routine_id)
    WHERE status <> 'fired';

DROP INDEX cm.routine_fires_completed_idx;
