-- Occurrences asked for by hand (`routine trigger`, `routine backfill`), waiting for a tick to
-- claim them. They go through the same ledger as scheduled occurrences: the claim statement
-- inserts or finds their `routine_fires` row, so a slot already settled is never fired again.
CREATE TABLE routine_requests (
    routine_id UUID NOT NULL REFERENCES routines (id) ON DELETE CASCADE,
    scheduled_at TIMESTAMPTZ NOT NULL,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (routine_id, scheduled_at)
);

-- The tick takes requests oldest occurrence first.
CREATE INDEX routine_requests_scheduled_idx ON routine_requests (scheduled_at);
