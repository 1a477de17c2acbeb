//! `gpurent volumes cp` (issue 33, part 6) with real parts: files and trees into and out of a
//! loop-mounted volume and a shared one with no instance running, read by an instance that
//! mounts the volume and read back from what it wrote; the volume's size holds; nothing
//! outside the volume is reached, by `..` or by a symlink planted in it; another tenant's
//! volume is not found, and a lost node's volume is refused saying why.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::{eventually, Cluster, Daemon};
use crate::volumes::root;

/// An isolated process agent with a volumes dir (loop volumes) and shared volume storage.
fn agent(cluster: &Cluster, name: &str) -> Daemon {
    let shared = cluster.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
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
    Daemon::start_quiet(&args, &cluster.dir.path().join(format!("{name}.log")))
}

fn write(path: &Path, bytes: &[u8], mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every file under `dir`, relative, with its bytes and mode, sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                let mode = meta.permissions().mode() & 0o777;
                out.push((rel, std::fs::read(&path).unwrap(), mode));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn files_go_into_and_out_of_volumes_with_no_instance_confined_to_the_volume() {
    if !root() {
        return;
    }
    let cluster = Cluster::start("127.0.0.1:0");
    let mut node = agent(&cluster, "files");
    cluster.wait_ready(1);
    let token = cluster.tenant("fay");
    let other = cluster.tenant("oren");
    let cli = |token: &str, args: &[&str]| cluster.cli(Some(token), true, args);
    for args in [
        ["volumes", "create", "data", "--size", "64MiB"].as_slice(),
        &["volumes", "create", "common", "--size", "1GB", "--shared"],
    ] {
        let made = cli(&token, args);
        assert_eq!(made.code, 0, "{made:?}");
    }
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("dataset");
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    write(&src.join("a.txt"), b"hello\n", 0o644);
    write(&src.join("run.sh"), b"#!/bin/sh\necho ran\n", 0o750);
    write(&src.join("sub/big.bin"), &big, 0o600);
    let sent: u64 = tree(&src).iter().map(|(_, b, _)| b.len() as u64).sum();

    for volume in ["data", "common"] {
        // A tree in, with no instance: its bytes, and nothing reserved or billed for a GPU.
        let copied = cli(
            &token,
            &[
                "volumes",
                "cp",
                "-r",
                src.to_str().unwrap(),
                &format!("{volume}:/"),
            ],
        );
        assert_eq!(copied.code, 0, "{copied:?}");
        assert_eq!(copied.json()["bytes"], sent, "{copied:?}");
        // A file out, to a path and into a directory.
        let one = work.path().join(format!("{volume}-a.txt"));
        let got = cli(
            &token,
            &[
                "volumes",
                "cp",
                &format!("{volume}:dataset/a.txt"),
                one.to_str().unwrap(),
            ],
        );
        assert_eq!(got.code, 0, "{got:?}");
        assert_eq!(std::fs::read(&one).unwrap(), b"hello\n");
        // The tree out again, equal with its modes.
        let back = work.path().join(format!("{volume}-back"));
        let got = cli(
            &token,
            &[
                "volumes",
                "cp",
                "-r",
                &format!("{volume}:/dataset"),
                back.to_str().unwrap(),
            ],
        );
        assert_eq!(got.code, 0, "{got:?}");
        assert_eq!(got.json()["bytes"], sent);
        assert_eq!(
            tree(&back),
            tree(&src),
            "{volume}: the tree comes back as it went"
        );
        // A directory without -r is refused, saying so.
        let dir = cli(
            &token,
            &[
                "volumes",
                "cp",
                &format!("{volume}:/dataset"),
                work.path().to_str().unwrap(),
            ],
        );
        assert_ne!(dir.code, 0);
        assert!(dir.stdout.contains("give -r"), "{dir:?}");
    }
    // The whole volume into a directory: under the volume's name.
    let whole = cli(
        &token,
        &[
            "volumes",
            "cp",
            "-r",
            "common:",
            work.path().to_str().unwrap(),
        ],
    );
    assert_eq!(whole.code, 0, "{whole:?}");
    assert_eq!(tree(&work.path().join("common/dataset")), tree(&src));
    assert_eq!(
        cli(&token, &["ls"]).json().as_array().unwrap().len(),
        0,
        "copies reserve nothing"
    );

    // An instance that mounts the volume reads what was copied in; what it writes is copied
    // out.
    let id = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--volume",
            "data:/workspace",
            "--volume",
            "common:/common",
            "--",
            "sh",
            "-c",
            "cat /workspace/dataset/a.txt /common/dataset/a.txt && sh /workspace/dataset/run.sh \
             && echo from-inside > /workspace/out.txt",
        ],
    );
    eventually("the instance to end", 120, || {
        cluster.get(&token, &id)["status"] == "stopped"
    });
    let logs = cluster.cli(Some(&token), false, &["logs", &id]).stdout;
    assert!(logs.contains("hello\nhello\nran"), "{logs}");
    let out = work.path().join("out.txt");
    let got = cli(
        &token,
        &["volumes", "cp", "data:/out.txt", out.to_str().unwrap()],
    );
    assert_eq!(got.code, 0, "{got:?}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "from-inside\n");

    // Nothing outside the volume: not by `..`, not through a symlink planted in it (the files
    // are served with the volume as their root).
    let volume_id = cli(&token, &["volumes", "get", "data"]).json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mounted = cluster.dir.path().join("files/volumes").join(&volume_id);
    std::os::unix::fs::symlink("/etc", mounted.join("etc-link")).unwrap();
    std::fs::write(cluster.dir.path().join("secret.txt"), "node secret").unwrap();
    for path in [
        "data:/etc-link/hostname",
        "data:/../../../../etc/hostname",
        "data:../secret.txt",
    ] {
        let leak = work.path().join("leak");
        let got = cli(&token, &["volumes", "cp", path, leak.to_str().unwrap()]);
        assert_ne!(got.code, 0, "{path} must not be reached: {got:?}");
        assert!(!leak.exists(), "{path}");
    }
    let up = cli(
        &token,
        &[
            "volumes",
            "cp",
            out.to_str().unwrap(),
            "data:/../../escaped.txt",
        ],
    );
    assert_eq!(
        up.code, 0,
        "a path above the root is the root, as in chroot: {up:?}"
    );
    assert!(mounted.join("escaped.txt").is_file());
    assert!(!cluster.dir.path().join("files/escaped.txt").exists());

    // The volume's size holds: past it, the copy fails saying why; the node goes on.
    let huge = work.path().join("huge.bin");
    std::fs::write(&huge, vec![7u8; 80 << 20]).unwrap();
    let full = cli(
        &token,
        &["volumes", "cp", huge.to_str().unwrap(), "data:/huge.bin"],
    );
    assert_ne!(full.code, 0, "{full:?}");
    assert!(
        full.stdout.contains("No space left") || full.stdout.contains("quota"),
        "{full:?}"
    );
    assert!(
        !mounted.join("huge.bin").exists(),
        "no partial file is left"
    );
    assert_eq!(cluster.nodes()[0]["status"], "ready");

    // Another tenant's volume does not exist for them; bad sides are refused.
    let theirs = cli(&other, &["volumes", "cp", out.to_str().unwrap(), "data:/x"]);
    assert_ne!(theirs.code, 0);
    assert!(theirs.stdout.contains("not found"), "{theirs:?}");
    let neither = cli(&token, &["volumes", "cp", "/tmp/a", "/tmp/b"]);
    assert!(neither.stdout.contains("NAME:PATH"), "{neither:?}");

    // The node lost: its volume is unavailable and a copy says so (the shared one is served by
    // no live node either).
    node.kill9();
    eventually("the volume unavailable", 90, || {
        cli(&token, &["volumes", "get", "data"]).json()["state"] == "unavailable"
    });
    let lost = cli(&token, &["volumes", "cp", out.to_str().unwrap(), "data:/x"]);
    assert_ne!(lost.code, 0);
    assert!(lost.stdout.contains("not live"), "{lost:?}");
    let lost = cli(
        &token,
        &["volumes", "cp", out.to_str().unwrap(), "common:/x"],
    );
    assert!(lost.stdout.contains("no live node"), "{lost:?}");
}
