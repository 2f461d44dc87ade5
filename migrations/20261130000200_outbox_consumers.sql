-- The outbox's consumer contract: consumers take batches of pending messages in `seq` order
-- under a lease, and acknowledge them once delivered.
--
-- A take marks rows `leased_by` a consumer until `lease_expires_at` (rows are chosen with
-- `FOR UPDATE SKIP LOCKED`, so consumers sharing the table never take the same pending row at
-- once); a consumer that crashes leaves its lease to run out, and its batch is taken again. An
-- acknowledged row (`acked_at` set) is never taken again, and is pruned after the scheduler's
-- retention. Delivery is at least once: a consumer whose lease ran out before it acknowledged
-- may see its batch delivered by another too; the idempotency key tells the two apart.
ALTER TABLE outbox_messages
    ADD COLUMN leased_by TEXT,
    ADD COLUMN lease_expires_at TIMESTAMPTZ,
    -- How many times the row was taken (1 for its first delivery).
    ADD COLUMN deliveries INTEGER NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    ADD COLUMN acked_at TIMESTAMPTZ,
    ADD COLUMN acked_by TEXT;

-- Taking pending rows in order, and counting them.
CREATE INDEX outbox_messages_pending_idx ON outbox_messages (seq) WHERE acked_at IS NULL;

-- Pruning acknowledged rows past their retention.
CREATE INDEX outbox_messages_acked_idx ON outbox_messages (acked_at) WHERE acked_at IS NOT NULL;
