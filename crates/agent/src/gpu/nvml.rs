//! Real GPUs through NVML. `libnvidia-ml.so.1` is loaded when the agent starts, so the same
//! binary runs on hosts without GPUs (where this backend reports that NVML is missing). A GPU
//! with MIG mode on is offered as its MIG devices, each a unit of its own.

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
use nvml_wrapper::{Device, EventSet, Nvml};

use super::topology::switch_groups;
use super::{cuda_version, mib, GpuBackend};
use crate::AgentError;

pub struct NvmlGpus {
    /// Loaded once for the agent's life: the event set borrows it.
    nvml: &'static Nvml,
    /// The UUIDs `discover` offered, by GPU index (the GPU's own, or its MIG devices'): the
    /// units of a GPU fallen off the bus are reported by them.
    uuids: Mutex<Vec<Vec<String>>>,
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

/// Whether MIG mode is on now (a GPU without MIG support: off).
fn mig_on(d: &Device<'_>) -> bool {
    d.mig_mode().is_ok_and(|m| m.current != 0)
}

/// The MIG devices of a GPU with MIG mode on, in NVML's order. NVML gives the most there can
/// be; an index without a MIG device (no compute instance there) is skipped.
fn mig_devices<'n>(d: &Device<'n>) -> Vec<Device<'n>> {
    let max = d.mig_device_count().unwrap_or(0);
    (0..max)
        .filter_map(|i| d.mig_device_by_index(i).ok())
        .collect()
}

/// A MIG device's model: NVML names it after its parent and profile (`NVIDIA H200 MIG
/// 3g.71gb`); a driver that does not gets the parent's name and the memory, so the unit is
/// still a type of its own (priced by memory, as the profile is unknown).
fn mig_model(parent: &str, mig_name: Option<String>, vram_mb: u64) -> String {
    match mig_name {
        Some(name) if name.contains(" MIG ") => name,
        _ => format!("{parent} MIG {}gb", vram_mb.div_ceil(1024)),
    }
}

fn processes(d: &Device<'_>) -> Vec<GpuProcess> {
    d.running_compute_processes()
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
        .collect()
}

