//! `gpurent bench chaos --minutes 2` (issue 19): the HA stack of scripts/ha-up.sh, simulated
//! agents and clients through HAProxy while faults are injected; every target must be met.
//! About 5 minutes (the stack's start, 2 minutes of faults, the checks); root only, and it
//! runs with the machine to itself (.config/nextest.toml).

use std::process::Command;

use serde_json::Value;

use crate::support::BIN;

#[test]
fn chaos_two_minutes_meet_the_targets() {
    if !nix_is_root() {
        println!("skipped: bench chaos needs root (it starts PostgreSQL and HAProxy)");
        return;
    }
    // Seed 12 deals the primary's kill (at about 48 s), then a replica cut from the database
    // and a replica's SIGSTOP, into the two minutes.
    let out = Command::new(BIN)
        .args(["--json", "bench", "chaos", "--minutes", "2", "--seed", "12"])
        .output()
        .expect("run gpurent bench chaos");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("apt-get") {
        println!("skipped: the HA stack's packages cannot be installed here: {stderr}");
        return;
    }
    assert!(out.status.success(), "bench chaos failed: {stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {stderr}"));
    println!("{doc:#}");
    for field in [
        "requests",
        "answered",
        "availability",
        "longest_outage_s",
        "lost_reservations",
        "double_runs",
        "p99_ms_during_faults",
    ] {
        assert!(doc[field].is_number(), "{field}: {doc}");
    }
    let faults = doc["faults"].as_array().expect("faults");
    assert!(
        faults.len() >= 2,
        "at least two faults in two minutes: {doc}"
    );
    assert!(
        faults.iter().any(|f| f["kind"] == "kill-primary"),
        "the seed deals the primary's kill: {doc}"
    );
    assert!(doc["requests"].as_u64().expect("requests") > 500, "{doc}");
    assert!(
        doc["reservations_acknowledged"].as_u64().expect("acks") > 50,
        "{doc}"
    );
    assert!(
        doc["instances_started"].as_u64().expect("started") > 0,
        "{doc}"
    );
    assert!(
        doc["availability"].as_f64().expect("availability") >= 0.9995,
        "availability under 99.95%: {doc}\n{stderr}"
    );
    assert_eq!(doc["lost_reservations"], 0, "{doc}\n{stderr}");
    assert_eq!(doc["lost_stops"], 0, "{doc}\n{stderr}");
    assert_eq!(doc["double_runs"], 0, "{doc}\n{stderr}");
    assert_eq!(doc["ledger_ok"], true, "{doc}");
    assert_eq!(doc["audit_ok"], true, "{doc}");
    assert_eq!(doc["targets_met"], true, "{doc}");
    // Nothing of the stack is left running.
    let left = Command::new("pgrep")
        .args(["-f", "gpurent-chaos-"])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "the stack left processes: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
