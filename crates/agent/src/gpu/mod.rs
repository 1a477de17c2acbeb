//! GPU backends find the node's GPUs: `sim` from a spec like `2xRTX4090,1xA100-80GB`; NVML
//! (real GPUs) and the fixture-replaying fake come with the real agent.

mod sim;

use gpurent_types::agent::GpuInfo;

pub use sim::SimGpus;

use crate::AgentError;

pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// Reported to the control plane and shown in `gpurent nodes ls`.
    fn name(&self) -> &'static str;

    fn discover(&self) -> Result<Vec<GpuInfo>, AgentError>;
}
