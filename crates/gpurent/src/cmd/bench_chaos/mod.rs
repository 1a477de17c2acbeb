//! `gpurent bench chaos`: availability as a client sees it while the HA stack is hurt. The
//! stack of `scripts/ha-up.sh` (HAProxy, three replicas, PostgreSQL under pg_auto_failover,
//! each replica reaching the database through a proxy of this process), simulated agents and
//! tenants' clients through HAProxy, a seeded fault every 30-60 s; then whether every
//! acknowledged write is there, nothing ran twice, and the ledger and the audit trail check.

mod agents;
mod clients;
mod faults;
mod proxy;
mod stack;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_types::api::{AuditVerdict, CreateUser, JoinToken, LedgerReport, UserCreated};
use gpurent_types::{Money, Role};
use serde::Serialize;
use tokio::sync::watch;

use self::agents::{Control, Runs};
use self::clients::{Record, Tenant};
use self::faults::{Fault, Target};
use self::proxy::ReplicaProxy;
use self::stack::{Stack, REPLICAS};
use super::bench_common::percentile_ms;
use super::bench_fleet_agent::{self as fleet_agent, Fleet, HEARTBEAT};
use crate::api_client::{ApiClient, Retry};
use crate::cli::BenchChaosArgs;
use crate::output::{print_json, print_table};

/// GPUs of each simulated agent.
const GPUS_PER_AGENT: u32 = 4;

/// The targets (issue 19): availability, and nothing lost or run twice.
const AVAILABILITY_TARGET: f64 = 0.9995;

#[derive(Debug, Serialize)]
struct ChaosResult {
    minutes: f64,
    seed: u64,
    /// Client requests sent (reserve, get, ls, logs, stop).
    requests: u64,
    /// Answered by the API, after the client's own retries (3, 5 s apart).
    answered: u64,
    /// answered / requests.
    availability: f64,
    /// The longest time in which every try failed, from the first failed try after an
    /// answered one to the next answered one.
    longest_outage_s: f64,
    /// Reservations acknowledged (201) that the API no longer knows.
    lost_reservations: u64,
    /// Stops acknowledged whose reservation still runs.
    lost_stops: u64,
    /// Reservations that ran on two nodes at the same time.
    double_runs: u64,
    ledger_ok: bool,
    audit_ok: bool,
    /// Of the requests sent while a fault was in effect (injected, not yet repaired): the
    /// 99th percentile from sending to the final answer, retries included.
    p99_ms_during_faults: f64,
    p50_ms: f64,
    p99_ms: f64,
    reservations_acknowledged: u64,
    stops_acknowledged: u64,
    instances_started: u64,
    agents: u32,
    agent_syncs: u64,
    agent_failed_syncs: u64,
    /// Agents that stopped their instances for a lapsed lease.
    agent_fences: u64,
    faults: Vec<Fault>,
    /// Seconds ha-up.sh took to bring the stack up from nothing.
    stack_up_s: f64,
    /// Each minute of the load: requests sent, left unanswered, and their p99 (ms).
    minutes_seen: Vec<Minute>,
    /// Requests left unanswered, by what they did.
    unanswered: std::collections::BTreeMap<clients::Op, u64>,
    /// The first error a client was left with (answered or not).
    #[serde(skip_serializing_if = "Option::is_none")]
    first_error: Option<String>,
    /// Availability of at least 99.95%, nothing lost or run twice, ledger and trail clean.
    targets_met: bool,
}

/// One minute of a run, by when its requests were sent.
#[derive(Debug, Serialize)]
struct Minute {
    minute: u64,
    requests: u64,
    unanswered: u64,
    p99_ms: f64,
}

