//! The agent's VRAM watchdog end to end (issue 17): a real `gpurent server` and `gpurent
//! agent` (the process executor) on a fake NVML whose file the test rewrites with the real pids
//! of two 40 GB shares of one H200. The share over its memory is told, then stopped after the
//! grace (`failed`, `vram_exceeded`, billed to the agent's decision) while its neighbour runs on; a
//! process of the neighbour on the other GPU, and a process of no instance on a rented GPU,
//! are events too.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::support::{eventually, instance_pgid, Cluster};

const MIB: u64 = 1024 * 1024;

/// The H200 probe NVML gave on a real machine, as two GPUs (the second a copy with its own
/// UUID), with these processes as (GPU index, pid, MiB).
fn probe(procs: &[(usize, i64, u64)]) -> Value {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../agent/tests/fixtures/nvidia-h200/nvml-idle.json"
    );
    let mut probe: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let first = probe["devices"][0].clone();
    let mut second = first.clone();
    second["index"] = json!(1);
    second["uuid"] = json!("GPU-00000000-0000-0000-0000-0000000000b2");
    let mut devices = vec![first, second];
    for (i, d) in devices.iter_mut().enumerate() {
        let on: Vec<Value> = procs
            .iter()
            .filter(|p| p.0 == i)
            .map(|p| json!({"pid": p.1, "used": format!("Used({})", p.2 * MIB)}))
            .collect();
        d["processes"] = json!(on);
    }
    probe["devices"] = json!(devices);
    probe
}

/// Rewrites the probe as the test's script says: a whole file renamed over the old one.
fn write_probe(path: &Path, probe: &Value) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(probe).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn events(cluster: &Cluster) -> Vec<Value> {
    let r = cluster.cli(Some(&cluster.admin), true, &["events"]);
    assert_eq!(r.code, 0, "{r:?}");
    r.json().as_array().cloned().unwrap_or_default()
}

fn event_of<'a>(events: &'a [Value], kind: &str, id: Option<&str>) -> Option<&'a Value> {
    events
        .iter()
        .find(|e| e["kind"] == kind && e["reservation_id"].as_str() == id)
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("not a time: {v}"))
}

