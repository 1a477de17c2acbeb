-- Periodic settlement: how far a running reservation has been charged (unix microseconds).
ALTER TABLE reservations ADD COLUMN settled_until BIGINT;
CREATE INDEX reservations_settle ON reservations (status, settled_until);
