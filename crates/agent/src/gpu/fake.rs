//! A fake NVML that replays what NVML reported on a real machine (the JSON probes in
//! `tests/fixtures/`), so inventory and telemetry parsing are tested without a GPU. It reads
//! its file again whenever the file changes, so a test scripts telemetry by rewriting it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpurent_types::agent::{GpuInfo, GpuProcess, GpuSample, NodeTelemetry};
use serde::Deserialize;

use super::{cuda_version, mib, GpuBackend};
use crate::AgentError;

#[derive(Debug, Clone, Deserialize)]
struct Probe {
    cuda: i32,
    driver: String,
    devices: Vec<ProbeDevice>,
}

#[derive(Debug, Clone, Deserialize)]
struct ProbeDevice {
    index: u32,
    uuid: String,
    name: String,
    mem_total: u64,
    mem_used: u64,
    util_gpu: u32,
    temp: u32,
    power_mw: u64,
    ecc_errors_uncorrected_volatile: u64,
    pcie_gen: u32,
    pcie_width: u32,
    /// As nvml-wrapper's Debug prints it: `MigMode { current: 0, pending: 0 }`.
    mig_mode: String,
    processes: Vec<ProbeProcess>,
    /// With MIG on, its MIG devices (nvmlDeviceGetMigDeviceHandleByIndex for each index below
    /// nvmlDeviceGetMaxMigDeviceCount): the units offered in place of the GPU.
    #[serde(default)]
    mig_devices: Vec<ProbeMigDevice>,
}

/// A MIG device as NVML's MIG API reports it on its own handle.
#[derive(Debug, Clone, Deserialize)]
struct ProbeMigDevice {
    /// Its index under the parent (nvmlDeviceGetMigDeviceHandleByIndex).
    index: u32,
    /// nvmlDeviceGetUUID: `MIG-...`.
    uuid: String,
    /// nvmlDeviceGetName: the parent's name and the profile, `NVIDIA H200 MIG 3g.71gb`.
    name: String,
    // The fixtures also hold `gpu_instance_id` and `compute_instance_id`
    // (nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId): nothing reads them, as
    // nvml-wrapper does not expose them for the real backend either.
    /// nvmlDeviceGetMemoryInfo on the MIG handle: its GPU instance's memory.
    mem_total: u64,
    mem_used: u64,
    /// nvmlDeviceGetComputeRunningProcesses on the MIG handle: the processes in it.
    processes: Vec<ProbeProcess>,
}

#[derive(Debug, Clone, Deserialize)]
struct ProbeProcess {
    pid: u32,
    /// As nvml-wrapper's Debug prints it: `Used(1184890880)` or `Unavailable`.
    used: String,
}

#[derive(Debug, Clone)]
pub struct FakeNvml {
    path: PathBuf,
    loaded: Arc<Mutex<Loaded>>,
    faults: std::sync::Arc<std::sync::Mutex<Faults>>,
}

/// The last good probe, and the file as it was when last read (good or not).
#[derive(Debug, Clone)]
struct Loaded {
    probe: Probe,
    file: Option<FileStamp>,
}

/// What tells a changed file: a rename onto it makes another inode, a rewrite in place
/// another size or modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        inode: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

fn read_probe(path: &Path) -> Result<Probe, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Faults injected into every GPU's samples from now on (health rule tests): what is `None`
/// is replayed from the probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    pub temperature_c: Option<u32>,
    pub memory_used_mb: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    /// XID errors raised once, with the next sample.
    pub xid_errors: Vec<u64>,
    /// The GPUs have fallen off the bus.
    pub lost: bool,
}

impl FakeNvml {
    pub fn load(path: &Path) -> Result<Self, AgentError> {
        let file = stamp(path);
        let probe = read_probe(path).map_err(|message| AgentError::Gpu {
            what: "read the fake NVML probe",
            message,
        })?;
        Ok(FakeNvml {
            path: path.to_owned(),
            loaded: Arc::new(Mutex::new(Loaded { probe, file })),
            faults: std::sync::Arc::default(),
        })
    }

