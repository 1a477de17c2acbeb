//! The agent's Prometheus metrics (`--metrics-listen`): each GPU under dcgm-exporter's names
//! and labels, and each reservation's GPUs, from the sample the heartbeat took last (a scrape
//! never calls NVML), in the Prometheus text format (0.0.4) as `prometheus-client` writes it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use gpurent_types::agent::{AgentEventKind, GpuInfo, NodeTelemetry};
use gpurent_types::families::{counters, gauges};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::prometheus_text::{self, CONTENT_TYPE};
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, GaugeValueEncoder};
use prometheus_client::registry::Registry;
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
        let events = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let scrape = Scrape {
            hostname: self.hostname.clone(),
            latest,
            last_sync,
            events,
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(scrape));
        let mut text = String::new();
        if let Err(e) = prometheus_text::encode(&mut text, &registry) {
            tracing::warn!(error = %e, "the metrics could not be written");
        }
        // dcgm-exporter's ECC family is a counter without `_total`, which the encoder appends
        // to every counter's name: it is written as a gauge and typed here as dcgm-exporter
        // types it, so that its dashboards and rules keep working.
        text.replacen(
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL gauge\n",
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n",
            1,
        )
    }
}

/// What one scrape writes, read from the agent's state at its start.
#[derive(Debug)]
struct Scrape {
    hostname: String,
    latest: Option<Snapshot>,
    last_sync: Option<i64>,
    events: BTreeMap<AgentEventKind, u64>,
}

/// Unlabelled: the one sample of a family.
const NONE: [(&str, &str); 0] = [];

/// A reading as dcgm-exporter writes it: whole numbers as integers, others (watts, seconds)
/// as the float that prints their exact decimals (`687.933`).
#[derive(Debug, Clone, Copy)]
enum Reading {
    Whole(u64),
    Fraction(f64),
}

impl Reading {
    /// `n` of `1/per` (milliwatts in watts, microseconds in seconds).
    #[allow(clippy::cast_precision_loss)]
    fn parts(n: i64, per: u64) -> Reading {
        match u64::try_from(n) {
            Ok(n) if n % per == 0 => Reading::Whole(n / per),
            _ => Reading::Fraction(n as f64 / per as f64),
        }
    }

    fn seconds(micros: i64) -> Reading {
        Reading::parts(micros, 1_000_000)
    }
}

impl EncodeGaugeValue for Reading {
    fn encode(&self, encoder: &mut GaugeValueEncoder) -> fmt::Result {
        match self {
            Reading::Whole(v) => EncodeGaugeValue::encode(v, encoder),
            Reading::Fraction(v) => EncodeGaugeValue::encode(v, encoder),
        }
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let latest = self.latest.as_ref();
        write_gpus(&mut e, &self.hostname, latest)?;
        write_reservations(&mut e, latest)?;
        gauges(
            &mut e,
            "gpurent_agent_telemetry_timestamp_seconds",
            "When the GPUs were last sampled (unix time), by the heartbeat.",
            latest.map(|s| (NONE, Reading::seconds(s.sampled_at_us))),
        )?;
        gauges(
            &mut e,
            "gpurent_agent_last_sync_timestamp_seconds",
            "When a sync with the control plane last succeeded (unix time).",
            self.last_sync.map(|at| (NONE, Reading::seconds(at))),
        )?;
        counters(
            &mut e,
            "gpurent_agent_vram_events_total",
            "Events of the VRAM watchdog, by kind (a share over its memory, back under, stopped, a process on a foreign GPU, a process of no instance on a rented GPU).",
            AgentEventKind::ALL.iter().map(|kind| {
                let n = self.events.get(kind).copied().unwrap_or(0);
                ([("kind", kind.as_str())], n)
            }),
        )
    }
}

fn write_gpus(e: &mut DescriptorEncoder, hostname: &str, latest: Option<&Snapshot>) -> fmt::Result {
    // (name, help, value of a sample); dcgm-exporter's units: %, MiB, C, W. All gauges but
    // the ECC count (see `render`).
    type Value = fn(&gpurent_types::agent::GpuSample) -> Reading;
    let families: [(&str, &str, Value); 6] = [
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |s| {
            Reading::Whole(u64::from(s.utilization_pct))
        }),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", |s| {
            Reading::Whole(s.memory_used_mb)
        }),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", |s| {
            Reading::Whole(s.memory_total_mb.saturating_sub(s.memory_used_mb))
        }),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |s| {
            Reading::Whole(u64::from(s.temperature_c))
        }),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |s| {
            Reading::parts(i64::try_from(s.power_mw).unwrap_or(i64::MAX), 1000)
        }),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit (uncorrected) volatile ECC errors, since the driver loaded.",
            |s| Reading::Whole(s.ecc_uncorrected),
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
                        ("Hostname", hostname.to_owned()),
                    ];
                    (labels, g)
                })
                .collect()
        })
        .unwrap_or_default();
    for (name, help, value) in families {
        gauges(
            e,
            name,
            help,
            gpus.iter()
                .map(|(labels, sample)| (labels.as_slice(), value(sample))),
        )?;
    }
    Ok(())
}

fn write_reservations(e: &mut DescriptorEncoder, latest: Option<&Snapshot>) -> fmt::Result {
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
    gauges(
        e,
        "gpurent_reservation_gpu_memory_used_bytes",
        "GPU memory used by a reservation's processes on each of its GPUs.",
        rows.iter().map(|((id, uuid), (index, used, _))| {
            (
                [
                    ("reservation", *id),
                    ("UUID", *uuid),
                    ("gpu", index.as_str()),
                ],
                used.saturating_mul(MIB),
            )
        }),
    )?;
    gauges(
        e,
        "gpurent_reservation_gpu_utilization_percent",
        "Utilization of each GPU a reservation runs on (in %): NVML measures the whole GPU, so on a shared GPU this is all its reservations together.",
        rows.iter().map(|((id, uuid), (index, _, util))| {
            (
                [("reservation", *id), ("UUID", *uuid), ("gpu", index.as_str())],
                *util,
            )
        }),
    )
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
            // dcgm-exporter's types: the ECC count is a counter without `_total`.
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter".to_owned(),
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge".to_owned(),
            "# TYPE gpurent_agent_vram_events_total counter".to_owned(),
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
