-- The cores and memory (MiB) a node's agent reports of its host (`nodes ls`); NULL until an
-- agent that reports them syncs.
ALTER TABLE nodes ADD COLUMN cpus BIGINT;
ALTER TABLE nodes ADD COLUMN memory_mb BIGINT;
-- Why a reservation's instance failed, in the executor's words (a refused image, a command
-- not found), bounded; NULL for every other end.
ALTER TABLE reservations ADD COLUMN end_message TEXT;