    /// The probe as the file says now: read again when the file changed since last read. A
    /// file that cannot be read or parsed (written halfway: write another and rename it over
    /// this one) keeps the last good probe, with a warning once per change.
    fn probe(&self) -> Probe {
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = stamp(&self.path);
        if now != loaded.file {
            loaded.file = now;
            match read_probe(&self.path) {
                Ok(probe) => loaded.probe = probe,
                Err(error) => {
                    tracing::warn!(%error, "fake NVML probe not readable; keeping the last good one")
                }
            }
        }
        loaded.probe.clone()
    }

    /// Replaces the injected faults (`Faults::default()` clears them).
    pub fn inject(&self, faults: Faults) {
        if let Ok(mut f) = self.faults.lock() {
            *f = faults;
        }
    }
}

fn used_bytes(s: &str) -> u64 {
    s.strip_prefix("Used(")
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl GpuBackend for FakeNvml {
    fn name(&self) -> &'static str {
        "fake-nvml"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError> {
        Ok(self.probe().devices.iter().flat_map(offered).collect())
    }

    fn sample(&self) -> Result<NodeTelemetry, AgentError> {
        let faults = match self.faults.lock() {
            // XIDs are events: reported once.
            Ok(mut f) => {
                let now = f.clone();
                f.xid_errors.clear();
                now
            }
            Err(_) => Faults::default(),
        };
        let probe = self.probe();
        Ok(NodeTelemetry {
            driver_version: Some(probe.driver.clone()),
            cuda_version: Some(cuda_version(probe.cuda)),
            gpus: probe
                .devices
                .iter()
                .flat_map(|d| sampled(d, &faults))
                .collect(),
            // The agent adds the CPU (`crate::cpu`) and its burn-in (`crate::burn_in`).
            cpu_utilization_pct: None,
            burn_in: None,
        })
    }
}

fn mig_on(d: &ProbeDevice) -> bool {
    !d.mig_mode.contains("current: 0")
}

fn processes(recorded: &[ProbeProcess]) -> Vec<GpuProcess> {
    recorded
        .iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            used_mb: mib(used_bytes(&p.used)),
            reservation_id: None,
        })
        .collect()
}

/// What a recorded GPU offers: itself, or with MIG on each of its MIG devices (a GPU with MIG
/// on runs no CUDA work of its own). A MIG device's link is its parent's.
fn offered(d: &ProbeDevice) -> Vec<GpuInfo> {
    let unit = |uuid: &str, model: &str, mem_total: u64| GpuInfo {
        index: d.index,
        uuid: uuid.to_owned(),
        model: model.to_owned(),
        vram_mb: mib(mem_total),
        pcie_gen: Some(d.pcie_gen),
        pcie_width: Some(d.pcie_width),
        // The probe recorded the links as they were, not their maximum.
        pcie_gen_max: None,
        pcie_width_max: None,
        mig_enabled: Some(mig_on(d)),
        // The probe recorded no topology.
        switch_group: None,
    };
    if !mig_on(d) {
        return vec![unit(&d.uuid, &d.name, d.mem_total)];
    }
    mig_devices(d)
        .map(|m| unit(&m.uuid, &m.name, m.mem_total))
        .collect()
}

/// In NVML's order: by index under the parent.
fn mig_devices(d: &ProbeDevice) -> impl Iterator<Item = &ProbeMigDevice> {
    let mut devices: Vec<&ProbeMigDevice> = d.mig_devices.iter().collect();
    devices.sort_by_key(|m| m.index);
    devices.into_iter()
}

