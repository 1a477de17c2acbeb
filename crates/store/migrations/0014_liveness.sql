-- Node liveness (issue 6). nodes.status: ready, unhealthy, draining or lost; a node not heard
-- from for the node TTL becomes lost, and ready again when its agent syncs. lost_at: when the
-- control plane fenced it (its last heartbeat + TTL).
ALTER TABLE nodes ADD COLUMN status TEXT NOT NULL DEFAULT 'ready';
ALTER TABLE nodes ADD COLUMN lost_at BIGINT;
-- reservations.on_node_loss: reschedule or stop. run_before_s: whole seconds it ran (and was
-- charged for) on nodes lost before, so that its hours and charge continue where they stopped.
ALTER TABLE reservations ADD COLUMN on_node_loss TEXT NOT NULL DEFAULT 'reschedule';
ALTER TABLE reservations ADD COLUMN run_before_s BIGINT NOT NULL DEFAULT 0;
-- meters.base_charged: what the reservation had been charged when it started on its current
-- node (its earlier runs were on lost nodes): the current node's owner earns a share of the rest.
ALTER TABLE meters ADD COLUMN base_charged BIGINT NOT NULL DEFAULT 0;
-- One row per run of a reservation cut short by the loss of its node: the node, and the
-- reservation's running charge before and after that run (the node's owner earned a share of
-- the difference), so that ledger-check can attribute every charge to the node it ran on.
CREATE TABLE lost_runs (
    reservation_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    charged_from BIGINT NOT NULL,
    charged_to BIGINT NOT NULL,
    host_share_bps BIGINT NOT NULL,
    lost_at BIGINT NOT NULL,
    PRIMARY KEY (reservation_id, epoch)
);
