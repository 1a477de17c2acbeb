//! The chaos run's simulated agents: each syncs through the load balancer as the real agent's
//! loop does, fences itself (stops everything) when no sync succeeded for its lease, and can
//! be restarted (down a few seconds, its instances running on, then a full sync). Every
//! instance's run is recorded, so that a reservation running on two nodes at once is seen.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use tokio::sync::{watch, Notify};

use crate::cmd::bench_fleet_agent::{host_facts, inventory, sync_request, Fleet, HEARTBEAT, WAIT};
use gpurent_types::agent::SyncResponse;
/// How long a restarted agent is down.
pub const RESTART_DOWN: Duration = Duration::from_secs(3);

/// One instance's run on one node, from its start to its stop (open while it runs).
#[derive(Debug, Clone)]
pub struct Run {
    pub reservation: String,
    pub node: u32,
    pub start: Instant,
    pub end: Option<Instant>,
}

/// What every chaos agent shares besides the fleet: the runs, and each agent's restart bell.
#[derive(Debug, Default)]
pub struct Runs {
    runs: Mutex<Vec<Run>>,
}

impl Runs {
    fn start(&self, reservation: &str, node: u32) -> usize {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.push(Run {
            reservation: reservation.to_owned(),
            node,
            start: Instant::now(),
            end: None,
        });
        runs.len() - 1
    }

    fn end(&self, index: usize) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(run) = runs.get_mut(index) {
            run.end.get_or_insert_with(Instant::now);
        }
    }

    /// Reservations that ran on two nodes at the same time.
    pub fn double_runs(&self) -> Vec<String> {
        let now = Instant::now();
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        let mut by_reservation: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
        for r in runs.iter() {
            by_reservation.entry(&r.reservation).or_default().push(r);
        }
        by_reservation
            .into_iter()
            .filter(|(_, rs)| {
                rs.iter().enumerate().any(|(i, a)| {
                    rs[i + 1..].iter().any(|b| {
                        a.node != b.node
                            && a.start < b.end.unwrap_or(now)
                            && b.start < a.end.unwrap_or(now)
                    })
                })
            })
            .map(|(id, _)| id.to_owned())
            .collect()
    }

    /// Instances started in all.
    pub fn count(&self) -> usize {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One agent's handle: its restart bell.
#[derive(Debug, Default)]
pub struct Control {
    restart: Notify,
}

impl Control {
    pub fn restart(&self) {
        self.restart.notify_one();
    }
}

/// Counts of what the agents saw, for the run's report.
#[derive(Debug, Default)]
pub struct AgentCounts {
    pub syncs: u64,
    pub failed_syncs: u64,
    pub fences: u64,
}

/// Node `n`'s loop until `stop`: registered already (`auth`), lease `lease`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    fleet: Arc<Fleet>,
    runs: Arc<Runs>,
    control: Arc<Control>,
    n: u32,
    auth: HeaderValue,
    lease: Duration,
    delay: Duration,
    mut stop: watch::Receiver<bool>,
) -> AgentCounts {
    let mut counts = AgentCounts::default();
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        _ = stop.changed() => return counts,
    }
    let url = format!("{}/api/v1/agent/sync", fleet.base);
    let gpus = inventory(n, fleet.gpus_per_node);
    let host = host_facts();
    // What runs here (epoch, GPUs, index of its run), and what is being reported stopped.
    let mut running: BTreeMap<String, (i64, Vec<String>, usize)> = BTreeMap::new();
    let mut stopping: BTreeMap<String, i64> = BTreeMap::new();
    let mut known_version: Option<i64> = None;
    let mut last_contact = Instant::now();
    let mut fenced = false;
    while !*stop.borrow() {
        let by_reservation: BTreeMap<String, (i64, Vec<String>)> = running
            .iter()
            .map(|(id, (e, g, _))| (id.clone(), (*e, g.clone())))
            .collect();
        let request = sync_request(&gpus, &host, &by_reservation, &stopping, known_version);
        let body = serde_json::to_vec(&request).unwrap_or_default();
        let sent = Instant::now();
        // The lease counts from when the last sync that succeeded was sent.
        let lease_end = tokio::time::Instant::from_std(last_contact + lease);
        let call = fleet
            .http
            .post(&url)
            .header(AUTHORIZATION, auth.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(body)
            .timeout(WAIT + Duration::from_secs(30))
            .send();
        tokio::pin!(call);
        let answer = loop {
            tokio::select! {
                r = &mut call => break Some(r),
                () = tokio::time::sleep_until(lease_end), if !fenced => {
                    fence(&runs, &mut running, &mut counts);
                    fenced = true;
                }
                () = control.restart.notified() => break None,
                _ = stop.changed() => break None,
            }
        };
        let Some(answer) = answer else {
            if *stop.borrow() {
                break;
            }
            // Restarted: down a while (its instances run on, as containers do), then a full
            // sync as a new agent process makes.
            tokio::time::sleep(RESTART_DOWN).await;
            known_version = None;
            continue;
        };
        let response = match answer {
            Ok(r) if r.status().is_success() => {
                r.json::<SyncResponse>().await.map_err(|e| e.to_string())
            }
            Ok(r) => Err(format!("sync answered {}", r.status())),
            Err(e) => Err(e.to_string()),
        };
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                counts.failed_syncs += 1;
                fleet.error(format!("node {n}: {e}"));
                let lease_end = tokio::time::Instant::from_std(last_contact + lease);
                tokio::select! {
                    () = tokio::time::sleep(HEARTBEAT) => {}
                    () = tokio::time::sleep_until(lease_end), if !fenced => {
                        fence(&runs, &mut running, &mut counts);
                        fenced = true;
                    }
                    _ = stop.changed() => {}
                }
                continue;
            }
        };
        counts.syncs += 1;
        last_contact = sent;
        fenced = false;
        let mut started = false;
        for a in &response.assignments {
            if a.run && !running.contains_key(&a.reservation_id) {
                let index = runs.start(&a.reservation_id, n);
                running.insert(a.reservation_id.clone(), (a.epoch, a.gpus.clone(), index));
                stopping.remove(&a.reservation_id);
                started = true;
            } else if !a.run {
                if let Some((_, _, index)) = running.remove(&a.reservation_id) {
                    runs.end(index);
                }
                stopping.insert(a.reservation_id.clone(), a.epoch);
            }
        }
        let listed = |id: &String| response.assignments.iter().any(|a| &a.reservation_id == id);
        running.retain(|id, (_, _, index)| {
            let keep = listed(id);
            if !keep {
                runs.end(*index);
            }
            keep
        });
        stopping.retain(|id, _| listed(id));
        // New instances are reported at once, with the inventory (as the agent does).
        known_version = if started {
            None
        } else {
            Some(response.version)
        };
    }
    for (_, (_, _, index)) in running {
        runs.end(index);
    }
    counts
}

/// The lease ran out: everything here stops (the control plane may start it elsewhere).
fn fence(
    runs: &Runs,
    running: &mut BTreeMap<String, (i64, Vec<String>, usize)>,
    counts: &mut AgentCounts,
) {
    counts.fences += 1;
    for (_, (_, _, index)) in std::mem::take(running) {
        runs.end(index);
    }
}
