-- Price tiers, holds and host earnings.
--
-- A reservation's charge for s seconds is floor((min(s, price_step_s) * price_per_hour
-- + max(0, s - price_step_s) * price_after) / 3600); price_step_s NULL means one flat price.
ALTER TABLE reservations ADD COLUMN price_step_s BIGINT;
ALTER TABLE reservations ADD COLUMN price_after BIGINT;
-- What the tenant's hold account keeps for this reservation: the first hour until the first
-- settlement (on-demand, stepped, spot) or the unused part of a prepaid block (reserved).
ALTER TABLE reservations ADD COLUMN held BIGINT NOT NULL DEFAULT 0;
-- The part of every charge that goes to the node's owner, in basis points.
ALTER TABLE reservations ADD COLUMN host_share_bps BIGINT NOT NULL DEFAULT 0;
-- Spot: the bid per whole GPU-hour that decides who is preempted; NULL is never preempted.
ALTER TABLE reservations ADD COLUMN priority BIGINT;
-- Seconds between SIGTERM and SIGKILL when the agent stops it (a preempted spot instance).
ALTER TABLE reservations ADD COLUMN stop_grace_s BIGINT;
CREATE INDEX reservations_preemptible ON reservations (tier, status, priority);

-- Hosts own nodes; nodes joined before owners existed belong to the first admin.
ALTER TABLE nodes ADD COLUMN owner_id TEXT REFERENCES users (id);
UPDATE nodes SET owner_id = (SELECT id FROM users WHERE role = 'admin' ORDER BY created_at, id LIMIT 1);

-- What a transfer was for (credit, hold, release, charge, refund, earning) and, for host
-- earnings, the node that earned it.
ALTER TABLE transfers ADD COLUMN kind TEXT NOT NULL DEFAULT 'charge';
UPDATE transfers SET kind = 'credit' WHERE reservation_id IS NULL;
ALTER TABLE transfers ADD COLUMN node_id TEXT;
CREATE INDEX transfers_node ON transfers (node_id, created_at) WHERE node_id IS NOT NULL;

-- Every user has a balance, a hold and an earnings account.
INSERT INTO accounts (id, balance) SELECT 'hold:' || id, 0 FROM users;
INSERT INTO accounts (id, balance) SELECT 'earnings:' || id, 0 FROM users;
