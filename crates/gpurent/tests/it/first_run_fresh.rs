//! The first run on a fresh machine: a Debian root made by debootstrap (no Docker, no
//! bubblewrap, no passt), `gpurent up` run there as the README's run command runs it (this
//! build stands in for `cargo run --release --`). As an ordinary user it refuses and says
//! why; as root it installs what isolation needs, saying so, and runs a job whose `logs`
//! print what it ran.

use std::process::Command;

use crate::debian_root::DebianRoot;
use crate::support::{cli, eventually, Daemon, BIN};

#[test]
fn up_on_a_fresh_debian_installs_what_it_needs_and_runs_a_job() {
    let Some(mut root) = DebianRoot::fresh() else {
        return;
    };
    // A machine's / is a mount point (bubblewrap makes it a slave mount); a bare chroot
    // directory is not, so make it one. Dropping the root unmounts it.
    let made = Command::new("mount")
        .arg("--bind")
        .arg(root.path())
        .arg(root.path())
        .status()
        .expect("run mount");
    assert!(made.success(), "cannot bind-mount the root onto itself");
    let bin = root.path().join("usr/local/bin/gpurent");
    std::fs::copy(BIN, &bin).expect("copy gpurent into the root");
    // Nothing isolation needs is there yet.
    let missing = root.run("command -v bwrap || command -v pasta || command -v docker");
    assert!(
        !missing.status.success(),
        "the fresh root already has {}",
        String::from_utf8_lossy(&missing.stdout)
    );

    // An ordinary user: the same refusal as ever, and nothing installed.
    let refused = root.run(
        "cd /tmp && setpriv --reuid=65534 --regid=65534 --clear-groups \
         gpurent up --listen 127.0.0.1:0 --ssh-listen off 2>&1",
    );
    let said = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("cannot isolate instances on this host"),
        "{said}"
    );
    assert!(said.contains("Install bubblewrap"), "{said}");
    assert!(!said.contains("installing"), "{said}");
    assert!(!root.run("command -v bwrap").status.success());

    // Root: `up` installs bubblewrap and passt, says so, and gets to ready.
    let log_path = root.scratch().join("up.log");
    let log = std::fs::File::create(&log_path).expect("up.log");
    let mut command = Command::new("chroot");
    command
        .arg(root.path())
        .args(["/bin/sh", "-c"])
        .arg(
            "cd /root && exec gpurent up --listen 127.0.0.1:0 --ssh-listen off \
             --min-disk-free-gb 0",
        )
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8");
    let up = Daemon::spawn(command, log);
    let up_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    for package in ["bubblewrap", "passt"] {
        assert!(
            up_log.contains(&format!("gpurent: installing {package} with apt-get")),
            "{up_log}"
        );
        assert!(
            up_log.contains(&format!("gpurent: installed {package}")),
            "{up_log}"
        );
    }
    assert!(root.run("command -v bwrap").status.success());

    // The README's tour, the job's output in its log.
    let admin = std::fs::read_to_string(root.path().join("root/gpurent-data/admin.token"))
        .expect("admin.token");
    let nodes = cli(&up.url, Some(admin.trim()), true, &["nodes", "ls"]).json();
    let node = &nodes.as_array().expect("nodes")[0];
    assert_eq!(node["executor"], "process", "{node}");
    assert_eq!(node["isolated"], true, "{node}");
    // Its own network (the field is left out when false).
    assert_ne!(node["shared_network"], true, "{node}");
    let alice = cli(
        &up.url,
        Some(admin.trim()),
        true,
        &["users", "create", "alice", "--credit", "10"],
    )
    .json();
    let token = alice["token"].as_str().expect("token").to_owned();
    let reserved = cli(
        &up.url,
        Some(&token),
        true,
        &[
            "reserve",
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--",
            "sh",
            "-c",
            "echo hi from a fresh machine",
        ],
    );
    assert_eq!(reserved.code, 0, "{reserved:?}");
    let id = reserved.json()["id"].as_str().expect("id").to_owned();
    eventually("the job's output in its log", 120, || {
        cli(&up.url, Some(&token), false, &["logs", &id])
            .stdout
            .contains("hi from a fresh machine")
    });
    let _ = cli(&up.url, Some(&token), true, &["stop", &id]);
    assert!(up.terminate().success());
}
