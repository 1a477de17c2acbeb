//! The simulated agents of `gpurent bench fleet`: each registers like a real agent and syncs
//! over HTTP as its sync loop does (long polls of three quarters of a heartbeat, telemetry on
//! every sync, the inventory and host facts when it starts and after it started an instance),
//! at a fraction of its cost: one HTTP client for all, each request body serialized once until
//! what it says changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use gpurent_types::agent::{
    GpuInfo, GpuProcess, GpuSample, HostFacts, InstanceReport, InstanceState, NodeRegistered,
    NodeTelemetry, RegisterNode, SyncRequest, SyncResponse,
};
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use tokio::sync::watch;

/// The agent's default heartbeat, and its long poll (three quarters of it).
pub const HEARTBEAT: Duration = Duration::from_secs(2);
pub const WAIT: Duration = Duration::from_millis(1500);

/// What every simulated agent shares: where to sync, what is measured, and the reservations
/// posted and not yet seen by their node (to time placement to the agent's answer).
pub struct Fleet {
    pub http: reqwest::Client,
    pub base: String,
    pub join_token: String,
    pub gpus_per_node: u32,
    /// Syncs answered while this is set are counted.
    pub measuring: AtomicBool,
    pub posted: Mutex<HashMap<String, Instant>>,
    pub errors: AtomicU64,
    pub first_error: Mutex<Option<String>>,
}

impl Fleet {
    pub fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(what);
        }
    }
}

/// What one simulated agent measured while the fleet was measuring.
#[derive(Debug, Default)]
pub struct AgentStats {
    /// Syncs answered, whatever their latency.
    pub syncs: u64,
    /// The time the control plane took for a sync, less the long poll it held it for: syncs
    /// sent without a known version (not held) and held ones answered at the end of their
    /// wait (unchanged version). Those woken early by a change are counted apart.
    pub latencies: Vec<Duration>,
    pub woken: u64,
    /// From a reservation's creation to its agent's answer naming it.
    pub placements: Vec<Duration>,
}

/// A node's inventory: `gpus` simulated RTX 4090s.
pub fn inventory(n: u32, gpus: u32) -> Vec<GpuInfo> {
    (0..gpus)
        .map(|i| {
            let mut g = GpuInfo::basic(
                i,
                format!("GPU-fleet-{n:05}-{i}"),
                "NVIDIA GeForce RTX 4090".into(),
                24_564,
            );
            g.pcie_gen = Some(4);
            g.pcie_width = Some(16);
            g.pcie_gen_max = Some(4);
            g.pcie_width_max = Some(16);
            g.switch_group = Some(i / 4);
            g
        })
        .collect()
}

pub fn host_facts() -> HostFacts {
    HostFacts {
        driver_version: Some("550.54.15".into()),
        cuda_version: Some("12.4".into()),
        disk_free_mb: Some(900_000),
        isolated: Some(true),
        cpus: Some(64),
        memory_mb: Some(512_000),
        ..HostFacts::default()
    }
}

/// A sample of every GPU as the fake NVML backend gives it: busy with a process of its
/// instance where one runs, idle otherwise.
pub fn telemetry(
    gpus: &[GpuInfo],
    running: &BTreeMap<String, (i64, Vec<String>)>,
) -> NodeTelemetry {
    let holder = |uuid: &str| {
        running
            .iter()
            .find(|(_, (_, g))| g.iter().any(|u| u == uuid))
            .map(|(id, _)| id.clone())
    };
    NodeTelemetry {
        burn_in: None,
        driver_version: Some("550.54.15".into()),
        cuda_version: Some("12.4".into()),
        gpus: gpus
            .iter()
            .map(|g| {
                let holder = holder(&g.uuid);
                GpuSample {
                    uuid: g.uuid.clone(),
                    utilization_pct: if holder.is_some() { 87 } else { 0 },
                    memory_used_mb: if holder.is_some() { 18_200 } else { 1 },
                    temperature_c: if holder.is_some() { 71 } else { 34 },
                    power_mw: if holder.is_some() { 380_000 } else { 21_000 },
                    ecc_uncorrected: 0,
                    memory_total_mb: g.vram_mb,
                    xid_errors: Vec::new(),
                    lost: false,
                    processes: holder
                        .map(|id| GpuProcess {
                            pid: 4242,
                            used_mb: 18_100,
                            reservation_id: Some(id),
                        })
                        .into_iter()
                        .collect(),
                }
            })
            .collect(),
        cpu_utilization_pct: Some(12),
    }
}

/// Registers node `n` with the join token: its node id and the `Authorization` header of its
/// syncs.
pub async fn register(fleet: &Fleet, n: u32) -> anyhow::Result<HeaderValue> {
    let body = RegisterNode {
        join_token: fleet.join_token.clone(),
        name: format!("fleet-{n:05}"),
        executor: "sim".into(),
        gpu_backend: "nvml".into(),
        gpus: inventory(n, fleet.gpus_per_node),
        host: Some(host_facts()),
        csr: None,
    };
    let response = fleet
        .http
        .post(format!("{}/api/v1/agent/register", fleet.base))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("register node {n}"))?;
    let status = response.status();
    if !status.is_success() {
        let text = response.text().await.unwrap_or_default();
        anyhow::bail!("registering node {n} was answered {status}: {text}");
    }
    let registered: NodeRegistered = response.json().await?;
    Ok(HeaderValue::from_str(&format!(
        "Bearer {}",
        registered.node_token
    ))?)
}

