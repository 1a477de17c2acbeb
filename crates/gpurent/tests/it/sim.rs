//! `gpurent sim` on the small fixtures of `gpurent-sched`: the report, the decision times and
//! the chart.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpurent_sched::policies::NAMES as POLICIES;

use crate::support::{Run, BIN};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sched/tests/it/fixtures")
        .join(name)
}

/// `gpurent sim` with the fixtures' nodes and first 400 pods of the default list, one seed.
fn sim(extra: &[&str]) -> Run {
    let out = Command::new(BIN)
        .arg("sim")
        .arg("--nodes")
        .arg(fixture("openb_node_list_gpu_node.csv"))
        .arg("--pods")
        .arg(fixture("openb_pod_list_default_head400.csv"))
        .args(extra)
        .output()
        .expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn sim_json_reports_each_policy_with_its_p99_decision_time() {
    let run = sim(&["--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.json();
    let policies = report["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, POLICIES);
    for p in policies {
        for key in [
            "default",
            "gpu_allocation_ratio",
            "fragmentation_ratio",
            "placements_per_sec",
            "failed_placements",
        ] {
            assert!(p.get(key).is_some(), "{key} missing in {p}");
        }
        let p99 = p["decision_p99_us"].as_f64().unwrap();
        assert!(p99 > 0.0, "{p}");
        assert!(p["decision_p50_us"].as_f64().unwrap() <= p99, "{p}");
    }
}

#[test]
fn sim_table_shows_the_p99_decision_time() {
    let run = sim(&[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let header = run.stdout.lines().next().unwrap();
    assert!(header.ends_with("P99 µs"), "{header}");
}

#[test]
fn sim_plot_png_is_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.png");
    let run = sim(&["--plot", path.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let png = std::fs::read(&path).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "the PNG signature");
    // The first chunk: its length (13), its type, then the width and height.
    assert_eq!(&png[8..16], b"\0\0\0\x0dIHDR");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(width > 0 && height > 0, "{width}x{height}");
}

#[test]
fn sim_plot_svg_has_a_line_and_a_legend_entry_per_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.svg");
    let run = sim(&["--plot", path.to_str().unwrap(), "--seeds", "2"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    // Grid lines and legend samples are polylines of two points; the curves have many.
    let curves = svg
        .split("<polyline")
        .skip(1)
        .filter(|el| {
            let points = el
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            points.split_whitespace().count() > 2
        })
        .count();
    assert_eq!(curves, POLICIES.len());
    for name in POLICIES {
        assert!(svg.contains(name), "no {name} in the legend");
    }
    assert!(
        svg.contains("openb_pod_list_default_head400.csv"),
        "the title names the pods"
    );
    assert!(svg.contains("Arrived GPU request"));
}

#[test]
fn sim_plot_to_another_format_fails_before_the_simulation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.txt");
    // The node list does not exist: the chart's name is checked before anything is read.
    let out = Command::new(BIN)
        .args([
            "sim",
            "--nodes",
            "/nonexistent/nodes.csv",
            "--pods",
            "/nonexistent/pods.csv",
        ])
        .arg("--plot")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr.contains(".png or .svg"), "{stderr}");
    assert!(!path.exists());
}
