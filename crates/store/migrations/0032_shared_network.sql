-- Whether a node's instances share its network (1: the process executor where no network
-- namespace can be made for each instance, or unisolated), as its agent last reported it.
-- Nodes from before this report: the process executor's instances shared it, the others not.
ALTER TABLE nodes ADD COLUMN shared_network BIGINT NOT NULL DEFAULT 0;
UPDATE nodes SET shared_network = 1 WHERE executor IN ('process', 'docker+process');
