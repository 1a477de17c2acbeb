//! The faults of a chaos run: which, on what and when (seeded: a run is repeated exactly by its
//! seed), each injected and then repaired as an operator's supervisor would (a killed daemon
//! started again by `ha-up.sh`, a stopped one continued, a cut one let through).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::agents::{Control, RESTART_DOWN};
use super::proxy::ReplicaProxy;
use super::stack::{Stack, REPLICAS};
use crate::cli::FaultKind;

/// How long a replica stays stopped (SIGSTOP) or cut from the database.
const HELD: Duration = Duration::from_secs(10);
/// How long a killed replica stays dead before it is started again.
const DEAD: Duration = Duration::from_secs(3);
/// Longest wait for the standby to take writes after the primary's loss.
const FAILOVER_LIMIT: Duration = Duration::from_secs(120);
/// Longest wait for a lost primary, started again, to be the standby.
const REJOIN_LIMIT: Duration = Duration::from_secs(300);

/// What disrupted the stack: a fault injected, or a step of a rolling upgrade.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(untagged)]
pub enum Disruption {
    Fault(FaultKind),
    Upgrade(UpgradeStep),
}

/// A step of `bench upgrade`: one daemon stopped and started again on the new binary.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeStep {
    UpgradeReplica,
    UpgradeAgent,
}

impl std::fmt::Display for Disruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Disruption::Fault(kind) => kind.fmt(f),
            Disruption::Upgrade(UpgradeStep::UpgradeReplica) => f.write_str("upgrade-replica"),
            Disruption::Upgrade(UpgradeStep::UpgradeAgent) => f.write_str("upgrade-agent"),
        }
    }
}

/// A fault (or an upgrade's step) as it happened.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: Disruption,
    pub target: String,
    /// Seconds from the start of the load.
    pub at_s: f64,
    /// When everything was whole again.
    pub repaired_s: f64,
    /// What was seen (a database failover's length).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What faults are injected into.
pub struct Target<'a> {
    pub stack: &'a Stack,
    pub proxies: &'a [ReplicaProxy],
    pub agents: &'a [Arc<Control>],
}

/// Injects faults of `kinds` (each kind once, in a seeded order, before any twice), the first
/// `every` after `start` and each next one `every` after the last (at least 5 s after its
/// repair), until `end`; returns them as they happened.
pub async fn inject(
    target: &Target<'_>,
    kinds: &[FaultKind],
    seed: u64,
    every: (f64, f64),
    start: Instant,
    end: Instant,
) -> anyhow::Result<Vec<Fault>> {
    // The order from a stream of its own: a seed deals the same kinds however long repairs take.
    let mut order = StdRng::seed_from_u64(seed);
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
    let mut deck: Vec<FaultKind> = Vec::new();
    let mut done = Vec::new();
    let mut next = start + Duration::from_secs_f64(rng.random_range(every.0..=every.1));
    while next < end && !kinds.is_empty() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
        if deck.is_empty() {
            deck = deal(kinds, &mut order);
        }
        let Some(kind) = deck.pop() else { break };
        let at = Instant::now();
        eprintln!(
            "bench: {:>5.0} s: {}",
            (at - start).as_secs_f64(),
            kind.describe()
        );
        let (what, note) = one(target, kind, &mut rng)
            .await
            .with_context(|| format!("fault {}", kind.describe()))?;
        let repaired = Instant::now();
        eprintln!(
            "bench: {:>5.0} s: {what} repaired{}",
            (repaired - start).as_secs_f64(),
            note.as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        );
        done.push(Fault {
            kind: Disruption::Fault(kind),
            target: what,
            at_s: (at - start).as_secs_f64(),
            repaired_s: (repaired - start).as_secs_f64(),
            note,
        });
        next = (at + Duration::from_secs_f64(rng.random_range(every.0..=every.1)))
            .max(repaired + Duration::from_secs(5));
    }
    Ok(done)
}

/// One round of every kind in a random order, the first to come last (popped first).
fn deal(kinds: &[FaultKind], order: &mut StdRng) -> Vec<FaultKind> {
    let mut deck = kinds.to_vec();
    deck.shuffle(order);
    deck
}