/// The samples of a recorded GPU, one per unit `offered` gives. A MIG device has its own
/// memory and processes; temperature, power, ECC errors, XIDs and being lost are the physical
/// GPU's (so the health rules judge each of its units by them), and its utilisation is 0:
/// NVML reports none per MIG device.
fn sampled(d: &ProbeDevice, faults: &Faults) -> Vec<GpuSample> {
    let unit = |uuid: &str, util: u32, used: u64, total: u64, procs: &[ProbeProcess]| GpuSample {
        uuid: uuid.to_owned(),
        utilization_pct: util,
        memory_used_mb: faults.memory_used_mb.unwrap_or(mib(used)),
        temperature_c: faults.temperature_c.unwrap_or(d.temp),
        power_mw: d.power_mw,
        ecc_uncorrected: faults
            .ecc_uncorrected
            .unwrap_or(d.ecc_errors_uncorrected_volatile),
        memory_total_mb: mib(total),
        xid_errors: faults.xid_errors.clone(),
        lost: faults.lost,
        processes: processes(procs),
    };
    if !mig_on(d) {
        return vec![unit(
            &d.uuid,
            d.util_gpu,
            d.mem_used,
            d.mem_total,
            &d.processes,
        )];
    }
    mig_devices(d)
        .map(|m| unit(&m.uuid, 0, m.mem_used, m.mem_total, &m.processes))
        .collect()
}

#[cfg(test)]
mod tests {
    use gpurent_types::GpuType;

    use super::*;

