-- A run limit (`routine create --limit-runs N`): how many more scheduled occurrences the routine
-- may fire. NULL is no limit. The claim that claims occurrences of the routine lowers it by
-- their number in the same statement that moves the routine's clock, under the row lock the
-- due walk took, so two schedulers never fire one more; at 0 the routine has no next run and is
-- finished. Manual triggers and backfills are not counted.
ALTER TABLE routines
    ADD COLUMN runs_left INTEGER CHECK (runs_left IS NULL OR runs_left >= 0);
