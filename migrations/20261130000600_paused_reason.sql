-- Why a routine is paused, when cm paused it by itself (its last fires all failed); NULL when
-- it runs, or when a person paused it. Resuming clears it.
ALTER TABLE routines
    ADD COLUMN paused_reason TEXT CHECK (octet_length(paused_reason) <= 4096),
    ADD CONSTRAINT routines_paused_reason_only_when_paused
        CHECK (paused OR paused_reason IS NULL);