impl GpuBackend for NvmlGpus {
    fn name(&self) -> &'static str {
        "nvml"
    }

    /// Every GPU, or with MIG mode on each of its MIG devices in its place (a GPU with MIG on
    /// runs CUDA work only in its MIG devices). A MIG device has the index, PCIe link and
    /// switch group of its GPU.
    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError> {
        let count = self.nvml.device_count().map_err(nvml_error("count GPUs"))?;
        let mut gpus = Vec::new();
        let mut uuids = Vec::new();
        for index in 0..count {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_error("open a GPU"))?;
            let gpu = GpuInfo {
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
            };
            if !mig_on(&d) {
                uuids.push(vec![gpu.uuid.clone()]);
                gpus.push(gpu);
                continue;
            }
            let mut units = Vec::new();
            for m in mig_devices(&d) {
                let vram_mb = mib(m
                    .memory_info()
                    .map_err(nvml_error("read a MIG device's memory"))?
                    .total);
                units.push(GpuInfo {
                    uuid: m.uuid().map_err(nvml_error("read a MIG device's UUID"))?,
                    model: mig_model(&gpu.model, m.name().ok(), vram_mb),
                    vram_mb,
                    ..gpu.clone()
                });
            }
            if units.is_empty() {
                tracing::warn!(
                    gpu = %gpu.uuid,
                    "MIG mode is on but the GPU has no MIG devices: it is not offered (create \
                     GPU and compute instances with `nvidia-smi mig -cgi PROFILES -C`)"
                );
            }
            uuids.push(units.iter().map(|u| u.uuid.clone()).collect());
            gpus.extend(units);
        }
        // Two GPUs are near when their closest common ancestor is one PCIe switch or the board.
        let physical = usize::try_from(count).unwrap_or(0);
        let groups = switch_groups(physical, |i, j| {
            let index = |k: usize| u32::try_from(k).ok();
            let a = self.nvml.device_by_index(index(i)?).ok()?;
            let b = self.nvml.device_by_index(index(j)?).ok()?;
            let level = a.topology_common_ancestor(b).ok()?;
            Some(matches!(
                level,
                TopologyLevel::Internal | TopologyLevel::Single
            ))
        });
        for gpu in &mut gpus {
            gpu.switch_group = usize::try_from(gpu.index)
                .ok()
                .and_then(|i| groups.get(i).copied().flatten());
        }
        if let Ok(mut known) = self.uuids.lock() {
            *known = uuids;
        }
        if let Ok(mut events) = self.xid_events.lock() {
            if events.is_none() {
                *events = self.register_xid_events(count);
            }
        }
        Ok(gpus)
    }

    /// One sample per unit `discover` offers. A MIG device has its own memory and processes;
    /// its temperature, power, ECC errors and XIDs are its GPU's, so the health rules judge
    /// every unit of a failing GPU. Its utilisation is 0: NVML reports none per MIG device
    /// (nvmlDeviceGetUtilizationRates is not supported with MIG on; DCGM's profiling metrics
    /// would be the way).
    fn sample(&self) -> Result<NodeTelemetry, AgentError> {
        let count = self.nvml.device_count().map_err(nvml_error("count GPUs"))?;
        let mut gpus = Vec::new();
        let mut xids = self.take_xids();
        for index in 0..count {
            let d = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                // Fallen off the bus: each of its units is reported as such (by the UUIDs
                // `discover` found), the others sampled.
                Err(NvmlError::GpuLost) => {
                    let known = self
                        .uuids
                        .lock()
                        .ok()
                        .and_then(|u| u.get(usize::try_from(index).ok()?).cloned())
                        .unwrap_or_default();
                    // XID 79 (fallen off the bus), when NVML raised it, by the GPU's UUID or
                    // the UUID of its only unit.
                    let raised: Vec<u64> = known
                        .iter()
                        .flat_map(|u| xids.remove(u).unwrap_or_default())
                        .collect();
                    for uuid in known {
                        gpus.push(GpuSample {
                            xid_errors: raised.clone(),
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
            let uuid = d.uuid().map_err(nvml_error("read a GPU's UUID"))?;
            let xid_errors = xids.remove(&uuid).unwrap_or_default();
            // A reading the GPU does not support is shown as zero rather than failing the
            // whole heartbeat.
            let temperature_c = d.temperature(TemperatureSensor::Gpu).unwrap_or(0);
            let power_mw = d.power_usage().map(u64::from).unwrap_or(0);
            let ecc_uncorrected = d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .unwrap_or(0);
            let unit = |uuid: String, utilization_pct: u32, d: &Device<'_>| {
                let memory = d.memory_info().ok();
                GpuSample {
                    xid_errors: xid_errors.clone(),
                    uuid,
                    utilization_pct,
                    memory_used_mb: memory.as_ref().map(|m| mib(m.used)).unwrap_or(0),
                    memory_total_mb: memory.as_ref().map(|m| mib(m.total)).unwrap_or(0),
                    lost: false,
                    temperature_c,
                    power_mw,
                    ecc_uncorrected,
                    processes: processes(d),
                }
            };
            if !mig_on(&d) {
                let utilization = d.utilization_rates().map(|u| u.gpu).unwrap_or(0);
                gpus.push(unit(uuid, utilization, &d));
                continue;
            }
            for m in mig_devices(&d) {
                let Ok(mig_uuid) = m.uuid() else { continue };
                gpus.push(unit(mig_uuid, 0, &m));
            }
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

#[cfg(test)]
mod tests {
    use super::mig_model;

    #[test]
    fn a_mig_device_is_named_by_nvml_or_after_its_parent() {
        assert_eq!(
            mig_model(
                "NVIDIA H200",
                Some("NVIDIA H200 MIG 3g.71gb".into()),
                71_680
            ),
            "NVIDIA H200 MIG 3g.71gb"
        );
        for unnamed in [None, Some("NVIDIA H200".to_owned())] {
            assert_eq!(
                mig_model("NVIDIA H200", unnamed, 71_680),
                "NVIDIA H200 MIG 70gb"
            );
        }
    }
}
