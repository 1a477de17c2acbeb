//! Real GPUs through NVML. `libnvidia-ml.so.1` is loaded when the agent starts, so the same
//! binary runs on hosts without GPUs (where this backend reports that NVML is missing).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Mutex;

use gpurent_types::agent::{GpuInfo, GpuProcess, GpuSample, NodeTelemetry};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};

use super::topology::switch_groups;
use super::{cuda_version, mib, GpuBackend};
use crate::AgentError;

pub struct NvmlGpus {
    /// Loaded once for the agent's life: the event set borrows it.
    nvml: &'static Nvml,
    /// The UUIDs found by `discover`, by index: a GPU fallen off the bus is reported by it.
    uuids: Mutex<Vec<String>>,
    /// Critical XID events of every GPU that supports them (registered by `discover`); None
    /// where the driver offers none.
    xid_events: Mutex<Option<EventSet<'static>>>,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlGpus")
    }
}

fn nvml_error(what: &'static str) -> impl Fn(nvml_wrapper::error::NvmlError) -> AgentError {
    move |e| AgentError::Gpu {
        what,
        message: e.to_string(),
    }
}

impl NvmlGpus {
    /// Loads NVML. Fails with a clear message where there is no NVIDIA driver.
    pub fn load() -> Result<Self, AgentError> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new("libnvidia-ml.so.1"))
            .init()
            .map_err(|e| AgentError::Gpu {
                what: "load NVML (libnvidia-ml.so.1)",
                message: format!(
                    "{e}; is the NVIDIA driver installed? For simulated GPUs pass --sim-gpus"
                ),
            })?;
        Ok(NvmlGpus {
            // Leaked on purpose: NVML stays loaded until the process exits, and the XID event
            // set must borrow it for as long.
            nvml: Box::leak(Box::new(nvml)),
            uuids: Mutex::new(Vec::new()),
            xid_events: Mutex::new(None),
        })
    }

    /// Registers every GPU that supports them for critical XID events, in one new set.
    fn register_xid_events(&self, count: u32) -> Option<EventSet<'static>> {
        let nvml: &'static Nvml = self.nvml;
        let mut set = match nvml.create_event_set() {
            Ok(set) => set,
            Err(e) => {
                tracing::warn!("XID events unavailable: {e}");
                return None;
            }
        };
        for index in 0..count {
            let Ok(d) = nvml.device_by_index(index) else {
                continue;
            };
            let supported = d
                .supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
            if !supported {
                continue;
            }
            // A failed registration frees the set (NVML leaves it undefined).
            set = match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(set) => set,
                Err(e) => {
                    tracing::warn!("XID events unavailable on GPU {index}: {e}");
                    return None;
                }
            };
        }
        Some(set)
    }

    /// The critical XIDs raised since the last call, by GPU UUID (never waits).
    fn take_xids(&self) -> BTreeMap<String, Vec<u64>> {
        let mut raised: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let Ok(guard) = self.xid_events.lock() else {
            return raised;
        };
        let Some(set) = guard.as_ref() else {
            return raised;
        };
        // Bounded, so a GPU raising events without end cannot hold up the heartbeat.
        for _ in 0..1024 {
            match set.wait(0) {
                Ok(event) => {
                    let Some(XidError::Value(xid)) = event.event_data else {
                        continue;
                    };
                    if let Ok(uuid) = event.device.uuid() {
                        raised.entry(uuid).or_default().push(xid);
                    }
                }
                // Timeout: nothing more now. Anything else: read again on the next sample.
                Err(_) => break,
            }
        }
        raised
    }
}

