-- How far its node's pull of a reservation's image is, while it starts (JSON: image,
-- layers_done, layers_total, bytes_done, bytes_total); the last figures are kept after.
ALTER TABLE reservations ADD COLUMN pull TEXT;
