-- Job arrays (`--array 0-999%50`): one id for tasks of one shape, indexes `first..=last`, at
-- most `max_running` queued or running at once. `spec` is the tasks' shape (the request, JSON);
-- `next_index` the next index to start, moved on only by the pass that started the task before
-- it (a task is reserved under the key of its array and index, so two passes start it once).
-- `secrets` are the tasks' secret variables, sealed by the control plane.
-- `stopped_at` is set when the array is stopped: no task starts after. `message` says why the
-- next task cannot start (credit, limits), until `retry_at`.
CREATE TABLE arrays (
    id          TEXT PRIMARY KEY,
    tenant_id   TEXT NOT NULL REFERENCES users (id),
    created_by  TEXT,
    spec        TEXT NOT NULL,
    secrets     TEXT,
    idempotency_key TEXT,
    request_hash TEXT,
    first_index BIGINT NOT NULL,
    last_index  BIGINT NOT NULL,
    max_running BIGINT,
    next_index  BIGINT NOT NULL,
    message     TEXT,
    retry_at    BIGINT,
    created_at  BIGINT NOT NULL,
    stopped_at  BIGINT,
    ended_at    BIGINT
);
CREATE INDEX arrays_tenant ON arrays (tenant_id, created_at);
-- A retried request with its Idempotency-Key is the same array (the same request: its
-- `request_hash`).
CREATE UNIQUE INDEX arrays_idempotency ON arrays (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The arrays the pass looks at.
CREATE INDEX arrays_live ON arrays (created_at) WHERE ended_at IS NULL;
-- A task is a reservation of its array: which one and its index.
ALTER TABLE reservations ADD COLUMN array_id TEXT;
ALTER TABLE reservations ADD COLUMN array_index BIGINT;
CREATE INDEX reservations_array ON reservations (array_id, array_index)
    WHERE array_id IS NOT NULL;
-- An array's live tasks, counted by every pass: without the ended ones, however many.
CREATE INDEX reservations_array_live ON reservations (array_id)
    WHERE array_id IS NOT NULL AND status IN ('pending', 'starting', 'running', 'stopping');
