//! `gpurent`: one binary for the control plane (`up`, `server`), the node agent (`agent`) and
//! the CLI that tenants and admins use.

mod api_client;
mod cli;
mod cmd;
mod config;
mod output;

use std::process::ExitCode;

use crate::api_client::CliError;
use crate::cli::{BenchCommand, Command, DaemonCommand};

/// mimalloc: with glibc's allocator, `malloc` and `free` took a fifth of the busy CPU of the
/// reservation path and a sixth of the control plane's under `bench fleet`, contended between
/// the runtime's workers, the reservation writer and SQLite's thread (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPURENT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    // Logs go to stderr: stdout is for results (`--json` prints exactly one document there).
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = match config::parse(std::env::args_os().collect()) {
        Ok(parsed) => parsed.cli,
        Err(config::ParseError::Usage(e)) => {
            // With --json, a usage error is a JSON error too; help and version print as usual.
            let wants_json = std::env::args_os()
                .take_while(|a| a != "--")
                .any(|a| a == "--json");
            if wants_json && e.use_stderr() {
                let detail = e.to_string();
                let message: Vec<&str> = detail
                    .lines()
                    .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
                    .map(|l| l.trim().trim_start_matches("error: "))
                    .collect();
                report_cli_error(&CliError::new("usage", message.join(" ")), true);
                return ExitCode::from(2);
            }
            e.exit();
        }
        Err(e) => {
            // A configuration file's flaw: the daemon does not start.
            eprintln!("error: {}", output::escape_control(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    // Before the runtime: the helper enters a mount namespace, which needs a process of
    // one thread.
    if let Command::Daemon(DaemonCommand::InstanceSftp(args)) = &cli.command {
        return cmd::instance_sftp::run(args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = cli.json;
    let tls = cli.client_tls();
    match cli.command {
        Command::Daemon(daemon) => run_daemon(daemon, &runtime, &cli.server, tls, json),
        Command::Api(command) => {
            let result = runtime.block_on(cmd::client::run(
                command,
                &cli.server,
                cli.token,
                &tls,
                json,
            ));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    report_cli_error(&e, json);
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn run_daemon(
    daemon: DaemonCommand,
    runtime: &tokio::runtime::Runtime,
    server: &str,
    tls: gpurent_agent::tls::ClientTls,
    json: bool,
) -> ExitCode {
    match daemon {
        // Served before the runtime started.
        DaemonCommand::InstanceSftp(_) => ExitCode::FAILURE,
        DaemonCommand::Up(args) => {
            init_logging();
            report_daemon(runtime.block_on(cmd::up::run(*args, tls)))
        }
        DaemonCommand::Server(args) => {
            init_logging();
            report_daemon(runtime.block_on(cmd::server::run(*args)))
        }
        DaemonCommand::Agent(args) => {
            init_logging();
            report_daemon(runtime.block_on(cmd::agent::run(*args, server, tls)))
        }
        DaemonCommand::Bench(BenchCommand::Reserve(args)) => {
            report_daemon(runtime.block_on(cmd::bench::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Running(args)) => {
            // Its agent's log, only when asked for (it would cut into the table).
            if std::env::var_os("GPURENT_LOG").is_some() {
                init_logging();
            }
            report_daemon(runtime.block_on(cmd::bench_running::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Array(args)) => {
            report_daemon(runtime.block_on(cmd::bench_array::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Endpoint(args)) => {
            if std::env::var_os("GPURENT_LOG").is_some() {
                init_logging();
            }
            report_daemon(runtime.block_on(cmd::bench_endpoint::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::App { port }) => {
            report_daemon(runtime.block_on(cmd::bench_app::run(port)))
        }
        DaemonCommand::Bench(BenchCommand::Settle(args)) => {
            init_logging();
            report_daemon(runtime.block_on(cmd::bench_settle::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Start(args)) => {
            report_daemon(runtime.block_on(cmd::bench_start::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Backup(args)) => {
            report_daemon(runtime.block_on(cmd::bench_backup::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Failover(args)) => {
            report_daemon(runtime.block_on(cmd::bench_failover::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Audit(args)) => {
            report_daemon(runtime.block_on(cmd::bench_audit::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Ssh(args)) => {
            report_daemon(runtime.block_on(cmd::bench_ssh::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Console(args)) => {
            report_daemon(runtime.block_on(cmd::bench_console::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Agent(args)) => {
            report_daemon(runtime.block_on(cmd::bench_agent::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Fleet(args)) => {
            report_daemon(runtime.block_on(cmd::bench_fleet::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Chaos(args)) => {
            report_daemon(runtime.block_on(cmd::bench_chaos::run(args, json)))
        }
        DaemonCommand::Bench(BenchCommand::Upgrade(args)) => {
            report_daemon(runtime.block_on(cmd::bench_chaos::upgrade(args, json)))
        }
        DaemonCommand::Sim(args) => report_daemon(cmd::sim::run(&args, json)),
        DaemonCommand::Config(command) => match config::print::run(command, json) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                report_cli_error(&CliError::new("config", format!("{e:#}")), json);
                ExitCode::FAILURE
            }
        },
    }
}

fn report_daemon(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", output::escape_control(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn report_cli_error(e: &CliError, json: bool) {
    if json {
        let body = serde_json::json!({"error": {"code": e.code, "message": e.message}});
        // As JSON is: its own escapes, no others.
        let _ = output::print_json_line(&body);
    } else {
        eprintln!(
            "error: {} ({})",
            output::escape_control(&e.message),
            output::escape_control(&e.code)
        );
    }
}
