-- A schedule may carry clauses after its rule (`except …`, `from …`, `until …`), so the text
-- holds up to 1,024 characters (cm-domain's MAX_SCHEDULE_CHARS); each cron expression in it is
-- still at most 256.
ALTER TABLE routines
    DROP CONSTRAINT routines_schedule_check,
    ADD CONSTRAINT routines_schedule_check CHECK (length(schedule) BETWEEN 1 AND 1024);
