-- Host verification: the checks of a node's host as last reported (JSON) and whether they all
-- passed. A node that failed gets no work; nodes from before verification count as passed.
ALTER TABLE nodes ADD COLUMN verification TEXT;
ALTER TABLE nodes ADD COLUMN verified BIGINT NOT NULL DEFAULT 1;
