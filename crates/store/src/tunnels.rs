//! Which replica holds each agent's tunnel: the store's side of relaying SSH channels
//! between replicas (`TunnelStore`, implemented in `sql/tunnels.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::Result;

/// The replica holding a node's tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelHolder {
    pub replica_url: String,
    pub relay_token: String,
    pub seen_at: DateTime<Utc>,
}

#[async_trait]
pub trait TunnelStore: Send + Sync {
    /// Records (or refreshes) that this replica holds the node's tunnel.
    async fn hold_tunnel(
        &self,
        node_name: &str,
        replica_url: &str,
        relay_token: &str,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// Forgets the node's tunnel if it is still the one with `relay_token` (a newer tunnel,
    /// perhaps on another replica, is kept).
    async fn release_tunnel(&self, node_name: &str, relay_token: &str) -> Result<()>;

    /// Who holds the node's tunnel, if its record was refreshed since `since`.
    async fn tunnel_holder(
        &self,
        node_name: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<TunnelHolder>>;
}