#[test]
fn a_share_over_its_memory_is_stopped_after_the_grace_and_its_neighbour_runs_on() {
    let cluster = Cluster::start("127.0.0.1:0");
    let nvml = cluster.dir.path().join("nvml.json");
    write_probe(&nvml, &probe(&[]));
    let nvml_arg = nvml.to_str().unwrap().to_owned();
    let args = cluster.agent_args_on(
        "h200",
        &["--fake-nvml", &nvml_arg],
        &["--vram-grace-secs", "2"],
    );
    let _agent = cluster.agent("h200", &args);
    cluster.wait_ready(1);
    let tenant = cluster.tenant("alice");
    let share = [
        "--gpu",
        "H200",
        "--vram-gb",
        "40",
        "--hours",
        "1",
        "--",
        "sleep",
        "600",
    ];
    let a = cluster.reserve(&tenant, &share);
    let b = cluster.reserve(&tenant, &share);
    eventually("both shares running", 30, || {
        [&a, &b]
            .iter()
            .all(|id| cluster.get(&tenant, id)["status"] == "running")
    });
    let gpu_of = |id: &str| {
        cluster.get(&tenant, id)["gpus"][0]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (gpu_a, gpu_b) = (gpu_of(&a), gpu_of(&b));
    assert_eq!(gpu_a, gpu_b, "two shares of the one H200");
    let gpu0 = probe(&[])["devices"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    let (on, other) = if gpu_a == gpu0 { (0, 1) } else { (1, 0) };
    let node_dir = cluster.dir.path().join("h200");
    let (pid_a, pid_b) = (instance_pgid(&node_dir, &a), instance_pgid(&node_dir, &b));

    // A takes 45 GiB of its 40; B stays within its share.
    write_probe(
        &nvml,
        &probe(&[(on, pid_a, 45 * 1024), (on, pid_b, 10 * 1024)]),
    );
    let mut seen = Vec::new();
    eventually("the over-share event", 30, || {
        seen = events(&cluster);
        event_of(&seen, "vram_over_share", Some(&a)).is_some()
    });
    let over = event_of(&seen, "vram_over_share", Some(&a))
        .unwrap()
        .clone();
    assert!(
        over["detail"].as_str().unwrap().contains("46080 MiB"),
        "{over}"
    );
    assert!(
        event_of(&seen, "vram_over_share", Some(&b)).is_none(),
        "{seen:?}"
    );
    // `stopping` from the decision's sync, then its end once the agent reports the stop.
    eventually("A ended", 30, || {
        !cluster.get(&tenant, &a)["ended_at"].is_null()
    });
    // Its process is gone from the GPU, as NVML would show.
    write_probe(&nvml, &probe(&[(on, pid_b, 10 * 1024)]));
    let ended = cluster.get(&tenant, &a);
    assert_eq!(
        (ended["status"].as_str(), ended["end_reason"].as_str()),
        (Some("failed"), Some("vram_exceeded")),
        "{ended}"
    );
    let seen = events(&cluster);
    let exceeded = event_of(&seen, "vram_exceeded", Some(&a)).expect("the stop's event");
    // Billed from its start to the agent's decision to stop it (not to the report of the
    // stop, which follows once the instance is gone): after it went over; its neighbour runs.
    let (over_at, exceeded_at, ended_at) = (
        time(&over["at"]),
        time(&exceeded["at"]),
        time(&ended["ended_at"]),
    );
    assert!(over_at <= exceeded_at, "{over} {exceeded}");
    assert_eq!(exceeded_at, ended_at, "{exceeded} {ended}");
    assert!(time(&ended["started_at"]) < over_at);
    let charged = ended["charged"].as_str().unwrap_or_default();
    assert!(charged.chars().any(|c| ('1'..='9').contains(&c)), "{ended}");
    let neighbour = cluster.get(&tenant, &b);
    assert_eq!(neighbour["status"], "running", "{neighbour}");
    assert!(neighbour["ended_at"].is_null());
    // A's log says why, in the platform's words.
    let logs = cluster.cli(Some(&tenant), false, &["logs", &a]);
    assert_eq!(logs.code, 0, "{logs:?}");
    // The breach when it began, and the stop's reason once, from its ending.
    assert!(
        logs.stdout.contains("[gpurent] GPU memory 46080 MiB"),
        "{}",
        logs.stdout
    );
    assert_eq!(
        logs.stdout.matches("vram_exceeded").count(),
        1,
        "{}",
        logs.stdout
    );
    assert!(
        logs.stdout
            .contains("[gpurent] vram_exceeded: GPU memory 46080 MiB"),
        "{}",
        logs.stdout
    );
    assert!(
        ended["end_message"]
            .as_str()
            .is_some_and(|m| m.starts_with("GPU memory 46080 MiB") && m.ends_with("the grace")),
        "{ended}"
    );
    let untouched = cluster.cli(Some(&tenant), false, &["logs", &b]);
    assert!(
        !untouched.stdout.contains("[gpurent]"),
        "{}",
        untouched.stdout
    );

    // B escapes to the other GPU; a process of no instance (this test) sits on B's GPU.
    let me = i64::from(std::process::id());
    write_probe(&nvml, &probe(&[(other, pid_b, 512), (on, me, 700)]));
    let mine = |e: &&Value| {
        e["kind"] == "unowned_gpu_process"
            && e["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with(&format!("process {me} of no instance")))
    };
    let mut seen = Vec::new();
    eventually("the foreign-GPU and unowned-process events", 30, || {
        seen = events(&cluster);
        event_of(&seen, "foreign_gpu", Some(&b)).is_some() && seen.iter().any(|e| mine(&e))
    });
    let unowned = seen.iter().find(mine).unwrap();
    assert!(unowned["reservation_id"].is_null(), "{unowned}");
    assert_eq!(
        unowned["detail"].as_str().unwrap(),
        format!("process {me} of no instance uses 700 MiB on {gpu_b}, which {b} rents")
    );
    eventually("B ended", 30, || {
        !cluster.get(&tenant, &b)["ended_at"].is_null()
    });
    let b_ended = cluster.get(&tenant, &b);
    assert_eq!(b_ended["status"], "failed", "{b_ended}");
    assert_eq!(b_ended["end_reason"], "vram_exceeded", "{b_ended}");
    // The host's process is reported once, not with every sample.
    let seen = events(&cluster);
    let reports = seen.iter().filter(mine).count();
    assert_eq!(reports, 1, "{seen:?}");
    let logs = cluster.cli(Some(&tenant), false, &["logs", &b]);
    assert!(
        logs.stdout.contains("which is not its GPU"),
        "{}",
        logs.stdout
    );
    cluster.ledger_check();
}
