-- GPU quotas (`gpurent quotas set`): a tenant's (a team's, usually) guaranteed milli-GPUs of a
-- GPU type, and how much more it may borrow (NULL: whatever is idle).
CREATE TABLE quotas (
    tenant_id    TEXT NOT NULL REFERENCES users (id),
    type_key     TEXT NOT NULL,
    guaranteed   BIGINT NOT NULL CHECK (guaranteed >= 0),
    borrow_limit BIGINT CHECK (borrow_limit >= 0),
    set_at       BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, type_key)
);
CREATE INDEX quotas_type ON quotas (type_key);
-- Work placed beyond its tenant's quota of a type with quotas: the first to be preempted when
-- a quota's owner needs its GPUs back.
ALTER TABLE reservations ADD COLUMN borrowed INTEGER NOT NULL DEFAULT 0;
