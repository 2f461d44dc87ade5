-- The outbox's retention deletes acknowledged messages only, by `acked_at`
-- (`outbox_messages_acked_idx`). Deleting by creation time alone dropped messages no consumer had
-- read, and is gone; its index only slowed every outbox insert, which happens in the claim.
DROP INDEX IF EXISTS outbox_messages_created_idx;
