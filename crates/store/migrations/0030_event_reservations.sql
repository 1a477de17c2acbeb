-- The reservation an event concerns (the agent's VRAM watchdog: a share over its memory, a
-- process on a GPU not its own), NULL for events of a node alone.
ALTER TABLE events ADD COLUMN reservation_id TEXT;
