//! Volumes (issue 33) with real parts: a loop-mounted ext4 image on the agent's disk, bound
//! into isolated processes and Docker containers; data written by one reservation read by the
//! next on both executors; a write past the size gets ENOSPC while the node goes on; the
//! lifecycle's refusals; and a shared volume that moves with its work when its node is lost.

use std::path::PathBuf;

use serde_json::Value;

use crate::docker_and_processes::{agent, docker_and_isolation};
use crate::support::{eventually, instance_pgid, Cluster, Daemon};

pub(crate) fn root() -> bool {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    eprintln!("SKIPPED: volumes are loop-mounted, which needs root");
    false
}

/// Waits for the reservation to end; its log.
/// Waits for the reservation to end (saying, if it does not, where it stands and what the
/// agents logged); the reservation and its log.
fn ended(cluster: &Cluster, token: &str, id: &str) -> (Value, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let r = cluster.get(token, id);
        let s = r["status"].as_str().unwrap_or_default().to_owned();
        if !["pending", "starting", "running", "stopping"].contains(&s.as_str()) {
            let logs = cluster.cli(Some(token), false, &["logs", id]).stdout;
            return (r, logs);
        }
        if std::time::Instant::now() > deadline {
            let mut agents = String::new();
            for entry in std::fs::read_dir(cluster.dir.path()).unwrap().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    agents.push_str(&format!("== {}\n", path.display()));
                    agents.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
                }
            }
            panic!("{id} did not end: {r}\n{agents}");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn a_volume_keeps_its_data_between_reservations_on_both_executors() {
    if !docker_and_isolation() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "vols", &[]);
    // The node's facts are written in the sync that made it ready, a moment after.
    eventually("the node's volume facts", 30, || {
        cluster.nodes()[0]["volumes"]["enforcement"] == "loop"
    });
    let node = cluster.nodes()[0].clone();
    let token = cluster.tenant("vic");
    let vol = |args: &[&str]| cluster.cli(Some(&token), true, &[&["volumes"], args].concat());

    let made = vol(&["create", "data", "--size", "64MiB"]);
    assert_eq!(made.code, 0, "{made:?}");
    let made = made.json();
    assert_eq!(made["state"], "ready", "{made}");
    assert_eq!(made["kind"], "local");
    assert_eq!(made["size_bytes"], 64 << 20);
    // The command line's contract names these too.
    assert_eq!(made["status"], "ready", "{made}");
    assert_eq!(made["size_gb"], 0.067108864);
    assert_eq!(made["price_per_gb_month"], "0.07");
    assert_eq!(made["node"], node["name"]);
    let volume_id = made["id"].as_str().unwrap().to_owned();
    let agent_dir = cluster.dir.path().join(node["name"].as_str().unwrap());
    assert!(
        agent_dir
            .join("volumes")
            .join(format!("{volume_id}.img"))
            .is_file(),
        "a loop image in the agent's volumes dir"
    );

    let run = |image: Option<&str>, mount: &str, script: &str| {
        let mut args = vec!["--gpu", "rtx4090", "--hours", "1", "--volume", mount];
        if let Some(image) = image {
            args.extend(["--image", image]);
        }
        args.extend(["--", "sh", "-c", script]);
        let id = cluster.reserve(&token, &args);
        ended(&cluster, &token, &id)
    };
    // An isolated process writes; a container reads and appends; a process reads both.
    let (r, logs) = run(
        None,
        "data:/workspace",
        "echo one > /workspace/f && cat /workspace/f",
    );
    assert_eq!(r["status"], "stopped", "{r}\n{logs}");
    assert_eq!(r["volumes"][0]["path"], "/workspace", "{r}");
    assert!(logs.contains("one"), "{logs}");
    let (r, logs) = run(
        Some("gpurent-test/busybox"),
        "data:/workspace",
        "cat /workspace/f && echo two >> /workspace/f",
    );
    assert_eq!(r["status"], "stopped", "{r}\n{logs}");
    assert!(
        logs.contains("one"),
        "the container reads what the process wrote: {logs}"
    );
    let (_, logs) = run(None, "data:/data", "cat /data/f");
    assert!(
        logs.contains("one\ntwo"),
        "the process reads what the container wrote: {logs}"
    );

    // Read-only is read-only, in both.
    let (_, logs) = run(
        None,
        "data:/data:ro",
        "cat /data/f; touch /data/x || echo refused",
    );
    assert!(logs.contains("two") && logs.contains("refused"), "{logs}");
    let (_, logs) = run(
        Some("gpurent-test/busybox"),
        "data:/data:ro",
        "touch /data/x || echo refused",
    );
    assert!(logs.contains("refused"), "{logs}");

    // Past its size: ENOSPC inside, on both executors; the node's disk and agent go on.
    for image in [None, Some("gpurent-test/busybox")] {
        let (r, logs) = run(
            image,
            "data:/workspace",
            "dd if=/dev/zero of=/workspace/big bs=1M count=100; rm -f /workspace/big; echo after",
        );
        assert!(
            logs.contains("No space left on device") && logs.contains("after"),
            "{image:?}: {r}\n{logs}"
        );
    }
    assert_eq!(cluster.nodes()[0]["status"], "ready");
    let listed = vol(&["ls"]).json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    // One writer at a time; no removal while mounted.
    let holder = cluster.reserve(
        &token,
        &[
            "--gpu", "rtx4090", "--hours", "1", "--volume", "data:/w", "--", "sleep", "600",
        ],
    );
    eventually("the holder running", 60, || {
        cluster.get(&token, &holder)["status"] == "running"
    });
    let second = cluster.cli(
        Some(&token),
        true,
        &[
            "reserve", "--gpu", "rtx4090", "--hours", "1", "--volume", "data:/w", "--", "true",
        ],
    );
    assert_ne!(second.code, 0);
    assert!(
        second
            .stdout
            .contains(&format!("mounted read-write by reservation {holder}")),
        "{second:?}"
    );
    let busy = vol(&["rm", "data"]);
    assert_ne!(busy.code, 0);
    assert!(busy.stdout.contains("stop it first"), "{busy:?}");
    let got = vol(&["get", "data"]).json();
    assert_eq!(
        got["used_by"][0]["reservation_id"],
        holder.as_str(),
        "{got}"
    );
    cluster.cli(Some(&token), true, &["stop", &holder]);
    ended(&cluster, &token, &holder);

    // Grown while unused; never shrunk.
    let grown = vol(&["resize", "data", "--size", "128MiB"]);
    assert_eq!(grown.code, 0, "{grown:?}");
    assert_eq!(grown.json()["size_bytes"], 128 << 20);
    let (_, logs) = run(
        None,
        "data:/workspace",
        "dd if=/dev/zero of=/workspace/big bs=1M count=80 2>&1 && echo fits",
    );
    assert!(logs.contains("fits"), "the grown room is usable: {logs}");
    let shrink = vol(&["resize", "data", "--size", "64MiB"]);
    assert_ne!(shrink.code, 0);
    assert!(shrink.stdout.contains("only grows"), "{shrink:?}");

    // Removed: its node deletes it, and the name is free again.
    let removed = vol(&["rm", "data"]);
    assert_eq!(removed.code, 0, "{removed:?}");
    eventually("the volume deleted", 30, || {
        vol(&["ls"]).json().as_array().is_some_and(Vec::is_empty)
    });
    assert!(!agent_dir
        .join("volumes")
        .join(format!("{volume_id}.img"))
        .exists());
    cluster.ledger_check();
}

