-- Acknowledgement is fenced on the lease, as settles are on the claim: every take writes a
-- fresh token on the rows it leases, and an acknowledgement names the token of the take it
-- delivered. A consumer whose lease ran out and whose rows another consumer took since cannot
-- acknowledge them: the rows carry the other's token.
ALTER TABLE outbox_messages ADD COLUMN lease_token UUID;
