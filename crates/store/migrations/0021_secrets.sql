-- Secret environment variables of a reservation: sealed by the control plane with envelope
-- encryption (its master key wraps a data key per reservation); the store keeps only the
-- ciphertext, and the names for display.
ALTER TABLE reservations ADD COLUMN secrets TEXT;
ALTER TABLE reservations ADD COLUMN secret_names TEXT NOT NULL DEFAULT '[]';
