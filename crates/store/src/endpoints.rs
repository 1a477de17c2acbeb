//! Endpoints: the store's side of `gpurent endpoints` (`EndpointStore`, implemented in
//! `sql/endpoints.rs`): the endpoints, their keys, their replicas (reservations), and the
//! scaler's decisions, each applied at the revision it read.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use gpurent_types::api::{EndpointScaling, EndpointState, Reservation};
use gpurent_types::Tier;
use serde::{Deserialize, Serialize};

use crate::Result;

/// The shape of an endpoint's replicas, as kept (JSON): what each replica reservation asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSpec {
    pub gpu_type: String,
    pub gpu_count: Option<u32>,
    pub vram_gb: Option<u32>,
    pub tier: Tier,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub port: u16,
}

/// An endpoint as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointRow {
    pub id: String,
    pub name: String,
    pub tenant_id: String,
    pub spec: EndpointSpec,
    pub scaling: EndpointScaling,
    pub generation: u64,
    pub state: EndpointState,
    pub message: Option<String>,
    /// Replicas that failed in a row (to start, or to pass their health check).
    pub failures: u32,
    /// No replica is started before this (back-off after failures).
    pub retry_at: Option<DateTime<Utc>>,
    /// Bumped by each decision the scaler applies.
    pub revision: i64,
    pub created_at: DateTime<Utc>,
}

/// An endpoint to keep, checked by the control plane.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    pub name: String,
    pub tenant_id: String,
    pub spec: EndpointSpec,
    pub scaling: EndpointScaling,
}

/// A replica of an endpoint: its reservation, its number and the generation it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaRow {
    pub endpoint_id: String,
    pub index: u64,
    pub generation: u64,
    pub reservation: Reservation,
}

/// What the scaler decided about an endpoint's standing, applied only if the endpoint is still
/// at `revision` (another control plane's decision in between wins, and this one is dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointStanding {
    pub revision: i64,
    pub state: EndpointState,
    pub message: Option<String>,
    pub failures: u32,
    pub retry_at: Option<DateTime<Utc>>,
}

#[async_trait]
pub trait EndpointStore: Send + Sync {
    /// `Duplicate` when a live endpoint has the name.
    async fn create_endpoint(&self, new: NewEndpoint, now: DateTime<Utc>) -> Result<EndpointRow>;

    /// The live endpoint of this name, whoever's it is (`NotFound` for none).
    async fn endpoint_by_name(&self, name: &str) -> Result<EndpointRow>;

    /// Every live endpoint, or only `tenant`'s, by name.
    async fn list_endpoints(&self, tenant: Option<&str>) -> Result<Vec<EndpointRow>>;

    /// A new spec and scaling for the endpoint `id`; `new_generation` bumps its generation (its
    /// replicas roll over) and clears its failures.
    async fn update_endpoint(
        &self,
        id: &str,
        spec: &EndpointSpec,
        scaling: &EndpointScaling,
        new_generation: bool,
    ) -> Result<EndpointRow>;

    /// Marks the endpoint deleted (its name is free again) and drops its keys; stopping its
    /// replicas is the caller's.
    async fn delete_endpoint(&self, id: &str, now: DateTime<Utc>) -> Result<()>;

    /// Applies a decision of the scaler at the revision it read; false when another came first.
    async fn set_endpoint_standing(&self, id: &str, standing: &EndpointStanding) -> Result<bool>;

    /// The replicas of the endpoints `ids` (of every endpoint, deleted ones too, when empty)
    /// that are live, and those that ended at or after `ended_since`, by endpoint and number.
    async fn endpoint_replicas(
        &self,
        ids: &[String],
        ended_since: Option<DateTime<Utc>>,
    ) -> Result<Vec<ReplicaRow>>;

    /// The highest replica number the endpoint ever used (0 for none).
    async fn last_replica_index(&self, id: &str) -> Result<u64>;

    /// Keeps an API key of the endpoint (its hash).
    async fn add_endpoint_key(
        &self,
        endpoint_id: &str,
        key_id: &str,
        key_hash: &str,
        prefix: &str,
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// The endpoint's keys: (id, prefix, created).
    async fn endpoint_keys(
        &self,
        endpoint_id: &str,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>>;

    /// `NotFound` when the endpoint has no such key.
    async fn remove_endpoint_key(&self, endpoint_id: &str, key_id: &str) -> Result<()>;

    /// The endpoint a key (by its hash) opens, if any.
    async fn endpoint_of_key(&self, key_hash: &str) -> Result<Option<String>>;

    /// Takes or renews the lease to scale the endpoint `id` for `server` until `until`: true
    /// when `server` holds it (it held it, nobody did, or the holder's ran out by `now`).
    async fn lease_endpoint(
        &self,
        id: &str,
        server: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool>;

    /// Writes what `server` carries of each endpoint now: (endpoint, in flight, waiting).
    async fn put_endpoint_loads(
        &self,
        server: &str,
        loads: &[(String, u32, u32)],
        now: DateTime<Utc>,
    ) -> Result<()>;

    /// What the other control planes carried of each endpoint, written at or after `since`:
    /// (endpoint, in flight, waiting), summed.
    async fn endpoint_loads(
        &self,
        except_server: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<(String, u32, u32)>>;
}
