-- What each dispatch's target answered, kept on its fire; and an outbox row that costs one index
-- fewer to write.

-- The receipt of the dispatch that settled the fire: an outbox sequence number, an HTTP status,
-- a JetStream stream and sequence, a container id. NULL for fires settled without a dispatch
-- (abandoned) and for fires settled before receipts were kept.
ALTER TABLE routine_fires ADD COLUMN receipt TEXT CHECK (octet_length(receipt) <= 1024);

-- The primary key (routine_id, scheduled_at) already makes a second message for one occurrence
-- a no-op, and the key is derived from those two columns: a unique index on the key repeats it
-- and costs every insert a second index write.
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_idempotency_key_key;
