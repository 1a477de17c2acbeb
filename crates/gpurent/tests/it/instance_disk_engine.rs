//! A container's own disk where the Engine bounds it (`--storage-opt size`): a Docker Engine of
//! this test's own, on a loop-mounted btrfs with quotas (XFS with pquota is the other such
//! driver; this machine's kernel has no XFS quotas). A write past the instance's size fails
//! inside it ("Disk quota exceeded", btrfs's word; XFS says "No space left on device"), the
//! instance goes on running, its neighbour goes on, and the node stays ready.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::host_limits::engine_answers;
use crate::support::{eventually, Cluster, Daemon, BIN};

/// A Docker Engine on a btrfs of its own, with its own bridge: stopped, unmounted and removed
/// on drop, even when the test fails.
struct BtrfsEngine {
    dir: PathBuf,
    bridge: String,
    dockerd: Option<std::process::Child>,
}

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl BtrfsEngine {
    /// None, saying why, where this machine cannot have one.
    fn start(dir: &Path) -> Option<BtrfsEngine> {
        let btrfs = std::fs::read_to_string("/proc/filesystems")
            .is_ok_and(|f| f.lines().any(|l| l.trim_end().ends_with("btrfs")));
        if !btrfs || !run("sh", &["-c", "command -v mkfs.btrfs"]) {
            eprintln!("SKIPPED: no btrfs here (kernel or btrfs-progs; scripts/test.sh installs btrfs-progs)");
            return None;
        }
        let pid = std::process::id();
        let mut engine = BtrfsEngine {
            dir: dir.join("btrfs-engine"),
            bridge: format!("gprbt{}", pid % 100_000),
            dockerd: None,
        };
        let mnt = engine.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let img = engine.dir.join("img");
        let (img, mnt) = (img.to_str().unwrap(), mnt.to_str().unwrap());
        assert!(run("truncate", &["-s", "3G", img]));
        assert!(run("mkfs.btrfs", &["-q", img]), "mkfs.btrfs");
        assert!(run("mount", &["-o", "loop", img, mnt]), "mount the btrfs");
        assert!(
            run("btrfs", &["quota", "enable", mnt]),
            "btrfs quota enable"
        );
        let subnet = format!("172.30.{}.1/24", 20 + pid % 200);
        assert!(run(
            "ip",
            &["link", "add", &engine.bridge, "type", "bridge"]
        ));
        assert!(run("ip", &["addr", "add", &subnet, "dev", &engine.bridge]));
        assert!(run("ip", &["link", "set", &engine.bridge, "up"]));
        let log = std::fs::File::create(engine.dir.join("dockerd.log")).unwrap();
        let d = engine.dir.to_str().unwrap().to_owned();
        engine.dockerd = Some(
            Command::new("dockerd")
                .args([
                    "--data-root",
                    &format!("{mnt}/docker"),
                    "--exec-root",
                    &format!("{d}/exec"),
                    "--pidfile",
                    &format!("{d}/dockerd.pid"),
                    "-H",
                    &engine.host(),
                    "--storage-driver",
                    "btrfs",
                    "--bridge",
                    &engine.bridge,
                    "--iptables=false",
                    "--ip6tables=false",
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start dockerd"),
        );
        eventually("the btrfs Engine to answer", 60, || {
            run("docker", &["-H", &engine.host(), "info"])
        });
        // The tests' image, from the Engine test.sh started.
        assert!(
            run(
                "sh",
                &[
                    "-c",
                    &format!(
                        "docker save gpurent-test/busybox:latest | docker -H {} load",
                        engine.host()
                    ),
                ],
            ),
            "the test image into the btrfs Engine"
        );
        Some(engine)
    }

    fn host(&self) -> String {
        format!("unix://{}/docker.sock", self.dir.display())
    }

    fn docker(&self, args: &[&str]) -> String {
        let out = Command::new("docker")
            .args([&["-H", &self.host()][..], args].concat())
            .output()
            .expect("run docker");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for BtrfsEngine {
    fn drop(&mut self) {
        if let Some(mut dockerd) = self.dockerd.take() {
            for id in self.docker(&["ps", "-aq"]).lines() {
                self.docker(&["rm", "-f", id]);
            }
            let _ = run("kill", &["-TERM", &dockerd.id().to_string()]);
            let _ = dockerd.wait();
        }
        let mnt = self.dir.join("mnt");
        let mnt = mnt.to_str().unwrap_or_default();
        if !run("umount", &[mnt]) {
            let _ = run("umount", &["-l", mnt]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn where_the_engine_bounds_a_containers_disk_a_write_past_it_fails_inside() {
    if !engine_answers() || !crate::volumes::root() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let Some(engine) = BtrfsEngine::start(cluster.dir.path()) else {
        return;
    };
    let join = cluster
        .cli(Some(&cluster.admin), true, &["nodes", "join-token"])
        .json();
    let data = cluster.dir.path().join("agent");
    let agent_log = cluster.dir.path().join("agent.log");
    let _agent = Daemon::start_quiet_env(
        BIN,
        &[
            "--server",
            &cluster.url,
            "agent",
            "--data-dir",
            data.to_str().unwrap(),
            "--name",
            "btrfs",
            "--sim-gpus",
            "2xRTX4090",
            "--executor",
            "docker",
            "--disk-per-gpu-gb",
            "1",
            "--join-token",
            join["token"].as_str().unwrap(),
        ],
        &[("DOCKER_HOST", &engine.host())],
        &agent_log,
    );
    cluster.wait_ready(1);
    let token = cluster.tenant("bea");
    let logs = |id: &str| cluster.cli(Some(&token), false, &["logs", id]).stdout;
    let reserve = |script: &str| {
        cluster.reserve(
            &token,
            &[
                "--gpu",
                "rtx4090",
                "--hours",
                "1",
                "--image",
                "gpurent-test/busybox:latest",
                "--",
                "sh",
                "-c",
                script,
            ],
        )
    };
    let neighbour = reserve("i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done");
    let filler = reserve(
        "dd if=/dev/zero of=/big bs=1M count=1400; echo dd ended; \
         while true; do echo alive; sleep 1; done",
    );
    eventually("the filler's write to fail inside it", 90, || {
        let log = logs(&filler);
        log.contains("dd ended") && log.contains("alive")
    });
    let log = logs(&filler);
    assert!(
        log.contains("Disk quota exceeded") || log.contains("No space left on device"),
        "{log}"
    );
    // The Engine bounds it, so the agent's watch has nothing to stop: it goes on running.
    let agent_log = std::fs::read_to_string(&agent_log).unwrap_or_default();
    assert!(
        !agent_log.contains("cannot bound a container's disk"),
        "{agent_log}"
    );
    let container = engine.docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=io.gpurent.reservation={filler}"),
    ]);
    assert!(!container.is_empty(), "the filler's container runs");
    let opts = engine.docker(&[
        "inspect",
        "-f",
        "{{json .HostConfig.StorageOpt}}",
        &container,
    ]);
    assert!(opts.contains("\"size\":\"1000000000\""), "{opts}");
    let ticks = |log: &str| log.matches("tick").count();
    let before = ticks(&logs(&neighbour));
    eventually("the neighbour to go on", 30, || {
        ticks(&logs(&neighbour)) > before + 5
    });
    assert_eq!(cluster.get(&token, &filler)["status"], "running");
    assert_eq!(cluster.nodes()[0]["status"], "ready");
    for id in [&filler, &neighbour] {
        cluster.cli(Some(&token), true, &["stop", id]);
    }
    eventually("both stopped", 60, || {
        [&filler, &neighbour]
            .iter()
            .all(|id| cluster.get(&token, id)["status"] == "stopped")
    });
}