    fn fixture(name: &str) -> FakeNvml {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/nvidia-h200")
            .join(name);
        FakeNvml::load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes the probe as a test does: to a file beside it, renamed over it.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_rewritten_probe_is_read_again_and_a_bad_one_keeps_the_last_good() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("nvml.json");
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-h200");
        let idle = std::fs::read_to_string(fixtures.join("nvml-idle.json")).unwrap_or_default();
        let busy = std::fs::read_to_string(fixtures.join("nvml-busy.json")).unwrap_or_default();
        replace(&path, &idle);
        let nvml = FakeNvml::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let used = |n: &FakeNvml| {
            let t = n.sample().unwrap_or_default();
            (t.gpus[0].utilization_pct, t.gpus[0].processes.len())
        };
        assert_eq!(used(&nvml), (0, 0));
        replace(&path, &busy);
        assert_eq!(used(&nvml), (99, 1), "the rewritten probe is replayed");
        // A copy shares what its original read (the agent hands clones around).
        assert_eq!(used(&nvml.clone()), (99, 1));
        replace(&path, "{\"cuda\": 13000, \"devi");
        assert_eq!(
            used(&nvml),
            (99, 1),
            "a half-written probe keeps the last good one"
        );
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            used(&nvml),
            (99, 1),
            "a missing probe keeps the last good one"
        );
        replace(&path, &idle);
        assert_eq!(used(&nvml), (0, 0), "a good probe after a bad one is read");
        assert_eq!(nvml.discover().map(|g| g.len()).unwrap_or(0), 1);
    }

    #[test]
    fn h200_inventory_is_read_exactly() {
        let gpus = fixture("nvml-idle.json").discover().unwrap_or_default();
        assert_eq!(
            gpus,
            vec![GpuInfo {
                index: 0,
                uuid: "GPU-cce5198b-9fe5-68bd-b940-5f2b9b9158a4".into(),
                model: "NVIDIA H200".into(),
                vram_mb: 143_771,
                pcie_gen: Some(5),
                pcie_width: Some(16),
                pcie_gen_max: None,
                pcie_width_max: None,
                mig_enabled: Some(false),
                switch_group: None,
            }]
        );
    }

    #[test]
    fn mig_devices_are_offered_in_place_of_their_gpu() {
        let gpus = fixture("nvml-mig.json").discover().unwrap_or_default();
        let unit = |uuid: &str, model: &str, vram_mb: u64| GpuInfo {
            index: 0,
            uuid: uuid.into(),
            model: model.into(),
            vram_mb,
            pcie_gen: Some(5),
            pcie_width: Some(16),
            pcie_gen_max: None,
            pcie_width_max: None,
            mig_enabled: Some(true),
            switch_group: None,
        };
        assert_eq!(
            gpus,
            vec![
                unit(
                    "MIG-7c2e6a2b-8f3d-5b1e-9a44-0d6f1c3e2b71",
                    "NVIDIA H200 MIG 3g.71gb",
                    71_680
                ),
                unit(
                    "MIG-3a91d0c4-62b7-5e08-b1f9-84c2e7a5d3f0",
                    "NVIDIA H200 MIG 2g.35gb",
                    35_840
                ),
                unit(
                    "MIG-e5b84f17-0c6a-5d29-8e3b-2f71a9c4d608",
                    "NVIDIA H200 MIG 1g.18gb",
                    17_920
                ),
                unit(
                    "MIG-1f6d3b28-a94e-5c71-9d02-6b8e4f3a7c15",
                    "NVIDIA H200 MIG 1g.18gb",
                    17_920
                ),
            ]
        );
        let types: Vec<String> = gpus
            .iter()
            .map(|g| GpuType::from_driver_name(&g.model).display().to_owned())
            .collect();
        assert_eq!(
            types,
            [
                "H200-MIG-3G.71GB",
                "H200-MIG-2G.35GB",
                "H200-MIG-1G.18GB",
                "H200-MIG-1G.18GB"
            ]
        );
    }

    #[test]
    fn a_mig_device_has_its_own_memory_and_processes_and_its_gpus_health() {
        let fake = fixture("nvml-mig-busy.json");
        let t = fake.sample().unwrap_or_default();
        let three_g = GpuSample {
            uuid: "MIG-7c2e6a2b-8f3d-5b1e-9a44-0d6f1c3e2b71".into(),
            // NVML reports no utilisation per MIG device.
            utilization_pct: 0,
            memory_used_mb: 1138,
            temperature_c: 53,
            power_mw: 687_933,
            ecc_uncorrected: 0,
            memory_total_mb: 71_680,
            xid_errors: vec![],
            lost: false,
            processes: vec![GpuProcess {
                pid: 472,
                used_mb: 1130,
                reservation_id: None,
            }],
        };
        assert_eq!(t.gpus.len(), 4, "{:?}", t.gpus);
        assert_eq!(t.gpus[0], three_g);
        // The parent lists the process too; it is counted once, in its MIG device.
        let processes: usize = t.gpus.iter().map(|g| g.processes.len()).sum();
        assert_eq!(processes, 1);
        let idle = &t.gpus[3];
        assert_eq!(
            (
                idle.uuid.as_str(),
                idle.memory_used_mb,
                idle.memory_total_mb,
                idle.temperature_c
            ),
            ("MIG-1f6d3b28-a94e-5c71-9d02-6b8e4f3a7c15", 0, 17_920, 53)
        );
        // A fault of the physical GPU shows in every MIG device of it.
        fake.inject(Faults {
            ecc_uncorrected: Some(2),
            xid_errors: vec![79],
            ..Faults::default()
        });
        let t = fake.sample().unwrap_or_default();
        assert!(
            t.gpus
                .iter()
                .all(|g| g.ecc_uncorrected == 2 && g.xid_errors == [79]),
            "{:?}",
            t.gpus
        );
    }

    #[test]
    fn h200_telemetry_under_load_is_read_exactly() {
        let t = fixture("nvml-busy.json").sample().unwrap_or_default();
        assert_eq!(t.driver_version.as_deref(), Some("580.159.04"));
        assert_eq!(t.cuda_version.as_deref(), Some("13.0"));
        assert_eq!(
            t.gpus,
            vec![GpuSample {
                uuid: "GPU-cce5198b-9fe5-68bd-b940-5f2b9b9158a4".into(),
                utilization_pct: 99,
                memory_used_mb: 1138,
                temperature_c: 53,
                power_mw: 687_933,
                ecc_uncorrected: 0,
                memory_total_mb: 143_771,
                xid_errors: vec![],
                lost: false,
                processes: vec![GpuProcess {
                    pid: 472,
                    used_mb: 1130,
                    reservation_id: None
                }],
            }]
        );
        let idle = fixture("nvml-idle.json").sample().unwrap_or_default();
        assert_eq!(
            (
                idle.gpus[0].utilization_pct,
                idle.gpus[0].memory_used_mb,
                idle.gpus[0].processes.len()
            ),
            (0, 0, 0)
        );
    }
}
