//! The agent's loop: sync with the control plane (report actual state, receive desired state),
//! plan, act; and fence itself when the control plane is out of reach for longer than the lease.
//! Joining is `register`, the output a sync ships `output`, its ports and telemetry `report`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpurent_types::agent::{
    AgentEvent, Assignment, GpuInfo, HostFacts, InstanceState, PublishedPort, SyncRequest,
    AGENT_EVENT_DETAIL_MAX,
};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::burn_in::{BurnIn, BurnInConfig};
use crate::client::{ControlPlane, RetryPolicy};
use crate::cpu::{CpuSampler, CpuSource};
use crate::metrics::AgentMetrics;
use crate::reconcile::{self, Action, Observed, ObservedState};
use crate::stops::Stops;
use crate::tls::ClientTls;
use crate::vram::{Verdict, Watchdog};
use crate::{AgentError, CheckpointConfig, Executor, GpuBackend, NodeIdentity};

mod desired;
mod images;
mod output;
mod register;
mod report;

use desired::{mask_own_stops, running_assignments, running_gpus};
pub(crate) mod volumes;

/// The longest the end of an instance is held back while its output is shipped: output that
/// keeps coming (from a process it left behind) must not keep its reservation going.
const DRAIN_AT_MOST: Duration = Duration::from_secs(30);
/// Between SIGTERM and SIGKILL for an instance the VRAM watchdog stops: it had the whole
/// grace to give the memory back, and its neighbours on the GPU pay for every second more.
const VRAM_STOP_GRACE: Duration = Duration::from_secs(1);
/// The end reason of an instance the VRAM watchdog stopped.
const VRAM_EXCEEDED: &str = "vram_exceeded";
/// Events kept while the control plane is out of reach; older ones are dropped past this.
const EVENTS_KEPT: usize = 1000;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub server: String,
    pub join_token: Option<String>,
    pub data_dir: PathBuf,
    pub name: String,
    /// The longest time between two syncs (the heartbeat).
    pub heartbeat: Duration,
    /// Out of touch with the control plane for longer than this, the agent stops its instances.
    pub lease: Duration,
    /// The grace period of those stops: short enough that they are over before the control
    /// plane's node TTL runs out and it starts the work elsewhere.
    pub fence_grace: Duration,
    pub retry: RetryPolicy,
    /// Where the CPU utilisation in the telemetry comes from (`/proc/stat` by default).
    pub cpu: CpuSource,
    /// Periodic burn-in of the GPUs while the node is idle (off unless a command is given).
    pub burn_in: Option<BurnInConfig>,
    /// Where checkpoint volumes live, and the owner's hook for them.
    pub checkpoint: CheckpointConfig,
    /// How an `https://` control plane is trusted (`--ca-cert`, `--tls-fingerprint`); the
    /// node's client certificate is added once it has one.
    pub tls: ClientTls,
    /// How long an instance may stay over its share's GPU memory (or on a GPU not its own)
    /// before it is stopped (`--vram-grace-secs`).
    pub vram_grace: Duration,
    /// Tenants' volumes (`--volumes-dir`, `--shared-volumes-dir`); none: the node keeps none.
    pub volumes: Option<crate::volumes::VolumeStore>,
    /// Images to pull at start where missing, to keep them warm (`--prepull`).
    pub prepull: Vec<String>,
}

impl AgentConfig {
    pub fn new(server: &str, data_dir: PathBuf, name: &str) -> Self {
        AgentConfig {
            server: server.to_owned(),
            join_token: None,
            name: name.to_owned(),
            heartbeat: Duration::from_secs(2),
            lease: Duration::from_secs(30),
            fence_grace: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            cpu: CpuSource::default(),
            burn_in: None,
            checkpoint: CheckpointConfig::new(data_dir.join("checkpoints")),
            tls: ClientTls::default(),
            vram_grace: Duration::from_secs(10),
            volumes: None,
            prepull: Vec::new(),
            data_dir,
        }
    }
}

#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    gpus: Arc<dyn GpuBackend>,
    executor: Arc<dyn Executor>,
    client: ControlPlane,
    cpu: std::sync::Mutex<CpuSampler>,
    metrics: Arc<AgentMetrics>,
    volumes: Arc<volumes::Keeper>,
}

