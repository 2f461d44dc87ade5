-- The per-group walks' indexes serve the claims, reaper passes and consumer takes that name a
-- group: every one on Citus, none by default on plain PostgreSQL, where a scheduler claims across
-- the groups through the cross-group indexes (`routines_due_idx`, `outbox_messages_pending_idx`,
-- `routine_fires_lease_idx`). There they only cost: each claim wrote one more index entry per
-- routine it moved on and per message it wrote. `cm-scheduler migrate --citus` creates them
-- (`PgStore::distribute_on_citus`); on plain PostgreSQL, `run --claim-per-group` walks the
-- cross-group indexes with the group as a filter.
DROP INDEX IF EXISTS routines_group_due_idx;
DROP INDEX IF EXISTS routine_fires_group_lease_idx;
DROP INDEX IF EXISTS outbox_messages_group_pending_idx;
