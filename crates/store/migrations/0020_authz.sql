-- Passwords, token expiry and revocation, and per-tenant caps (issue 8, items 4 and 5).

-- A token has a public id (to list and revoke it without showing its secret), a kind
-- (`api`, or `session` from a password login), an optional expiry and a revocation time.
ALTER TABLE api_tokens ADD COLUMN id TEXT;
ALTER TABLE api_tokens ADD COLUMN kind TEXT NOT NULL DEFAULT 'api';
ALTER TABLE api_tokens ADD COLUMN name TEXT;
ALTER TABLE api_tokens ADD COLUMN expires_at BIGINT;
ALTER TABLE api_tokens ADD COLUMN revoked_at BIGINT;
UPDATE api_tokens SET id = substr(token_hash, 1, 32) WHERE id IS NULL;
CREATE UNIQUE INDEX api_tokens_id ON api_tokens (id);
CREATE INDEX api_tokens_user ON api_tokens (user_id, created_at);
-- The maintenance loop forgets tokens expired or revoked long ago.
CREATE INDEX api_tokens_expired ON api_tokens (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX api_tokens_revoked ON api_tokens (revoked_at) WHERE revoked_at IS NOT NULL;

-- An argon2id PHC string; NULL: the user has no password and logs in by token only.
ALTER TABLE users ADD COLUMN password_hash TEXT;
-- Per-tenant overrides of the platform's caps; NULL: the platform default.
ALTER TABLE users ADD COLUMN max_reservations BIGINT;
ALTER TABLE users ADD COLUMN max_spend_per_hour BIGINT;

-- The caps count a tenant's live reservations in the reserve transaction.
CREATE INDEX reservations_tenant_status ON reservations (tenant_id, status);
