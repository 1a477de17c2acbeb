-- Idle reclaim: whether a reservation is stopped once its GPUs have been idle for the
-- platform's idle time, and when one of its GPUs was last seen busy (NULL: never since it
-- started running).
ALTER TABLE reservations ADD COLUMN idle_reclaim BIGINT NOT NULL DEFAULT 1;
ALTER TABLE reservations ADD COLUMN last_active_at BIGINT;
