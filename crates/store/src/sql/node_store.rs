//! `NodeStore` for `SqlStore`: each method is one line into the file that holds its
//! transition (`nodes`, `sync`, `health`, `events`, `fleet`, `drain`, `fencing`).

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::agent::{Assignment, SyncRequest};
use gpurent_types::api::{Event, HealthIssue, HostVerification, Node};

use super::{drain, events, fencing, fleet, gpu_hours, health, nodes, sync, ts, SqlStore};
use crate::{
    Drained, Fenced, FleetView, GpuHour, NewNode, NodeAction, NodeCertificate, NodeStore, Result,
    Synced,
};

#[async_trait]
impl NodeStore for SqlStore {
    async fn create_join_token(
        &self,
        token_hash: &str,
        created_by: &str,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        nodes::create_join_token(self, token_hash, created_by, expires_at, now).await
    }

    async fn register_node(&self, node: NewNode, now: DateTime<Utc>) -> Result<String> {
        nodes::register_node(self, node, now).await
    }

    async fn record_health(
        &self,
        node_id: &str,
        issues: &[HealthIssue],
        now: DateTime<Utc>,
    ) -> Result<bool> {
        health::record_health(self, node_id, issues, now).await
    }

    async fn last_event_id(&self) -> Result<i64> {
        events::last_event_id(self).await
    }

    async fn events(&self, after: i64, limit: u32) -> Result<Vec<Event>> {
        events::events(self, after, limit).await
    }

    async fn set_verification(&self, node_id: &str, verification: &HostVerification) -> Result<()> {
        nodes::set_verification(self, node_id, verification).await
    }

    async fn set_node_images(&self, node_id: &str, images: &[String]) -> Result<()> {
        super::node_images::set(self, node_id, images).await
    }

    async fn set_isolation(&self, node_id: &str, isolated: bool) -> Result<()> {
        nodes::set_isolation(self, node_id, isolated).await
    }

    async fn set_shared_network(&self, node_id: &str, shared: bool) -> Result<()> {
        nodes::set_shared_network(self, node_id, shared).await
    }

    async fn set_capacity(
        &self,
        node_id: &str,
        cpus: Option<u32>,
        memory_mb: Option<u64>,
    ) -> Result<()> {
        nodes::set_capacity(self, node_id, cpus, memory_mb).await
    }

    async fn authenticate_node(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, NodeCertificate)>> {
        nodes::authenticate_node(self, token_hash).await
    }

    async fn set_node_certificate(&self, node_id: &str, sha256: &str) -> Result<()> {
        nodes::set_node_certificate(self, node_id, sha256).await
    }

    async fn node_name(&self, node_id: &str) -> Result<String> {
        nodes::node_name(self, node_id).await
    }

    async fn node_certificate(&self, node_id: &str) -> Result<NodeCertificate> {
        nodes::node_certificate(self, node_id).await
    }

    async fn revoke_node(&self, node: &str, now: DateTime<Utc>) -> Result<String> {
        nodes::revoke_node(self, node, now).await
    }

    async fn sync_node(
        &self,
        node_id: &str,
        report: &SyncRequest,
        now: DateTime<Utc>,
    ) -> Result<Synced> {
        sync::sync_node(self, node_id, report, now).await
    }

    async fn desired_version(&self, node_id: &str) -> Result<i64> {
        sync::desired_version(self, node_id).await
    }

    async fn desired_versions(&self) -> Result<Vec<(String, i64)>> {
        sync::desired_versions(self).await
    }

    async fn desired_state(&self, node_id: &str) -> Result<(i64, Vec<Assignment>)> {
        sync::desired_state(self, node_id).await
    }

    async fn log_rooms(&self, node_id: &str) -> Result<BTreeMap<String, u64>> {
        sync::log_rooms(self, node_id).await
    }

    async fn list_nodes(
        &self,
        live_since: DateTime<Utc>,
        owner: Option<&str>,
    ) -> Result<Vec<Node>> {
        fleet::list_nodes(self, live_since, owner).await
    }

    async fn fleet(&self, live_since: DateTime<Utc>) -> Result<FleetView> {
        fleet::fleet(self, live_since).await
    }

    async fn schedule_node(
        &self,
        node: &str,
        action: NodeAction,
        now: DateTime<Utc>,
    ) -> Result<Drained> {
        drain::schedule_node(self, node, action, now).await
    }

    async fn prune_gpu_hours(&self, before: DateTime<Utc>) -> Result<u64> {
        gpu_hours::prune(&self.pool, ts(before)).await
    }

    async fn gpu_hours_of(
        &self,
        gpus: &[String],
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<GpuHour>> {
        gpu_hours::read_of(&self.pool, gpus, gpu_hours::hour_of(ts(from)), ts(to)).await
    }

    async fn fence_lost_nodes(
        &self,
        ttl: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<Fenced> {
        fencing::fence_lost_nodes(self, ttl, now).await
    }
}
