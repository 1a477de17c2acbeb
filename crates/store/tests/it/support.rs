use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use gpurent_store::prelude::*;
use gpurent_store::testing::TestDatabase;
use gpurent_store::{Backend, NewNode, NewReservation, NewUser, SqlStore, Want};
use gpurent_types::agent::{GpuInfo, InstanceReport, InstanceState, SyncRequest};
use gpurent_types::{GpuType, Money, Role, Tier};

pub struct Fixture {
    pub store: Arc<SqlStore>,
    pub _db: TestDatabase,
}

pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("valid time")
}

/// One whole RTX 4090 for an hour, on demand, placed now or refused.
pub fn one_gpu(tenant: &str) -> NewReservation {
    NewReservation {
        tenant_id: tenant.to_owned(),
        created_by: None,
        gpu_type: GpuType::parse("rtx 4090").expect("type"),
        want: Want::Whole { count: 1 },
        duration_s: 3600,
        tier: Tier::OnDemand,
        bid: None,
        image: None,
        command: vec![],
        env: Default::default(),
        ports: vec![],
        http_ports: vec![],
        idempotency_key: None,
        request_hash: "h".into(),
        queue: false,
        on_node_loss: Default::default(),
        idle_reclaim: true,
        checkpoint: false,
        sealed_secrets: None,
        secret_names: vec![],
        limits: gpurent_store::TenantLimits::UNLIMITED,
        mounts: Vec::new(),
        node_filter: Default::default(),
        replica_of: None,
        array_of: None,
        avoid_nodes: Vec::new(),
        restart: Default::default(),
        max_restarts: 0,
    }
}

/// A heartbeat that reports one instance of a reservation.
pub fn report(id: &str, epoch: i64, state: InstanceState, exit_code: Option<i32>) -> SyncRequest {
    SyncRequest {
        gpus: vec![],
        instances: vec![InstanceReport {
            reservation_id: id.to_owned(),
            epoch,
            state,
            exit_code,
            message: None,
            ports: vec![],
            end_reason: None,
            disk: None,
            pull: None,
        }],
        known_version: None,
        wait_ms: None,
        telemetry: None,
        logs: vec![],
        host: None,
        events: Vec::new(),
        volumes: Vec::new(),
        volume_free_bytes: None,
        images: None,
    }
}

impl Fixture {
    /// The database's URL, for raw SQL (tampering, as an attacker with access would).
    pub fn url(&self) -> String {
        self._db.url.clone()
    }

    pub async fn new(backend: Backend) -> Fixture {
        let db = TestDatabase::new(backend).await.expect("test database");
        let store = SqlStore::connect(&db.url).await.expect("connect");
        Fixture {
            store: Arc::new(store),
            _db: db,
        }
    }

    pub async fn user(&self, name: &str, credit: &str) -> String {
        let user = self
            .store
            .create_user(
                NewUser {
                    name: name.to_owned(),
                    role: Role::Tenant,
                    token_hash: format!("hash-{name}"),
                    credit: credit.parse::<Money>().expect("money"),
                },
                t0(),
            )
            .await
            .expect("create user");
        user.id
    }

    /// A node with `count` GPUs of `model` (24 GiB each).
    pub async fn node(&self, name: &str, model: &str, count: u32) -> String {
        self.node_owned(name, model, count).await.0
    }

    /// A node as `node` makes it, and the id of the user who owns it.
    pub async fn node_owned(&self, name: &str, model: &str, count: u32) -> (String, String) {
        let admin = self.user(&format!("admin-of-{name}"), "0").await;
        self.store
            .create_join_token(
                &format!("join-{name}"),
                &admin,
                t0() + chrono::Duration::days(1),
                t0(),
            )
            .await
            .expect("join token");
        let gpus = (0..count)
            .map(|i| GpuInfo::basic(i, format!("GPU-{name}-{i}"), model.to_owned(), 24_576))
            .collect();
        let node = self
            .store
            .register_node(
                NewNode {
                    join_token_hash: format!("join-{name}"),
                    node_token_hash: format!("node-{name}"),
                    name: name.to_owned(),
                    executor: "sim".to_owned(),
                    gpu_backend: "sim".to_owned(),
                    gpus,
                    verification: None,
                    isolated: true,
                    shared_network: false,
                },
                t0(),
            )
            .await
            .expect("register node");
        (node, admin)
    }
}

pub fn assert_send_sync<T: Store + Send + Sync>(_: &T) {}

/// Counts the queries the store sends, each a round trip to the database (sqlx logs each at
/// trace level as `sqlx::query`; a batch of statements sent together counts once). Installed
/// as the global subscriber by a test that runs in a process of its own (nextest).
pub struct Statements(pub std::sync::atomic::AtomicU64);

impl tracing::Subscriber for Statements {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// How many reservations the tenant has, read on a connection of its own (PostgreSQL).
pub async fn reservations_of(f: &Fixture, tenant: &str) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&f.url())
        .await
        .expect("connect");
    sqlx::query_scalar("SELECT count(*) FROM reservations WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&mut conn)
        .await
        .expect("count")
}
