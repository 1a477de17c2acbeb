//! Node loss with real processes: a control plane and two agents, each its own process and
//! data dir; kill -9 the agent running a reservation (and its instance: the machine is gone),
//! and it runs again on the other node with the next epoch within the node TTL and a tick or
//! two, resuming from what the first run left in its checkpoint volume (storage both nodes
//! share).

use std::time::{Duration, Instant};

use crate::support::{cli, eventually, instance_pgid, Cluster};

#[test]
fn a_killed_agents_work_runs_on_the_other_node() {
    let cluster = Cluster::start("127.0.0.1:0");
    let dir = cluster.dir.path();
    let shared = dir.join("checkpoints");
    let hook_log = dir.join("hook.log");
    let hook = format!(
        "echo \"$GPURENT_CHECKPOINT_ACTION ${{GPURENT_EPOCH:-}}\" >> {}",
        hook_log.display()
    );
    let mut agents = Vec::new();
    for name in ["box-a", "box-b"] {
        let args = cluster.agent_args(
            name,
            &[
                "--checkpoint-dir",
                shared.to_str().unwrap(),
                "--checkpoint-hook",
                &hook,
            ],
        );
        agents.push((name, cluster.agent(name, &args)));
    }
    cluster.wait_ready(2);
    let token = cluster.tenant("pat");
    let id = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--checkpoint",
            "--",
            "sh",
            "-c",
            "n=$(cat \"$GPURENT_CHECKPOINT_DIR/n\" 2>/dev/null || echo 0); \
             echo \"epoch $GPURENT_EPOCH resumed from $n\"; \
             echo $((n + 1)) > \"$GPURENT_CHECKPOINT_DIR/n\"; exec sleep 600",
        ],
    );
    eventually("running", 30, || {
        cluster.get(&token, &id)["status"] == "running"
    });
    let on = cluster.get(&token, &id)["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, victim) = agents
        .iter_mut()
        .find(|(name, _)| *name == on)
        .expect("the node's agent");
    let volume = shared.join(&id);
    eventually("the first run to checkpoint", 30, || {
        std::fs::read_to_string(volume.join("n")).is_ok_and(|n| n.trim() == "1")
    });
    // A healthy agent with the default heartbeat and lease keeps its work running: over three
    // heartbeats of long polls it never fences itself (it once did, every few seconds).
    let pgid = instance_pgid(&dir.join(&on), &id);
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(instance_pgid(&dir.join(&on), &id), pgid);
    let log = std::fs::read_to_string(dir.join(format!("{on}.log"))).unwrap();
    assert!(!log.contains("lost the control plane"), "{log}");
    assert_eq!(
        std::fs::read_to_string(volume.join("n")).unwrap().trim(),
        "1"
    );
    let killed = Instant::now();
    victim.kill9();
    // The machine is gone with its agent: its instance too.
    let status = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status()
        .unwrap();
    assert!(status.success());

    eventually("the node to be lost", 20, || {
        cluster.node_status(&on).as_deref() == Some("lost")
    });
    let detected = killed.elapsed();
    eventually("the reservation to run on the other node", 30, || {
        let r = cluster.get(&token, &id);
        r["status"] == "running" && r["node"] != on && r["epoch"] == 2
    });
    let recovered = killed.elapsed();
    // The defaults: 2 s heartbeats, 3 missed: lost 6 s after the last sync arrived (syncs go
    // out every 1.5 s at most), and at most a tick more.
    assert!(detected >= Duration::from_millis(4400), "{detected:?}");
    eprintln!(
        "failover with processes: detected in {detected:?}, running elsewhere in {recovered:?}"
    );
    cluster.ledger_check();

    // The second run found the first one's checkpoint, through the owner's hook each time.
    eventually("the second run to checkpoint", 30, || {
        std::fs::read_to_string(volume.join("n")).is_ok_and(|n| n.trim() == "2")
    });
    eventually("its output", 30, || {
        let logs = cli(&cluster.url, Some(&token), false, &["logs", &id]);
        logs.stdout.contains("epoch 2 resumed from 1")
    });
    let hooks = std::fs::read_to_string(&hook_log).unwrap();
    let hooks: Vec<&str> = hooks.lines().collect();
    assert_eq!(hooks, ["restore 1", "restore 2"]);
    // Stopped, the instance is saved through the hook (and no process outlives the test).
    cli(&cluster.url, Some(&token), true, &["stop", &id]);
    eventually("stopped", 30, || {
        cluster.get(&token, &id)["status"] == "stopped"
    });
    eventually("the save hook", 30, || {
        std::fs::read_to_string(&hook_log).is_ok_and(|h| h.lines().last() == Some("save "))
    });
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&volume).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the volume is the owner's only");
}
