//! `TestApp`: a control plane on an ephemeral loopback port with a fresh database and
//! in-process simulated agents, and HTTP clients for its users.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig, CpuSource, RetryPolicy};
use gpurent_server::{hash_token, HostPolicy, RunningServer, ScaleConfig, ServerConfig};
use gpurent_store::prelude::*;
use gpurent_store::testing::TestDatabase;
use gpurent_store::{Backend, SqlStore};
use gpurent_types::{Clock, ManualClock, SystemClock};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;

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

type RunningAgent = (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), gpurent_agent::AgentError>>,
);

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

/// A TCP proxy between one agent and the control plane whose link can be cut (every
/// connection dropped, new ones refused) and healed: a network partition.
struct Link {
    name: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
    connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl Link {
    async fn to(name: &str, target: std::net::SocketAddr) -> (String, Link) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (is_cut, open) = (cut.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_cut.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let copy = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                open.lock().expect("lock").push(copy);
            }
        });
        (
            format!("http://{addr}"),
            Link {
                name: name.to_owned(),
                cut,
                connections,
                _accept: accept,
            },
        )
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for c in self.connections.lock().expect("lock").drain(..) {
                c.abort();
            }
        }
    }
}

#[derive(Clone)]
struct AgentParts {
    name: String,
    dir: std::path::PathBuf,
    gpus: Arc<dyn gpurent_agent::GpuBackend>,
    executor: Arc<dyn gpurent_agent::Executor>,
    sim: Option<Arc<SimExecutor>>,
    index: usize,
    /// What the agent's `/metrics` shows.
    metrics: Arc<gpurent_agent::AgentMetrics>,
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
    /// Joins a simulated agent, exactly as a remote one would, and waits until it is ready.
    pub async fn add_node(&mut self, name: &str, spec: &str) {
        let gpus = Arc::new(SimGpus::parse(spec, name).expect("spec"));
        self.add_node_with(name, gpus).await;
    }

    /// Joins an agent with one simulated RTX 4090 and the process executor (unisolated, no
    /// cgroup limits, this grace before SIGKILL); returns the executor's data dir.
    pub async fn add_process_node(&mut self, name: &str, grace: Duration) -> std::path::PathBuf {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().to_owned();
        let executor = gpurent_agent::executor::ProcessExecutor::unisolated(
            &path,
            None,
            gpurent_agent::executor::ResourcesPerGpu::default(),
        )
        .expect("process executor")
        .with_grace(grace);
        let gpus = Arc::new(SimGpus::parse("1xRTX4090", name).expect("spec"));
        self.add_node_running(name, gpus, Arc::new(executor)).await;
        self._dirs.push(dir);
        path
    }

    /// Joins an agent with these GPUs (the fake NVML, say) and the sim executor.
    pub async fn add_node_with(&mut self, name: &str, gpus: Arc<dyn gpurent_agent::GpuBackend>) {
        let sim = Arc::new(SimExecutor::new());
        self.add_node_running(name, gpus, sim.clone()).await;
        if let Some(parts) = self.agent_parts.last_mut() {
            parts.sim = Some(sim);
        }
    }

