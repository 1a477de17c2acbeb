-- Reservations placed from the queue are found by when, per tenant (the webhooks' events).
CREATE INDEX reservations_placed ON reservations (tenant_id, placed_at) WHERE queued_at IS NOT NULL;
