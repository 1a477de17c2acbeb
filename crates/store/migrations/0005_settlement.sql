-- Periodic settlement: how far a running reservation has been charged (unix microseconds).
ALTER TABLE reservations ADD COLUMN settled_until BIGINT;
-- (no index: settled_until changes every period, and an index on it would make every settlement update a non-HOT one)
