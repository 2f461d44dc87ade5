-- Turns between concurrency keys: when more is due than a claim takes, each key's oldest due
-- routines past the walk's frontier are read too, so one key's backlog does not hold another
-- key's routines back. They are read key by key through this index, which also serves what
-- `routines_concurrency_key_idx` served (a key's routines, to count its places): it replaces
-- it, so a keyed routine's clock moving writes no more index entries than before.

CREATE INDEX routines_key_due_idx ON cm.routines (concurrency_key, next_run_at, id)
    WHERE concurrency_key IS NOT NULL;

DROP INDEX cm.routines_concurrency_key_idx;
