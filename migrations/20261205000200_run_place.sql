-- Where a mission run's evidence is, as the runtime that launched it names its place (the process
-- runner: `HOST:DIR`, its host and its absolute work directory), written when the run is begun.
-- A scheduler judges a run (and may call it `lost`) only from the evidence at that place; one that
-- cannot see it leaves the run to a scheduler that can. NULL for a runtime every scheduler asks
-- alike, and for runs begun before this column.
ALTER TABLE routine_fires
    ADD COLUMN run_place TEXT CHECK (octet_length(run_place) <= 4096);
