//! The node agent: finds the node's GPUs, registers with the control plane, and reconciles
//! what runs on the node with the desired state it pulls. Hardware sits behind two small
//! traits, [`GpuBackend`] and [`Executor`], chosen at start-up.

pub mod burn_in;
pub mod checkpoint;
mod client;
pub mod cpu;
pub mod entry;
mod error;
pub mod executor;
pub mod gpu;
mod host;
mod identity;
pub mod metrics;
pub mod mps;
pub mod reconcile;
mod run;
mod stops;
pub mod testing;
pub mod tls;
mod tunnel;
pub mod volumes;
pub mod vram;

pub use burn_in::BurnInConfig;
pub use checkpoint::CheckpointConfig;
pub use client::{ControlPlane, RetryPolicy};
pub use cpu::CpuSource;
pub use entry::{Entered, EntryControl, EntryError, EntryKind, EntryRequest, ExitStatus, Pty};
pub use error::AgentError;
pub use executor::Executor;
pub use gpu::GpuBackend;
pub use identity::NodeIdentity;
pub use metrics::AgentMetrics;
pub use run::{Agent, AgentConfig};
