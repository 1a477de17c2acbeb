-- The same DDL runs on SQLite and PostgreSQL: text ids, BIGINT integers (times in unix
-- microseconds UTC, money in micro-units), no booleans, no serial columns.

CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL CHECK (role IN ('tenant', 'host', 'admin')),
    created_at  BIGINT NOT NULL
);

-- API tokens are stored as SHA-256 hashes; the token itself is shown once.
CREATE TABLE api_tokens (
    token_hash  TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id),
    created_at  BIGINT NOT NULL
);

-- Ledger: every movement of money is a transfer between two accounts with a unique id, so a
-- retried transfer is a no-op. Account balances are a cache of the transfers, updated in the same
-- transaction and checked against them by `ledger_check`.
CREATE TABLE accounts (
    id          TEXT PRIMARY KEY,
    balance     BIGINT NOT NULL
);

CREATE TABLE transfers (
    id              TEXT PRIMARY KEY,
    debit_account   TEXT NOT NULL REFERENCES accounts (id),
    credit_account  TEXT NOT NULL REFERENCES accounts (id),
    amount          BIGINT NOT NULL CHECK (amount > 0),
    reservation_id  TEXT,
    created_at      BIGINT NOT NULL
);
CREATE INDEX transfers_debit ON transfers (debit_account);
CREATE INDEX transfers_credit ON transfers (credit_account);

CREATE TABLE join_tokens (
    token_hash  TEXT PRIMARY KEY,
    created_by  TEXT NOT NULL REFERENCES users (id),
    expires_at  BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE nodes (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL UNIQUE,
    token_hash       TEXT NOT NULL UNIQUE,
    executor         TEXT NOT NULL,
    gpu_backend      TEXT NOT NULL,
    -- Bumped whenever the node's desired state changes; agents long-poll on it.
    desired_version  BIGINT NOT NULL,
    last_seen_at     BIGINT NOT NULL,
    created_at       BIGINT NOT NULL
);

-- free_mb is the allocation compare-and-set target: it only moves down through
-- `UPDATE ... WHERE free_mb >= wanted`, and the CHECK makes over-allocation impossible.
CREATE TABLE gpus (
    uuid      TEXT PRIMARY KEY,
    node_id   TEXT NOT NULL REFERENCES nodes (id),
    idx       BIGINT NOT NULL,
    model     TEXT NOT NULL,
    -- The GPU type as tenants name it (GpuType::display) and its comparison key.
    type_name TEXT NOT NULL,
    type_key  TEXT NOT NULL,
    vram_mb   BIGINT NOT NULL CHECK (vram_mb > 0),
    free_mb   BIGINT NOT NULL CHECK (free_mb >= 0 AND free_mb <= vram_mb)
);
CREATE INDEX gpus_type_free ON gpus (type_key, free_mb);
CREATE INDEX gpus_node ON gpus (node_id);

-- How many whole GPUs of a type are free on each node: best-fit placement of whole GPUs is one
-- probe of the (type_key, whole_free) index instead of a scan of every GPU. Kept in step with
-- gpus.free_mb in the same transactions, and checked by `allocation_problems`.
CREATE TABLE gpu_pools (
    node_id     TEXT NOT NULL REFERENCES nodes (id),
    type_key    TEXT NOT NULL,
    whole_free  BIGINT NOT NULL CHECK (whole_free >= 0),
    PRIMARY KEY (node_id, type_key)
);
CREATE INDEX gpu_pools_fit ON gpu_pools (type_key, whole_free, node_id);

CREATE TABLE reservations (
    id                 TEXT PRIMARY KEY,
    tenant_id          TEXT NOT NULL REFERENCES users (id),
    status             TEXT NOT NULL,
    gpu_type           TEXT NOT NULL,
    gpu_count          BIGINT NOT NULL,
    vram_mb            BIGINT,
    tier               TEXT NOT NULL,
    bid                BIGINT,
    price_per_hour     BIGINT NOT NULL,
    duration_s         BIGINT NOT NULL,
    node_id            TEXT REFERENCES nodes (id),
    -- JSON array of the GPU UUIDs it was placed on; kept after it ends.
    gpus               TEXT NOT NULL,
    epoch              BIGINT NOT NULL,
    image              TEXT,
    command            TEXT NOT NULL,
    env                TEXT NOT NULL,
    created_at         BIGINT NOT NULL,
    started_at         BIGINT,
    stop_requested_at  BIGINT,
    ended_at           BIGINT,
    end_reason         TEXT,
    charged            BIGINT NOT NULL,
    idempotency_key    TEXT,
    request_hash       TEXT,
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX reservations_tenant ON reservations (tenant_id, created_at);
CREATE INDEX reservations_node_status ON reservations (node_id, status);
CREATE INDEX reservations_status ON reservations (status);

-- Which GPU memory each live reservation holds. Rows exist only while the reservation is not
-- terminal; the sum over a GPU always equals vram_mb - free_mb.
CREATE TABLE allocations (
    reservation_id  TEXT NOT NULL REFERENCES reservations (id),
    gpu_uuid        TEXT NOT NULL REFERENCES gpus (uuid),
    vram_mb         BIGINT NOT NULL CHECK (vram_mb > 0),
    PRIMARY KEY (reservation_id, gpu_uuid)
);
CREATE INDEX allocations_gpu ON allocations (gpu_uuid);

INSERT INTO accounts (id, balance) VALUES ('platform:credit', 0);
INSERT INTO accounts (id, balance) VALUES ('platform:revenue', 0);
