-- Ports of a reservation's instance published over HTTP through the control plane's proxy
-- (`/proxy/ID/PORT/`; JSON array of numbers).
ALTER TABLE reservations ADD COLUMN http_ports TEXT NOT NULL DEFAULT '[]';
-- The proxy's one-time links (kind 'link', valid minutes, used once) and the browser sessions
-- they open (kind 'session'): each for one reservation's port, stored by the SHA-256 of the
-- token so that any replica honours them and a leaked table reveals none.
CREATE TABLE proxy_tokens (
    token_hash     TEXT PRIMARY KEY,
    kind           TEXT NOT NULL,
    reservation_id TEXT NOT NULL REFERENCES reservations (id),
    port           BIGINT NOT NULL,
    user_id        TEXT NOT NULL REFERENCES users (id),
    expires_at     BIGINT NOT NULL,
    used_at        BIGINT
);
CREATE INDEX proxy_tokens_expiry ON proxy_tokens (expires_at);
