//! Tenants' volumes: the store's side of `gpurent volumes` and of the agents that keep them
//! (`VolumeStore`, implemented in `sql/volumes*.rs`). The server decides what is allowed;
//! the store applies it, checking in the same transaction what a race could break (a name
//! taken, a node's room, a volume mounted).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::agent::{NodeVolume, VolumeFacts, VolumeReport};
use gpurent_types::api::{MountedVolume, Volume, VolumeKind};
use gpurent_types::Money;
use serde::{Deserialize, Serialize};

use crate::Result;

/// A volume to make, checked by the control plane.
#[derive(Debug, Clone)]
pub struct NewVolume {
    pub owner_id: String,
    pub name: String,
    pub kind: VolumeKind,
    /// A local volume's node (its id).
    pub node_id: Option<String>,
    pub size_bytes: u64,
    /// Its price per GB-month (the price list's, now).
    pub price_per_gb_month: Money,
    /// The part of its charges paid to its node's owner (a local volume).
    pub host_share_bps: u32,
}

/// A volume a reservation mounts, as the reservation keeps it (`reservations.volumes`): what
/// `get` shows and what its agent is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMountRow {
    pub volume_id: String,
    pub name: String,
    pub kind: VolumeKind,
    pub size_bytes: u64,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    /// A local volume's node (its id): where the reservation must run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// That node's name, for the reasons a reservation is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// A managed job's checkpoint volume (`--checkpoint-volume`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
}

impl VolumeMountRow {
    pub fn for_agent(self) -> gpurent_types::agent::Mount {
        gpurent_types::agent::Mount {
            volume_id: self.volume_id,
            kind: self.kind,
            size_bytes: self.size_bytes,
            path: self.path,
            read_only: self.read_only,
            checkpoint: self.checkpoint,
        }
    }

    pub fn shown(&self) -> MountedVolume {
        MountedVolume {
            volume_id: self.volume_id.clone(),
            name: self.name.clone(),
            path: self.path.clone(),
            read_only: self.read_only,
        }
    }
}

/// The node-local volume that ties a reservation to its node, for the reason it is told when
/// it waits or is refused: the volume's name, its node's name, and the node's state when it
/// cannot take work now (`lost`, `unreachable`, `draining`, ... as `nodes ls` says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeTie {
    pub volume: String,
    pub node_name: String,
    pub node_down: Option<String>,
}

impl VolumeTie {
    /// The tie of a reservation mounting `mounts` (its first local volume), with its node's
    /// state once known.
    pub fn of(mounts: &[VolumeMountRow]) -> Option<Self> {
        mounts
            .iter()
            .find(|m| m.kind == VolumeKind::Local)
            .map(|m| VolumeTie {
                volume: m.name.clone(),
                node_name: m
                    .node_name
                    .clone()
                    .unwrap_or_else(|| "(its node)".to_owned()),
                node_down: None,
            })
    }

    /// In words: where it runs, and when.
    pub fn describe(&self) -> String {
        match &self.node_down {
            None => format!(
                "its volume {} is on node {}: it runs there or nowhere",
                self.volume, self.node_name
            ),
            Some(state) => format!(
                "its volume {} is on node {}, which is {state}: it runs there once that node is back",
                self.volume, self.node_name
            ),
        }
    }
}

/// Where a reservation may be placed, by the volumes it mounts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NodeFilter {
    /// Anywhere (no volume, or none that ties it).
    #[default]
    Any,
    /// On this node only: its local volume is there.
    Node(String),
    /// On a node that mounts the shared volume storage.
    SharedVolumes,
}

impl NodeFilter {
    /// The filter of a reservation mounting volumes of these kinds on these nodes, or why no
    /// node can take it (local volumes of two nodes). A local volume and a shared one: the
    /// local one's node, which must mount the shared storage too (the caller checks).
    pub fn of<'a>(
        volumes: impl IntoIterator<Item = (VolumeKind, Option<&'a str>)>,
    ) -> std::result::Result<Self, String> {
        let mut filter = NodeFilter::Any;
        for (kind, node) in volumes {
            filter = match (kind, node, filter) {
                (VolumeKind::Local, Some(node), NodeFilter::Node(other)) if other != node => {
                    return Err(format!(
                        "its local volumes are on two nodes ({other} and {node}); an instance runs on one"
                    ))
                }
                (VolumeKind::Local, Some(node), _) => NodeFilter::Node(node.to_owned()),
                (_, _, NodeFilter::Node(n)) => NodeFilter::Node(n),
                _ => NodeFilter::SharedVolumes,
            };
        }
        Ok(filter)
    }

    /// Where it lets a reservation run, in words (for a queued one's reason).
    pub fn describe(&self) -> String {
        match self {
            NodeFilter::Any => "anywhere".to_owned(),
            NodeFilter::Node(_) => {
                "its node-local volume runs it on that volume's node only".to_owned()
            }
            NodeFilter::SharedVolumes => {
                "its shared volume needs a node that mounts the shared volume storage".to_owned()
            }
        }
    }

