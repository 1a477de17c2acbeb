//! The agent's executors against the real operating system: processes, process groups and,
//! where the cgroup v2 tree is writable, cgroups; and the agent's loop with them.

// A failing test panics; that is what these are for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent;
mod by_image;
mod checkpoint;
mod docker;
mod entry;
mod entry_docker;
mod entry_support;
mod gpu_limits;
mod isolation;
mod kept_output;
mod metrics;
mod mps;
mod network;
mod process;
mod support;
