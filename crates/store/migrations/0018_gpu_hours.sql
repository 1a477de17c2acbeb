-- Hourly rollup of GPU telemetry for the usage reports: one row per UTC hour and GPU, upserted
-- by every agent sync that carries a sample of it. The means are the sums over `samples`.
-- The key starts with the hour, so a report of a day reads one range of it and no other index
-- is written on the sync path.
CREATE TABLE gpu_hours (
    hour             BIGINT NOT NULL,
    gpu_uuid         TEXT NOT NULL,
    node_id          TEXT NOT NULL,
    samples          BIGINT NOT NULL,
    util_sum         BIGINT NOT NULL,
    mem_used_mb_sum  BIGINT NOT NULL,
    mem_max_mb       BIGINT NOT NULL,
    PRIMARY KEY (hour, gpu_uuid)
);
