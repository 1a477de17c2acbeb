-- GPU health: the rules a node's GPUs breach now (JSON, NULL when none) and whether the node
-- may take work. Events: what happened to nodes, in order (`gpurent events`).
ALTER TABLE nodes ADD COLUMN health TEXT;
ALTER TABLE nodes ADD COLUMN healthy BIGINT NOT NULL DEFAULT 1;
-- postgres only below
CREATE TABLE events (
    id      BIGSERIAL PRIMARY KEY,
    at      BIGINT NOT NULL,
    node_id TEXT,
    kind    TEXT NOT NULL,
    detail  TEXT NOT NULL
);
-- sqlite only below
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      BIGINT NOT NULL,
    node_id TEXT,
    kind    TEXT NOT NULL,
    detail  TEXT NOT NULL
);
