//! The agents of a `TestApp`: simulated (or process-executor) agents joined as a remote one
//! would, killed and restarted, each behind a link that can be cut.

use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::executor::SimExecutor;
use gpurent_agent::gpu::SimGpus;
use gpurent_agent::{Agent, AgentConfig, RetryPolicy};
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::watch;

use super::client::Client;
use super::link::Link;
use super::TestApp;

pub(super) type RunningAgent = (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), gpurent_agent::AgentError>>,
);

#[derive(Clone)]
pub(super) struct AgentParts {
    name: String,
    dir: std::path::PathBuf,
    gpus: Arc<dyn gpurent_agent::GpuBackend>,
    executor: Arc<dyn gpurent_agent::Executor>,
    sim: Option<Arc<SimExecutor>>,
    index: usize,
    /// What the agent's `/metrics` shows.
    metrics: Arc<gpurent_agent::AgentMetrics>,
}

impl TestApp {
    /// A node joined through the agent protocol by hand, with no agent running for it: one
    /// RTX 4090, `GPU-<name>-0`. Returns its agent's client and the body of a sync that
    /// reports nothing new.
    pub async fn node_by_hand(&self, name: &str) -> (Client, serde_json::Value) {
        let (status, join) = self
            .admin()
            .post("/api/v1/nodes/join-token", &json!({}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{join}");
        let gpus = json!([{"index": 0, "uuid": format!("GPU-{name}-0"),
                           "model": "NVIDIA GeForce RTX 4090", "vram_mb": 24564}]);
        let register = json!({
            "join_token": join["token"],
            "name": name,
            "executor": "sim",
            "gpu_backend": "sim",
            "gpus": gpus,
        });
        let (status, node) = self
            .anonymous()
            .post("/api/v1/agent/register", &register)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{node}");
        (
            self.client(node["node_token"].as_str()),
            json!({"gpus": gpus, "instances": []}),
        )
    }

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
}

/// Of the two nodes `node-0` and `node-1` (`with_sim_gpus` twice), the one that is not `first`.
pub fn other_node(first: &str) -> &'static str {
    if first == "node-0" {
        "node-1"
    } else {
        "node-0"
    }
}
