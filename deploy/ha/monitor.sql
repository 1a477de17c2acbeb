-- pg_auto_failover's monitor, tuned for the local HA stack (scripts/ha-up.sh): a lost primary
-- is noticed within ~5 s and replaced within ~10 s, instead of the defaults' ~50-60 s, so that
-- a client's retries (3, 5 s apart) outlast a failover. In production keep the defaults unless
-- the network is known to be steady (docs/operations.md).
ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 5000;
-- How long the secondary waits, before it is promoted, for a primary it cannot see to have
-- demoted itself (the guard against two primaries): 30 s by default. Short here: the primary
-- replicates synchronously, so one cut off from its standby commits nothing (its commits wait
-- for the standby's acknowledgement) and a second primary cannot take acknowledged writes.
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 2000;
SELECT pg_reload_conf();
