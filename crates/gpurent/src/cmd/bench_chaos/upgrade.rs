//! `gpurent bench upgrade --from BIN`: a rolling upgrade under load. The HA stack of
//! `scripts/ha-up.sh` and real agents start on the previous release's binary; while tenants'
//! clients and simulated agents work through the load balancer, each replica is stopped as a
//! service manager stops it and started on this binary, one at a time, then each agent. Then
//! what the clients saw, whether anything was lost or ran twice, the books, and whether the
//! agents' instances ran on through their agent's upgrade.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_types::api::{CreateUser, JoinToken, UserCreated};
use gpurent_types::{Money, Role};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use super::faults::{Disruption, Fault, UpgradeStep};
use super::load::{ChaosResult, Load, Spec};
use super::stack::{Stack, REPLICAS};
use crate::api_client::{ApiClient, Retry};
use crate::cli::BenchUpgradeArgs;
use crate::output::{print_json, print_table};

/// What each long instance runs: a command no other process here has.
const LONG_COMMAND: [&str; 2] = ["sleep", "86399"];
/// The real agents' GPUs: a model the clients never ask for, so that only the long
/// instances land there.
const REAL_GPUS: &str = "2xA100-80GB";
/// Longest wait for a daemon stopped with SIGTERM to end.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// Longest wait for a started daemon to be ready (a replica in HAProxy's rotation, an agent's
/// node ready on its new version).
const READY_LIMIT: Duration = Duration::from_secs(90);

#[derive(Debug, Serialize)]
struct UpgradeResult {
    from_version: String,
    to_version: String,
    /// From the first replica's SIGTERM to the last one back in HAProxy's rotation.
    replicas_upgrade_s: f64,
    /// From the first agent's SIGTERM to the last one's node ready on the new version.
    agents_upgrade_s: f64,
    /// Long instances started on the real agents before the upgrade.
    long_instances: u64,
    /// Of them, still running after it as the same processes.
    long_instances_kept: u64,
    /// Real agents whose node reports the new version after the upgrade.
    agents_on_new_version: u64,
    real_agents: u32,
    #[serde(flatten)]
    load: ChaosResult,
}

pub async fn run(args: BenchUpgradeArgs, json: bool) -> anyhow::Result<()> {
    let from_version = check(&args)?;
    let mut stack = Stack::new(args.missed_heartbeats)?;
    stack.set_bin(Some(args.from.clone()));
    let mut agents = Vec::new();
    let result = tokio::select! {
        r = measure(&args, &from_version, &mut stack, &mut agents) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    if !result.as_ref().is_ok_and(|r| r.load.targets_met) {
        stack.keep_logs();
    }
    // The agents before the stack: their instances are stopped by the stack's end otherwise
    // never (each is a process of its own, in a cgroup of the agent's).
    for agent in &mut agents {
        agent.kill_all();
    }
    drop(stack);
    let result = result?;
    if json {
        print_json(&result).map_err(|e| anyhow::anyhow!(e))?;
    } else {
        print_table(
            &[
                "from",
                "to",
                "replicas s",
                "agents s",
                "instances kept",
                "availability",
                "longest outage s",
                "lost",
                "double runs",
                "ledger",
                "audit",
                "targets",
            ],
            &[vec![
                result.from_version.clone(),
                result.to_version.clone(),
                format!("{:.1}", result.replicas_upgrade_s),
                format!("{:.1}", result.agents_upgrade_s),
                format!("{}/{}", result.long_instances_kept, result.long_instances),
                format!("{:.4}%", result.load.availability * 100.0),
                format!("{:.1}", result.load.longest_outage_s),
                (result.load.lost_reservations + result.load.lost_stops).to_string(),
                result.load.double_runs.to_string(),
                super::ok(result.load.ledger_ok).to_owned(),
                super::ok(result.load.audit_ok).to_owned(),
                if result.load.targets_met {
                    "met"
                } else {
                    "MISSED"
                }
                .to_owned(),
            ]],
        );
        super::print_faults(&result.load);
    }
    Ok(())
}

/// Root, bubblewrap, sane rates, and the previous binary's version (which must differ).
fn check(args: &BenchUpgradeArgs) -> anyhow::Result<String> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "bench upgrade starts the HA stack (scripts/ha-up.sh: PostgreSQL under \
             pg_auto_failover, HAProxy, packages installed when missing) and agents with the \
             process executor, which need root: run it as root"
        );
    }
    anyhow::ensure!(
        gpurent_agent::executor::system_tool("bwrap").is_some(),
        "bench upgrade's agents isolate their instances with bubblewrap, which is not \
         installed: apt-get install bubblewrap"
    );
    anyhow::ensure!(
        args.rate > 0.0 && args.rate <= 1000.0,
        "--rate must be more than 0 and at most 1000 requests a second"
    );
    anyhow::ensure!(
        args.settle_secs >= 0.0 && args.settle_secs.is_finite(),
        "--settle-secs must be 0 or more"
    );
    let out = std::process::Command::new(&args.from)
        .arg("--version")
        .output()
        .with_context(|| format!("--from {}: cannot run it", args.from.display()))?;
    let said = String::from_utf8_lossy(&out.stdout);
    let version = said
        .split_whitespace()
        .nth(1)
        .filter(|_| out.status.success() && said.starts_with("gpurent "))
        .with_context(|| {
            format!(
                "--from {}: not a gpurent binary (`--version` said {said:?})",
                args.from.display()
            )
        })?
        .to_owned();
    anyhow::ensure!(
        version != env!("CARGO_PKG_VERSION"),
        "--from {} is gpurent {version}, this release: give the previous release's binary",
        args.from.display()
    );
    Ok(version)
}

