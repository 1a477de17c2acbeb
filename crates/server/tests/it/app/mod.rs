//! `TestApp`: a control plane on an ephemeral loopback port with a fresh database and
//! in-process simulated agents (`agents`, each behind a `link` a test can cut), and HTTP clients
//! for its users (`client`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use gpurent_agent::CpuSource;
use gpurent_server::{hash_token, HostPolicy, RunningServer, ScaleConfig, ServerConfig};
use gpurent_store::prelude::*;
use gpurent_store::testing::TestDatabase;
use gpurent_store::{Backend, SqlStore};
use gpurent_types::{Clock, ManualClock, SystemClock};
use reqwest::StatusCode;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "gpr_test_admin";

pub struct TestAppBuilder {
    backend: Backend,
    nodes: Vec<String>,
    manual_clock: bool,
    lease: Duration,
    prices: Option<String>,
    scale: Option<ScaleConfig>,
    agent_cpu: CpuSource,
    host_policy: Option<HostPolicy>,
    idle_reclaim: Option<Duration>,
    alert_webhook: Option<String>,
    burn_in: Option<gpurent_agent::BurnInConfig>,
    liveness: Option<(Duration, u32)>,
    cuttable: bool,
    configure: Option<fn(&mut ServerConfig)>,
}

mod agents;
mod client;
mod link;
mod teams;

pub use agents::other_node;
use agents::{AgentParts, RunningAgent};
pub use client::{Client, Tenant};
use link::Link;

pub struct TestApp {
    pub server: Option<RunningServer>,
    pub base: String,
    pub store: Arc<SqlStore>,
    pub clock: Option<ManualClock>,
    lease: Duration,
    agent_cpu: CpuSource,
    burn_in: Option<gpurent_agent::BurnInConfig>,
    agents: Vec<RunningAgent>,
    /// Each agent's name, data dir, GPUs and executor, to restart it after `kill_agent`.
    agent_parts: Vec<AgentParts>,
    cuttable: bool,
    links: Vec<Link>,
    _dirs: Vec<tempfile::TempDir>,
    _db: TestDatabase,
}

impl TestApp {
    pub fn with(backend: Backend) -> TestAppBuilder {
        TestAppBuilder {
            backend,
            nodes: Vec::new(),
            manual_clock: false,
            lease: Duration::from_secs(30),
            prices: None,
            scale: None,
            agent_cpu: CpuSource::default(),
            host_policy: None,
            idle_reclaim: None,
            alert_webhook: None,
            burn_in: None,
            liveness: None,
            cuttable: false,
            configure: None,
        }
    }
}

impl TestAppBuilder {
    /// One node with these simulated GPUs, e.g. `"4xRTX4090"`.
    pub fn with_sim_gpus(mut self, spec: &str) -> Self {
        self.nodes.push(spec.to_owned());
        self
    }

    /// How long agents keep running without the control plane before fencing themselves.
    pub fn with_agent_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Prices from this price file (see `gpurent_billing::PriceList::from_toml`).
    pub fn with_prices(mut self, toml: &str) -> Self {
        self.prices = Some(toml.to_owned());
        self
    }

