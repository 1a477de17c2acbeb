-- Scoped tokens: what a token may do (scopes: a comma-separated list of read, reserve, ssh,
-- volumes, billing, admin; NULL: everything its user may) and the team it acts for.
ALTER TABLE api_tokens ADD COLUMN scopes TEXT;
ALTER TABLE api_tokens ADD COLUMN team_id TEXT;