async fn measure(
    args: &BenchUpgradeArgs,
    from_version: &str,
    stack: &mut Stack,
    agents: &mut Vec<RealAgent>,
) -> anyhow::Result<UpgradeResult> {
    let this = std::env::current_exe().context("this binary's path")?;
    let to_version = env!("CARGO_PKG_VERSION").to_owned();
    let stack_up_s = stack
        .first_up(&format!(" on gpurent {from_version}"))
        .await?;

    // The real agents, on the previous release, each with its long instances.
    let admin = ApiClient::new(&stack.url(), Some(stack.admin_token()?)).retry(Retry::DEFAULT);
    let join: JoinToken = admin
        .post("/api/v1/nodes/join-token", &serde_json::json!({}), None)
        .await
        .context("make a join token")?;
    for k in 0..args.real_agents {
        let mut agent = RealAgent::new(stack, k, &join.token, args.missed_heartbeats);
        agent.spawn(&args.from)?;
        agents.push(agent);
    }
    let new_version = format!("gpurent {to_version}");
    for agent in agents.iter() {
        agent.ready(&admin, |said| said != new_version).await?;
    }
    let long = tenant(&admin, &stack.url(), "upgrade-long").await?;
    let mut long_ids = Vec::new();
    for _ in 0..2 * args.real_agents {
        let r: serde_json::Value = long
            .post(
                "/api/v1/reservations",
                &serde_json::json!({
                    "gpu_type": "A100-80GB", "hours": 1, "command": LONG_COMMAND,
                }),
                Some(&uuid::Uuid::new_v4().to_string()),
            )
            .await
            .context("reserve a long instance on a real agent")?;
        long_ids.push(r["id"].as_str().context("a reservation's id")?.to_owned());
    }
    let before = wait_for_instances(long_ids.len()).await?;
    eprintln!(
        "bench: {} real agents on gpurent {from_version} run {} long instances",
        args.real_agents,
        before.len()
    );

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
    let settle = Duration::from_secs_f64(args.settle_secs);
    tokio::time::sleep(settle).await;

    // The replicas, one at a time: the next only once HAProxy sends work to the last again.
    let mut steps = Vec::new();
    stack.set_bin(Some(this.clone()));
    let replicas_from = Instant::now();
    for n in 1..=REPLICAS {
        let at = Instant::now();
        eprintln!("bench: upgrading replica {n}");
        let ended = stack.stop_replica(n, STOP_LIMIT).await?;
        stack.up().await?;
        anyhow::ensure!(
            stack.balanced(n, READY_LIMIT).await,
            "replica {n} was not back in HAProxy's rotation within {} s of its start",
            READY_LIMIT.as_secs()
        );
        let exe = stack.replica_exe(n)?;
        anyhow::ensure!(
            same_file(&exe, &this),
            "replica {n} runs {}, not this binary",
            exe.display()
        );
        steps.push(step(
            UpgradeStep::UpgradeReplica,
            format!("replica-{n}"),
            at,
            load.start,
            ended,
        ));
    }
    let replicas_upgrade_s = replicas_from.elapsed().as_secs_f64();

    // Then the agents, one at a time: their instances run on, and the new agent adopts them.
    let agents_from = Instant::now();
    for agent in agents.iter_mut() {
        let at = Instant::now();
        eprintln!("bench: upgrading {}", agent.name);
        let ended = agent.stop(STOP_LIMIT).await?;
        agent.spawn(&this)?;
        agent.ready(&admin, |said| said == new_version).await?;
        steps.push(step(
            UpgradeStep::UpgradeAgent,
            agent.name.clone(),
            at,
            load.start,
            ended,
        ));
    }
    let agents_upgrade_s = agents_from.elapsed().as_secs_f64();
    tokio::time::sleep(settle).await;
    let mut result = load.finish(steps, stack_up_s).await?;

    // The long instances: the same processes, their reservations running, then stopped.
    let after = instances();
    let kept = before.intersection(&after).count() as u64;
    let mut still_running = 0;
    for id in &long_ids {
        let r: serde_json::Value = long.get(&format!("/api/v1/reservations/{id}")).await?;
        if r["status"] == "running" {
            still_running += 1;
        } else {
            eprintln!(
                "bench: the long instance {id} is {} after the upgrade",
                r["status"]
            );
        }
    }
    let mut on_new = 0;
    for agent in agents.iter() {
        on_new += u64::from(agent.version(&admin).await?.as_deref() == Some(&new_version));
    }
    for id in &long_ids {
        let _: serde_json::Value = long
            .post(
                &format!("/api/v1/reservations/{id}/stop"),
                &serde_json::json!({}),
                None,
            )
            .await
            .with_context(|| format!("stop {id}"))?;
    }
    wait_for_instances(0).await?;
    for agent in agents.iter_mut() {
        agent.stop(STOP_LIMIT).await?;
    }

    let long_instances = before.len() as u64;
    result.targets_met = result.targets_met
        && long_instances == long_ids.len() as u64
        && kept == long_instances
        && still_running == long_ids.len()
        && after.len() == before.len()
        && on_new == u64::from(args.real_agents);
    Ok(UpgradeResult {
        from_version: from_version.to_owned(),
        to_version,
        replicas_upgrade_s,
        agents_upgrade_s,
        long_instances,
        long_instances_kept: kept.min(still_running as u64),
        agents_on_new_version: on_new,
        real_agents: args.real_agents,
        load: result,
    })
}

