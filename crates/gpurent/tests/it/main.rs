//! System tests of the `gpurent` binary: real processes on loopback, driven through the CLI
//! exactly as a user's scripts would, and killed with SIGKILL to test crash safety.

// A failing test panics; that is what these are for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access_cli;
mod agent_register;
mod agent_restart;
mod app_origin;
mod audit;
mod bench_fleet;
mod bench_reserve;
mod browser;
mod browser_selftest;
mod chaos;
mod cli_flow;
mod cli_safety;
mod console_host_admin;
mod console_pages;
mod console_refusals;
mod console_support;
mod console_tenant;
mod console_terminal;
mod crash;
mod data_dir;
mod docker_and_processes;
mod failover_processes;
mod first_run;
mod ha_stack;
mod host_limits;
mod http_ports;
mod instance_network;
mod instance_sftp;
mod logs_download;
mod mig;
mod mps_agent;
mod netns;
mod partition;
mod prices_cli;
mod report;
mod ride_through;
mod shared_keys;
mod sim;
mod sim_replay;
mod ssh_cli;
mod ssh_client_sshd;
mod ssh_endpoint;
mod ssh_instances;
mod ssh_keys_cli;
mod ssh_replicas;
mod ssh_support;
mod support;
mod tls;
mod unisolated;
mod vram_watchdog;
mod web_terminal;
