//! Endpoints: an app served behind one stable URL by replicas (each a reservation of the
//! endpoint's shape) that scale with its traffic, to zero when nobody calls it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ReservationStatus, Tier};

/// The most replicas one endpoint may have.
pub const ENDPOINT_MAX_REPLICAS: u32 = 64;
/// The longest a request may wait for a replica, in seconds.
pub const ENDPOINT_MAX_QUEUE_TIMEOUT_S: u64 = 600;
/// The most requests one endpoint may hold waiting.
pub const ENDPOINT_MAX_QUEUE: u32 = 10_000;
/// The largest request body an endpoint may be set to take, in MiB.
pub const ENDPOINT_MAX_BODY_MB: u32 = 1024;
/// The prefix of an endpoint's API keys.
pub const ENDPOINT_KEY_PREFIX: &str = "gpe_";

/// `POST /api/v1/endpoints`: an endpoint, its replicas' shape and how they scale.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// Its name: the first label of its URL (`NAME.e.APPS-DOMAIN`), unique among live
    /// endpoints. Lowercase letters, digits and `-`, at most 40.
    #[schema(pattern = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")]
    pub name: String,
    /// The GPU type of each replica.
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$")]
    pub gpu_type: String,
    /// Whole GPUs per replica (1 when neither this nor `vram_gb` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 64)]
    pub gpu_count: Option<u32>,
    /// A share of one GPU with this much memory, per replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1024)]
    pub vram_gb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// The image each replica runs (Docker executor); none runs `command` on the process
    /// executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A template to take the image, command and environment from (`gpurent templates ls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The port the app listens on inside each replica.
    #[schema(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// How it scales and holds requests (every field has a default).
    #[serde(default)]
    pub scaling: EndpointScaling,
}

/// How an endpoint scales and holds requests. Every field has a default.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct EndpointScaling {
    /// Replicas kept however quiet it is; 0 scales to zero.
    #[schema(maximum = 64)]
    pub min_replicas: u32,
    #[schema(minimum = 1, maximum = 64)]
    pub max_replicas: u32,
    /// Requests in flight per replica that the scaler aims at.
    #[schema(minimum = 1, maximum = 10000)]
    pub target_inflight: u32,
    /// How long below the target before replicas are stopped, in seconds.
    #[schema(maximum = 86400)]
    pub scale_down_after_s: u64,
    /// The path polled until a new replica answers 2xx (every 100 ms while it starts).
    #[schema(pattern = r"^/[!-~]{0,255}$")]
    pub health_path: String,
    /// Anyone may call it, without a key.
    pub public: bool,
    /// How long a request waits for a replica before 503, in seconds.
    #[schema(minimum = 1, maximum = 600)]
    pub queue_timeout_s: u64,
    /// Past this many waiting requests, new ones get 429 at once.
    #[schema(minimum = 1, maximum = 10000)]
    pub max_queue: u32,
    /// The largest request body, in MiB (413 beyond).
    #[schema(minimum = 1, maximum = 1024)]
    pub max_body_mb: u32,
}

impl Default for EndpointScaling {
    fn default() -> Self {
        EndpointScaling {
            min_replicas: 0,
            max_replicas: 4,
            target_inflight: 4,
            scale_down_after_s: 60,
            health_path: "/health".to_owned(),
            public: false,
            queue_timeout_s: 30,
            max_queue: 100,
            max_body_mb: 16,
        }
    }
}

/// `PATCH /api/v1/endpoints/{name}`: what changes. A new image, command or environment rolls
/// the replicas over (a new one passes its health check before an old one stops).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpdateEndpoint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The whole environment, replacing the one before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_inflight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_after_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_mb: Option<u32>,
}

/// Where an endpoint is, as a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndpointState {
    /// No replica and none wanted: the first request starts one.
    Idle,
    /// Replicas are starting and none is ready yet.
    Starting,
    /// At least one replica serves.
    Ready,
    /// Replicas fail to start or to pass their health check; `message` says why, and the next
    /// try waits (back-off).
    Failing,
    /// Its owner's credit ran out: no replica runs and requests get 402.
    OutOfCredit,
}

impl EndpointState {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointState::Idle => "idle",
            EndpointState::Starting => "starting",
            EndpointState::Ready => "ready",
            EndpointState::Failing => "failing",
            EndpointState::OutOfCredit => "out_of_credit",
        }
    }

    pub fn parse(s: &str) -> Option<EndpointState> {
        [
            EndpointState::Idle,
            EndpointState::Starting,
            EndpointState::Ready,
            EndpointState::Failing,
            EndpointState::OutOfCredit,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }
}

/// An endpoint, its replicas and its figures.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Endpoint {
    pub id: String,
    pub name: String,
    /// Who owns and pays for it.
    pub tenant_id: String,
    /// Where API clients call it: `/e/NAME` on the control plane's own host (answers are
    /// sandboxed and set no cookies).
    pub url: String,
    /// Where a browser calls it: the app's own origin, `NAME.e.APPS-DOMAIN`.
    pub app_url: String,
    pub gpu_type: String,
    pub gpu_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_gb: Option<u32>,
    pub tier: Tier,
    pub image: Option<String>,
    pub command: Vec<String>,
    /// The names of its environment's variables.
    pub env: Vec<String>,
    pub port: u16,
    pub scaling: EndpointScaling,
    /// Bumped by each change of image, command or environment; replicas of an older one are
    /// rolled over.
    pub generation: u64,
    pub status: EndpointState,
    /// Replicas that pass their health check and take requests.
    pub ready_replicas: u32,
    /// Why it is `failing` or `out_of_credit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub replicas: Vec<EndpointReplica>,
    #[serde(flatten)]
    pub figures: EndpointFigures,
}

/// One replica of an endpoint: a reservation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct EndpointReplica {
    /// Its number in the endpoint, from 1 (`endpoints logs NAME --replica N`).
    pub index: u64,
    /// Its reservation's id.
    pub id: String,
    pub status: ReservationStatus,
    /// It passed its health check and takes requests.
    pub ready: bool,
    pub generation: u64,
    pub node: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    /// Requests it is answering now (as this control plane sees them).
    pub inflight: u32,
}

/// What an endpoint served, as this control plane counted it since it started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct EndpointFigures {
    pub requests: u64,
    /// Over the last minute.
    pub requests_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// How long requests waited for a replica.
    pub queue_wait_p50_ms: Option<f64>,
    pub queue_wait_p99_ms: Option<f64>,
    pub queued: u32,
    pub inflight: u32,
    /// Requests answered 502, 503 or 429 by the control plane itself.
    pub rejected: u64,
    /// Replicas started because none was ready, and how long they took to serve.
    pub cold_starts: u64,
    pub cold_start_p50_ms: Option<f64>,
    pub cold_start_p99_ms: Option<f64>,
    /// Replicas over the last hour, a point per change: (time, ready replicas).
    pub replicas_over_time: Vec<ReplicaCount>,
}

/// How many replicas were ready from a moment on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ReplicaCount {
    pub at: DateTime<Utc>,
    pub ready: u32,
}

/// `POST /api/v1/endpoints/{name}/keys`: a new key, shown once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct EndpointKeyCreated {
    pub id: String,
    /// The key, `gpe_...`: sent as `Authorization: Bearer KEY`. Never shown again.
    pub key: String,
    pub created_at: DateTime<Utc>,
}

/// An endpoint's key, as listed (never the key itself).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct EndpointKey {
    pub id: String,
    /// The key's first characters, to tell keys apart.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
}
