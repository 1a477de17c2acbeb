//! Each instance's own disk has a size (issue 33): an isolated process instance that writes
//! past it gets ENOSPC while its neighbour on the same node and their agent go on, `get` says
//! how much of its disk it uses, and its disk is gone once it is stopped.

use crate::docker_and_processes::agent;
use crate::support::{eventually, Cluster};
use crate::volumes::root;

#[test]
fn an_instance_that_fills_its_disk_gets_enospc_and_its_neighbour_goes_on() {
    if !root() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, started) = agent(
        &cluster,
        "disk",
        &["--executor", "process", "--disk-per-gpu-gb", "1"],
    );
    if !started.contains("each instance's disk is bounded") {
        panic!("the agent must bound instances' disks as root with bubblewrap:\n{started}");
    }
    let token = cluster.tenant("dina");
    let logs = |id: &str| cluster.cli(Some(&token), false, &["logs", id]).stdout;
    let neighbour = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--",
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done",
        ],
    );
    let filler = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--",
            "sh",
            "-c",
            "echo disk=$GPURENT_DISK_MB MB; dd if=/dev/zero of=$HOME/big bs=1M count=1200; \
             echo dd ended; exec sleep 600",
        ],
    );
    eventually("the filler to run out of disk", 60, || {
        let log = logs(&filler);
        log.contains("No space left on device") && log.contains("dd ended")
    });
    assert!(logs(&filler).contains("disk=953 MB"), "{}", logs(&filler));
    // The neighbour goes on writing, and the node stays ready.
    let ticks = |log: &str| log.matches("tick").count();
    let before = ticks(&logs(&neighbour));
    eventually("the neighbour to go on", 30, || {
        ticks(&logs(&neighbour)) > before + 5
    });
    assert_eq!(cluster.nodes()[0]["status"], "ready");
    let mut last = serde_json::Value::Null;
    for _ in 0..450 {
        last = cluster.get(&token, &filler);
        // 1 GB, rounded up to whole 4 KiB blocks.
        let size = last["disk"]["size_bytes"].as_u64();
        let used = last["disk"]["used_bytes"].as_u64();
        if size.is_some_and(|s| (1_000_000_000..1_000_004_096).contains(&s))
            && used.is_some_and(|u| u > 800_000_000)
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        last["disk"]["used_bytes"]
            .as_u64()
            .is_some_and(|u| u > 800_000_000),
        "get must say what its disk holds: {last}"
    );
    let shown = cluster.cli(Some(&token), false, &["get", &filler]).stdout;
    assert!(
        shown.contains("disk: ") && shown.contains("used of 1.0 GB"),
        "{shown}"
    );
    for id in [&filler, &neighbour] {
        cluster.cli(Some(&token), true, &["stop", id]);
    }
    eventually("both stopped", 60, || {
        [&filler, &neighbour]
            .iter()
            .all(|id| cluster.get(&token, id)["status"] == "stopped")
    });
    let volumes = cluster
        .dir
        .path()
        .join(format!("disk-{}", std::process::id()))
        .join("volumes");
    let left: Vec<String> = std::fs::read_dir(&volumes)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("scratch-"))
        .collect();
    assert!(
        left.is_empty(),
        "the instances' disks are removed: {left:?}"
    );
}
