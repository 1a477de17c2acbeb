-- What a reservation's instance's own disk holds and its size, as its node last measured it
-- (a minute apart); NULL until measured, or where the node does not bound it.
ALTER TABLE reservations ADD COLUMN disk_used_bytes BIGINT;
ALTER TABLE reservations ADD COLUMN disk_bytes BIGINT;
