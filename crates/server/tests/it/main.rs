//! The control plane's integration tests: a real server on loopback, a real store (SQLite and
//! PostgreSQL), and simulated agents that speak the real agent protocol over HTTP.

// A failing test panics; that is what these are for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod agent_protocol;
mod app;
mod arrays;
mod audit;
mod authz;
mod budgets;
mod concurrency;
mod console;
mod console_account;
mod console_admin;
mod console_admin_books;
mod console_billing;
mod console_csp;
mod console_endpoints;
mod console_markup;
mod console_nodes;
mod console_reauth;
mod console_support;
mod console_terminal;
mod currency;
mod drain;
mod elastic;
mod endpoints;
mod endpoints_faults;
mod endpoints_spread;
mod endpoints_support;
mod failover;
mod fencing;
mod health;
mod held_sync;
mod hostile;
mod idempotency;
mod idle;
mod isolation;
mod lifecycle;
mod limits;
mod login_next;
mod login_throttle;
mod logs;
mod logs_kept;
mod logs_stopped;
mod managed_jobs;
mod metrics;
mod mig_health;
mod notifications;
mod openapi;
mod proxy;
mod proxy_sites;
mod proxy_support;
mod proxy_teams;
mod proxy_websockets;
mod queue;
mod quotas;
mod readiness;
mod registries;
mod reports;
mod revoke;
mod roles;
mod scoped_tokens;
mod secrets;
mod settlement;
mod share_sizes;
mod slow_clients;
mod ssh_channels;
mod ssh_keys;
mod ssh_limits;
mod team_volumes;
mod teams;
mod telemetry;
mod templates;
mod tiers;
mod tokens;
mod topology;
mod validation;
mod verification;
mod volume_billing;
mod volume_node_loss;
mod volumes;

/// Runs an async test body once per store backend.
#[macro_export]
macro_rules! both_stores {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$body(gpurent_store::Backend::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$body(gpurent_store::Backend::Postgres).await;
            }
        }
    };
}
