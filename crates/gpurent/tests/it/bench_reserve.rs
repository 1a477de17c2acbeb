//! `gpurent bench reserve --json`: the figures (reservations per second, p50, p99),
//! at concurrency 16 by default, with the audit trail, access control and metrics on and the
//! rate limits off, as its output says; the opening requests and the warm-up take no GPU the
//! measured requests need.

use std::process::Command;

use crate::support::{Run, BIN};

#[test]
fn bench_reserve_prints_its_figures_and_what_was_on() {
    let out = Command::new(BIN)
        .args([
            "--json",
            "bench",
            "reserve",
            "--nodes",
            "8",
            "--requests",
            "64",
        ])
        .output()
        .expect("run gpurent bench reserve");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(run.code, 0, "bench reserve failed: {}", run.stderr);
    let r = run.json();
    for field in ["reservations_per_sec", "p50_ms", "p99_ms"] {
        assert!(
            r[field].as_f64().is_some_and(|v| v > 0.0),
            "{field} is not a positive number in {r}"
        );
    }
    assert!(r["p50_ms"].as_f64() <= r["p99_ms"].as_f64(), "{r}");
    assert_eq!(r["concurrency"], 16, "{r}");
    // 8 nodes of 8 GPUs: room for all 64 measured, the warm-up and the opening requests
    // taking GPUs of nodes of their own.
    assert_eq!(r["requests"], 64, "{r}");
    assert_eq!(r["created"], 64, "every reservation was placed: {r}");
    assert_eq!(r["errors"], 0, "{r}");
    // 50 more nodes' worth reserved before the measured round.
    assert_eq!(r["warm_up"], 400, "{r}");
    // One untimed request a client opens its connection with.
    assert_eq!(r["opening_requests"], 16, "{r}");
    assert_eq!(r["audit"], true, "{r}");
    assert_eq!(r["access_control"], true, "{r}");
    assert_eq!(r["metrics"], true, "{r}");
    assert_eq!(r["rate_limits"], false, "{r}");
    assert!(
        run.stderr.contains("audit trail on") && run.stderr.contains("rate limits"),
        "the run says what is on: {}",
        run.stderr
    );
}
