-- Which GPUs of a node share a PCIe switch (the agent's `switch_group`, NULL where unknown):
-- whole GPUs for one reservation come from one switch when one has enough.
ALTER TABLE gpus ADD COLUMN switch_group BIGINT;
