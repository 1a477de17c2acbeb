//! The agent's Prometheus metrics (`--metrics-listen`): each GPU under dcgm-exporter's names
//! and labels, and each reservation's GPUs, from the sample the heartbeat took last (a scrape
//! never calls NVML).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use gpurent_types::agent::{AgentEventKind, GpuInfo, NodeTelemetry};
use gpurent_types::exposition::{micros, millis, Exposition, Kind, CONTENT_TYPE};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const MIB: u64 = 1024 * 1024;

/// The latest heartbeat's view of the node.
#[derive(Debug, Clone)]
struct Snapshot {
    inventory: Vec<GpuInfo>,
    telemetry: NodeTelemetry,
    /// (reservation, GPU UUID) of every running instance's GPUs.
    holds: Vec<(String, String)>,
    sampled_at_us: i64,
}

/// What the agent's `/metrics` shows; the sync loop records, scrapes read.
#[derive(Debug)]
pub struct AgentMetrics {
    hostname: String,
    latest: Mutex<Option<Snapshot>>,
    last_sync_us: Mutex<Option<i64>>,
    /// The VRAM watchdog's events so far, by kind.
    events: Mutex<BTreeMap<AgentEventKind, u64>>,
}

fn unix_micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_micros()).ok())
        .unwrap_or(0)
}

impl AgentMetrics {
    /// `hostname` is the `Hostname` label of every GPU series (dcgm-exporter's).
    pub fn new(hostname: &str) -> Self {
        AgentMetrics {
            hostname: hostname.to_owned(),
            latest: Mutex::new(None),
            last_sync_us: Mutex::new(None),
            events: Mutex::new(BTreeMap::new()),
        }
    }

    /// Keeps a heartbeat's sample: the GPUs as found at start-up, their telemetry (processes
    /// attributed to reservations), and the GPUs each running instance was given.
    pub fn record(
        &self,
        inventory: &[GpuInfo],
        telemetry: &NodeTelemetry,
        running: &[(String, Vec<String>)],
    ) {
        let mut holds: Vec<(String, String)> = running
            .iter()
            .flat_map(|(id, gpus)| gpus.iter().map(move |g| (id.clone(), g.clone())))
            .collect();
        for gpu in &telemetry.gpus {
            for p in &gpu.processes {
                if let Some(id) = &p.reservation_id {
                    holds.push((id.clone(), gpu.uuid.clone()));
                }
            }
        }
        holds.sort();
        holds.dedup();
        let snapshot = Snapshot {
            inventory: inventory.to_vec(),
            telemetry: telemetry.clone(),
            holds,
            sampled_at_us: unix_micros(SystemTime::now()),
        };
        *self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(snapshot);
    }

    /// A sync with the control plane succeeded now.
    pub fn synced(&self) {
        *self
            .last_sync_us
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(unix_micros(SystemTime::now()));
    }

    /// The VRAM watchdog raised an event of this kind.
    pub fn event(&self, kind: AgentEventKind) {
        *self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(kind)
            .or_default() += 1;
    }

    /// The text exposition of the latest sample (families without samples before the first).
    pub fn render(&self) -> String {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let last_sync = *self
            .last_sync_us
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut e = Exposition::new();
        self.write_gpus(&mut e, latest.as_ref());
        write_reservations(&mut e, latest.as_ref());
        let name = "gpurent_agent_telemetry_timestamp_seconds";
        e.family(
            name,
            Kind::Gauge,
            "When the GPUs were last sampled (unix time), by the heartbeat.",
        );
        if let Some(s) = &latest {
            e.sample(name, &[], micros(s.sampled_at_us));
        }
        let name = "gpurent_agent_last_sync_timestamp_seconds";
        e.family(
            name,
            Kind::Gauge,
            "When a sync with the control plane last succeeded (unix time).",
        );
        if let Some(at) = last_sync {
            e.sample(name, &[], micros(at));
        }
        let name = "gpurent_agent_vram_events_total";
        e.family(
            name,
            Kind::Counter,
            "Events of the VRAM watchdog, by kind (a share over its memory, back under, stopped, a process on a foreign GPU, a process of no instance on a rented GPU).",
        );
        let events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for kind in AgentEventKind::ALL {
            let n = events.get(&kind).copied().unwrap_or(0);
            e.sample(name, &[("kind", kind.as_str())], n);
        }
        e.finish()
    }