fn step(kind: UpgradeStep, target: String, at: Instant, start: Instant, ended: bool) -> Fault {
    let fault = Fault {
        kind: Disruption::Upgrade(kind),
        target,
        at_s: (at - start).as_secs_f64(),
        repaired_s: start.elapsed().as_secs_f64(),
        note: (!ended).then(|| "did not end on SIGTERM: killed".to_owned()),
    };
    eprintln!(
        "bench: {} upgraded in {:.1} s",
        fault.target,
        fault.repaired_s - fault.at_s
    );
    fault
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A tenant with credit, as the admin makes one.
async fn tenant(admin: &ApiClient, url: &str, name: &str) -> anyhow::Result<ApiClient> {
    let user: UserCreated = admin
        .post(
            "/api/v1/users",
            &CreateUser {
                name: name.to_owned(),
                role: Some(Role::Tenant),
                credit: Some(Money::units(1_000_000)),
            },
            Some(&uuid::Uuid::new_v4().to_string()),
        )
        .await
        .context("create a tenant")?;
    Ok(ApiClient::new(url, Some(user.token)).retry(Retry::DEFAULT))
}

/// The long instances' processes here, by pid.
fn instances() -> BTreeSet<u32> {
    let wanted = format!("{}\0", LONG_COMMAND.join("\0"));
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted.as_bytes())
        })
        .collect()
}

