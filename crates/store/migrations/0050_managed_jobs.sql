-- Managed jobs (`--restart`): when a run that ended is started again, how many counted
-- restarts it may have (`max_restarts`) and has had (`restarts_counted`), every restart so far
-- (`restarts`, a JSON list: cause, when, the run's epoch, node and start), and when a failed
-- run's restart may be placed (`retry_at`, its back-off).
ALTER TABLE reservations ADD COLUMN restart_policy TEXT NOT NULL DEFAULT 'never';
ALTER TABLE reservations ADD COLUMN max_restarts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN restarts_counted BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN restarts TEXT NOT NULL DEFAULT '[]';
ALTER TABLE reservations ADD COLUMN retry_at BIGINT;
-- Managed jobs queued again, by tenant and when (the webhooks' `reservation_restarted`, read
-- every maintenance tick): ordinary reservations are not in it.
CREATE INDEX reservations_restarted ON reservations (tenant_id, queued_at)
    WHERE restart_policy <> 'never';
