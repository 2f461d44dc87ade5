-- What an ended run left, kept with it: the last 16 KiB of its output (secrets scrubbed before
-- it is written) and when it started and ended by its runtime's clock. Written once, by the
-- watch pass whose update recorded the run's end.
ALTER TABLE routine_fires
    ADD COLUMN run_output TEXT CHECK (octet_length(run_output) <= 16384),
    ADD COLUMN run_started_at TIMESTAMPTZ,
    ADD COLUMN run_finished_at TIMESTAMPTZ;
