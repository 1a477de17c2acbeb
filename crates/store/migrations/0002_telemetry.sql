-- The latest telemetry of each node (driver, CUDA version, per-GPU samples) as JSON, written
-- with the heartbeat's own update of the node row: no extra write per GPU.
ALTER TABLE nodes ADD COLUMN telemetry TEXT;
