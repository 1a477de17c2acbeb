-- Notifications: webhooks of a user or a team (its owner_id), each signed with its own
-- secret (sealed by the master key), for the events it names (a comma-separated list, or `*`).
CREATE TABLE notification_hooks (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL REFERENCES users (id),
    url           TEXT NOT NULL,
    events        TEXT NOT NULL,
    secret_sealed TEXT NOT NULL,
    created_by    TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);
CREATE INDEX notification_hooks_owner ON notification_hooks (owner_id);
-- One delivery per hook and event (event_key: the event's identity, so two replicas that see
-- the same event queue it once), tried until delivered or a day old; next_at is when it is
-- tried next (NULL once delivered or given up).
CREATE TABLE notification_deliveries (
    id         TEXT PRIMARY KEY,
    hook_id    TEXT NOT NULL,
    event_key  TEXT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts   INTEGER NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    next_at    BIGINT,
    UNIQUE (hook_id, event_key)
);
CREATE INDEX notification_deliveries_due ON notification_deliveries (next_at)
    WHERE next_at IS NOT NULL;
CREATE INDEX notification_deliveries_hook ON notification_deliveries (hook_id, created_at);
-- Each attempt with its answer: the HTTP status, or why there was none.
CREATE TABLE notification_attempts (
    delivery_id TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    at          BIGINT NOT NULL,
    status      INTEGER,
    error       TEXT,
    PRIMARY KEY (delivery_id, attempt)
);
-- The events of ended and placed reservations are found by when they happened.
CREATE INDEX reservations_ended ON reservations (tenant_id, ended_at) WHERE ended_at IS NOT NULL;
-- Nodes' health events are found by when they happened.
CREATE INDEX events_at ON events (at);
