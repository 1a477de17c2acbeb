//! The store's test suite, run against SQLite and PostgreSQL alike.

// A failing test panics; that is what these are for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_events;
mod audit;
mod billing_model;
mod concurrent_settlement;
mod credential_cache;
mod end_message;
mod failover;
mod gpu_hours;
mod health;
mod idempotency;
mod image_locality;
mod lifecycle;
mod liveness;
mod login_throttle;
mod logs;
mod lost_commit;
mod metrics;
mod node_certs;
mod pg_cluster;
mod placement;
mod queue;
mod settlement_rule;
mod shared_keys;
mod support;
mod sync_cost;
mod team_model;
mod tunnels;
mod volume_billing;
mod wal;
mod writer_connection;
