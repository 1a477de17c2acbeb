//! The store's inputs and small outputs: validated intents from the server.

use std::collections::BTreeMap;

use gpurent_types::agent::GpuInfo;
use gpurent_types::{GpuType, Money, Role, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The caller of an API request, found by token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser {
    pub id: String,
    pub name: String,
    pub role: Role,
}

/// Whose reservations a query may see: a tenant only its own, an admin all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Tenant(String),
    All,
}

impl Scope {
    pub fn of(user: &AuthUser) -> Self {
        match user.role {
            Role::Admin => Scope::All,
            Role::Tenant | Role::Host => Scope::Tenant(user.id.clone()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct NewUser {
    pub name: String,
    pub role: Role,
    pub token_hash: String,
    pub credit: Money,
}

#[derive(Debug, Clone)]
pub struct NewNode {
    pub join_token_hash: String,
    pub node_token_hash: String,
    pub name: String,
    pub executor: String,
    pub gpu_backend: String,
    pub gpus: Vec<GpuInfo>,
}

/// Whole GPUs or a share of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Whole { count: u32 },
    Share { vram_mb: u64 },
}

#[derive(Debug, Clone)]
pub struct NewReservation {
    pub tenant_id: String,
    pub gpu_type: GpuType,
    pub want: Want,
    pub duration_s: u64,
    pub tier: Tier,
    pub bid: Option<Money>,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<u16>,
    /// With `request_hash`: a retried request with the same key returns the first reservation.
    pub idempotency_key: Option<String>,
    pub request_hash: String,
}

/// The result of recomputing the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerCheck {
    pub transfers: i64,
    /// Sum of all cached account balances; zero when money was neither created nor destroyed.
    pub sum: i64,
    /// Accounts whose cached balance differs from their transfers: (account, cached, derived).
    pub mismatched: Vec<(String, i64, i64)>,
    /// Holds and host earnings that do not match the reservations they belong to.
    pub problems: Vec<String>,
}

impl LedgerCheck {
    pub fn ok(&self) -> bool {
        self.sum == 0 && self.mismatched.is_empty() && self.problems.is_empty()
    }
}

/// What an `Idempotency-Key` means for a request that presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyClaim {
    /// First use: the key is now held for this request, which should run and then be finished
    /// (or aborted when it failed).
    Fresh,
    /// The key's request ran: its answer's status and sealed body.
    Replay {
        status: u16,
        sealed_response: String,
    },
    /// The first request with the key is still running.
    InProgress,
    /// The key was used with another request body.
    Mismatch,
}
