-- Endpoints (`gpurent endpoints`): an app behind one URL, served by replicas that are
-- reservations of its shape. `spec` is the replicas' shape (JSON), `scaling` how they scale and
-- hold requests (JSON); `revision` is bumped by each scaling decision, which is applied only at
-- the revision it read. One control plane at a time scales an endpoint: the one whose lease
-- (`leader`, `lease_until`) is current.
CREATE TABLE endpoints (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    tenant_id   TEXT NOT NULL REFERENCES users (id),
    spec        TEXT NOT NULL,
    scaling     TEXT NOT NULL,
    generation  BIGINT NOT NULL DEFAULT 1,
    state       TEXT NOT NULL DEFAULT 'idle',
    message     TEXT,
    failures    BIGINT NOT NULL DEFAULT 0,
    retry_at    BIGINT,
    revision    BIGINT NOT NULL DEFAULT 0,
    leader      TEXT,
    lease_until BIGINT,
    created_at  BIGINT NOT NULL,
    deleted_at  BIGINT
);
-- A name is one URL: unique among the live endpoints.
CREATE UNIQUE INDEX endpoints_name ON endpoints (name) WHERE deleted_at IS NULL;
CREATE INDEX endpoints_tenant ON endpoints (tenant_id);
-- An endpoint's API keys, kept as their SHA-256.
CREATE TABLE endpoint_keys (
    id          TEXT PRIMARY KEY,
    endpoint_id TEXT NOT NULL REFERENCES endpoints (id),
    key_hash    TEXT NOT NULL UNIQUE,
    prefix      TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX endpoint_keys_endpoint ON endpoint_keys (endpoint_id);
-- The requests in flight and waiting at each control plane, per endpoint, as each last wrote
-- them: the scaling control plane sums the fresh ones.
CREATE TABLE endpoint_load (
    endpoint_id TEXT NOT NULL REFERENCES endpoints (id),
    server_id   TEXT NOT NULL,
    inflight    BIGINT NOT NULL,
    queued      BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    PRIMARY KEY (endpoint_id, server_id)
);
-- A replica is a reservation of its endpoint: which one, its number there, and the generation
-- of the endpoint's spec it runs.
ALTER TABLE reservations ADD COLUMN endpoint_id TEXT;
ALTER TABLE reservations ADD COLUMN endpoint_replica BIGINT;
ALTER TABLE reservations ADD COLUMN endpoint_gen BIGINT;
CREATE INDEX reservations_endpoint ON reservations (endpoint_id, endpoint_replica)
    WHERE endpoint_id IS NOT NULL;