    /// Elastic capacity with these settings (the scale policy and its hook).
    pub fn with_scale(mut self, scale: ScaleConfig) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Host verification rules (default: production's, but any free disk, so that a full test
    /// machine does not keep every node out).
    pub fn with_host_policy(mut self, policy: HostPolicy) -> Self {
        self.host_policy = Some(policy);
        self
    }

    /// Agents burn their GPUs in while idle with this.
    pub fn with_burn_in(mut self, burn_in: gpurent_agent::BurnInConfig) -> Self {
        self.burn_in = Some(burn_in);
        self
    }

    /// POST every event to this URL.
    pub fn with_alert_webhook(mut self, url: String) -> Self {
        self.alert_webhook = Some(url);
        self
    }

    /// Stop reservations whose GPUs have been idle this long (default: never, in tests).
    pub fn with_idle_reclaim(mut self, idle: Duration) -> Self {
        self.idle_reclaim = Some(idle);
        self
    }

    /// Agents report this CPU utilisation instead of the test machine's.
    pub fn with_agent_cpu(mut self, pct: u32) -> Self {
        self.agent_cpu = CpuSource::Fixed(pct);
        self
    }

    /// Node liveness: the heartbeat interval and the heartbeats a node may miss before it is
    /// fenced as `lost`. By default nodes are never fenced with a manual clock (its jumps would
    /// fence them all) and only after 30 s with the real one.
    pub fn with_liveness(mut self, interval: Duration, missed: u32) -> Self {
        self.liveness = Some((interval, missed));
        self
    }

    /// Agents reach the control plane through proxies that `TestApp::cut` can cut.
    pub fn with_cuttable_links(mut self) -> Self {
        self.cuttable = true;
        self
    }

    /// A clock that moves only with `TestApp::advance`.
    /// Changes the server's configuration last (rate limits, caps, ...).
    pub fn with_config(mut self, configure: fn(&mut ServerConfig)) -> Self {
        self.configure = Some(configure);
        self
    }

    pub fn with_manual_clock(mut self) -> Self {
        self.manual_clock = true;
        self
    }

    pub async fn start(self) -> TestApp {
        // GPURENT_TEST_LOG=debug (an env filter) shows what the server and agents do.
        if let Ok(filter) = std::env::var("GPURENT_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let db = TestDatabase::new(self.backend)
            .await
            .expect("test database");
        let store = Arc::new(SqlStore::connect(&db.url).await.expect("connect store"));
        let manual = self.manual_clock.then(|| {
            ManualClock::new(
                Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0)
                    .single()
                    .expect("time"),
            )
        });
        let clock: Arc<dyn Clock> = match &manual {
            Some(m) => Arc::new(m.clone()),
            None => Arc::new(SystemClock),
        };
        store
            .ensure_admin(&hash_token(ADMIN_TOKEN), clock.now())
            .await
            .expect("admin");
        let (heartbeat_interval, missed_heartbeats) = self.liveness.unwrap_or((
            Duration::from_secs(2),
            if self.manual_clock { u32::MAX } else { 15 },
        ));
        let mut config = ServerConfig {
            maintenance_interval: Duration::from_millis(100),
            heartbeat_interval,
            missed_heartbeats,
            // Polling helpers (`eventually`) ask many times a second; `limits.rs` tests the
            // rate limits with a configuration of its own.
            rate_limits: gpurent_server::RateLimits {
                per_token: None,
                per_address: None,
            },
            // Every test client is 127.0.0.1, some hundreds of connections at once
            // (`concurrency.rs`); `slow_clients.rs` tests the caps with a configuration of its own.
            http: gpurent_server::HttpLimits {
                max_connections_per_ip: None,
                ..gpurent_server::HttpLimits::default()
            },
            ..ServerConfig::default()
        };
        if let Some(toml) = &self.prices {
            config.prices = gpurent_billing::PriceList::from_toml(toml).expect("price file");
        }
        if let Some(scale) = self.scale.clone() {
            config.scale = scale;
        }
        config.idle_reclaim = self.idle_reclaim;
        config.alert_webhook = self.alert_webhook.clone();
        config.host_policy = self.host_policy.clone().unwrap_or(HostPolicy {
            min_disk_free_gb: 0,
            ..HostPolicy::default()
        });
        if let Some(configure) = self.configure {
            configure(&mut config);
        }
        let server = RunningServer::start(
            "127.0.0.1:0".parse().expect("addr"),
            store.clone(),
            clock,
            config,
        )
        .await
        .expect("start server");
        let base = format!("http://{}", server.addr);
        let mut app = TestApp {
            server: Some(server),
            base,
            store,
            clock: manual,
            lease: self.lease,
            agent_cpu: self.agent_cpu.clone(),
            burn_in: self.burn_in.clone(),
            agents: Vec::new(),
            agent_parts: Vec::new(),
            cuttable: self.cuttable,
            links: Vec::new(),
            _dirs: Vec::new(),
            _db: db,
        };
        for (i, spec) in self.nodes.iter().enumerate() {
            app.add_node(&format!("node-{i}"), spec).await;
        }
        app
    }
}

impl TestApp {
    pub fn client(&self, token: Option<&str>) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: self.base.clone(),
            token: token.map(str::to_owned),
        }
    }

    pub fn admin(&self) -> Client {
        self.client(Some(ADMIN_TOKEN))
    }

    pub fn anonymous(&self) -> Client {
        self.client(None)
    }

    /// A tenant with this much credit.
    pub async fn tenant(&self, name: &str, credit: &str) -> Tenant {
        self.user(name, "tenant", credit).await
    }

    /// A user of this role with this much credit.
    pub async fn user(&self, name: &str, role: &str, credit: &str) -> Tenant {
        let (status, body) = self
            .admin()
            .post(
                "/api/v1/users",
                &json!({"name": name, "role": role, "credit": credit}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        Tenant {
            id: body["id"].as_str().expect("id").to_owned(),
            client: self.client(body["token"].as_str()),
        }
    }

    pub fn advance(&self, by: chrono::Duration) {
        self.clock
            .as_ref()
            .expect("built with_manual_clock")
            .advance(by);
    }

    /// Waits until every node has sent a heartbeat since the manual clock last moved (until
    /// then a jump of the clock makes them look unreachable).
    pub async fn wait_nodes_ready(&self) {
        self.eventually("every node to be ready", || async {
            let (_, nodes) = self.admin().get("/api/v1/nodes").await;
            nodes
                .as_array()
                .is_some_and(|ns| ns.iter().all(|n| n["status"] == "ready"))
        })
        .await;
    }

    pub async fn maintenance_tick(&self) {
        self.server
            .as_ref()
            .expect("running")
            .maintenance_tick()
            .await
            .expect("tick");
    }

    /// Polls until `check` holds; agents and the server run in real time.
    pub async fn eventually<F, Fut>(&self, what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        for _ in 0..400 {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}");
    }

    /// Waits until the reservation has this status, as its owner sees it.
    pub async fn wait_status(&self, client: &Client, id: &str, status: &str) -> Value {
        client
            .wait_status(id, status, Duration::from_secs(10))
            .await
    }

    /// Stores must always be consistent: no GPU memory without an owner and the ledger balanced.
    pub async fn assert_consistent(&self) {
        let problems = self.store.allocation_problems().await.expect("check");
        assert!(problems.is_empty(), "{problems:?}");
        let ledger = self.store.ledger_check().await.expect("ledger");
        assert!(ledger.ok(), "{ledger:?}");
    }

    /// Restarts the control plane on the same database and address, as after a crash or an
    /// upgrade: a fresh store connection and server state; the agents keep running and
    /// reconnect.
    pub async fn restart_server(&mut self) {
        let server = self.server.take().expect("running");
        let addr = server.addr;
        let clock = server.state.clock.clone();
        let config = (*server.state.config).clone();
        server.shutdown().await.expect("shutdown");
        self.store.close().await;
        let store = Arc::new(
            SqlStore::connect(&self._db.url)
                .await
                .expect("reopen store"),
        );
        self.store = store.clone();
        let server = RunningServer::start(addr, store, clock, config)
            .await
            .expect("restart server");
        self.server = Some(server);
    }

    /// The URL of the server's database.
    pub fn database_url(&self) -> &str {
        &self._db.url
    }

    /// Runs SQL on the database behind the server's back (as an attacker with access would).
    pub async fn raw_sql(&self, sql: &str) {
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&self._db.url)
            .await
            .expect("connect");
        sqlx::query(sql).execute(&mut conn).await.expect("raw SQL");
    }

    /// A node's status as `GET /nodes` shows it (empty when there is no such node).
    pub async fn node_status(&self, name: &str) -> String {
        let (_, nodes) = self.admin().get("/api/v1/nodes").await;
        nodes
            .as_array()
            .and_then(|ns| ns.iter().find(|n| n["name"] == name))
            .and_then(|n| n["status"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// A count from SQL run on the database behind the server's back.
    pub async fn raw_count(&self, sql: &str) -> i64 {
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&self._db.url)
            .await
            .expect("connect");
        sqlx::query_scalar(sql)
            .fetch_one(&mut conn)
            .await
            .expect("raw SQL")
    }

    pub async fn shutdown(mut self) {
        for (stop, _) in &self.agents {
            let _ = stop.send(true);
        }
        for (_, task) in self.agents.drain(..) {
            match task.await {
                Ok(done) => done.expect("agent"),
                // One killed by `kill_agent` and not restarted.
                Err(e) => assert!(e.is_cancelled(), "agent task: {e}"),
            }
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await.expect("shutdown");
        }
        self.store.close().await;
    }
}

impl Drop for TestApp {
    /// Agents that end (or a test that fails) leave their process executors' instances
    /// running; none may outlive the test.
    fn drop(&mut self) {
        for dir in &self._dirs {
            gpurent_agent::testing::kill_processes_naming(dir.path());
        }
    }
}
