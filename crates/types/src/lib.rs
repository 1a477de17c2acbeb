//! Types shared by every gpurent crate: money, GPU type names, statuses, and the
//! request and response bodies of the HTTP API and of the agent protocol; and the one way the
//! daemons write owner-only key files and load PEM (`keyfile`); the rule of login throttling
//! (`login_throttle`).

mod access_api;
pub mod agent;
pub mod api;
mod clock;
pub mod families;
mod gpu_type;
pub mod keyfile;
pub mod login_throttle;
mod money;
pub mod report;
mod status;
pub mod text;

pub use clock::{Clock, ManualClock, SystemClock};
pub use gpu_type::{GpuType, GpuTypeError, MigSlice};
pub use money::{Money, MoneyError};
pub use status::{
    NodeStatus, OnNodeLoss, ReservationStatus, RestartPolicy, Role, TeamRole, Tier, TokenScope,
    UnknownValue,
};