/// Waits until exactly `count` long instances run; they are returned.
async fn wait_for_instances(count: usize) -> anyhow::Result<BTreeSet<u32>> {
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        let now = instances();
        if now.len() == count {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!(
                "{} long instances run after {} s, not {count}",
                now.len(),
                READY_LIMIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One `gpurent agent` process with the process executor on simulated GPUs, started on one
/// binary and then another, on the same data dir.
struct RealAgent {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    cgroup: PathBuf,
    child: Option<tokio::process::Child>,
}

impl RealAgent {
    fn new(stack: &Stack, k: u32, join_token: &str, missed_heartbeats: u32) -> RealAgent {
        let name = format!("upgrade-agent-{k}");
        let dir = stack.dir().join(&name);
        let cgroup = PathBuf::from(format!(
            "/sys/fs/cgroup/gpurent-bench-{}-{k}",
            std::process::id()
        ));
        let args = vec![
            "--server".to_owned(),
            stack.url(),
            "agent".to_owned(),
            "--data-dir".to_owned(),
            dir.display().to_string(),
            "--name".to_owned(),
            name.clone(),
            "--sim-gpus".to_owned(),
            REAL_GPUS.to_owned(),
            "--executor".to_owned(),
            "process".to_owned(),
            "--shared-network".to_owned(),
            "--cgroup-root".to_owned(),
            cgroup.display().to_string(),
            // Each agent's instances in a uid range of their own.
            "--instance-uid-base".to_owned(),
            (400_000 + 70_000 * k).to_string(),
            "--missed-heartbeats".to_owned(),
            missed_heartbeats.to_string(),
            "--join-token".to_owned(),
            join_token.to_owned(),
        ];
        RealAgent {
            log: stack.dir().join(format!("{name}.log")),
            name,
            args,
            cgroup,
            child: None,
        }
    }

    fn spawn(&mut self, bin: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("open {}", self.log.display()))?;
        let child = tokio::process::Command::new(bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {} with {}", self.name, bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGTERM, as a service manager stops it, and its end waited for (at most `within`,
    /// then kill -9); whether it ended on its own. Its instances run on.
    async fn stop(&mut self, within: Duration) -> anyhow::Result<bool> {
        let Some(mut child) = self.child.take() else {
            return Ok(true);
        };
        if let Some(pid) = child.id() {
            let pid = Pid::from_raw(i32::try_from(pid).context("a pid")?);
            kill(pid, Signal::SIGTERM).with_context(|| format!("SIGTERM {}", self.name))?;
        }
        match tokio::time::timeout(within, child.wait()).await {
            Ok(_) => Ok(true),
            Err(_) => {
                let _ = child.kill().await;
                Ok(false)
            }
        }
    }

    /// The agent's process and the long instances it left, killed; its cgroups removed.
    fn kill_all(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
        for pid in instances() {
            let _ = kill(
                Pid::from_raw(pid.try_into().unwrap_or(i32::MAX)),
                Signal::SIGKILL,
            );
        }
        // cgroup v2 has the one directory; on v1 the agent makes it under each controller.
        let name = self.cgroup.file_name().unwrap_or_default();
        for controller in ["", "memory", "cpu", "cpu,cpuacct", "pids"] {
            remove_cgroup(&Path::new("/sys/fs/cgroup").join(controller).join(name));
        }
    }

    /// What its node's `agent` check says, once the node is ready ("gpurent 0.2.0"; "an
    /// earlier release ..." for agents that send no version; a control plane of the previous
    /// release has no such check).
    async fn version(&self, admin: &ApiClient) -> anyhow::Result<Option<String>> {
        let nodes: Vec<serde_json::Value> = admin.get_all("/api/v1/nodes").await?;
        Ok(nodes
            .iter()
            .find(|n| n["name"] == self.name.as_str() && n["status"] == "ready")
            .map(|n| {
                n["verification"]["checks"]
                    .as_array()
                    .and_then(|checks| checks.iter().find(|c| c["name"] == "agent"))
                    .and_then(|c| c["detail"].as_str())
                    .unwrap_or("no agent check (a control plane of an earlier release)")
                    .to_owned()
            }))
    }

    /// Waits until its node is ready and its `agent` check says what `wanted` takes.
    async fn ready(&self, admin: &ApiClient, wanted: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_LIMIT;
        let mut said = None;
        while Instant::now() < deadline {
            said = self.version(admin).await.ok().flatten();
            if said.as_deref().is_some_and(&wanted) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!(
            "{}'s node was not ready on the expected release within {} s (its agent check: \
             {said:?}; its log: {})",
            self.name,
            READY_LIMIT.as_secs(),
            self.log.display()
        )
    }
}

/// Removes a cgroup and those under it, deepest first (their files go with them); one that
/// still holds a process stays.
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