    /// Whether a node with this id, mounting the shared storage or not, passes.
    pub fn admits(&self, node_id: &str, shared_volumes: bool) -> bool {
        match self {
            NodeFilter::Any => true,
            NodeFilter::Node(id) => id == node_id,
            NodeFilter::SharedVolumes => shared_volumes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_tie_a_reservation_to_a_node_or_to_shared_storage() {
        assert_eq!(NodeFilter::of([]), Ok(NodeFilter::Any));
        assert_eq!(
            NodeFilter::of([(VolumeKind::Shared, None)]),
            Ok(NodeFilter::SharedVolumes)
        );
        assert!(!NodeFilter::Node("n1".into()).describe().contains("n1"));
        let mut tie = VolumeTie {
            volume: "data".into(),
            node_name: "keeper".into(),
            node_down: None,
        };
        assert!(tie
            .describe()
            .contains("on node keeper: it runs there or nowhere"));
        tie.node_down = Some("lost".into());
        assert!(tie.describe().contains("keeper, which is lost"));
        let both = [(VolumeKind::Shared, None), (VolumeKind::Local, Some("n1"))];
        assert_eq!(NodeFilter::of(both), Ok(NodeFilter::Node("n1".into())));
        let same = [
            (VolumeKind::Local, Some("n1")),
            (VolumeKind::Local, Some("n1")),
        ];
        assert_eq!(NodeFilter::of(same), Ok(NodeFilter::Node("n1".into())));
        let two = [
            (VolumeKind::Local, Some("n1")),
            (VolumeKind::Local, Some("n2")),
        ];
        assert!(NodeFilter::of(two).unwrap_err().contains("two nodes"));
        assert!(NodeFilter::Node("n1".into()).admits("n1", false));
        assert!(!NodeFilter::Node("n1".into()).admits("n2", true));
        assert!(!NodeFilter::SharedVolumes.admits("n2", false));
    }
}

/// A node as volume placement sees it: its room and how it keeps volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeNode {
    pub id: String,
    pub name: String,
    /// Heard from since the liveness cutoff, and ready.
    pub live: bool,
    pub enforcement: Option<String>,
    pub reason: Option<String>,
    /// Free bytes on its volumes file system less what its volumes may still grow into.
    pub room_bytes: i64,
    pub shared: bool,
}

#[async_trait]
pub trait VolumeStore: Send + Sync {
    /// Makes a volume (`creating` for a local one, whose node is woken to make it; `ready`
    /// for a shared one). `Duplicate` when the owner has one of this name; `NoCapacity` when
    /// a local volume's node has not the room (checked under the node's lock).
    async fn create_volume(&self, new: NewVolume, now: DateTime<Utc>) -> Result<Volume>;

    /// The volumes of `owner` (everyone's for `None`), newest first, at most `limit` after
    /// the volume `after`; nodes not heard from since `live_since` make theirs `unavailable`.
    async fn list_volumes(
        &self,
        owner: Option<&str>,
        limit: u32,
        after: Option<&str>,
        live_since: DateTime<Utc>,
    ) -> Result<Vec<Volume>>;

    /// The volume of `owner` (anyone's for `None`) with this name or id. `NotFound` for
    /// another owner's, as for none.
    async fn volume(
        &self,
        owner: Option<&str>,
        name_or_id: &str,
        live_since: DateTime<Utc>,
    ) -> Result<Volume>;

    /// Grows a volume to `size_bytes` (a local one: `resizing` until its node grew it),
    /// charged at its old size up to `now` and at the new one, at `price_per_gb_month`, after.
    /// `Conflict` for a size not above the one it has, or a volume being deleted;
    /// `NoCapacity` when its node has not the room.
    #[allow(clippy::too_many_arguments)]
    async fn resize_volume(
        &self,
        owner: Option<&str>,
        name_or_id: &str,
        size_bytes: u64,
        price_per_gb_month: Money,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Volume>;

    /// Removes a volume: `deleting` until a node deleted its data, charged up to `now`.
    /// `Conflict` while a live reservation mounts it.
    async fn remove_volume(
        &self,
        owner: Option<&str>,
        name_or_id: &str,
        live_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Volume>;

    /// Charges every volume last settled a `period` ago or more up to `now`
    /// (`sql/volume_billing.rs`). The number of volumes settled.
    async fn settle_volumes(
        &self,
        now: DateTime<Utc>,
        period: std::time::Duration,
    ) -> Result<usize>;

    /// The nodes as volume placement sees them, by id.
    async fn volume_nodes(&self, live_since: DateTime<Utc>) -> Result<Vec<VolumeNode>>;

    /// The volumes the node should have or delete: its local volumes, and (for a node that
    /// mounts the shared storage) the shared volumes being deleted.
    async fn node_volumes(&self, node_id: &str) -> Result<Vec<NodeVolume>>;

    /// What the node's agent reported of its volumes: made, grown, measured, removed, failed;
    /// and the bytes free for them, when it measured that.
    async fn apply_volume_reports(
        &self,
        node_id: &str,
        reports: &[VolumeReport],
        free_bytes: Option<u64>,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// What the node offers for volumes (`None`: nothing, an agent without a volumes dir).
    async fn set_volume_facts(&self, node_id: &str, facts: Option<&VolumeFacts>) -> Result<()>;
}
