-- Answers to POST requests sent with an Idempotency-Key, so that a retry gets the first answer.
--
-- Keys are per caller and route (`scope` is the route's name, ':', the caller's user id) and
-- stored only as their SHA-256 (`key_hash`). `request_hash` is the SHA-256 of the request body:
-- the same key with another body is refused. `status` is the answer's HTTP status, 0 while the
-- first request is still running; `response` is the answer's body sealed (AES-256-GCM) under a
-- key derived from the Idempotency-Key, since it may hold a secret stored nowhere else in clear.
-- Rows are pruned after a day.
CREATE TABLE idempotency_keys (
    scope         TEXT NOT NULL,
    key_hash      TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    status        BIGINT NOT NULL,
    response      TEXT,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (scope, key_hash)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
