//! `gpurent bench chaos`: availability as a client sees it while the HA stack is hurt. The
//! stack of `scripts/ha-up.sh` (HAProxy, three replicas, PostgreSQL under pg_auto_failover,
//! each replica reaching the database through a proxy of this process), simulated agents and
//! tenants' clients through HAProxy, a seeded fault every 30-60 s; then whether every
//! acknowledged write is there, nothing ran twice, and the ledger and the audit trail check.

mod agents;
mod clients;
mod faults;
mod load;
mod proxy;
mod stack;
mod upgrade;

use std::time::Duration;

use anyhow::bail;

use self::faults::Target;
use self::load::{ChaosResult, Load, Spec};
use self::proxy::ReplicaProxy;
use self::stack::{Stack, REPLICAS};
use crate::cli::BenchChaosArgs;
use crate::output::{print_json, print_table};

pub use self::upgrade::run as upgrade;

pub async fn run(args: BenchChaosArgs, json: bool) -> anyhow::Result<()> {
    check(&args)?;
    let mut stack = Stack::new(args.missed_heartbeats)?;
    // Ctrl-C ends the run; the stack is brought down (ha-down.sh) either way, its logs kept
    // when the run did not finish.
    let result = tokio::select! {
        r = measure(&args, &mut stack) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    // A run that failed or missed a target keeps the stack's logs to look into.
    if !result.as_ref().is_ok_and(|r| r.targets_met) {
        stack.keep_logs();
    }
    drop(stack);
    let result = result?;
    if json {
        print_json(&result).map_err(|e| anyhow::anyhow!(e))?;
    } else {
        print_text(&result);
    }
    Ok(())
}

/// What the clients saw, as a table, and each fault on its own line (stderr).
fn print_text(result: &ChaosResult) {
    print_table(
        &[
            "requests",
            "answered",
            "availability",
            "longest outage s",
            "lost",
            "double runs",
            "ledger",
            "audit",
            "p99 ms (faults)",
            "faults",
            "targets",
        ],
        &[vec![
            result.requests.to_string(),
            result.answered.to_string(),
            format!("{:.4}%", result.availability * 100.0),
            format!("{:.1}", result.longest_outage_s),
            (result.lost_reservations + result.lost_stops).to_string(),
            result.double_runs.to_string(),
            ok(result.ledger_ok).to_owned(),
            ok(result.audit_ok).to_owned(),
            format!("{:.0}", result.p99_ms_during_faults),
            result.faults.len().to_string(),
            if result.targets_met { "met" } else { "MISSED" }.to_owned(),
        ]],
    );
    print_faults(result);
}

/// Each fault (or upgrade step) on a line of its own, and the first error, on stderr.
fn print_faults(result: &ChaosResult) {
    for f in &result.faults {
        eprintln!(
            "  {:>6.1} s  {:<14} {:<20} repaired at {:.1} s{}",
            f.at_s,
            f.kind.to_string(),
            f.target,
            f.repaired_s,
            f.note
                .as_deref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        );
    }
    if let Some(e) = &result.first_error {
        eprintln!("bench: first error: {e}");
    }
}

fn ok(b: bool) -> &'static str {
    if b {
        "ok"
    } else {
        "BROKEN"
    }
}

fn check(args: &BenchChaosArgs) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "bench chaos starts the HA stack (scripts/ha-up.sh: PostgreSQL under pg_auto_failover, \
             HAProxy, packages installed when missing), which needs root: run it as root"
        );
    }
    anyhow::ensure!(
        args.minutes > 0.0 && args.minutes.is_finite(),
        "--minutes must be more than 0"
    );
    anyhow::ensure!(
        args.rate > 0.0 && args.rate <= 1000.0,
        "--rate must be more than 0 and at most 1000 requests a second"
    );
    anyhow::ensure!(
        args.fault_every_min >= 1.0 && args.fault_every_min <= args.fault_every_max,
        "--fault-every-min must be at least 1 and at most --fault-every-max"
    );
    Ok(())
}

async fn measure(args: &BenchChaosArgs, stack: &mut Stack) -> anyhow::Result<ChaosResult> {
    let mut proxies = Vec::new();
    for _ in 0..REPLICAS {
        proxies.push(ReplicaProxy::start(&[stack.pg_node_port(1), stack.pg_node_port(2)]).await?);
    }
    stack.set_replica_db_urls(proxies.iter().map(ReplicaProxy::database_url).collect());
    let stack_up_s = stack.first_up("").await?;
    let load = Load::begin(
        stack,
        Spec {
            tenants: args.tenants,
            agents: args.agents,
            rate: args.rate,
            missed_heartbeats: args.missed_heartbeats,
        },
    )
    .await?;
    eprintln!(
        "bench: {} min of load, a fault every {}-{} s",
        args.minutes, args.fault_every_min, args.fault_every_max
    );
    let end = load.start + Duration::from_secs_f64(args.minutes * 60.0);
    let faults = faults::inject(
        &Target {
            stack,
            proxies: &proxies,
            agents: &load.controls,
        },
        &args.faults,
        args.seed,
        (args.fault_every_min, args.fault_every_max),
        load.start,
        end,
    )
    .await?;
    tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
    let mut result = load.finish(faults, stack_up_s).await?;
    result.minutes = args.minutes;
    result.seed = Some(args.seed);
    Ok(result)
}
