use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use gpurent_store::prelude::*;
use gpurent_store::testing::TestDatabase;
use gpurent_store::{Backend, NewNode, NewUser, SqlStore};
use gpurent_types::agent::GpuInfo;
use gpurent_types::{Money, Role};

pub struct Fixture {
    pub store: Arc<SqlStore>,
    pub _db: TestDatabase,
}

pub fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("valid time")
}

impl Fixture {
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
                },
                t0(),
            )
            .await
            .expect("register node");
        (node, admin)
    }
}

pub fn assert_send_sync<T: Store + Send + Sync>(_: &T) {}
