-- Instances' output as bytes (issue 14): stored as it was written (not UTF-8 or not), each
-- row at the byte of the log where it starts, so that reads start at any byte.
-- log_bytes: the size of the stored log (bytes, gap markers included);
-- log_read: the bytes of the current epoch's output its agent has shipped (the agent's offset;
--   its output starts at 0 with each epoch);
-- log_cut: where in the current epoch's output the kept head ended (NULL while all is kept);
-- log_tail: the bytes kept after the gap marker of the current epoch (NULL until it is written).
ALTER TABLE reservations ADD COLUMN log_read BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reservations ADD COLUMN log_cut BIGINT;
ALTER TABLE reservations ADD COLUMN log_tail BIGINT;
-- The text rows are copied as their UTF-8 bytes, each moved to where the bytes before it end
-- (invalid UTF-8 had been replaced, so a row held more bytes than its length said).
-- postgres only below
CREATE TABLE reservation_output (
    reservation_id  TEXT NOT NULL REFERENCES reservations (id),
    byte_offset     BIGINT NOT NULL,
    data            BYTEA NOT NULL,
    PRIMARY KEY (reservation_id, byte_offset)
);
INSERT INTO reservation_output (reservation_id, byte_offset, data)
SELECT reservation_id,
       COALESCE(SUM(octet_length(data)) OVER (PARTITION BY reservation_id ORDER BY byte_offset
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0),
       convert_to(data, 'UTF8')
FROM reservation_logs;
-- sqlite only below
CREATE TABLE reservation_output (
    reservation_id  TEXT NOT NULL REFERENCES reservations (id),
    byte_offset     BIGINT NOT NULL,
    data            BLOB NOT NULL,
    PRIMARY KEY (reservation_id, byte_offset)
);
INSERT INTO reservation_output (reservation_id, byte_offset, data)
SELECT reservation_id,
       COALESCE(SUM(length(CAST(data AS BLOB))) OVER (PARTITION BY reservation_id ORDER BY byte_offset
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0),
       CAST(data AS BLOB)
FROM reservation_logs;
-- both below
UPDATE reservations SET log_read = log_bytes - log_base,
    log_bytes = COALESCE((SELECT SUM(length(o.data)) FROM reservation_output o
                          WHERE o.reservation_id = reservations.id), 0);
DROP TABLE reservation_logs;
-- The maintenance loop prunes the logs of reservations that ended longer ago than kept.
CREATE INDEX reservations_log_retention ON reservations (ended_at) WHERE log_bytes > 0;
