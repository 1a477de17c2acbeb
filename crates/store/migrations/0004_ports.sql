-- Ports a reservation asked to publish (JSON array of numbers) and where its agent published
-- them (JSON array of {container_port, host_port}) once it runs.
ALTER TABLE reservations ADD COLUMN ports TEXT NOT NULL DEFAULT '[]';
ALTER TABLE reservations ADD COLUMN published TEXT NOT NULL DEFAULT '[]';
