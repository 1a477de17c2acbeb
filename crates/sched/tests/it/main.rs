//! The simulator on the Alibaba trace: a slice of it copied here, and the full experiment on
//! the trace directory named by `GPURENT_TRACES` (ignored by default; run it in release).

#![allow(clippy::unwrap_used, clippy::expect_used)]
// The full experiment prints its table for a person to read.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use gpurent_sched::cluster::{Cluster, Pod};
use gpurent_sched::experiment::{run, PolicyRun};
use gpurent_sched::policies::NAMES;
use gpurent_sched::trace::{parse_nodes, parse_pods};

const NODES: &str = include_str!("fixtures/openb_node_list_gpu_node.csv");
const PODS_HEAD: &str = include_str!("fixtures/openb_pod_list_default_head400.csv");

fn load(nodes: &str, pods: &str) -> (Cluster, Vec<Pod>) {
    let cluster = Cluster::from_rows(&parse_nodes(nodes).unwrap()).unwrap();
    let pods = parse_pods(pods)
        .unwrap()
        .iter()
        .map(|r| cluster.pod(r))
        .collect();
    (cluster, pods)
}

#[test]
fn the_trace_cluster_parses() {
    let (cluster, pods) = load(NODES, PODS_HEAD);
    assert_eq!(cluster.nodes.len(), 1213);
    assert_eq!(cluster.gpu_capacity_milli(), 6212 * 1000);
    assert_eq!(pods.len(), 400);
}

/// A small cluster (the first 40 nodes of the trace) under the first 400 pods: every policy
/// runs to 130% arrived, keeps the invariants, and is deterministic.
#[test]
fn every_policy_on_a_slice_of_the_trace() {
    let small: String = NODES.lines().take(41).map(|l| format!("{l}\n")).collect();
    let (cluster, pods) = load(&small, PODS_HEAD);
    let zero = || Duration::ZERO;
    let a = run(&cluster, &pods, &NAMES, 42, &zero).unwrap();
    assert_eq!(a, run(&cluster, &pods, &NAMES, 42, &zero).unwrap());
    for r in &a {
        let last = r.checkpoints.last().unwrap();
        assert!(last.gpu_allocation_ratio > 0.5, "{}: {last:?}", r.policy);
        assert!(last.gpu_allocation_ratio <= 1.0);
    }
}

fn report(runs: &[PolicyRun]) {
    for r in runs {
        let c: Vec<String> = r
            .checkpoints
            .iter()
            .map(|c| {
                format!(
                    "{:.0}%: alloc {:.2}% frag {:.2}% ({:.2}% of free)",
                    c.arrived * 100.0,
                    c.gpu_allocation_ratio * 100.0,
                    c.fragmentation_ratio * 100.0,
                    c.fragmentation_of_free * 100.0
                )
            })
            .collect();
        println!(
            "{:<15} {} | failed {} | {:.0}/s",
            r.policy,
            c.join(" | "),
            r.failed_placements,
            r.placements_per_sec
        );
    }
}

/// `GPURENT_TRACES=DIR [GPURENT_POLICIES=a,b] [GPURENT_SEEDS=42-51]
/// cargo test --release -p gpurent-sched --test it -- --ignored --nocapture`
#[test]
#[ignore = "needs GPURENT_TRACES and a release build"]
fn paper_experiment_on_the_full_trace() {
    let Ok(dir) = std::env::var("GPURENT_TRACES") else {
        return;
    };
    let dir = std::path::Path::new(&dir);
    let nodes = std::fs::read_to_string(dir.join("openb_node_list_gpu_node.csv")).unwrap();
    let list = std::env::var("GPURENT_POD_LIST").unwrap_or_else(|_| "default".into());
    let pods = std::fs::read_to_string(dir.join(format!("openb_pod_list_{list}.csv"))).unwrap();
    let (cluster, pods) = load(&nodes, &pods);
    let names_env = std::env::var("GPURENT_POLICIES").unwrap_or_else(|_| "best-fit,fgd".into());
    let names: Vec<&str> = names_env.split(',').collect();
    let seeds = std::env::var("GPURENT_SEEDS").unwrap_or_else(|_| "42-42".into());
    let (lo, hi) = seeds.split_once('-').unwrap();
    let start = Instant::now();
    let clock = move || start.elapsed();
    for seed in lo.parse::<u64>().unwrap()..=hi.parse::<u64>().unwrap() {
        println!("pod list {list}, seed {seed}");
        report(&run(&cluster, &pods, &names, seed, &clock).unwrap());
    }
}
