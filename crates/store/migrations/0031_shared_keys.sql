-- The secrets every control-plane replica shares (the node CA, the audit signing key, the SSH
-- host key, the self-signed TLS certificate), each sealed by the master key: written once by
-- the first replica to start (insert if absent), read by every other.
CREATE TABLE shared_keys (
    name       TEXT PRIMARY KEY,
    -- The sealed envelope (`server/src/secrets.rs`): the master key's id, the wrapped data
    -- key and the ciphertext; never the key in clear.
    sealed     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
