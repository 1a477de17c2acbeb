//! The SFTP helper (`gpurent instance-sftp`) with the real OpenSSH `sftp` client (`-D`
//! runs a local SFTP server without ssh) against a Docker container and an isolated
//! process-executor instance: mkdir, put, get, rename, rm with checksums; symlinks and `..`
//! that point out of the instance resolve inside it, never on the node; what it creates
//! belongs to the instance's uid. And the executors' own SFTP sessions (`enter`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use gpurent_agent::executor::{DockerExecutor, Isolation, ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::{EntryKind, EntryRequest, Executor};
use gpurent_types::agent::Assignment;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::support::BIN;

const IMAGE: &str = "gpurent-test/busybox:latest";
const PATIENCE: Duration = Duration::from_secs(30);
/// A uid no account of the node or the image has.
const TENANT_UID: u32 = 4321;

fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{n:x}")
}

fn sftp_available() -> bool {
    let found = Command::new("sftp")
        .arg("-V")
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .is_ok();
    if !found {
        assert_ne!(
            std::env::var("GPURENT_TEST_DOCKER").as_deref(),
            Ok("1"),
            "scripts/test.sh installs openssh-client, yet there is no sftp"
        );
        eprintln!("SKIPPED: no OpenSSH sftp client here");
    }
    found
}

