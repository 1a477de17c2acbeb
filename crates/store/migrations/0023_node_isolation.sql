-- Whether a node's executor isolates instances from the node's secrets and from each other
-- (0: the process executor run with --allow-unisolated), as its agent last reported it.
-- Nodes from before this report: the process executor did not isolate, the others did.
ALTER TABLE nodes ADD COLUMN isolated BIGINT NOT NULL DEFAULT 1;
UPDATE nodes SET isolated = 0 WHERE executor = 'process';
