-- A service in any language writes its routines with cm's SQL functions, in its own
-- transaction: here an account and its weekly report commit together. Run it against a
-- database cm has migrated (`cm-scheduler migrate`):
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f cm-store/examples/sql-writes.sql
--
-- SQL checks the name, the payload's kind and size and the policies' names at once (an error
-- here rolls the whole transaction back); the cron expression and the zone are read by the
-- next scheduler pass, which gives the routine its first run or pauses it with the reason
-- (`cm-scheduler routine show 'weekly report for acme'` says which).

BEGIN;

CREATE TABLE IF NOT EXISTS accounts (
    name TEXT PRIMARY KEY,
    report UUID NOT NULL
);

INSERT INTO accounts (name, report)
VALUES ('acme', cm.create_routine(
    name => 'weekly report for acme',
    schedule => '0 8 * * MON',
    timezone => 'America/New_York',
    message => 'The weekly report for acme is ready.',
    misfire => 'skip'));

-- A mission: the JSON a mission file holds, checked (host, env, labels) when planned.
SELECT cm.create_mission_routine(
    name => 'nightly audit for acme',
    schedule => '30 2 * * *',
    timezone => 'Europe/Berlin',
    mission => '{"repository": "https://git.example.com/acme/app.git", "task": "audit"}',
    overlap => 'forbid');

-- cm.set_routine_paused(id, true|false), cm.trigger_routine(id) and cm.delete_routine(id)
-- pause, resume, fire now and delete, in the caller's transaction too.

COMMIT;
