-- Volumes are charged per GB-month of their size, per second, from their making until their
-- removal (issue 33). A stretch is a time at one size and price (a resize starts another):
-- billed_from is its start, billed_until how far it was charged, stretch_charged what it was
-- charged for it (a running total rounded down once: gpurent_billing::storage_due), charged
-- the volume's lifetime total, of which its node's owner earns host_share_bps (a local volume).
-- unpaid_since: since when its owner's balance has been below zero (the storage grace).
ALTER TABLE volumes ADD COLUMN price_per_gb_month BIGINT NOT NULL DEFAULT 70000;
ALTER TABLE volumes ADD COLUMN host_share_bps BIGINT NOT NULL DEFAULT 8000;
ALTER TABLE volumes ADD COLUMN billed_from BIGINT NOT NULL DEFAULT 0;
ALTER TABLE volumes ADD COLUMN billed_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE volumes ADD COLUMN stretch_charged BIGINT NOT NULL DEFAULT 0;
ALTER TABLE volumes ADD COLUMN charged BIGINT NOT NULL DEFAULT 0;
ALTER TABLE volumes ADD COLUMN unpaid_since BIGINT;
UPDATE volumes SET billed_from = created_at, billed_until = created_at;
CREATE INDEX volumes_billed ON volumes (billed_until) WHERE state IN ('creating', 'ready', 'resizing');
-- The volume a charge or an earning is for (reservation_id is NULL on these).
ALTER TABLE transfers ADD COLUMN volume_id TEXT;
CREATE INDEX transfers_volume ON transfers (volume_id) WHERE volume_id IS NOT NULL;