/// The requests of each minute of the load.
fn by_minute(outcomes: &[clients::Outcome], start: Instant) -> Vec<Minute> {
    let mut minutes: std::collections::BTreeMap<u64, (u64, u64, Vec<Duration>)> =
        std::collections::BTreeMap::new();
    for o in outcomes {
        let m = (o.sent - start).as_secs() / 60;
        let e = minutes.entry(m).or_default();
        e.0 += 1;
        e.1 += u64::from(!o.answered);
        e.2.push(o.took);
    }
    minutes
        .into_iter()
        .map(|(minute, (requests, unanswered, mut took))| {
            took.sort();
            Minute {
                minute,
                requests,
                unanswered,
                p99_ms: percentile_ms(&took, 0.99),
            }
        })
        .collect()
}

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
    Ok(())
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
    eprintln!(
        "bench: bringing the HA stack up in {} (ha-up.sh; about 2 minutes)",
        stack.dir().display()
    );
    let up = Instant::now();
    stack.up().await?;
    let stack_up_s = up.elapsed().as_secs_f64();
    eprintln!(
        "bench: the stack is up after {stack_up_s:.0} s: {}",
        stack.url()
    );

    let admin = ApiClient::new(&stack.url(), Some(stack.admin_token()?)).retry(Retry::DEFAULT);
    let mut tokens = Vec::new();
    for i in 0..args.tenants {
        let user: UserCreated = admin
            .post(
                "/api/v1/users",
                &CreateUser {
                    name: format!("chaos-{i}"),
                    role: Some(Role::Tenant),
                    credit: Some(Money::units(1_000_000)),
                },
                Some(&uuid::Uuid::new_v4().to_string()),
            )
            .await
            .context("create a tenant")?;
        tokens.push(user.token);
    }
    let join: JoinToken = admin
        .post("/api/v1/nodes/join-token", &serde_json::json!({}), None)
        .await
        .context("make a join token")?;

    let fleet = Arc::new(Fleet {
        http: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?,
        base: stack.url(),
        join_token: join.token,
        gpus_per_node: GPUS_PER_AGENT,
        measuring: AtomicBool::new(false),
        posted: Mutex::new(std::collections::HashMap::new()),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    let ttl = HEARTBEAT * args.missed_heartbeats;
    // As the agent's default: half a heartbeat less than the node TTL, at least a heartbeat.
    let lease = ttl.saturating_sub(HEARTBEAT / 2).max(HEARTBEAT);
    let runs = Arc::new(Runs::default());
    let (stop_agents, agents_stopped) = watch::channel(false);
    let mut controls = Vec::new();
    let mut agent_tasks = Vec::new();
    for n in 0..args.agents {
        let auth = fleet_agent::register(&fleet, n).await?;
        let control = Arc::new(Control::default());
        controls.push(control.clone());
        let delay = HEARTBEAT.mul_f64(f64::from(n) / f64::from(args.agents));
        agent_tasks.push(tokio::spawn(agents::run(
            fleet.clone(),
            runs.clone(),
            control,
            n,
            auth,
            lease,
            delay,
            agents_stopped.clone(),
        )));
    }
    tokio::time::sleep(HEARTBEAT * 2).await;
    eprintln!(
        "bench: {} agents of {GPUS_PER_AGENT} GPUs syncing; {} tenants sending {} requests/s for {} min, a fault every {}-{} s",
        args.agents, args.tenants, args.rate, args.minutes, args.fault_every_min, args.fault_every_max
    );

    let record = Arc::new(Record::default());
    let tenants: Vec<Arc<Tenant>> = tokens
        .into_iter()
        .map(|t| Arc::new(Tenant::new(&stack.url(), t, &record)))
        .collect();
    let (stop_clients, clients_stopped) = watch::channel(false);
    let start = Instant::now();
    let driving = tokio::spawn(clients::drive(
        tenants,
        record.clone(),
        args.rate,
        clients_stopped,
    ));
    let end = start + Duration::from_secs_f64(args.minutes * 60.0);
    let faults = faults::inject(
        &Target {
            stack,
            proxies: &proxies,
            agents: &controls,
        },
        &args.faults,
        args.seed,
        (args.fault_every_min, args.fault_every_max),
        start,
        end,
    )
    .await?;
    tokio::time::sleep_until(tokio::time::Instant::from_std(end)).await;
    let _ = stop_clients.send(true);
    eprintln!("bench: load done; waiting for the requests still out (retries included)");
    driving.await?;

    // The books: every acknowledged write still there, the ledger and the trail.
    eprintln!("bench: checking what was acknowledged, the ledger and the audit trail");
    let acknowledged = record
        .acknowledged
        .lock()
        .map(|a| a.clone())
        .unwrap_or_default();
    let stopped = record.stopped.lock().map(|s| s.clone()).unwrap_or_default();
    // One listing of everything (admin), not a read per reservation.
    let listed: Vec<serde_json::Value> = admin.get_all("/api/v1/reservations").await?;
    let status: std::collections::HashMap<&str, &str> = listed
        .iter()
        .filter_map(|r| Some((r["id"].as_str()?, r["status"].as_str()?)))
        .collect();
    let mut lost_reservations = 0;
    let mut lost_stops = 0;
    for id in &acknowledged {
        match status.get(id.as_str()) {
            None => {
                eprintln!("bench: {id} was acknowledged, but is not found");
                lost_reservations += 1;
            }
            Some(s) if stopped.contains(id) && matches!(*s, "running" | "pending") => {
                eprintln!("bench: {id}'s stop was acknowledged, but it is {s}");
                lost_stops += 1;
            }
            Some(_) => {}
        }
    }
    let vanished = record.vanished.lock().map(|v| v.len()).unwrap_or(0);
    lost_reservations = lost_reservations.max(vanished as u64);
    let ledger: LedgerReport = admin.get("/api/v1/admin/ledger-check").await?;
    let audit: AuditVerdict = admin.get("/api/v1/audit/verify").await?;

    let _ = stop_agents.send(true);
    let mut counts = agents::AgentCounts::default();
    for t in agent_tasks {
        let c = t.await?;
        counts.syncs += c.syncs;
        counts.failed_syncs += c.failed_syncs;
        counts.fences += c.fences;
    }
    let double = runs.double_runs();
    for id in &double {
        eprintln!("bench: {id} ran on two nodes at once");
    }

    let outcomes = record
        .outcomes
        .lock()
        .map(|o| o.clone())
        .unwrap_or_default();
    let tries = record.tries.lock().map(|t| t.clone()).unwrap_or_default();
    let requests = outcomes.len() as u64;
    let answered = outcomes.iter().filter(|o| o.answered).count() as u64;
    let in_fault = |o: &clients::Outcome| {
        let at = (o.sent - start).as_secs_f64();
        faults.iter().any(|f| f.at_s <= at && at <= f.repaired_s)
    };
    let mut all: Vec<Duration> = outcomes.iter().map(|o| o.took).collect();
    all.sort();
    let mut during: Vec<Duration> = outcomes
        .iter()
        .filter(|o| in_fault(o))
        .map(|o| o.took)
        .collect();
    during.sort();
    #[allow(clippy::cast_precision_loss)]
    let availability = if requests == 0 {
        0.0
    } else {
        answered as f64 / requests as f64
    };
    let first_error = outcomes
        .iter()
        .filter(|o| !o.answered)
        .chain(outcomes.iter())
        .find_map(|o| o.error.clone());
    let mut unanswered = std::collections::BTreeMap::new();
    for o in outcomes.iter().filter(|o| !o.answered) {
        *unanswered.entry(o.op).or_insert(0) += 1;
    }
    let double_runs = double.len() as u64;
    let targets_met = availability >= AVAILABILITY_TARGET
        && lost_reservations == 0
        && lost_stops == 0
        && double_runs == 0
        && ledger.ok
        && audit.ok;
    Ok(ChaosResult {
        minutes: args.minutes,
        seed: args.seed,
        requests,
        answered,
        availability,
        longest_outage_s: longest_outage(&tries),
        lost_reservations,
        lost_stops,
        double_runs,
        ledger_ok: ledger.ok,
        audit_ok: audit.ok,
        p99_ms_during_faults: percentile_ms(&during, 0.99),
        p50_ms: percentile_ms(&all, 0.50),
        p99_ms: percentile_ms(&all, 0.99),
        reservations_acknowledged: acknowledged.len() as u64,
        stops_acknowledged: stopped.len() as u64,
        instances_started: runs.count() as u64,
        agents: args.agents,
        agent_syncs: counts.syncs,
        agent_failed_syncs: counts.failed_syncs,
        agent_fences: counts.fences,
        faults,
        stack_up_s,
        minutes_seen: by_minute(&outcomes, start),
        unanswered,
        first_error,
        targets_met,
    })
}

/// The longest stretch in which every try failed: from the first failed try after an
/// answered one (or the start) to the next answered one (or the last try).
fn longest_outage(tries: &[(Instant, bool)]) -> f64 {
    let mut tries = tries.to_vec();
    tries.sort_by_key(|t| t.0);
    let mut longest = Duration::ZERO;
    let mut down_since: Option<Instant> = None;
    for &(at, answered) in &tries {
        match (answered, down_since) {
            (false, None) => down_since = Some(at),
            (true, Some(since)) => {
                longest = longest.max(at - since);
                down_since = None;
            }
            _ => {}
        }
    }
    if let (Some(since), Some(&(last, _))) = (down_since, tries.last()) {
        longest = longest.max(last - since);
    }
    longest.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_runs_from_the_first_failed_try_to_the_next_answered_one() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let tries = [
            (at(0), true),
            (at(1), false),
            (at(3), false),
            (at(2), false),
            (at(7), true),
            (at(8), false),
            (at(9), true),
        ];
        assert!((longest_outage(&tries) - 6.0).abs() < 1e-9);
        assert!(longest_outage(&[(at(0), true), (at(1), true)]).abs() < 1e-9);
        assert!(
            (longest_outage(&[(at(0), true), (at(2), false), (at(5), false)]) - 3.0).abs() < 1e-9
        );
    }
}
