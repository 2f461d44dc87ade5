-- The automatic pause reads a routine's newest fires since its last update (pause, resume), in
-- claim order, and stops after N of them or at the update. Read through the primary key in
-- occurrence order, a routine with fewer than N fires since its update was read back to its
-- first fire (a million rows, past the statement timeout, and nothing was ever paused); through
-- this index the read is at most N rows.
CREATE INDEX routine_fires_claimed_idx ON routine_fires (routine_id, claimed_at, scheduled_at);