impl Agent {
    pub fn new(
        config: AgentConfig,
        gpus: Arc<dyn GpuBackend>,
        executor: Arc<dyn Executor>,
    ) -> Self {
        let client = Self::client(&config).unwrap_or_else(|e| {
            // `gpurent agent` checks the TLS settings before it starts; this is a fallback.
            tracing::error!(error = %e, "TLS settings not usable");
            ControlPlane::new(&config.server, config.retry)
        });
        let cpu = std::sync::Mutex::new(CpuSampler::new(config.cpu.clone()));
        Agent {
            metrics: Arc::new(AgentMetrics::new(&config.name)),
            volumes: Arc::new(volumes::Keeper::new(config.volumes.clone())),
            cpu,
            config,
            gpus,
            executor,
            client,
        }
    }

    /// The control plane's client: with the node's client certificate once it has one.
    fn client(config: &AgentConfig) -> Result<ControlPlane, AgentError> {
        let mut settings = config.tls.clone();
        settings.client_cert = NodeIdentity::client_cert(&config.data_dir);
        ControlPlane::with_tls(&config.server, config.retry, &settings)
    }

    /// What the agent's `/metrics` shows (`metrics::serve`): updated by every heartbeat.
    pub fn metrics(&self) -> Arc<AgentMetrics> {
        Arc::clone(&self.metrics)
    }

    /// The host as it is now, for the control plane's verification.
    fn host_facts(&self) -> HostFacts {
        let gpu_containers = self.executor.runs_containers() && self.gpus.name() == "nvml";
        HostFacts {
            volumes: self.volumes.facts(),
            ..crate::host::host_facts(
                self.gpus.sample().ok().as_ref(),
                &self.config.data_dir,
                gpu_containers,
                (self.executor.isolated(), self.executor.shared_network()),
            )
        }
    }

