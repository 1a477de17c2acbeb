-- What each quota's tenant holds of its type, in milli-GPUs (each allocation's memory over its
-- card's), kept as allocations are made and given back, so that a placement reads one row
-- instead of summing the tenant's live work.
ALTER TABLE quotas ADD COLUMN used BIGINT NOT NULL DEFAULT 0;
UPDATE quotas SET used = COALESCE((
    SELECT CAST(SUM(a.vram_mb * 1000 / g.vram_mb) AS BIGINT)
    FROM reservations r JOIN allocations a ON a.reservation_id = r.id
    JOIN gpus g ON g.uuid = a.gpu_uuid
    WHERE r.tenant_id = quotas.tenant_id AND g.type_key = quotas.type_key AND g.vram_mb > 0), 0);
-- The largest card of a type, which a share is sized against, read at each placement.
CREATE INDEX gpus_type_vram ON gpus (type_key, vram_mb);
