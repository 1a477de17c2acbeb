//! The simulator on the Alibaba trace: a slice of it copied here, and the full experiment on
//! the trace directory named by `GPURENT_TRACES` (ignored by default; run it in release).

#![allow(clippy::unwrap_used, clippy::expect_used)]
// The full experiment prints its table for a person to read.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use gpurent_sched::cluster::{Assignment, Cluster, GpuDemand, Pod, MILLI};
use gpurent_sched::experiment::{arrivals, node_rank, run, PolicyRun, POPULARITY};
use gpurent_sched::policies::{schedule_with, Fgd, Policy, Scored, TieBreak, MAX_SCORE, NAMES};
use gpurent_sched::rng::SimRng;
use gpurent_sched::trace::{parse_nodes, parse_pods};
use gpurent_sched::workload::Workload;

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

/// FGD as the paper states it, with nothing kept between calls: every fitting node's
/// fragmentation before and after the pod, computed afresh on every placement.
#[derive(Debug)]
struct PlainFgd(Workload);

impl Policy for PlainFgd {
    fn name(&self) -> &'static str {
        "plain-fgd"
    }

    #[allow(clippy::cast_possible_truncation)]
    fn score(&mut self, cluster: &Cluster, node: usize, pod: &Pod) -> Scored {
        let n = &cluster.nodes[node];
        let old = self.0.node_frag(n);
        let cpu = n.cpu_free.saturating_sub(pod.cpu_milli);
        let quantise = |new: f64| {
            let x = (old - new) / f64::from(MILLI);
            (MAX_SCORE as f64 / (1.0 + (-x).exp())) as i64
        };
        let mut gpus = n.gpu_free.clone();
        match pod.gpu {
            GpuDemand::None => Scored::new(quantise(self.0.frag_of(n.model, cpu, &gpus))),
            GpuDemand::Whole(count) => {
                for i in n.lowest_free_gpus(count) {
                    gpus[i] = 0;
                }
                Scored::new(quantise(self.0.frag_of(n.model, cpu, &gpus)))
            }
            GpuDemand::Share(m) => {
                let mut best = Scored::new(0);
                let mut any = false;
                for (i, &f) in n.gpu_free.iter().enumerate() {
                    if f < m {
                        continue;
                    }
                    gpus[i] = f - m;
                    let score = quantise(self.0.frag_of(n.model, cpu, &gpus));
                    gpus[i] = f;
                    // The first GPU of the best score, as the simulator takes it.
                    if !any || score > best.score {
                        best = Scored {
                            score,
                            share_gpu: Some(i),
                        };
                        any = true;
                    }
                }
                best
            }
        }
    }
}

/// The FGD policy, with what it keeps per node, places every pod where the plain FGD above
/// does, on the same GPUs, under both tie rules; pods also leave now and then (a release the
/// policy is not told of), so its kept results must notice every change of a node.
#[test]
fn fgd_places_as_plain_fgd() {
    let some: String = NODES.lines().take(161).map(|l| format!("{l}\n")).collect();
    let (cluster, pods) = load(&some, PODS_HEAD);
    let workload = Workload::from_pods(&pods, POPULARITY);
    for seed in [42u64, 43] {
        let order = arrivals(&pods, cluster.gpu_capacity_milli(), 1.3, seed).unwrap();
        let rank = node_rank(cluster.nodes.len(), seed);
        for ranked in [true, false] {
            let tie = if ranked {
                TieBreak::Ranked(&rank)
            } else {
                TieBreak::Random
            };
            let mut c = cluster.clone();
            let mut fast = Fgd::new(workload.clone(), c.nodes.len());
            let mut plain = PlainFgd(workload.clone());
            let (mut rng_fast, mut rng_plain, mut leave) =
                (SimRng::new(seed), SimRng::new(seed), SimRng::new(seed ^ 1));
            let mut running: Vec<(usize, Assignment)> = Vec::new();
            let mut placed = 0;
            for &i in &order {
                let pod = &pods[i];
                let a = schedule_with(&c, pod, &mut fast, &mut rng_fast, tie);
                let b = schedule_with(&c, pod, &mut plain, &mut rng_plain, tie);
                assert_eq!(a, b, "seed {seed}, ranked {ranked}, pod {placed}");
                if let Some(a) = a {
                    c.allocate(pod, &a).unwrap();
                    fast.placed(&c, &a, pod);
                    running.push((i, a));
                    placed += 1;
                }
                if leave.below(4) == 0 && !running.is_empty() {
                    let (j, a) = running.swap_remove(leave.below_usize(running.len()));
                    c.release(&pods[j], &a).unwrap();
                }
            }
            assert!(placed > 500, "{placed}");
        }
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