impl GpuBackend for NvmlGpus {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError> {
        let count = self.nvml.device_count().map_err(nvml_error("count GPUs"))?;
        let mut gpus = (0..count)
            .map(|index| {
                let d = self
                    .nvml
                    .device_by_index(index)
                    .map_err(nvml_error("open a GPU"))?;
                Ok(GpuInfo {
                    index,
                    uuid: d.uuid().map_err(nvml_error("read a GPU's UUID"))?,
                    model: d.name().map_err(nvml_error("read a GPU's name"))?,
                    vram_mb: mib(d
                        .memory_info()
                        .map_err(nvml_error("read GPU memory"))?
                        .total),
                    pcie_gen: d.current_pcie_link_gen().ok(),
                    pcie_width: d.current_pcie_link_width().ok(),
                    pcie_gen_max: d.max_pcie_link_gen().ok(),
                    pcie_width_max: d.max_pcie_link_width().ok(),
                    mig_enabled: d.mig_mode().ok().map(|m| m.current != 0),
                    switch_group: None,
                })
            })
            .collect::<Result<Vec<_>, AgentError>>()?;
        // Two GPUs are near when their closest common ancestor is one PCIe switch or the board.
        let groups = switch_groups(gpus.len(), |i, j| {
            let index = |k: usize| u32::try_from(k).ok();
            let a = self.nvml.device_by_index(index(i)?).ok()?;
            let b = self.nvml.device_by_index(index(j)?).ok()?;
            let level = a.topology_common_ancestor(b).ok()?;
            Some(matches!(
                level,
                TopologyLevel::Internal | TopologyLevel::Single
            ))
        });
        for (gpu, group) in gpus.iter_mut().zip(groups) {
            gpu.switch_group = group;
        }
        if let Ok(mut uuids) = self.uuids.lock() {
            *uuids = gpus.iter().map(|g| g.uuid.clone()).collect();
        }
        if let Ok(mut events) = self.xid_events.lock() {
            if events.is_none() {
                *events = self.register_xid_events(count);
            }
        }
        Ok(gpus)
    }

    fn sample(&self) -> Result<NodeTelemetry, AgentError> {
        let count = self.nvml.device_count().map_err(nvml_error("count GPUs"))?;
        let mut gpus = Vec::new();
        let mut xids = self.take_xids();
        for index in 0..count {
            let d = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                // Fallen off the bus: reported as such (by the UUID it had), the others sampled.
                Err(NvmlError::GpuLost) => {
                    let known = self
                        .uuids
                        .lock()
                        .ok()
                        .and_then(|u| u.get(usize::try_from(index).ok()?).cloned());
                    if let Some(uuid) = known {
                        gpus.push(GpuSample {
                            // XID 79 (fallen off the bus), when NVML raised it.
                            xid_errors: xids.remove(&uuid).unwrap_or_default(),
                            uuid,
                            utilization_pct: 0,
                            memory_used_mb: 0,
                            temperature_c: 0,
                            power_mw: 0,
                            ecc_uncorrected: 0,
                            memory_total_mb: 0,
                            lost: true,
                            processes: Vec::new(),
                        });
                    }
                    continue;
                }
                Err(e) => return Err(nvml_error("open a GPU")(e)),
            };
            let processes = d
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_mb: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => mib(bytes),
                        UsedGpuMemory::Unavailable => 0,
                    },
                    reservation_id: None,
                })
                .collect();
            let memory = d.memory_info().ok();
            let uuid = d.uuid().map_err(nvml_error("read a GPU's UUID"))?;
            gpus.push(GpuSample {
                xid_errors: xids.remove(&uuid).unwrap_or_default(),
                uuid,
                // A reading the GPU does not support is shown as zero rather than failing the
                // whole heartbeat.
                utilization_pct: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                memory_used_mb: memory.as_ref().map(|m| mib(m.used)).unwrap_or(0),
                memory_total_mb: memory.as_ref().map(|m| mib(m.total)).unwrap_or(0),
                lost: false,
                temperature_c: d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                power_mw: d.power_usage().map(u64::from).unwrap_or(0),
                ecc_uncorrected: d
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    .unwrap_or(0),
                processes,
            });
        }
        Ok(NodeTelemetry {
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_version: self.nvml.sys_cuda_driver_version().ok().map(cuda_version),
            gpus,
            // The agent adds the CPU (`crate::cpu`) and its burn-in (`crate::burn_in`).
            cpu_utilization_pct: None,
            burn_in: None,
        })
    }
}
