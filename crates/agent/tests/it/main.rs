//! The agent's executors against the real operating system: processes, process groups and,
//! where the cgroup v2 tree is writable, cgroups.

// A failing test panics; that is what these are for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod docker;
mod process;
mod support;
