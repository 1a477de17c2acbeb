-- A token made with another token is its child: it never outlives its parent (its expiry is
-- at most the parent's) and revoking the parent revokes it, and its children in turn. NULL:
-- a token of its own (made by `users create`, a password login, or with the password).
-- No foreign key: a pruned parent was revoked or expired with all its children.
ALTER TABLE api_tokens ADD COLUMN parent_id TEXT;
CREATE INDEX api_tokens_parent ON api_tokens (parent_id) WHERE parent_id IS NOT NULL;