#[test]
fn bad_volume_requests_are_refused_saying_why() {
    if !root() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let args = cluster.agent_args("disk", &[]);
    let _agent = cluster.agent("disk", &args);
    cluster.wait_ready(1);
    let token = cluster.tenant("val");
    let other = cluster.tenant("oscar");
    let refused = |token: &str, args: &[&str], why: &str| {
        let run = cluster.cli(Some(token), true, args);
        assert_ne!(run.code, 0, "{args:?} must be refused: {run:?}");
        assert!(
            run.stdout.contains(why) || run.stderr.contains(why),
            "{args:?}: {why:?} not in {run:?}"
        );
    };
    refused(
        &token,
        &["volumes", "create", "big", "--size", "60TB"],
        "room for",
    );
    refused(
        &token,
        &["volumes", "create", "x", "--size", "10 parsecs"],
        "not one of",
    );
    refused(
        &token,
        &["volumes", "create", "../x", "--size", "1GB"],
        "name:",
    );
    refused(
        &token,
        &["volumes", "create", "s", "--size", "1GB", "--shared"],
        "shared volume storage",
    );
    refused(
        &token,
        &[
            "volumes", "create", "n", "--size", "1GB", "--node", "nowhere",
        ],
        "no node",
    );
    let made = cluster.cli(
        Some(&token),
        true,
        &["volumes", "create", "mine", "--size", "64MiB"],
    );
    assert_eq!(made.code, 0, "{made:?}");
    refused(
        &token,
        &["volumes", "create", "mine", "--size", "64MiB"],
        "you have a volume named",
    );
    // Another tenant's volume does not exist for them.
    refused(&other, &["volumes", "get", "mine"], "not found");
    refused(&other, &["volumes", "rm", "mine"], "not found");
    let reserve = |token: &str, mount: &[&str], why: &str| {
        let args = [
            &["reserve", "--gpu", "rtx4090", "--hours", "1"],
            mount,
            &["--", "true"],
        ]
        .concat();
        refused(token, &args, why);
    };
    reserve(&other, &["--volume", "mine:/data"], "you have no volume");
    reserve(&token, &["--volume", "ghost:/data"], "you have no volume");
    reserve(&token, &["--volume", "mine:/etc"], "system directory");
    reserve(&token, &["--volume", "mine:data"], "absolute");
    reserve(&token, &["--volume", "mine:/data/../etc"], "each part");
    reserve(&token, &["--volume", "mine"], "NAME:PATH");
    reserve(
        &token,
        &["--volume", "mine:/a", "--volume", "mine:/b"],
        "mounted twice",
    );
    // Nothing was left behind by the refusals: no reservation, the volume unused.
    let listed = cluster.cli(Some(&token), true, &["ls"]).json();
    assert_eq!(listed.as_array().unwrap().len(), 0, "{listed}");
    let got = cluster
        .cli(Some(&token), true, &["volumes", "get", "mine"])
        .json();
    assert_eq!(got["used_by"].as_array().unwrap().len(), 0, "{got}");
}