    fn write_gpus(&self, e: &mut Exposition, latest: Option<&Snapshot>) {
        // (name, type, help, value of a sample); dcgm-exporter's units: %, MiB, C, W.
        type Value = fn(&gpurent_types::agent::GpuSample) -> String;
        let families: [(&str, Kind, &str, Value); 6] = [
            (
                "DCGM_FI_DEV_GPU_UTIL",
                Kind::Gauge,
                "GPU utilization (in %).",
                |s| s.utilization_pct.to_string(),
            ),
            (
                "DCGM_FI_DEV_FB_USED",
                Kind::Gauge,
                "Framebuffer memory used (in MiB).",
                |s| s.memory_used_mb.to_string(),
            ),
            (
                "DCGM_FI_DEV_FB_FREE",
                Kind::Gauge,
                "Framebuffer memory free (in MiB).",
                |s| {
                    s.memory_total_mb
                        .saturating_sub(s.memory_used_mb)
                        .to_string()
                },
            ),
            (
                "DCGM_FI_DEV_GPU_TEMP",
                Kind::Gauge,
                "GPU temperature (in C).",
                |s| s.temperature_c.to_string(),
            ),
            (
                "DCGM_FI_DEV_POWER_USAGE",
                Kind::Gauge,
                "Power draw (in W).",
                |s| millis(s.power_mw).to_string(),
            ),
            (
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                Kind::Counter,
                "Total number of double-bit (uncorrected) volatile ECC errors, since the driver loaded.",
                |s| s.ecc_uncorrected.to_string(),
            ),
        ];
        // A GPU fallen off the bus has no readings: it gets no samples (the control plane's
        // health rules and events report it).
        let gpus: Vec<(Vec<(&str, String)>, &gpurent_types::agent::GpuSample)> = latest
            .map(|s| {
                s.telemetry
                    .gpus
                    .iter()
                    .filter(|g| !g.lost)
                    .map(|g| {
                        let info = s.inventory.iter().find(|i| i.uuid == g.uuid);
                        let index = info.map_or_else(String::new, |i| i.index.to_string());
                        let labels = vec![
                            ("gpu", index.clone()),
                            ("UUID", g.uuid.clone()),
                            ("device", format!("nvidia{index}")),
                            (
                                "modelName",
                                info.map_or_else(String::new, |i| i.model.clone()),
                            ),
                            ("Hostname", self.hostname.clone()),
                        ];
                        (labels, g)
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (name, kind, help, value) in families {
            e.family(name, kind, help);
            for (labels, sample) in &gpus {
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                e.sample(name, &labels, value(sample));
            }
        }
    }
}

fn write_reservations(e: &mut Exposition, latest: Option<&Snapshot>) {
    // (reservation, UUID) -> (GPU index, memory its processes use, the GPU's utilisation)
    let mut rows: BTreeMap<(&str, &str), (String, u64, u32)> = BTreeMap::new();
    if let Some(s) = latest {
        for (id, uuid) in &s.holds {
            let Some(gpu) = s.telemetry.gpus.iter().find(|g| &g.uuid == uuid) else {
                continue;
            };
            let used: u64 = gpu
                .processes
                .iter()
                .filter(|p| p.reservation_id.as_deref() == Some(id.as_str()))
                .map(|p| p.used_mb)
                .sum();
            let index = s
                .inventory
                .iter()
                .find(|i| &i.uuid == uuid)
                .map_or_else(String::new, |i| i.index.to_string());
            rows.insert(
                (id.as_str(), uuid.as_str()),
                (index, used, gpu.utilization_pct),
            );
        }
    }
    let name = "gpurent_reservation_gpu_memory_used_bytes";
    e.family(
        name,
        Kind::Gauge,
        "GPU memory used by a reservation's processes on each of its GPUs.",
    );
    for ((id, uuid), (index, used, _)) in &rows {
        e.sample(
            name,
            &[("reservation", id), ("UUID", uuid), ("gpu", index)],
            used.saturating_mul(MIB),
        );
    }
    let name = "gpurent_reservation_gpu_utilization_percent";
    e.family(
        name,
        Kind::Gauge,
        "Utilization of each GPU a reservation runs on (in %): NVML measures the whole GPU, so on a shared GPU this is all its reservations together.",
    );
    for ((id, uuid), (index, _, util)) in &rows {
        e.sample(
            name,
            &[("reservation", id), ("UUID", uuid), ("gpu", index)],
            util,
        );
    }
}

async fn scrape(State(metrics): State<Arc<AgentMetrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.render())
}

/// Serves `GET /metrics` on `listen` (port 0 picks one) until `shutdown` turns true; returns
/// the address it listens on.
pub async fn serve(
    listen: SocketAddr,
    metrics: Arc<AgentMetrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(SocketAddr, JoinHandle<()>), crate::AgentError> {
    let bind_error = |source| crate::AgentError::MetricsListen {
        addr: listen,
        source,
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    let router = Router::new()
        .route("/metrics", get(scrape))
        .with_state(metrics);
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "the metrics endpoint stopped");
        }
    });
    tracing::info!(%addr, "agent metrics on /metrics");
    Ok((addr, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpurent_types::agent::{GpuProcess, GpuSample};

    #[test]
    fn gpus_and_reservations_carry_dcgm_labels_and_exact_units() {
        let m = AgentMetrics::new("box");
        assert!(!m.render().contains("DCGM_FI_DEV_GPU_UTIL{"));
        let inventory = vec![GpuInfo::basic(
            3,
            "GPU-a".to_owned(),
            "NVIDIA H200".to_owned(),
            143_771,
        )];
        let telemetry = NodeTelemetry {
            gpus: vec![GpuSample {
                uuid: "GPU-a".to_owned(),
                utilization_pct: 99,
                memory_used_mb: 1138,
                temperature_c: 53,
                power_mw: 687_933,
                ecc_uncorrected: 0,
                memory_total_mb: 143_771,
                xid_errors: vec![],
                lost: false,
                processes: vec![GpuProcess {
                    pid: 7,
                    used_mb: 1130,
                    reservation_id: Some("r1".to_owned()),
                }],
            }],
            ..NodeTelemetry::default()
        };
        m.record(
            &inventory,
            &telemetry,
            &[("r1".to_owned(), vec!["GPU-a".to_owned()])],
        );
        let text = m.render();
        let labels =
            "gpu=\"3\",UUID=\"GPU-a\",device=\"nvidia3\",modelName=\"NVIDIA H200\",Hostname=\"box\"";
        for line in [
            format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 99"),
            format!("DCGM_FI_DEV_FB_USED{{{labels}}} 1138"),
            format!("DCGM_FI_DEV_FB_FREE{{{labels}}} 142633"),
            format!("DCGM_FI_DEV_GPU_TEMP{{{labels}}} 53"),
            format!("DCGM_FI_DEV_POWER_USAGE{{{labels}}} 687.933"),
            format!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} 0"),
            "gpurent_reservation_gpu_memory_used_bytes{reservation=\"r1\",UUID=\"GPU-a\",gpu=\"3\"} 1184890880".to_owned(),
            "gpurent_reservation_gpu_utilization_percent{reservation=\"r1\",UUID=\"GPU-a\",gpu=\"3\"} 99".to_owned(),
            "gpurent_agent_vram_events_total{kind=\"vram_exceeded\"} 0".to_owned(),
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} not in\n{text}");
        }
        m.event(AgentEventKind::VramOverShare);
        m.event(AgentEventKind::VramOverShare);
        let text = m.render();
        assert!(
            text.contains("gpurent_agent_vram_events_total{kind=\"vram_over_share\"} 2\n"),
            "{text}"
        );
    }
}
