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

/// A container's own disk: where the Engine's storage driver can bound it, a write past it gets
/// ENOSPC; where it cannot (overlay2 on ext4, as here), the agent's watch stops the container,
/// which ends `failed` saying why. Either way its neighbour goes on and the node stays ready.
#[test]
fn a_container_that_fills_its_disk_is_bounded_and_its_neighbour_goes_on() {
    if !crate::host_limits::engine_answers() {
        eprintln!("SKIPPED: no Docker Engine here (GPURENT_TEST_DOCKER=0 skips)");
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "ddisk", &["--disk-per-gpu-gb", "1"]);
    let token = cluster.tenant("dora");
    let logs = |id: &str| cluster.cli(Some(&token), false, &["logs", id]).stdout;
    let image = ["--image", "gpurent-test/busybox:latest"];
    let neighbour = cluster.reserve(
        &token,
        &[
            &["--gpu", "rtx4090", "--hours", "1"][..],
            &image,
            &[
                "--",
                "sh",
                "-c",
                "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done",
            ],
        ]
        .concat(),
    );
    let filler = cluster.reserve(
        &token,
        &[
            &["--gpu", "rtx4090", "--hours", "1"][..],
            &image,
            &[
                "--",
                "sh",
                "-c",
                "dd if=/dev/zero of=/big bs=1M count=1400; echo dd ended; exec sleep 600",
            ],
        ]
        .concat(),
    );
    let mut last = serde_json::Value::Null;
    eventually("the filler to be bounded", 90, || {
        last = cluster.get(&token, &filler);
        last["status"] == "failed" || logs(&filler).contains("No space left on device")
    });
    if last["status"] == "failed" {
        // The watch: it wrote past its size and was stopped, saying so.
        let message = last["end_message"].as_str().unwrap_or_default();
        assert!(
            message.contains("past its size of 1.0 GB") && message.contains("volume"),
            "{last}"
        );
        eventually(
            "its container to be removed once its output was read",
            60,
            || {
                crate::host_limits::docker(&[
                    "ps",
                    "-aq",
                    "--filter",
                    &format!("label=io.gpurent.reservation={filler}"),
                ])
                .is_empty()
            },
        );
        assert!(logs(&filler).contains("dd ended") || !logs(&filler).is_empty());
    }
    let ticks = |log: &str| log.matches("tick").count();
    let before = ticks(&logs(&neighbour));
    eventually("the neighbour to go on", 30, || {
        ticks(&logs(&neighbour)) > before + 5
    });
    assert_eq!(cluster.nodes()[0]["status"], "ready");
    // `get` says what the neighbour's disk holds, of its size.
    let mut got = serde_json::Value::Null;
    for _ in 0..120 {
        got = cluster.get(&token, &neighbour);
        if got["disk"]["size_bytes"].is_u64() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    assert_eq!(got["disk"]["size_bytes"], 1_000_000_000_u64, "{got}");
    assert!(got["disk"]["used_bytes"].is_u64(), "{got}");
    cluster.cli(Some(&token), true, &["stop", &neighbour]);
}