/// Node `n`'s sync loop until `stop`, starting after `delay` (agents of a real fleet do not
/// sync in step).
pub async fn run(
    fleet: Arc<Fleet>,
    n: u32,
    auth: HeaderValue,
    delay: Duration,
    mut stop: watch::Receiver<bool>,
) -> AgentStats {
    let mut stats = AgentStats::default();
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        _ = stop.changed() => return stats,
    }
    let url = format!("{}/api/v1/agent/sync", fleet.base);
    let gpus = inventory(n, fleet.gpus_per_node);
    let host = host_facts();
    // Instances running (by reservation: epoch and GPUs) and being stopped (reported stopped).
    let mut running: BTreeMap<String, (i64, Vec<String>)> = BTreeMap::new();
    let mut stopping: BTreeMap<String, i64> = BTreeMap::new();
    let mut known_version: Option<i64> = None;
    let mut body: Option<Vec<u8>> = None;
    while !*stop.borrow() {
        let payload = match &body {
            Some(b) => b.clone(),
            None => {
                let request = sync_request(&gpus, &host, &running, &stopping, known_version);
                let bytes = serde_json::to_vec(&request).unwrap_or_default();
                body = Some(bytes.clone());
                bytes
            }
        };
        let sent = Instant::now();
        let call = fleet
            .http
            .post(&url)
            .header(AUTHORIZATION, auth.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(payload)
            .timeout(WAIT + Duration::from_secs(30))
            .send();
        let answer = tokio::select! {
            r = call => r,
            _ = stop.changed() => break,
        };
        let answer = match answer {
            Ok(r) if r.status().is_success() => r.json::<SyncResponse>().await,
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                fleet.error(format!("node {n}: sync answered {status}: {text}"));
                pause(&mut stop).await;
                continue;
            }
            Err(e) => Err(e),
        };
        let response = match answer {
            Ok(r) => r,
            Err(e) => {
                fleet.error(format!("node {n}: sync failed: {e}"));
                pause(&mut stop).await;
                continue;
            }
        };
        let elapsed = sent.elapsed();
        let measuring = fleet.measuring.load(Ordering::Relaxed);
        if measuring {
            stats.syncs += 1;
            match known_version {
                None => stats.latencies.push(elapsed),
                Some(v) if v == response.version => {
                    stats.latencies.push(elapsed.saturating_sub(WAIT));
                }
                Some(_) => stats.woken += 1,
            }
        }
        // What the agent does with the answer: start what is new, stop what is to stop, forget
        // what is no longer listed.
        let mut started = false;
        let before = (running.len(), stopping.len());
        for a in &response.assignments {
            if a.run && !running.contains_key(&a.reservation_id) {
                running.insert(a.reservation_id.clone(), (a.epoch, a.gpus.clone()));
                started = true;
                let posted = fleet
                    .posted
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&a.reservation_id);
                if let (Some(at), true) = (posted, measuring) {
                    stats.placements.push(at.elapsed());
                }
            } else if !a.run {
                running.remove(&a.reservation_id);
                stopping.insert(a.reservation_id.clone(), a.epoch);
            }
        }
        let listed = |id: &String| response.assignments.iter().any(|a| &a.reservation_id == id);
        running.retain(|id, _| listed(id));
        stopping.retain(|id, _| listed(id));
        let next = if started {
            // Report the new instances at once, with the inventory (as the agent does).
            None
        } else {
            Some(response.version)
        };
        if started || next != known_version || (running.len(), stopping.len()) != before {
            body = None;
        }
        known_version = next;
    }
    stats
}

/// A sync's request as the agent sends it: what runs and what is being stopped, telemetry every
/// time, the inventory and host facts until the control plane has them (no known version).
pub fn sync_request(
    gpus: &[GpuInfo],
    host: &HostFacts,
    running: &BTreeMap<String, (i64, Vec<String>)>,
    stopping: &BTreeMap<String, i64>,
    known_version: Option<i64>,
) -> SyncRequest {
    let mut instances: Vec<InstanceReport> = running
        .iter()
        .map(|(id, (epoch, _))| report(id, *epoch, InstanceState::Running))
        .collect();
    instances.extend(
        stopping
            .iter()
            .map(|(id, epoch)| report(id, *epoch, InstanceState::Stopped)),
    );
    SyncRequest {
        gpus: if known_version.is_none() {
            gpus.to_vec()
        } else {
            Vec::new()
        },
        instances,
        known_version,
        wait_ms: Some(u64::try_from(WAIT.as_millis()).unwrap_or(1500)),
        telemetry: Some(telemetry(gpus, running)),
        logs: Vec::new(),
        host: known_version.is_none().then(|| host.clone()),
        events: Vec::new(),
        volumes: Vec::new(),
        volume_free_bytes: None,
        images: None,
    }
}

fn report(id: &str, epoch: i64, state: InstanceState) -> InstanceReport {
    InstanceReport {
        reservation_id: id.to_owned(),
        epoch,
        state,
        exit_code: None,
        message: None,
        ports: Vec::new(),
        end_reason: None,
        disk: None,
        pull: None,
    }
}

/// After a failed sync the agent waits a heartbeat.
async fn pause(stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(HEARTBEAT) => {}
        _ = stop.changed() => {}
    }
}
