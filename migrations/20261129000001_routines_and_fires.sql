-- Routines, the occurrence ledger (`routine_fires`) and the message outbox.

-- A recurring action: a cron schedule in an IANA zone, and what to do when it comes due.
CREATE TABLE routines (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    -- The cron expression as written (5 fields, or 6 with seconds first).
    schedule TEXT NOT NULL CHECK (length(schedule) BETWEEN 1 AND 256),
    -- An IANA zone name, never an offset: the zone's rules change, its name does not.
    timezone TEXT NOT NULL DEFAULT 'UTC',
    kind TEXT NOT NULL CHECK (kind IN ('message', 'mission')),
    payload JSONB NOT NULL,
    misfire_policy TEXT NOT NULL DEFAULT 'fire-once'
        CHECK (misfire_policy IN ('fire-once', 'catch-up', 'skip')),
    paused BOOLEAN NOT NULL DEFAULT false,
    -- The routine's next occurrence; NULL while paused or when the schedule has no more.
    next_run_at TIMESTAMPTZ,
    -- When a tick last claimed occurrences of this routine.
    last_run_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (NOT paused OR next_run_at IS NULL)
);

-- The tick's query: due, unpaused routines, oldest first.
CREATE INDEX routines_due_idx ON routines (next_run_at) WHERE next_run_at IS NOT NULL;

-- One row per (routine, scheduled occurrence), so a firing is idempotent.
--
-- An occurrence is written here, `claimed`, in the same transaction that moves the routine's
-- `next_run_at` past it: there is no moment at which the clock has moved and nothing records
-- that the occurrence is owed. `scheduled_at` is the occurrence's own instant, not the claim
-- time, so the primary key is what makes a retry idempotent: claiming the same slot again finds
-- the existing row instead of firing twice.
CREATE TABLE routine_fires (
    routine_id UUID NOT NULL REFERENCES routines (id) ON DELETE CASCADE,
    -- The occurrence this row accounts for (the `next_run_at` that came due).
    scheduled_at TIMESTAMPTZ NOT NULL,
    -- When the current claim was taken (the first claim, or the latest takeover).
    claimed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at TIMESTAMPTZ,
    -- `claimed`: taken, dispatch not yet known to have finished. A row here whose lease has
    --   run out is a crash mid-fire and is safe to retry.
    -- `fired`: dispatch completed; never fire this slot again.
    -- `failed`: dispatch returned an error (kept in `error`), or its claimants crashed too
    --   often. Terminal: silently retrying a failing action every tick is how a broken routine
    --   becomes a denial-of-service against whatever it talks to.
    status TEXT NOT NULL DEFAULT 'claimed'
        CHECK (status IN ('claimed', 'fired', 'failed')),
    error TEXT CHECK (octet_length(error) <= 4096),
    -- The instance holding the claim, for operators.
    claimant TEXT NOT NULL,
    -- Fresh for every claim statement: a settle is fenced on it and on `attempt`, so a late
    -- settle from a claimant whose lease ran out matches nothing.
    claim_token UUID NOT NULL,
    -- 1 for the first claim; each takeover of an expired lease adds one.
    attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    -- Until then the claim belongs to its claimant; after it, the claim is presumed crashed.
    lease_expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (routine_id, scheduled_at),
    CHECK ((status = 'claimed') = (completed_at IS NULL)),
    CHECK (status <> 'failed' OR error IS NOT NULL)
);

-- The reaper's query: rows still `claimed` are either in flight or crashed; it walks them oldest
-- claim first and takes over those whose lease has run out.
CREATE INDEX routine_fires_stuck_idx
    ON routine_fires (status, claimed_at)
    WHERE status = 'claimed';

-- Listing a status across routines (`cm-scheduler fires --status failed`) and retention.
CREATE INDEX routine_fires_completed_idx
    ON routine_fires (completed_at)
    WHERE status <> 'claimed';

-- The default message backend: one row per occurrence of a message routine, for a consumer
-- (a chat service, a relay) to read in `seq` order. Keyed by the occurrence, so a retried
-- dispatch inserts nothing new.
CREATE TABLE outbox_messages (
    seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    routine_id UUID NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE,
    -- The attempt that wrote the row (a retry that finds it already there changes nothing).
    attempt INTEGER NOT NULL CHECK (attempt >= 1),
    payload JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (routine_id, scheduled_at)
);
