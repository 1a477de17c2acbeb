-- The audit trail: every API request, each record chained to the one before by its hash
-- (`gpurent-audit`). audit_head is the chain's head (one row, updated by each append, which
-- also serialises appends from several control planes) and the last checkpoint;
-- audit_checkpoints are signed with the server's key; `anchor` marks the checkpoint that the
-- retained chain continues from after older records were pruned. On SQLite the position is
-- the rowid (INTEGER PRIMARY KEY), so that reading the trail in order reads the table itself.
-- sqlite only below
CREATE TABLE audit_log (
    seq         INTEGER PRIMARY KEY,
    at          BIGINT NOT NULL,
    request_id  TEXT NOT NULL,
    user_id     TEXT,
    action      TEXT NOT NULL,
    resource    TEXT NOT NULL,
    allocation  TEXT,
    outcome     BIGINT NOT NULL,
    client      TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);
-- postgres only below
CREATE TABLE audit_log (
    seq         BIGINT PRIMARY KEY,
    at          BIGINT NOT NULL,
    request_id  TEXT NOT NULL,
    user_id     TEXT,
    action      TEXT NOT NULL,
    resource    TEXT NOT NULL,
    allocation  TEXT,
    outcome     BIGINT NOT NULL,
    client      TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);
-- both below
CREATE INDEX audit_by_user ON audit_log (user_id, seq);
CREATE INDEX audit_by_resource ON audit_log (resource, seq);
CREATE INDEX audit_by_time ON audit_log (at);

CREATE TABLE audit_head (
    id              BIGINT PRIMARY KEY,
    seq             BIGINT NOT NULL,
    hash            TEXT NOT NULL,
    checkpoint_seq  BIGINT NOT NULL,
    checkpoint_at   BIGINT NOT NULL
);
INSERT INTO audit_head (id, seq, hash, checkpoint_seq, checkpoint_at)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000', 0, 0);

CREATE TABLE audit_checkpoints (
    seq         BIGINT PRIMARY KEY,
    hash        TEXT NOT NULL,
    at          BIGINT NOT NULL,
    signature   TEXT NOT NULL,
    public_key  TEXT NOT NULL,
    anchor      BIGINT NOT NULL DEFAULT 0
);