/// Injects one fault and repairs it: what it hit, and what was seen.
async fn one(
    target: &Target<'_>,
    kind: FaultKind,
    rng: &mut StdRng,
) -> anyhow::Result<(String, Option<String>)> {
    let stack = target.stack;
    let replica = rng.random_range(1..=REPLICAS);
    match kind {
        FaultKind::KillReplica => {
            stack.kill_replica(replica)?;
            tokio::time::sleep(DEAD).await;
            stack.up().await?;
            Ok((format!("replica-{replica}"), None))
        }
        FaultKind::StopReplica => {
            stack.pause_replica(replica, true)?;
            tokio::time::sleep(HELD).await;
            stack.pause_replica(replica, false)?;
            ready(stack, replica).await?;
            Ok((format!("replica-{replica}"), None))
        }
        FaultKind::CutReplica => {
            let proxy = target
                .proxies
                .get(usize::from(replica - 1))
                .context("no proxy for the replica")?;
            proxy.set_cut(true);
            tokio::time::sleep(HELD).await;
            proxy.set_cut(false);
            ready(stack, replica).await?;
            Ok((format!("replica-{replica}"), None))
        }
        FaultKind::RestartAgent => {
            let i = rng.random_range(0..target.agents.len().max(1));
            if let Some(agent) = target.agents.get(i) {
                agent.restart();
            }
            tokio::time::sleep(RESTART_DOWN).await;
            Ok((format!("agent {i}"), None))
        }
        FaultKind::KillPrimary => {
            let primary = stack
                .primary()
                .await
                .context("no PostgreSQL node took writes before the fault")?;
            let standby = 3 - primary;
            stack.kill_pg_node(primary)?;
            let lost = Instant::now();
            while !stack.takes_writes(standby).await {
                anyhow::ensure!(
                    lost.elapsed() < FAILOVER_LIMIT,
                    "the standby (node{standby}) did not take writes within {} s of the primary's loss",
                    FAILOVER_LIMIT.as_secs()
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let failover = lost.elapsed();
            // The lost node comes back and rejoins as the standby; the next fault waits until
            // it has caught up (a primary lost meanwhile would have no standby to fail over to).
            stack.up().await?;
            let rejoining = Instant::now();
            while !stack.pair_healthy().await {
                anyhow::ensure!(
                    rejoining.elapsed() < REJOIN_LIMIT,
                    "node{primary} did not rejoin as the standby within {} s",
                    REJOIN_LIMIT.as_secs()
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok((
                format!("PostgreSQL node{primary}"),
                Some(format!(
                    "node{standby} took writes {:.1} s after node{primary}'s loss",
                    failover.as_secs_f64()
                )),
            ))
        }
    }
}

async fn ready(stack: &Stack, replica: u8) -> anyhow::Result<()> {
    anyhow::ensure!(
        stack.replica_ready(replica, Duration::from_secs(60)).await,
        "replica {replica} was not ready within 60 s of its repair"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds of the first round as `inject` injects them.
    fn first_round(seed: u64) -> Vec<FaultKind> {
        let mut deck = deal(&FaultKind::ALL, &mut StdRng::seed_from_u64(seed));
        deck.reverse();
        deck
    }

    #[test]
    fn a_seed_deals_every_kind_once_in_its_own_order() {
        let round = first_round(12);
        assert_eq!(round, first_round(12));
        let mut sorted = round.clone();
        sorted.sort_by_key(|k| k.to_string());
        let mut all = FaultKind::ALL.to_vec();
        all.sort_by_key(|k| k.to_string());
        assert_eq!(sorted, all);
        assert_ne!(first_round(12), first_round(4));
        // The test command's chaos run (tests/it/chaos.rs) counts on seed 12 dealing the
        // primary's kill first, then a replica cut from the database.
        assert_eq!(
            round[..2],
            [FaultKind::KillPrimary, FaultKind::CutReplica],
            "{round:?}"
        );
    }
}
