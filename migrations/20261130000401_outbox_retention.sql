-- The outbox's retention deletes rows older than the retention by their creation time, oldest
-- first; without an index the delete would scan the whole outbox whenever nothing is old enough.
CREATE INDEX outbox_messages_created_idx ON outbox_messages (created_at);
