-- Resuming elsewhere after a node loss.
-- checkpoint: a reservation made with `checkpoint` gets a directory that its agent mounts into
-- the instance and keeps across restarts (and, on storage the nodes share, across nodes).
-- log_base: the bytes of output stored before its current epoch began; an agent ships the
-- output of its own run, which starts at 0, so its offsets count from here.
ALTER TABLE reservations ADD COLUMN checkpoint BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN log_base BIGINT NOT NULL DEFAULT 0;
