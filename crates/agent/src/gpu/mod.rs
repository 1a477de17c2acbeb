//! GPU backends find the node's GPUs and sample their telemetry: `nvml` (real GPUs, the
//! library loaded at run time), `fake` (replays what NVML reported on a real machine), and
//! `sim` (declared by a spec such as `2xRTX4090,1xA100-80GB`).

mod fake;
mod nvml;
mod sim;
mod topology;

use gpurent_types::agent::{GpuInfo, NodeTelemetry};

pub use fake::{FakeNvml, Faults};
pub use nvml::NvmlGpus;
pub use sim::SimGpus;

use crate::AgentError;

pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// Reported to the control plane and shown in `gpurent nodes ls`.
    fn name(&self) -> &'static str;

    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError>;

    /// Utilisation, memory, temperature, power, ECC errors and compute processes now.
    /// Processes carry no reservation yet: the agent maps them through its executor.
    fn sample(&self) -> Result<NodeTelemetry, AgentError>;
}

/// Bytes to MiB, as NVML's memory figures are shown.
pub(crate) fn mib(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// CUDA's version number (13000) as people write it (13.0).
pub(crate) fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}
