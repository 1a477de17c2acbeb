-- A GPU its agent no longer reports (restarted with fewer, or gone from the driver's list):
-- since when. While set, the GPU has no memory free (free_mb = 0), is not counted in
-- gpu_pools, and the work that was on it has been handled as on a lost node.
ALTER TABLE gpus ADD COLUMN missing_since BIGINT;
