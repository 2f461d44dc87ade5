-- When an occurrence was first claimed. A takeover moves `claimed_at` and leaves this, so a
-- retry knows how long ago its first attempt could have produced an effect (a backend whose
-- dedupe lasts a window, as JetStream's does, must not publish again past it). Rows still
-- claimed when this was added take their current claim's instant, the latest the first could be.
ALTER TABLE routine_fires ADD COLUMN first_claimed_at TIMESTAMPTZ;
UPDATE routine_fires SET first_claimed_at = claimed_at WHERE status = 'claimed';
ALTER TABLE routine_fires ALTER COLUMN first_claimed_at SET DEFAULT now();
