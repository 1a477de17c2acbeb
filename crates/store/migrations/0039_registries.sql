-- Tenants' registry credentials: one per user and registry host, the password sealed under
-- the control plane's master key (purpose "registry"); copied, sealed, into a reservation's
-- secrets when its image is on that host.
CREATE TABLE registries (
    id              TEXT PRIMARY KEY,
    owner_id        TEXT NOT NULL REFERENCES users (id),
    host            TEXT NOT NULL,
    username        TEXT NOT NULL,
    sealed_password TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    UNIQUE (owner_id, host)
);