/// Agents named `names` (one simulated RTX 4090 each, isolated processes) mounting one shared
/// volume storage, once ready; the storage's directory.
pub(crate) fn agents_sharing_volumes(cluster: &Cluster, names: &[&str]) -> (PathBuf, Vec<Daemon>) {
    let shared = cluster.dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let mut agents = Vec::new();
    for name in names {
        // Isolated processes (volumes are bound into their sandboxes).
        let join = cluster
            .cli(Some(&cluster.admin), true, &["nodes", "join-token"])
            .json();
        let data = cluster.dir.path().join(name);
        let args = [
            "--server",
            &cluster.url,
            "agent",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            name,
            "--sim-gpus",
            "1xRTX4090",
            "--executor",
            "process",
            "--shared-volumes-dir",
            shared.to_str().unwrap(),
            "--join-token",
            join["token"].as_str().unwrap(),
        ];
        let log = cluster.dir.path().join(format!("{name}.log"));
        agents.push(Daemon::start_quiet(&args, &log));
    }
    cluster.wait_ready(names.len());
    (shared, agents)
}

/// Two agents mounting one shared volume storage; the one running the work is lost (kill
/// -9, its instance with it) and the work runs again on the other, finding its files.
#[test]
fn a_shared_volume_moves_with_its_work_when_its_node_is_lost() {
    if !root() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let (shared, agents) = agents_sharing_volumes(&cluster, &["near", "far"]);
    let mut agents: Vec<(&str, Daemon)> = ["near", "far"].into_iter().zip(agents).collect();
    let token = cluster.tenant("sam");
    let made = cluster.cli(
        Some(&token),
        true,
        &["volumes", "create", "ckpt", "--size", "1GB", "--shared"],
    );
    assert_eq!(made.code, 0, "{made:?}");
    assert_eq!(made.json()["kind"], "shared");
    let id = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--volume",
            "ckpt:/ckpt",
            "--",
            "sh",
            "-c",
            "echo \"run $GPURENT_EPOCH\" >> /ckpt/runs; cat /ckpt/runs; exec sleep 600",
        ],
    );
    eventually("running", 60, || {
        cluster.get(&token, &id)["status"] == "running"
    });
    let on = cluster.get(&token, &id)["node"]
        .as_str()
        .unwrap()
        .to_owned();
    // Its file written (running is said as its sandbox starts) before its node goes.
    eventually("the first run to write its file", 30, || {
        std::fs::read_dir(&shared).unwrap().any(|e| {
            std::fs::read_to_string(e.unwrap().path().join("runs")).is_ok_and(|r| r == "run 1\n")
        })
    });
    let pgid = instance_pgid(&cluster.dir.path().join(&on), &id);
    let (_, victim) = agents.iter_mut().find(|(n, _)| *n == on).unwrap();
    victim.kill9();
    let status = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("the work on the other node", 60, || {
        let r = cluster.get(&token, &id);
        r["status"] == "running" && r["node"] != on.as_str() && r["epoch"] == 2
    });
    let runs = || {
        let dirs: Vec<PathBuf> = std::fs::read_dir(&shared)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            dirs.len() <= 1,
            "one directory on the shared storage: {dirs:?}"
        );
        dirs.first()
            .and_then(|d| std::fs::read_to_string(d.join("runs")).ok())
            .unwrap_or_default()
    };
    eventually("the second run to add to the first one's file", 60, || {
        runs() == "run 1\nrun 2\n"
    });
    eventually("the second run to have read it", 30, || {
        let logs = cluster.cli(Some(&token), false, &["logs", &id]).stdout;
        logs.contains("run 1\nrun 2")
    });
    cluster.cli(Some(&token), true, &["stop", &id]);
    ended(&cluster, &token, &id);
    cluster.ledger_check();
}
