//! The load of a chaos or upgrade run: tenants' clients and simulated agents through the HA
//! stack's load balancer while the stack is disrupted; then what the clients saw, whether
//! every acknowledged write is there, whether anything ran twice, and the books.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use gpurent_types::api::{AuditVerdict, CreateUser, JoinToken, LedgerReport, UserCreated};
use gpurent_types::{Money, Role};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::agents::{self, AgentCounts, Control, Runs};
use super::clients::{self, Record, Tenant};
use super::faults::Fault;
use super::stack::Stack;
use crate::api_client::{ApiClient, Retry};
use crate::cmd::bench_common::percentile_ms;
use crate::cmd::bench_fleet_agent::{self as fleet_agent, Fleet, HEARTBEAT};

/// GPUs of each simulated agent (RTX 4090s, which the clients reserve).
pub const GPUS_PER_AGENT: u32 = 4;

/// The targets (issue 19): availability, and nothing lost or run twice.
pub const AVAILABILITY_TARGET: f64 = 0.9995;

/// How much load: tenants, simulated agents, requests a second, and the heartbeats a node
/// may miss (the agents' lease follows it).
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub tenants: u32,
    pub agents: u32,
    pub rate: f64,
    pub missed_heartbeats: u32,
}

#[derive(Debug, Serialize)]
pub struct ChaosResult {
    pub minutes: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Client requests sent (reserve, get, ls, logs, stop).
    pub requests: u64,
    /// Answered by the API, after the client's own retries (3, 5 s apart).
    pub answered: u64,
    /// answered / requests.
    pub availability: f64,
    /// The longest time in which every try failed, from the first failed try after an
    /// answered one to the next answered one.
    pub longest_outage_s: f64,
    /// Reservations acknowledged (201) that the API no longer knows.
    pub lost_reservations: u64,
    /// Stops acknowledged whose reservation still runs.
    pub lost_stops: u64,
    /// Reservations that ran on two nodes at the same time.
    pub double_runs: u64,
    pub ledger_ok: bool,
    pub audit_ok: bool,
    /// Of the requests sent while a fault was in effect (injected, not yet repaired): the
    /// 99th percentile from sending to the final answer, retries included.
    pub p99_ms_during_faults: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub reservations_acknowledged: u64,
    pub stops_acknowledged: u64,
    pub instances_started: u64,
    pub agents: u32,
    pub agent_syncs: u64,
    pub agent_failed_syncs: u64,
    /// Agents that stopped their instances for a lapsed lease.
    pub agent_fences: u64,
    pub faults: Vec<Fault>,
    /// Seconds ha-up.sh took to bring the stack up from nothing.
    pub stack_up_s: f64,
    /// Each minute of the load: requests sent, left unanswered, and their p99 (ms).
    pub minutes_seen: Vec<Minute>,
    /// Requests left unanswered, by what they did.
    pub unanswered: BTreeMap<clients::Op, u64>,
    /// The first error a client was left with (answered or not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Availability of at least 99.95%, nothing lost or run twice, ledger and trail clean.
    pub targets_met: bool,
}

/// One minute of a run, by when its requests were sent.
#[derive(Debug, Serialize)]
pub struct Minute {
    minute: u64,
    requests: u64,
    unanswered: u64,
    p99_ms: f64,
}

/// The load while it runs.
pub struct Load {
    pub admin: ApiClient,
    /// Each simulated agent's restart bell.
    pub controls: Vec<Arc<Control>>,
    /// When the clients started.
    pub start: Instant,
    spec: Spec,
    runs: Arc<Runs>,
    record: Arc<Record>,
    stop_agents: watch::Sender<bool>,
    agent_tasks: Vec<JoinHandle<AgentCounts>>,
    stop_clients: watch::Sender<bool>,
    driving: JoinHandle<()>,
}

impl Load {
    /// On a stack that is up: the tenants, the simulated agents registered and syncing, then
    /// the clients sending.
    pub async fn begin(stack: &Stack, spec: Spec) -> anyhow::Result<Load> {
        let admin = ApiClient::new(&stack.url(), Some(stack.admin_token()?)).retry(Retry::DEFAULT);
        let mut tokens = Vec::new();
        for i in 0..spec.tenants {
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
        let ttl = HEARTBEAT * spec.missed_heartbeats;
        // As the agent's default: half a heartbeat less than the node TTL, at least a heartbeat.
        let lease = ttl.saturating_sub(HEARTBEAT / 2).max(HEARTBEAT);
        let runs = Arc::new(Runs::default());
        let (stop_agents, agents_stopped) = watch::channel(false);
        let mut controls = Vec::new();
        let mut agent_tasks = Vec::new();
        for n in 0..spec.agents {
            let auth = fleet_agent::register(&fleet, n).await?;
            let control = Arc::new(Control::default());
            controls.push(control.clone());
            let delay = HEARTBEAT.mul_f64(f64::from(n) / f64::from(spec.agents));
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
            "bench: {} agents of {GPUS_PER_AGENT} GPUs syncing; {} tenants sending {} requests/s",
            spec.agents, spec.tenants, spec.rate
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
            spec.rate,
            clients_stopped,
        ));
        Ok(Load {
            admin,
            controls,
            start,
            spec,
            runs,
            record,
            stop_agents,
            agent_tasks,
            stop_clients,
            driving,
        })
    }

    /// Stops the clients (waiting for what is still out), checks every acknowledged write,
    /// the ledger and the audit trail, stops the agents, and says what was seen during
    /// `faults`.
    pub async fn finish(self, faults: Vec<Fault>, stack_up_s: f64) -> anyhow::Result<ChaosResult> {
        let minutes = self.start.elapsed().as_secs_f64() / 60.0;
        let _ = self.stop_clients.send(true);
        eprintln!("bench: load done; waiting for the requests still out (retries included)");
        self.driving.await?;

        // The books: every acknowledged write still there, the ledger and the trail.
        eprintln!("bench: checking what was acknowledged, the ledger and the audit trail");
        let record = &self.record;
        let acknowledged = record
            .acknowledged
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default();
        let stopped = record.stopped.lock().map(|s| s.clone()).unwrap_or_default();
        // One listing of everything (admin), not a read per reservation.
        let listed: Vec<serde_json::Value> = self.admin.get_all("/api/v1/reservations").await?;
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
        let ledger: LedgerReport = self.admin.get("/api/v1/admin/ledger-check").await?;
        let audit: AuditVerdict = self.admin.get("/api/v1/audit/verify").await?;

        let _ = self.stop_agents.send(true);
        let mut counts = AgentCounts::default();
        for t in self.agent_tasks {
            let c = t.await?;
            counts.syncs += c.syncs;
            counts.failed_syncs += c.failed_syncs;
            counts.fences += c.fences;
        }
        let double = self.runs.double_runs();
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
        let start = self.start;
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
        let mut unanswered = BTreeMap::new();
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
            minutes,
            seed: None,
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
            instances_started: self.runs.count() as u64,
            agents: self.spec.agents,
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
}

/// The requests of each minute of the load.
fn by_minute(outcomes: &[clients::Outcome], start: Instant) -> Vec<Minute> {
    let mut minutes: BTreeMap<u64, (u64, u64, Vec<Duration>)> = BTreeMap::new();
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