    /// What the node's agent's `/metrics` shows (serve it with `gpurent_agent::metrics::serve`).
    pub fn agent_metrics(&self, name: &str) -> Arc<gpurent_agent::AgentMetrics> {
        self.agent_parts
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.metrics.clone())
            .expect("an agent of that name")
    }

    /// The sim executor of the node's agent: what "runs" there, as the executor sees it.
    pub fn sim_executor(&self, name: &str) -> Arc<SimExecutor> {
        self.agent_parts
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.sim.clone())
            .expect("a node with the sim executor")
    }

    /// Kills the node's agent without a clean shutdown (its task is aborted mid-flight, as
    /// by SIGKILL); what its executor runs keeps running, as containers outlive their agent.
    pub async fn kill_agent(&mut self, name: &str) {
        let parts = self
            .agent_parts
            .iter()
            .find(|p| p.name == name)
            .expect("agent")
            .clone();
        let (_, task) = &self.agents[parts.index];
        task.abort();
        while !task.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Starts the node's agent again with its data dir, GPUs and executor (it resumes its
    /// node identity and adopts what its executor runs).
    pub async fn restart_agent(&mut self, name: &str) {
        self.restart_agent_with(name, None).await;
    }

    /// Restarts the node's agent with other simulated GPUs (`spec`, named as the node's own:
    /// `"1xRTX4090"` keeps the first of two and drops the second).
    pub async fn restart_agent_with_gpus(&mut self, name: &str, spec: &str) {
        let gpus: Arc<dyn gpurent_agent::GpuBackend> =
            Arc::new(SimGpus::parse(spec, name).expect("spec"));
        self.restart_agent_with(name, Some(gpus)).await;
    }

    async fn restart_agent_with(
        &mut self,
        name: &str,
        gpus: Option<Arc<dyn gpurent_agent::GpuBackend>>,
    ) {
        if let Some(gpus) = gpus {
            if let Some(p) = self.agent_parts.iter_mut().find(|p| p.name == name) {
                p.gpus = gpus;
            }
        }
        let parts = self
            .agent_parts
            .iter()
            .find(|p| p.name == name)
            .expect("agent")
            .clone();
        let mut config = AgentConfig::new(&self.base, parts.dir.clone(), name);
        self.configure_agent(&mut config);
        let agent = Agent::new(config, parts.gpus.clone(), parts.executor.clone());
        if let Some(p) = self.agent_parts.iter_mut().find(|p| p.name == name) {
            p.metrics = agent.metrics();
        }
        let (stop, stopped) = watch::channel(false);
        self.agents[parts.index] = (stop, tokio::spawn(agent.run(stopped)));
    }

    /// Cuts the node's agent off the control plane (built `with_cuttable_links`): a partition.
    pub fn cut(&self, name: &str) {
        self.link(name).set_cut(true);
    }

    /// Heals the partition made by `cut`.
    pub fn heal(&self, name: &str) {
        self.link(name).set_cut(false);
    }

    fn link(&self, name: &str) -> &Link {
        self.links
            .iter()
            .find(|l| l.name == name)
            .expect("an agent behind a cuttable link")
    }

    fn configure_agent(&self, config: &mut AgentConfig) {
        config.heartbeat = Duration::from_millis(300);
        config.lease = self.lease;
        config.cpu = self.agent_cpu.clone();
        config.burn_in = self.burn_in.clone();
        config.retry = RetryPolicy {
            tries: 3,
            delay: Duration::from_millis(100),
        };
    }

    /// Joins an agent with these GPUs and this executor.
    pub async fn add_node_running(
        &mut self,
        name: &str,
        gpus: Arc<dyn gpurent_agent::GpuBackend>,
        executor: Arc<dyn gpurent_agent::Executor>,
    ) {
        let admin = self.admin();
        self.join(&admin, name, gpus, executor).await;
    }

    /// Joins a simulated agent with a join token of `owner` (a host), whose node it becomes.
    pub async fn add_node_owned(&mut self, owner: &Client, name: &str, spec: &str) {
        let gpus = Arc::new(SimGpus::parse(spec, name).expect("spec"));
        self.join(owner, name, gpus, Arc::new(SimExecutor::new()))
            .await;
    }

    async fn join(
        &mut self,
        owner: &Client,
        name: &str,
        gpus: Arc<dyn gpurent_agent::GpuBackend>,
        executor: Arc<dyn gpurent_agent::Executor>,
    ) {
        let (status, token) = owner.post("/api/v1/nodes/join-token", &json!({})).await;
        assert_eq!(status, StatusCode::CREATED, "{token}");
        let dir = tempfile::tempdir().expect("tempdir");
        let server = if self.cuttable {
            let addr = self.server.as_ref().expect("running").addr;
            let (url, link) = Link::to(name, addr).await;
            self.links.push(link);
            url
        } else {
            self.base.clone()
        };
        let mut config = AgentConfig::new(&server, dir.path().to_owned(), name);
        config.join_token = token["token"].as_str().map(str::to_owned);
        self.configure_agent(&mut config);
        let agent = Agent::new(config, gpus.clone(), executor.clone());
        self.agent_parts.push(AgentParts {
            name: name.to_owned(),
            dir: dir.path().to_owned(),
            gpus,
            executor,
            sim: None,
            index: self.agents.len(),
            metrics: agent.metrics(),
        });
        let (stop, stopped) = watch::channel(false);
        self.agents.push((stop, tokio::spawn(agent.run(stopped))));
        self._dirs.push(dir);
        self.eventually("the node to be ready", || async {
            let (_, nodes) = self.admin().get("/api/v1/nodes").await;
            nodes.as_array().is_some_and(|ns| {
                // Joined: ready, or kept out by host verification.
                ns.iter().any(|n| {
                    n["name"] == name && (n["status"] == "ready" || n["status"] == "unverified")
                })
            })
        })
        .await;
    }

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

/// Of the two nodes `node-0` and `node-1` (`with_sim_gpus` twice), the one that is not `first`.
pub fn other_node(first: &str) -> &'static str {
    if first == "node-0" {
        "node-1"
    } else {
        "node-0"
    }
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: String,
    pub client: Client,
}

