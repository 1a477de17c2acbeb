-- Mutual TLS between agents and the control plane: the SHA-256 of the client certificate the
-- control plane's CA signed for each node at registration (NULL: the node joined without TLS),
-- and when an admin revoked it (`gpurent nodes revoke`): a revoked node's syncs are refused.
ALTER TABLE nodes ADD COLUMN cert_sha256 TEXT;
ALTER TABLE nodes ADD COLUMN cert_revoked_at BIGINT;