fn sha256(path: &Path) -> String {
    hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 300 KiB that are not all the same (several SFTP reads and writes).
fn payload(dir: &Path) -> PathBuf {
    let path = dir.join("in.bin");
    let data: Vec<u8> = (0..300 * 1024u32)
        .map(|i| i.wrapping_mul(2_654_435_761).to_be_bytes()[1])
        .collect();
    std::fs::write(&path, data).unwrap();
    path
}

/// Runs `sftp -b` with the helper's arguments; (success, what it printed).
fn sftp_batch(helper_args: &[String], batch: &str, cwd: &Path) -> (bool, String) {
    let batch_file = cwd.join("batch");
    std::fs::write(&batch_file, batch).unwrap();
    let server = format!("{BIN} instance-sftp {}", helper_args.join(" "));
    let out = Command::new("sftp")
        .arg("-b")
        .arg(&batch_file)
        .arg("-D")
        .arg(&server)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A file on the node that no instance may read: its content proves where a read went.
fn host_marker(dir: &Path) -> PathBuf {
    let marker = dir.join("marker.txt");
    std::fs::write(&marker, "THE-NODE'S-OWN-FILE\n").unwrap();
    marker
}

/// The transfer and escape checks against an instance whose root is `/proc/PID/root`:
/// `pw` links to `/etc/passwd`, `up` to `../../../../..`, `marker` to the node's marker.
fn transfer_and_escapes(args: &[String], root: &Path, home: &str, marker: &Path, owner: u32) {
    let local = tempfile::tempdir().unwrap();
    let input = payload(local.path());
    let escape = format!("../../../../../../..{}", marker.display());
    let batch = format!(
        "mkdir sub\nput in.bin sub/in.bin\nrename sub/in.bin sub/moved.bin\nget sub/moved.bin out.bin\n\
         get pw pw.txt\nls up/\n-get marker marker.txt\n-get {escape} escape.txt\n-get {} direct.txt\n",
        marker.display()
    );
    let (ok, text) = sftp_batch(args, &batch, local.path());
    assert!(ok, "sftp -b failed: {text}");
    assert_eq!(
        sha256(&local.path().join("out.bin")),
        sha256(&input),
        "{text}"
    );
    let inside = root
        .join(home.trim_start_matches('/'))
        .join("sub/moved.bin");
    let meta = std::fs::metadata(&inside).unwrap();
    assert_eq!(meta.uid(), owner, "the uploaded file's owner");
    assert_eq!(meta.gid(), owner, "the uploaded file's group");
    // /etc/passwd as the instance sees it.
    let instance_passwd = std::fs::read(root.join("etc/passwd")).unwrap();
    assert_eq!(
        std::fs::read(local.path().join("pw.txt")).unwrap(),
        instance_passwd
    );
    for name in ["marker.txt", "escape.txt", "direct.txt"] {
        let got = std::fs::read_to_string(local.path().join(name)).unwrap_or_default();
        assert!(
            !got.contains("THE-NODE'S-OWN-FILE"),
            "{name}: the node's file was read through the instance: {text}"
        );
    }
    assert!(
        text.contains("No such file") || text.contains("not found"),
        "the marker's path does not exist in the instance: {text}"
    );
    let (ok, text) = sftp_batch(args, "rm sub/moved.bin\nrmdir sub\n", local.path());
    assert!(ok, "{text}");
    assert!(!inside.exists());
}

struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn assignment(id: &str, image: Option<&str>, script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch: 1,
        restart_count: 0,
        array_index: None,
        gpus: vec![],
        vram_mb: None,
        image: image.map(str::to_owned),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        run: true,
        log_offset: 0,
        stop_grace_s: None,
        checkpoint: false,
        secrets: Default::default(),
        sealed_secrets: None,
        ports: vec![],
        mounts: Vec::new(),
    }
}

async fn docker_executor() -> Option<DockerExecutor> {
    let resources = ResourcesPerGpu {
        milli_cpus: 1000,
        memory_mb: 256,
        pids: 64,
    };
    match DockerExecutor::connect(resources, false).await {
        Ok(d) => Some(
            d.scoped(&format!("sftp-test-{}", std::process::id()))
                .with_grace(1)
                .with_entry_helper(BIN.into()),
        ),
        Err(e) if std::env::var("GPURENT_TEST_DOCKER").as_deref() == Ok("1") => {
            panic!("GPURENT_TEST_DOCKER=1 but no Docker Engine answers: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: no Docker Engine here ({e})");
            None
        }
    }
}

/// Waits for `path` to exist (the instance's script wrote it).
async fn wait_for_file(path: &Path) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn instance_sftp_in_a_docker_container() {
    let Some(e) = docker_executor().await else {
        return;
    };
    if !sftp_available() {
        return;
    }
    let node = tempfile::tempdir_in("/tmp").unwrap();
    let marker = host_marker(node.path());
    let id = unique("sftp-docker");
    let _guard = RemoveOnDrop(gpurent_agent::executor::docker::container_name(&id));
    // The stop keeps the container, renamed, for its output: it goes too.
    let _kept = RemoveOnDrop(gpurent_agent::executor::docker::kept_name(&id));
    let script = format!(
        "mkdir -p /etc /data && echo 'root:x:0:0:the container:/data:/bin/sh' > /etc/passwd && \
         chmod 777 /data && cd /data && ln -s /etc/passwd pw && \
         ln -s ../../../../.. up && ln -s {} marker && touch /ready && exec sleep 300",
        marker.display()
    );
    e.start(&assignment(&id, Some(IMAGE), &script), None)
        .await
        .unwrap();
    let inspect = e
        .docker()
        .inspect_container(&gpurent_agent::executor::docker::container_name(&id), None)
        .await
        .unwrap();
    let pid = inspect.state.unwrap().pid.unwrap();
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    wait_for_file(&root.join("ready")).await;
    let args: Vec<String> = [
        "--pid",
        &pid.to_string(),
        "--uid",
        &TENANT_UID.to_string(),
        "--gid",
        &TENANT_UID.to_string(),
        "--home",
        "/data",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    transfer_and_escapes(&args, &root, "/data", &marker, TENANT_UID);

    // The executor's own SFTP session: the container's user (root here), its home.
    let s = e
        .enter(
            &id,
            EntryRequest {
                kind: EntryKind::Sftp,
                pty: None,
                env: vec![],
            },
        )
        .await
        .unwrap();
    let session = russh_sftp::client::SftpSession::new(tokio::io::join(s.stdout, s.stdin))
        .await
        .unwrap();
    assert_eq!(session.canonicalize(".").await.unwrap(), "/data");
    assert_eq!(
        session.read("pw").await.unwrap(),
        std::fs::read(root.join("etc/passwd")).unwrap()
    );
    let mut file = session.create("by-root.txt").await.unwrap();
    file.write_all(b"mine").await.unwrap();
    file.shutdown().await.unwrap();
    assert_eq!(
        std::fs::metadata(root.join("data/by-root.txt"))
            .unwrap()
            .uid(),
        0
    );
    assert!(session.read("marker").await.is_err());
    // The server is in the container's PID namespace: it ends with the container.
    let mut control = s.control;
    e.stop(&id, Some(Duration::ZERO)).await.unwrap();
    tokio::time::timeout(PATIENCE, control.wait())
        .await
        .expect("the SFTP server outlived its container")
        .unwrap();
}

#[tokio::test]
async fn instance_sftp_in_a_process_instance() {
    use std::os::unix::fs::MetadataExt as _;
    if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
        || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0")
    {
        eprintln!("SKIPPED: isolated instances need root");
        return;
    }
    if !sftp_available() {
        return;
    }
    let data = tempfile::tempdir_in("/tmp").unwrap();
    // The agent's data dir: hidden from instances.
    let marker = host_marker(data.path());
    let isolation = Isolation {
        cgroup_root: "/sys/fs/cgroup/gpurent-test".into(),
        uid_base: 341_000,
        allow_unisolated: false,
        hidden: vec![],
    };
    let e = Arc::new(
        ProcessExecutor::isolated(data.path(), &isolation, ResourcesPerGpu::default())
            .unwrap()
            .with_grace(Duration::from_secs(1))
            .with_entry_helper(BIN.into()),
    );
    let id = unique("sftp-proc");
    let script = format!(
        "ln -s /etc/passwd pw && ln -s ../../../../.. up && ln -s {} marker && id -u > ready && exec sleep 300",
        marker.display()
    );
    e.start(&assignment(&id, None, &script), None)
        .await
        .unwrap();
    struct Stop(Arc<ProcessExecutor>, String);
    impl Drop for Stop {
        fn drop(&mut self) {
            let (e, id) = (self.0.clone(), self.1.clone());
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    let _ = rt.block_on(e.stop(&id, Some(Duration::ZERO)));
                }
            })
            .join();
        }
    }
    let _guard = Stop(e.clone(), id.clone());
    let ready = e.home_path(&id).join("ready");
    wait_for_file(&ready).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let uid: u32 = std::fs::read_to_string(&ready)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The workload (`sleep 300`, the instance's uid): its root is the sandbox's.
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .find(|p| {
            std::fs::metadata(format!("/proc/{p}")).is_ok_and(|m| m.uid() == uid)
                && std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c == b"sleep\x00300\x00")
        })
        .expect("the instance's workload");
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let args: Vec<String> = [
        "--pid",
        &pid.to_string(),
        "--uid",
        &uid.to_string(),
        "--gid",
        &uid.to_string(),
        "--home",
        "/instance",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    transfer_and_escapes(&args, &root, "/instance", &marker, uid);

    // The executor's own SFTP session.
    let s = e
        .enter(
            &id,
            EntryRequest {
                kind: EntryKind::Sftp,
                pty: None,
                env: vec![],
            },
        )
        .await
        .unwrap();
    let session = russh_sftp::client::SftpSession::new(tokio::io::join(s.stdout, s.stdin))
        .await
        .unwrap();
    assert_eq!(session.canonicalize(".").await.unwrap(), "/instance");
    let mut file = session.create("via-enter.txt").await.unwrap();
    file.write_all(b"mine").await.unwrap();
    file.shutdown().await.unwrap();
    assert_eq!(
        std::fs::metadata(e.home_path(&id).join("via-enter.txt"))
            .unwrap()
            .uid(),
        uid
    );
    assert!(session.read("marker").await.is_err());
    assert!(session.read(marker.to_string_lossy()).await.is_err());
    // The server is in the instance's cgroup and PID namespace: a stop ends it.
    let mut control = s.control;
    e.stop(&id, Some(Duration::ZERO)).await.unwrap();
    tokio::time::timeout(PATIENCE, control.wait())
        .await
        .expect("the SFTP server outlived its instance")
        .unwrap();
}
