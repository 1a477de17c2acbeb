-- Which replica holds each agent's tunnel (the connection tenants' SSH channels reach the
-- node through), so a replica an SSH client reached relays to the one the agent is on. The
-- holder refreshes seen_at while the tunnel is open; a row not refreshed is stale.
CREATE TABLE agent_tunnels (
    node_name   TEXT PRIMARY KEY,
    -- Where other replicas reach the holder (its --advertise-url).
    replica_url TEXT NOT NULL,
    -- What another replica presents to the holder to relay a stream (random per tunnel).
    relay_token TEXT NOT NULL,
    seen_at     BIGINT NOT NULL
);