#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn decode(response: reqwest::Response) -> (StatusCode, Value) {
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The whole response of a GET, headers included.
    pub async fn get_response(&self, path: &str) -> reqwest::Response {
        self.request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("send")
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        Self::decode(
            self.request(reqwest::Method::GET, path)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        Self::decode(
            self.request(reqwest::Method::POST, path)
                .json(body)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        Self::decode(
            self.request(reqwest::Method::PATCH, path)
                .json(body)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    pub async fn post_with_key(&self, path: &str, body: &Value, key: &str) -> (StatusCode, Value) {
        let r = self
            .request(reqwest::Method::POST, path)
            .header("Idempotency-Key", key)
            .json(body);
        Self::decode(r.send().await.expect("send")).await
    }

    /// A POST without a body, with an `Idempotency-Key`.
    pub async fn post_empty_with_key(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let r = self
            .request(reqwest::Method::POST, path)
            .header("Idempotency-Key", key);
        Self::decode(r.send().await.expect("send")).await
    }

    /// A raw body with a content type, for malformed requests.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let r = self
            .request(reqwest::Method::POST, path)
            .header("content-type", content_type)
            .body(body);
        Self::decode(r.send().await.expect("send")).await
    }

    /// A text answer and one of its headers.
    pub async fn get_text(&self, path: &str, header: &str) -> (StatusCode, String, Option<String>) {
        let (status, bytes, value) = self.get_bytes(path, header).await;
        let text = String::from_utf8(bytes).expect("a UTF-8 body");
        (status, text, value)
    }

    /// A GET whose body is kept as its bytes (an instance's output need not be UTF-8), with
    /// the status and one header.
    pub async fn get_bytes(
        &self,
        path: &str,
        header: &str,
    ) -> (StatusCode, Vec<u8>, Option<String>) {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("send");
        let status = response.status();
        let value = response
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (
            status,
            response.bytes().await.expect("body").to_vec(),
            value,
        )
    }

    /// Any request: its status, headers and JSON (or text) body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self.request(method, path);
        if let Some(body) = body {
            r = r.json(body);
        }
        let response = r.send().await.expect("send");
        let headers = response.headers().clone();
        let (status, body) = Self::decode(response).await;
        (status, headers, body)
    }

    /// The reservation once it has this status, polled for at most `within`.
    pub async fn wait_status(&self, id: &str, status: &str, within: Duration) -> Value {
        let path = format!("/api/v1/reservations/{id}");
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let (_, r) = self.get(&path).await;
            if r["status"] == status {
                return r;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("reservation {id} never became {status}; last seen {r}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A reservation's whole log as the API serves it, page after page, each page's
    /// `X-Log-Next-Offset` checked.
    pub async fn whole_log(&self, id: &str) -> Vec<u8> {
        let mut all = Vec::new();
        loop {
            let path = format!("/api/v1/reservations/{id}/logs?offset={}", all.len());
            let (status, page, next) = self.get_bytes(&path, "x-log-next-offset").await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&page));
            if page.is_empty() {
                return all;
            }
            all.extend_from_slice(&page);
            assert_eq!(next, Some(all.len().to_string()), "the next offset");
        }
    }

    pub async fn reserve(&self, body: Value) -> (StatusCode, Value) {
        self.post("/api/v1/reservations", &body).await
    }
}
