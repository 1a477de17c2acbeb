-- Login throttling per account (`gpurent_types::login_throttle`): the failures kept of each
-- account that failed lately, whatever the client address, so that every replica refuses a
-- try during the account's wait. A success deletes the row. `account` is the user's id, or for
-- a name that is no user's, `name:` and the name's SHA-256 (`user_id` NULL): those rows are
-- kept at most a day and at most 10,000 at a time (the maintenance loop forgets the oldest).
CREATE TABLE login_throttle (
    account      TEXT PRIMARY KEY,
    user_id      TEXT,
    failures     BIGINT NOT NULL,
    last_at      BIGINT NOT NULL,
    wait_until   BIGINT,
    window_start BIGINT NOT NULL,
    window_tries BIGINT NOT NULL
);
CREATE INDEX login_throttle_last ON login_throttle (last_at);