    /// Runs until `shutdown` turns true. Instances keep running when the agent stops, so a
    /// restarted agent adopts them; stops already begun are finished first.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
        let facts = self.host_facts();
        crate::host::check_toolkit(&facts)?;
        self.executor.prepull(&self.config.prepull).await;
        if let Some(toolkit) = &facts.container_toolkit {
            tracing::info!(%toolkit, "NVIDIA Container Toolkit");
        }
        let identity = self.identity().await?;
        if NodeIdentity::client_cert(&self.config.data_dir).is_some() {
            self.client = Self::client(&self.config)?;
        }
        let inventory = self.gpus.discover()?;
        tracing::info!(
            node_id = %identity.node_id,
            executor = self.executor.name(),
            gpu_backend = self.gpus.name(),
            gpus = inventory.len(),
            "agent running"
        );
        let mut stops = Stops::new(
            Arc::clone(&self.executor),
            Some(Arc::new(self.config.checkpoint.clone())),
        );
        let running: Vec<String> = match self.executor.list().await {
            Ok(instances) => instances.into_iter().map(|o| o.reservation_id).collect(),
            Err(_) => Vec::new(),
        };
        let live: Vec<&str> = running.iter().map(String::as_str).collect();
        self.volumes.prune_disks(&live).await;
        let pruned = self.config.checkpoint.prune(&live);
        if pruned > 0 {
            tracing::info!(
                pruned,
                "removed checkpoint volumes untouched for longer than kept"
            );
        }
        // Tenants enter instances through the tunnel: held open while the agent runs.
        let tunnel = tokio::spawn(crate::tunnel::hold(
            self.client.clone(),
            identity.node_token.clone(),
            Arc::clone(&self.executor),
            Arc::clone(&self.volumes),
            shutdown.clone(),
        ));
        let outcome = self
            .sync_loop(&identity, inventory, &mut stops, &mut shutdown)
            .await;
        tunnel.abort();
        stops.wait_all().await;
        tracing::info!("agent stopped");
        outcome
    }

    async fn sync_loop(
        &self,
        identity: &NodeIdentity,
        inventory: Vec<GpuInfo>,
        stops: &mut Stops,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), AgentError> {
        // A sync is held at most three quarters of a heartbeat, so that the next one goes out
        // well within the heartbeat and its answer well within the lease (which counts from
        // the last answered sync's sending).
        let wait_ms =
            u64::try_from((self.config.heartbeat * 3 / 4).as_millis()).unwrap_or(u64::MAX);
        // Sent with the inventory, until the control plane has both.
        let host = self.host_facts();
        let mut known_version = None;
        // An instance was just started (or failed to): the next sync reports it at once,
        // without the telemetry and disk figures that would hold it up.
        let mut at_once = false;
        let mut telemetry_sent: Option<Instant> = None;
        let mut desired: Vec<Assignment> = Vec::new();
        let mut failures: BTreeMap<String, Observed> = BTreeMap::new();
        // Published ports by (reservation, epoch): asked of the executor once.
        let mut published: BTreeMap<(String, i64), Vec<PublishedPort>> = BTreeMap::new();
        // What the control plane still keeps of each reservation's output (its last answer).
        let mut log_room: BTreeMap<String, u64> = BTreeMap::new();
        // Instances that ended, since when their output is being shipped.
        let mut draining: BTreeMap<String, Instant> = BTreeMap::new();
        let mut last_contact = Instant::now();
        let mut fenced = false;
        let mut burn_in = BurnIn::new(self.config.burn_in.clone());
        let gpu_uuids: Vec<String> = inventory.iter().map(|g| g.uuid.clone()).collect();
        let mut watchdog = Watchdog::new(self.config.vram_grace);
        // Instances the watchdog stopped, by reservation: their epoch and why. Their
        // assignments count as not to run (`mask_own_stops`) until the control plane has the
        // report and lets go of them.
        let mut own_stops: BTreeMap<String, (i64, String)> = BTreeMap::new();
        // The watchdog's events the control plane has not taken yet.
        let mut events: Vec<AgentEvent> = Vec::new();
        let mut disks_measured = None;
        let mut image_reports = images::ImageReports::default();
        while !*shutdown.borrow() {
            stops.reap();
            let actual = self.observe(&failures).await?;
            burn_in
                .step(!desired.is_empty() || !actual.is_empty(), &gpu_uuids)
                .await;
            let kept = self.kept_outputs().await;
            let mut instances = reconcile::reports(&desired, &actual);
            // An instance being stopped is reported once it is gone, not as it goes down
            // (when it may look exited for a moment).
            instances.retain(|r| !stops.contains(&r.reservation_id));
            for r in &mut instances {
                let own = own_stops
                    .get(&r.reservation_id)
                    .filter(|(epoch, _)| *epoch == r.epoch);
                if let (InstanceState::Stopped, Some((_, why))) = (r.state, own) {
                    r.end_reason = Some(VRAM_EXCEEDED.to_owned());
                    r.message = Some(why.clone());
                }
            }
            // An instance that ended, or was stopped, is reported once its output is all
            // shipped (its end ends the reservation, and with it the output the control plane
            // takes).
            let output = self.new_output(&desired, &actual, &kept, &log_room).await;
            draining.retain(|id, _| output.unshipped.contains(id));
            for id in &output.unshipped {
                draining.entry(id.clone()).or_insert_with(Instant::now);
            }
            instances.retain(|r| {
                if !matches!(r.state, InstanceState::Exited | InstanceState::Stopped) {
                    return true;
                }
                let Some(since) = draining.get(&r.reservation_id) else {
                    return true;
                };
                let late = since.elapsed() >= DRAIN_AT_MOST;
                if late {
                    tracing::warn!(reservation_id = %r.reservation_id, state = ?r.state, waited = ?DRAIN_AT_MOST, "reporting the end of an instance before all its output is shipped");
                }
                late
            });
            // Kept outputs whose stop this sync reports: forgotten once it is answered.
            let reported: Vec<(String, i64)> = instances
                .iter()
                .filter(|r| r.state == InstanceState::Stopped)
                .map(|r| (r.reservation_id.clone(), r.epoch))
                .filter(|k| kept.contains(k))
                .collect();
            // More to ship: the answer comes at once rather than after a long poll.
            let wait = if output.unshipped.is_empty() && !at_once {
                wait_ms
            } else {
                0
            };
            self.add_ports(&desired, &mut instances, &mut published)
                .await;
            // Telemetry at least once a heartbeat even while starts follow each other.
            let quick =
                at_once && telemetry_sent.is_some_and(|at| at.elapsed() < self.config.heartbeat);
            at_once = false;
            let telemetry = if quick {
                None
            } else {
                self.add_disks(&mut instances, &mut disks_measured).await;
                telemetry_sent = Some(Instant::now());
                self.telemetry().await.map(|mut t| {
                    t.burn_in = burn_in.state();
                    t
                })
            };
            if let Some(t) = &telemetry {
                self.metrics
                    .record(&inventory, t, &running_gpus(&desired, &actual));
                let running = running_assignments(&desired, &actual, stops);
                for verdict in watchdog.check(t, &running, std::time::Instant::now()) {
                    match verdict {
                        Verdict::Event(mut e) => {
                            // A detail naming many processes would otherwise be refused.
                            gpurent_types::text::cut_to_bytes(
                                &mut e.detail,
                                AGENT_EVENT_DETAIL_MAX,
                            );
                            tracing::warn!(kind = e.kind.as_str(), reservation_id = ?e.reservation_id, gpu = %e.gpu_uuid, detail = %e.detail, "VRAM watchdog");
                            self.metrics.event(e.kind);
                            events.push(e);
                        }
                        Verdict::Stop {
                            reservation_id,
                            epoch,
                            detail,
                        } => {
                            stops.start(&reservation_id, Some(VRAM_STOP_GRACE));
                            own_stops.insert(reservation_id, (epoch, detail));
                        }
                    }
                }
                mask_own_stops(&mut desired, &own_stops);
                if events.len() > EVENTS_KEPT {
                    let dropped = events.len() - EVENTS_KEPT;
                    tracing::warn!(
                        dropped,
                        "VRAM watchdog events dropped: the control plane has not taken them"
                    );
                    events.drain(..dropped);
                }
            }
            // Events go out at once rather than after a long poll.
            let wait = if events.is_empty() { wait } else { 0 };
            let (volume_reports, volume_free_bytes) = self.volumes.take_reports();
            let images = image_reports.due(&*self.executor).await;
            let request = SyncRequest {
                // The inventory only until the control plane has it; telemetry every time.
                gpus: if known_version.is_none() {
                    inventory.clone()
                } else {
                    Vec::new()
                },
                instances,
                known_version,
                wait_ms: Some(wait),
                telemetry,
                logs: output.chunks,
                host: if known_version.is_none() {
                    Some(host.clone())
                } else {
                    None
                },
                events: events.clone(),
                volumes: volume_reports.clone(),
                volume_free_bytes,
                images: images.clone(),
            };
            // A control plane that does not answer at all must not hold the agent past its
            // lease: the call (retries included) gets what is left of the lease, at least two
            // heartbeats.
            let budget = self
                .config
                .lease
                .saturating_sub(last_contact.elapsed())
                .max(self.config.heartbeat * 2);
            // The lease counts from when a sync that succeeded was sent: the control plane
            // counts its node TTL from when it received it, so with a lease no longer than the
            // TTL the agent fences itself no later than the control plane fences the node.
            let sent = Instant::now();
            let sync =
                tokio::time::timeout(budget, self.client.sync(&identity.node_token, &request));
            tokio::pin!(sync);
            // The lease runs out while this sync is still trying: fence then, not when the
            // call gives up.
            let lease_end = last_contact + self.config.lease;
            // None: a stop worked, or an instance changed on its own (a pull ended), and is
            // reported at once, by a new sync instead of this long poll (the control plane took
            // this one's report when it came). A failed stop
            // waits for the next heartbeat rather than retrying in a tight loop.
            let response = loop {
                tokio::select! {
                    r = &mut sync => break Some(r.unwrap_or(Err(AgentError::SyncTimedOut { after: budget }))),
                    _ = shutdown.changed() => return Ok(()),
                    stopped = stops.finished(), if !stops.is_empty() => if stopped { break None },
                    () = self.executor.changed() => break None,
                    () = tokio::time::sleep_until(lease_end), if !fenced => {
                        self.fence(stops).await;
                        fenced = true;
                        desired.clear();
                    }
                }
            };
            let Some(response) = response else { continue };
            match response {
                Ok(response) => {
                    self.metrics.synced();
                    image_reports.delivered(images);
                    last_contact = sent;
                    fenced = false;
                    known_version = Some(response.version);
                    desired = response.assignments;
                    events.clear();
                    own_stops.retain(|id, (epoch, _)| {
                        desired
                            .iter()
                            .any(|a| &a.reservation_id == id && a.epoch == *epoch)
                    });
                    mask_own_stops(&mut desired, &own_stops);
                    log_room = response.log_room;
                    // Volumes first: the instances this answer starts may mount them.
                    self.volumes.apply(&response.volumes).await;
                    self.forget_outputs(&kept, &reported, &desired).await;
                    if !desired.is_empty() {
                        // Work landed (placed just before a burn-in began): it goes first.
                        burn_in.step(true, &gpu_uuids).await;
                    }
                    failures.retain(|id, f| {
                        desired
                            .iter()
                            .any(|a| &a.reservation_id == id && a.epoch == f.epoch)
                    });
                    let actual = self.observe(&failures).await?;
                    let mut started = false;
                    for action in reconcile::plan(&desired, &actual) {
                        started |= self.act(action, stops, &mut failures).await;
                    }
                    // Report the outcome at once rather than after the next long poll.
                    at_once |= started;
                }
                Err(e) => {
                    self.volumes.put_back(volume_reports);
                    match &e {
                        // Not a passing fault: it lasts until one of the two is upgraded.
                        AgentError::Refused { message, .. }
                            if message.ends_with("(agent_protocol)") =>
                        {
                            tracing::error!(
                                "the control plane does not serve this agent: {message}"
                            );
                        }
                        _ => tracing::warn!(error = %e, "cannot sync with the control plane"),
                    }
                    if !fenced && last_contact.elapsed() > self.config.lease {
                        self.fence(stops).await;
                        fenced = true;
                        desired.clear();
                    }
                    // Waiting to try again must not let the lease run out unnoticed either.
                    let lease_end = last_contact + self.config.lease;
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.heartbeat) => {}
                        () = tokio::time::sleep_until(lease_end), if !fenced => {
                            self.fence(stops).await;
                            fenced = true;
                            desired.clear();
                        }
                        _ = shutdown.changed() => return Ok(()),
                    }
                }
            }
        }
        Ok(())
    }

    async fn observe(
        &self,
        failures: &BTreeMap<String, Observed>,
    ) -> Result<Vec<Observed>, AgentError> {
        let mut actual = self.executor.list().await?;
        actual.extend(failures.values().cloned());
        Ok(actual)
    }

    /// Carries out one action; true when it started an instance (or failed to). Stops go on
    /// in the background; a start waits while an earlier epoch of its reservation is being
    /// stopped (the next plan after that stop asks for it again).
    async fn act(
        &self,
        action: Action,
        stops: &mut Stops,
        failures: &mut BTreeMap<String, Observed>,
    ) -> bool {
        match action {
            Action::Start(a) if stops.contains(&a.reservation_id) => false,
            Action::Start(a) => {
                failures.remove(&a.reservation_id);
                let started = match self.volumes.binds(&a).await {
                    Ok(binds) => match a.checkpoint {
                        true => match self.config.checkpoint.prepare(&a).await {
                            Ok(volume) => self.executor.start_with(&a, Some(&volume), &binds).await,
                            Err(e) => Err(e),
                        },
                        false => self.executor.start_with(&a, None, &binds).await,
                    },
                    Err(e) => Err(e),
                };
                if let Err(e) = started {
                    tracing::warn!(reservation_id = %a.reservation_id, error = %e, "start failed");
                    failures.insert(
                        a.reservation_id.clone(),
                        Observed {
                            reservation_id: a.reservation_id.clone(),
                            epoch: a.epoch,
                            state: ObservedState::Failed(e.to_string()),
                            pull: None,
                        },
                    );
                }
                true
            }
            Action::Stop {
                reservation_id,
                grace,
                ..
            } => {
                stops.start(&reservation_id, grace);
                false
            }
        }
    }

    /// Self-fencing: without the control plane, this node's work may have been rescheduled
    /// elsewhere, so it must not keep running here. Each instance gets the fence's grace,
    /// unless it is being stopped already.
    async fn fence(&self, stops: &mut Stops) {
        tracing::error!(lease = ?self.config.lease, "lost the control plane for longer than the lease; stopping all instances");
        match self.executor.list().await {
            Ok(instances) => {
                for o in instances {
                    stops.start(&o.reservation_id, Some(self.config.fence_grace));
                }
            }
            Err(e) => tracing::error!(error = %e, "could not list instances while fencing"),
        }
    }
}
