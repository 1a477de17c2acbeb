-- Tenants' volumes: storage that outlives their instances. A local volume lives on one
-- node's disk (node_id), a shared one on the storage every node with shared volumes mounts.
-- state: 'creating' until its node made it, 'ready', 'resizing' (size_bytes above made_bytes),
-- 'deleting' (its owner removed it; its node deletes it), 'failed' (message says why),
-- 'deleted' (gone: the name is free again). Whether it is reachable (its node live) is read
-- from its node, not kept.
CREATE TABLE volumes (
    id          TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL REFERENCES users (id),
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    node_id     TEXT REFERENCES nodes (id),
    size_bytes  BIGINT NOT NULL,
    made_bytes  BIGINT,
    used_bytes  BIGINT,
    state       TEXT NOT NULL,
    message     TEXT,
    created_at  BIGINT NOT NULL,
    deleted_at  BIGINT
);
CREATE UNIQUE INDEX volumes_owner_name ON volumes (owner_id, name) WHERE state <> 'deleted';
CREATE INDEX volumes_node ON volumes (node_id) WHERE state <> 'deleted';
-- Which reservations mount which volumes: one writer or any number of readers among the live
-- ones, checked under the volume's row lock when a reservation is made.
CREATE TABLE volume_mounts (
    volume_id      TEXT NOT NULL REFERENCES volumes (id),
    reservation_id TEXT NOT NULL REFERENCES reservations (id),
    read_only      BIGINT NOT NULL,
    PRIMARY KEY (volume_id, reservation_id)
);
CREATE INDEX volume_mounts_reservation ON volume_mounts (reservation_id);
-- The volumes a reservation's instance mounts, as its agent is told and `get` shows them
-- (JSON array of {volume_id, name, kind, size_bytes, path, read_only}).
ALTER TABLE reservations ADD COLUMN volumes TEXT NOT NULL DEFAULT '[]';
-- What a node offers for volumes, as its agent last reported it: how a local volume's size
-- is enforced ('loop', 'project-quota', 'unavailable' with the reason; NULL: no volumes dir),
-- the room left, and whether it mounts the shared volume storage.
ALTER TABLE nodes ADD COLUMN volume_enforcement TEXT;
ALTER TABLE nodes ADD COLUMN volume_reason TEXT;
ALTER TABLE nodes ADD COLUMN volume_free_bytes BIGINT;
ALTER TABLE nodes ADD COLUMN shared_volumes BIGINT NOT NULL DEFAULT 0;
