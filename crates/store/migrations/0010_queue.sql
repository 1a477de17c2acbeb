-- The queue of reservations waiting for GPUs: a queued reservation is `pending` with no node.
-- queued_at: when it was queued (NULL if it was placed at once); placed_at: when it got its
-- GPUs (its wait is placed_at - created_at); queue_reason: why it still waits, as the last
-- scheduling pass saw it; type_key: the GPU type it waits for, as `gpus.type_key`.
ALTER TABLE reservations ADD COLUMN queued_at BIGINT;
ALTER TABLE reservations ADD COLUMN placed_at BIGINT;
ALTER TABLE reservations ADD COLUMN queue_reason TEXT;
ALTER TABLE reservations ADD COLUMN type_key TEXT;
UPDATE reservations SET placed_at = created_at WHERE node_id IS NOT NULL;
-- The scheduling pass reads the queue every maintenance tick: a small partial index.
CREATE INDEX reservations_queued ON reservations (queued_at) WHERE status = 'pending' AND node_id IS NULL;
