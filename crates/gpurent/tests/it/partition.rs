//! A partition with real processes and a real link: the agent running a reservation lives in
//! a network namespace whose link to the control plane is cut. It fences itself, the work
//! runs on the other node, and at no moment do two copies run: each copy (deaf to SIGTERM)
//! writes its epoch and the time every 50 ms, and the first copy's last line comes before the
//! second's first.
//! Healed, the node comes back and runs nothing of the moved work.

use std::time::{Duration, Instant};

use crate::netns::NetNs;
use crate::support::{eventually, instance_pgid, Cluster, Daemon, BIN};

/// (epoch, nanoseconds since the epoch) of each line the copies wrote.
fn beats(path: &std::path::Path) -> Vec<(i64, u128)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (epoch, at) = l.split_once(' ')?;
            Some((epoch.parse().ok()?, at.parse().ok()?))
        })
        .collect()
}

/// Kills a process group when dropped: a copy deaf to SIGTERM must not outlive a failed test.
struct KillOnDrop(i64);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Whether a process of the group still runs (the executor's own state of an instance);
/// zombies waiting for init to reap them do not count.
fn group_alive(pgid: i64) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i64>().ok());
        pgrp == Some(pgid) && state != Some("Z")
    })
}

#[test]
fn a_cut_off_agent_fences_itself_and_the_work_never_runs_twice() {
    let Some(ns) = NetNs::create_or_skip() else {
        return;
    };
    // Beyond loopback in plain HTTP, as this test is about the partition, not transport.
    let cluster = Cluster::start_with(&format!("{}:0", ns.host_ip), &["--allow-insecure-http"]);
    let dir = cluster.dir.path();

    // box-a, behind the link, joins first and takes the reservation.
    let args = cluster.agent_args("box-a", &[]);
    let inside: Vec<&str> = ns
        .exec_prefix()
        .into_iter()
        .chain([BIN])
        .chain(args.iter().map(String::as_str))
        .collect();
    let _box_a = Daemon::start_quiet_with("ip", &inside, &dir.join("box-a.log"));
    cluster.wait_ready(1);
    let token = cluster.tenant("pat");
    let out = dir.join("beats");
    let id = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--env",
            &format!("OUT={}", out.display()),
            "--",
            "sh",
            "-c",
            // Deaf to SIGTERM: only the fence's SIGKILL ends it.
            "trap '' TERM; while true; do echo \"$GPURENT_EPOCH $(date +%s%N)\" >> \"$OUT\"; sleep 0.05; done",
        ],
    );
    eventually("running on box-a", 30, || {
        let r = cluster.get(&token, &id);
        r["status"] == "running" && r["node"] == "box-a"
    });
    let _box_b = cluster.agent("box-b", &cluster.agent_args("box-b", &[]));
    cluster.wait_ready(2);
    eventually("the first copy to write", 10, || !beats(&out).is_empty());
    let pgid = instance_pgid(&dir.join("box-a"), &id);
    let _first = KillOnDrop(pgid);
    assert!(group_alive(pgid));

    let cut = Instant::now();
    ns.cut();
    eventually("the work to run on box-b", 40, || {
        let r = cluster.get(&token, &id);
        r["status"] == "running" && r["node"] == "box-b" && r["epoch"] == 2
    });
    let moved = cut.elapsed();
    eventually("the second copy to write", 10, || {
        beats(&out).iter().any(|&(epoch, _)| epoch == 2)
    });
    let _second = KillOnDrop(instance_pgid(&dir.join("box-b"), &id));
    // box-a's executor stopped its copy by itself: it never heard of the move.
    assert!(
        !group_alive(pgid),
        "the cut-off copy still runs {moved:?} after the cut; box-a's log:\n{}\nthe server's:\n{}",
        std::fs::read_to_string(dir.join("box-a.log")).unwrap_or_default(),
        std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
    );
    assert_eq!(cluster.node_status("box-a").as_deref(), Some("lost"));

    ns.heal();
    eventually("box-a back", 30, || {
        cluster.node_status("box-a").as_deref() == Some("ready")
    });
    // Two more heartbeats: nothing of the moved work starts again on box-a.
    std::thread::sleep(Duration::from_secs(4));
    assert!(!group_alive(pgid));
    assert_eq!(cluster.get(&token, &id)["node"], "box-b");

    let lines = beats(&out);
    let last_first = lines.iter().filter(|b| b.0 == 1).map(|b| b.1).max();
    let first_second = lines.iter().filter(|b| b.0 == 2).map(|b| b.1).min();
    let (Some(last_first), Some(first_second)) = (last_first, first_second) else {
        panic!("both copies wrote: {lines:?}")
    };
    assert!(
        last_first < first_second,
        "two copies ran at once: epoch 1 wrote {} ms after epoch 2 began",
        (last_first - first_second) / 1_000_000
    );
    assert!(lines.iter().all(|b| b.0 == 1 || b.0 == 2), "{lines:?}");
    eprintln!(
        "partition: running elsewhere {moved:?} after the cut; {} ms between the copies",
        (first_second - last_first) / 1_000_000
    );
    // Each second billed once, to the node it ran on.
    cluster.ledger_check();
    cluster.cli(Some(&token), true, &["stop", &id]);
    eventually("stopped", 30, || {
        cluster.get(&token, &id)["status"] == "stopped"
    });
}
