//! Interactive instances (issue 33): a reservation without a command stays up for its
//! hours. Without an image it runs a keeper as an isolated process, which says in its log how
//! to enter it, and files go in and out of it; with an image, the image's own command runs
//! (the keeper where the image has none),
//! and one that is a shell waits with its stdin open instead of ending at once.

use crate::docker_and_processes::{agent, docker_and_isolation};
use crate::host_limits::docker;
use crate::ssh_endpoint::{keygen, ssh, tenant};
use crate::support::{eventually, Cluster};

/// A local image from the test image whose command is `cmd` (as `docker commit --change`
/// makes it: no registry, no build).
fn image_with_cmd(name: &str, cmd: &str) -> String {
    let tag = format!("gpurent-test/{name}-{}", std::process::id());
    let container = docker(&["create", "gpurent-test/busybox", "true"]);
    assert!(!container.is_empty(), "docker create failed");
    let change = format!("CMD {cmd}");
    docker(&["commit", "--change", &change, &container, &tag]);
    docker(&["rm", "-f", &container]);
    assert!(
        !docker(&["images", "-q", &tag]).is_empty(),
        "no image {tag}"
    );
    tag
}

/// Removes the images made here, however the test ends.
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for tag in &self.0 {
            docker(&["rmi", "-f", tag]);
        }
    }
}

#[test]
fn a_reservation_without_a_command_stays_up_for_its_owner() {
    if !docker_and_isolation() {
        return;
    }
    let images = Images(vec![
        image_with_cmd(
            "own-cmd",
            r#"["sh", "-c", "echo from the image command; exec sleep 600"]"#,
        ),
        image_with_cmd("shell-cmd", r#"["sh"]"#),
    ]);
    let cluster = Cluster::start_with("127.0.0.1:0", &["--ssh-listen", "127.0.0.1:0"]);
    let addr = std::fs::read_to_string(cluster.dir.path().join("data/ssh.addr")).unwrap();
    let port: u16 = addr.trim().rsplit(':').next().unwrap().parse().unwrap();
    let (_agent, _containers, _) = agent(&cluster, "interactive", &[]);
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = keygen(dir.path(), "ida");
    let token = tenant(&cluster.url, &cluster.admin, "ida", &public);
    let reserve = |args: &[&str]| {
        cluster.reserve(
            &token,
            &[&["--gpu", "rtx4090", "--hours", "1"], args].concat(),
        )
    };
    let logs = |id: &str| cluster.cli(Some(&token), false, &["logs", id]).stdout;

    // No image, no command: the keeper, an isolated process, says how to enter it.
    let shell = reserve(&[]);
    eventually("the keeper's line in the log", 60, || {
        logs(&shell).contains(&format!(
            "an interactive instance (no command): it stays up until it is stopped or its \
             hours end; enter it with: gpurent ssh {shell}"
        ))
    });
    // Its owner gets in, and files go in and come back out.
    let (code, err) = ssh(dir.path(), port, &key, &shell);
    assert_eq!(code, Some(0), "ssh into the interactive instance: {err}");
    let local = dir.path().join("notes.txt");
    std::fs::write(&local, "kept in the instance\n").unwrap();
    let cp = |from: &str, to: &str| {
        let run = cluster.cli(
            Some(&token),
            false,
            &["cp", "-i", key.to_str().unwrap(), from, to],
        );
        assert_eq!(run.code, 0, "cp {from} {to}: {run:?}");
    };
    cp(local.to_str().unwrap(), &format!("{shell}:notes.txt"));
    let back = dir.path().join("back.txt");
    cp(&format!("{shell}:notes.txt"), back.to_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "kept in the instance\n"
    );

    // Still up a moment later; it ends when its owner stops it (the node has two GPUs).
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(cluster.get(&token, &shell)["status"], "running");
    let stop = cluster.cli(Some(&token), true, &["stop", &shell]);
    assert_eq!(stop.code, 0, "{stop:?}");
    eventually("stopped", 60, || {
        cluster.get(&token, &shell)["status"] == "stopped"
    });
    assert_eq!(cluster.get(&token, &shell)["end_reason"], "stopped_by_user");

    // An image without a command: its own, in a container.
    let own = reserve(&["--image", &images.0[0]]);
    eventually("the image's command's output", 60, || {
        logs(&own).lines().any(|l| l == "from the image command")
    });
    // An image whose command is a shell: it waits on its open stdin, as `docker run -i`.
    let sh = reserve(&["--image", &images.0[1]]);
    eventually("the shell image running", 60, || {
        cluster.get(&token, &sh)["status"] == "running"
    });
    let containers = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=io.gpurent.reservation={sh}"),
    ]);
    assert!(!containers.is_empty(), "no running container for {sh}");

    // Both are still up a moment later, then stop when asked.
    std::thread::sleep(std::time::Duration::from_secs(2));
    for id in [&own, &sh] {
        let r = cluster.get(&token, id);
        assert_eq!(r["status"], "running", "{r}\nlog: {}", logs(id));
        let stop = cluster.cli(Some(&token), true, &["stop", id]);
        assert_eq!(stop.code, 0, "{stop:?}");
    }
    for id in [&own, &sh] {
        eventually("stopped", 60, || {
            cluster.get(&token, id)["status"] == "stopped"
        });
        assert_eq!(cluster.get(&token, id)["end_reason"], "stopped_by_user");
    }

    // An image with no command of its own (the test image, a root file system imported):
    // the keeper, in a container, not a refusal by the Engine.
    let bare = reserve(&["--image", "gpurent-test/busybox:latest"]);
    eventually("the keeper's line in a container", 60, || {
        logs(&bare).contains("gpurent: an interactive instance")
    });
    let r = cluster.get(&token, &bare);
    assert_eq!(r["status"], "running", "{r}");
    let stop = cluster.cli(Some(&token), true, &["stop", &bare]);
    assert_eq!(stop.code, 0, "{stop:?}");
    eventually("stopped", 60, || {
        cluster.get(&token, &bare)["status"] == "stopped"
    });
    cluster.ledger_check();
}
