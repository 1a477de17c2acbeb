//! `gpurent sim`: the FGD paper's experiment on a node list and a pod list, per policy, as a
//! table or one JSON document, and optionally a chart of the allocation as the pods arrive.

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use gpurent_sched::cluster::Cluster;
use gpurent_sched::experiment::{self, PolicyRun, CHECKPOINTS};
use gpurent_sched::policies::NAMES;
use gpurent_sched::trace::{parse_nodes, parse_pods};

use crate::cli::SimArgs;
use crate::cmd::sim_plot::{self, Format, Line};
use crate::output::{print_json, print_table};

/// The policy the control plane places with (`gpurent_sched::place_expecting`).
pub(crate) const DEFAULT_POLICY: &str = "fgd-cpu";
/// The paper's seeds start here.
const FIRST_SEED: u64 = 42;

#[derive(Debug, Serialize)]
struct SimReport {
    policies: Vec<PolicyReport>,
}

/// Means over the seeds; ratios are fractions at 130% arrived; decision times are the means of
/// each seed's percentiles.
#[derive(Debug, Serialize)]
struct PolicyReport {
    name: &'static str,
    default: bool,
    gpu_allocation_ratio: f64,
    fragmentation_ratio: f64,
    placements_per_sec: f64,
    failed_placements: f64,
    decision_p50_us: f64,
    decision_p99_us: f64,
    #[serde(skip)]
    allocation_at: Vec<f64>,
    /// (arrived, allocation) in fractions of capacity.
    #[serde(skip)]
    curve: Vec<(f64, f64)>,
}

pub fn run(args: &SimArgs, json: bool) -> anyhow::Result<()> {
    if args.replay {
        return super::sim_replay::run(args, json);
    }
    // A chart that cannot be written is said before the minutes of simulation, not after.
    let plot = args
        .plot
        .as_deref()
        .map(|path| Format::of(path).map(|format| (path, format)))
        .transpose()?;
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let node_rows =
        parse_nodes(&read(&args.nodes)?).with_context(|| format!("in {}", args.nodes.display()))?;
    let pod_rows =
        parse_pods(&read(&args.pods)?).with_context(|| format!("in {}", args.pods.display()))?;
    let cluster = Cluster::from_rows(&node_rows)?;
    let pods: Vec<_> = pod_rows.iter().map(|r| cluster.pod(r)).collect();
    let names: Vec<&str> = if args.policy == "all" {
        NAMES.to_vec()
    } else {
        vec![args.policy.as_str()]
    };
    let seeds: Vec<u64> = match args.seeds {
        Some(n) => (FIRST_SEED..FIRST_SEED + n.max(1)).collect(),
        None => vec![args.seed],
    };
    let start = Instant::now();
    let clock = move || start.elapsed();
    let mut runs: Vec<Vec<PolicyRun>> = Vec::new();
    for &seed in &seeds {
        runs.push(experiment::run(&cluster, &pods, &names, seed, &clock)?);
    }
    let report = SimReport {
        policies: (0..names.len()).map(|i| mean(&runs, i)).collect(),
    };
    if let Some((path, format)) = plot {
        let file_name = |p: &std::path::Path| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        };
        let seeds = match seeds.as_slice() {
            [seed] => format!("seed {seed}"),
            [first, .., last] => format!("mean of seeds {first}-{last}"),
            [] => String::new(),
        };
        let title = format!("GPU allocation, {}, {seeds}", file_name(&args.pods));
        let lines: Vec<Line> = report
            .policies
            .iter()
            .map(|p| Line {
                label: label(p),
                points: p
                    .curve
                    .iter()
                    .map(|&(x, y)| (x * 100.0, y * 100.0))
                    .collect(),
            })
            .collect();
        sim_plot::write(path, format, &title, &lines)?;
    }
    if json {
        print_json(&report).map_err(|e| anyhow::anyhow!(e.message))?;
    } else {
        let mut header: Vec<String> = vec!["POLICY".into()];
        header.extend(
            CHECKPOINTS
                .iter()
                .map(|c| format!("ALLOC@{:.0}%", c * 100.0)),
        );
        header.extend(["FRAG@130%", "FAILED", "PLACEMENTS/S", "P99 µs"].map(String::from));
        let rows: Vec<Vec<String>> = report
            .policies
            .iter()
            .map(|p| {
                let mut row = vec![label(p)];
                row.extend(p.allocation_at.iter().map(|a| format!("{:.2}%", a * 100.0)));
                row.push(format!("{:.2}%", p.fragmentation_ratio * 100.0));
                row.push(format!("{:.1}", p.failed_placements));
                row.push(format!("{:.0}", p.placements_per_sec));
                row.push(format!("{:.1}", p.decision_p99_us));
                row
            })
            .collect();
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        print_table(&header, &rows);
    }
    Ok(())
}

fn label(p: &PolicyReport) -> String {
    if p.default {
        format!("{} (default)", p.name)
    } else {
        p.name.to_owned()
    }
}

fn mean(runs: &[Vec<PolicyRun>], policy: usize) -> PolicyReport {
    let of_policy: Vec<&PolicyRun> = runs.iter().map(|r| &r[policy]).collect();
    let n = of_policy.len().max(1) as f64;
    let avg = |f: &dyn Fn(&PolicyRun) -> f64| of_policy.iter().map(|r| f(r)).sum::<f64>() / n;
    let at = |k: usize| {
        avg(&|r: &PolicyRun| r.checkpoints.get(k).map_or(0.0, |c| c.gpu_allocation_ratio))
    };
    let last = CHECKPOINTS.len() - 1;
    let name = of_policy.first().map_or("", |r| r.policy);
    PolicyReport {
        name,
        default: name == DEFAULT_POLICY,
        gpu_allocation_ratio: at(last),
        fragmentation_ratio: avg(&|r: &PolicyRun| {
            r.checkpoints
                .get(last)
                .map_or(0.0, |c| c.fragmentation_ratio)
        }),
        placements_per_sec: avg(&|r: &PolicyRun| r.placements_per_sec),
        failed_placements: avg(&|r: &PolicyRun| r.failed_placements as f64),
        decision_p50_us: avg(&|r: &PolicyRun| r.decision_p50_us),
        decision_p99_us: avg(&|r: &PolicyRun| r.decision_p99_us),
        allocation_at: (0..CHECKPOINTS.len()).map(at).collect(),
        curve: mean_curve(&of_policy),
    }
}

/// Point by point: every run has the same marks (one per percent arrived), though a run cut
/// short would have fewer, so each point is the mean of the runs that reached it.
fn mean_curve(runs: &[&PolicyRun]) -> Vec<(f64, f64)> {
    let longest = runs.iter().map(|r| r.curve.len()).max().unwrap_or(0);
    (0..longest)
        .map(|k| {
            let at: Vec<(f64, f64)> = runs
                .iter()
                .filter_map(|r| r.curve.get(k).copied())
                .collect();
            let n = at.len() as f64;
            (
                at.iter().map(|p| p.0).sum::<f64>() / n,
                at.iter().map(|p| p.1).sum::<f64>() / n,
            )
        })
        .collect()
}
