-- Users' SSH public keys: the control plane's SSH endpoint lets a key into the running
-- reservations of its user. One key once per user (its SHA-256 fingerprint).
CREATE TABLE ssh_keys (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id),
    name        TEXT NOT NULL,
    algorithm   TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    -- The key in OpenSSH's one-line form, without its comment.
    public_key  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    UNIQUE (user_id, fingerprint)
);
CREATE INDEX ssh_keys_user ON ssh_keys (user_id, created_at);
