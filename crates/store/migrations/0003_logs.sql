-- Instances' output, shipped by agents in chunks that each start where the stored copy ends
-- (so a repeated chunk is ignored), kept up to a cap per reservation.
CREATE TABLE reservation_logs (
    reservation_id  TEXT NOT NULL REFERENCES reservations (id),
    byte_offset     BIGINT NOT NULL,
    length          BIGINT NOT NULL,
    data            TEXT NOT NULL,
    PRIMARY KEY (reservation_id, byte_offset)
);
ALTER TABLE reservations ADD COLUMN log_bytes BIGINT NOT NULL DEFAULT 0;
