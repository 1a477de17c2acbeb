//! `gpurent sim --replay`: the trace's own creation and deletion times replayed through each
//! policy, with the waits they cause, as a table or one JSON document.

use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use gpurent_sched::cluster::Cluster;
use gpurent_sched::policies::NAMES;
use gpurent_sched::replay::{self, timed_pods, ReplayRun};
use gpurent_sched::trace::{parse_nodes, parse_pods};

use super::sim::DEFAULT_POLICY;
use crate::cli::SimArgs;
use crate::output::{print_json, print_table};

#[derive(Debug, Serialize)]
struct ReplayReport {
    mode: &'static str,
    /// Pod rows without a creation or a deletion time, left out of the replay.
    skipped: usize,
    policies: Vec<PolicyReport>,
}

#[derive(Debug, Serialize)]
struct PolicyReport {
    name: &'static str,
    default: bool,
    placed: u64,
    never_placed: u64,
    mean_wait_s: f64,
    p99_wait_s: f64,
    mean_gpu_allocation_ratio: f64,
    decisions_per_sec: f64,
}

impl From<ReplayRun> for PolicyReport {
    fn from(r: ReplayRun) -> Self {
        PolicyReport {
            name: r.policy,
            default: r.policy == DEFAULT_POLICY,
            placed: r.placed,
            never_placed: r.never_placed,
            mean_wait_s: r.mean_wait_s,
            p99_wait_s: r.p99_wait_s,
            mean_gpu_allocation_ratio: r.mean_gpu_allocation_ratio,
            decisions_per_sec: r.decisions_per_sec,
        }
    }
}

pub fn run(args: &SimArgs, json: bool) -> anyhow::Result<()> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let node_rows =
        parse_nodes(&read(&args.nodes)?).with_context(|| format!("in {}", args.nodes.display()))?;
    let pod_rows =
        parse_pods(&read(&args.pods)?).with_context(|| format!("in {}", args.pods.display()))?;
    let cluster = Cluster::from_rows(&node_rows)?;
    let timed = timed_pods(&cluster, &pod_rows);
    let names: Vec<&str> = if args.policy == "all" {
        NAMES.to_vec()
    } else {
        vec![args.policy.as_str()]
    };
    let start = Instant::now();
    let clock = move || start.elapsed();
    let runs = replay::run(&cluster, &timed.pods, &names, args.seed, &clock)
        .with_context(|| format!("replaying {}", args.pods.display()))?;
    let report = ReplayReport {
        mode: "replay",
        skipped: timed.skipped,
        policies: runs.into_iter().map(PolicyReport::from).collect(),
    };
    if json {
        print_json(&report).map_err(|e| anyhow::anyhow!(e.message))?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = report
        .policies
        .iter()
        .map(|p| {
            vec![
                if p.default {
                    format!("{} (default)", p.name)
                } else {
                    p.name.to_owned()
                },
                p.placed.to_string(),
                p.never_placed.to_string(),
                format!("{:.1}", p.mean_wait_s),
                format!("{:.0}", p.p99_wait_s),
                format!("{:.2}%", p.mean_gpu_allocation_ratio * 100.0),
                format!("{:.0}", p.decisions_per_sec),
            ]
        })
        .collect();
    print_table(
        &[
            "POLICY",
            "PLACED",
            "NEVER PLACED",
            "MEAN WAIT s",
            "P99 WAIT s",
            "MEAN ALLOC %",
            "DECISIONS/S",
        ],
        &rows,
    );
    if timed.skipped > 0 {
        eprintln!(
            "{} pods without a creation or a deletion time were left out",
            timed.skipped
        );
    }
    Ok(())
}
