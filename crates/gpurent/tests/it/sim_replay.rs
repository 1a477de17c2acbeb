//! `gpurent sim --replay` on the trace slice of `crates/sched`'s fixtures: the first 8 nodes
//! (16 P100 GPUs) under the first 400 pods, few enough GPUs that pods wait (some of the first
//! pods run for months).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{Run, BIN};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sched/tests/it/fixtures")
        .join(name)
}

fn sim(args: &[&str]) -> Run {
    let out = Command::new(BIN)
        .arg("sim")
        .args(args)
        .output()
        .expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A node list of the fixture's first `nodes` nodes, in `dir`.
fn small_cluster(dir: &Path, nodes: usize) -> String {
    let text = std::fs::read_to_string(fixture("openb_node_list_gpu_node.csv")).unwrap();
    let head: String = text
        .lines()
        .take(nodes + 1)
        .map(|l| format!("{l}\n"))
        .collect();
    let path = dir.join("nodes.csv");
    std::fs::write(&path, head).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn replay_reports_every_policy_as_json_and_as_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = small_cluster(dir.path(), 8);
    let pods = fixture("openb_pod_list_default_head400.csv");
    let pods = pods.to_str().unwrap();
    let args = ["--nodes", nodes.as_str(), "--pods", pods, "--replay"];

    let run = sim(&[&args[..], &["--json"]].concat());
    assert_eq!(run.code, 0, "{run:?}");
    let report = run.json();
    assert_eq!(report["mode"], "replay");
    assert_eq!(report["skipped"], 0);
    let policies = report["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, gpurent_sched::policies::NAMES);
    for p in policies {
        let name = &p["name"];
        assert_eq!(p["default"], name == "fgd-cpu", "{p}");
        let placed = p["placed"].as_u64().unwrap();
        let never = p["never_placed"].as_u64().unwrap();
        assert_eq!(placed + never, 400, "{p}");
        // The 8-GPU pods find no node of two GPUs.
        assert!(never >= 4, "{p}");
        let (mean, p99) = (
            p["mean_wait_s"].as_f64().unwrap(),
            p["p99_wait_s"].as_f64().unwrap(),
        );
        assert!(
            mean > 0.0 && p99 >= mean,
            "16 GPUs for 400 pods: some wait: {p}"
        );
        let alloc = p["mean_gpu_allocation_ratio"].as_f64().unwrap();
        assert!(alloc > 0.0 && alloc <= 1.0, "{p}");
        assert!(p["decisions_per_sec"].as_f64().unwrap() > 0.0, "{p}");
    }
    // Deterministic for a seed, timing aside.
    let again = sim(&[&args[..], &["--json"]].concat()).json();
    for (a, b) in policies.iter().zip(again["policies"].as_array().unwrap()) {
        for field in ["placed", "never_placed", "mean_wait_s", "p99_wait_s"] {
            assert_eq!(a[field], b[field], "{field}");
        }
    }

    let table = sim(&[&args[..], &["--policy", "fgd-cpu"]].concat());
    assert_eq!(table.code, 0, "{table:?}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", table.stdout);
    for column in [
        "POLICY",
        "PLACED",
        "NEVER PLACED",
        "MEAN WAIT s",
        "P99 WAIT s",
        "MEAN ALLOC %",
        "DECISIONS/S",
    ] {
        assert!(lines[0].contains(column), "{column}: {}", lines[0]);
    }
    assert!(lines[1].starts_with("fgd-cpu (default)"), "{}", lines[1]);
}

#[test]
fn replay_needs_times_and_takes_no_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = small_cluster(dir.path(), 2);
    let pods = dir.path().join("pods.csv");
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n",
    )
    .unwrap();
    let pods = pods.to_str().unwrap();

    let run = sim(&["--nodes", &nodes, "--pods", pods, "--replay"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("creation"), "{}", run.stderr);

    let run = sim(&[
        "--nodes", &nodes, "--pods", pods, "--replay", "--seeds", "3",
    ]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--seeds"), "{}", run.stderr);
}
