//! Getting into running containers (`Executor::enter`) of the Docker executor (busybox test
//! image): exec with exit codes and signals, a PTY shell, stdin streamed both ways, the
//! container's environment, user and cgroup, a TCP connection to a server inside, and an image
//! without `/bin/sh`.

use std::path::Path;

use gpurent_agent::{EntryKind, EntryRequest, Executor, ExitStatus};

use crate::entry_support::{
    docker_executor, enter, exec, exit_statuses, pty_shell, run_to_end, sh, start_container,
    stdin_streamed, tcp_to_httpd, unique, IMAGE, NO_SHELL_IMAGE,
};

#[tokio::test]
async fn entry_docker_exec_statuses_pty_and_stdin() {
    let Some(e) = docker_executor().await else {
        return;
    };
    let id = unique("enter-docker");
    let _guard = start_container(&e, &id, IMAGE, sh("sleep 300")).await;
    // The Engine reports 128 + N for a process killed by signal N.
    exit_statuses(&e, &id, ExitStatus::Code(143)).await;
    pty_shell(&e, &id, "busybox stty", "sleep 7302", None).await;
    stdin_streamed(&e, &id).await;
}

#[tokio::test]
async fn entry_docker_session_has_the_container_environment_user_and_cgroup() {
    let Some(e) = docker_executor().await else {
        return;
    };
    let id = unique("enter-denv");
    let _guard = start_container(&e, &id, IMAGE, sh("sleep 300")).await;
    let request = EntryRequest {
        env: vec![
            ("LANG".into(), "C.UTF-8".into()),
            ("CUDA_VISIBLE_DEVICES".into(), "all".into()),
            ("MODEL".into(), "not-mine".into()),
        ],
        ..exec(concat!(
            "echo \"cuda=$CUDA_VISIBLE_DEVICES model=$MODEL token=$HF_TOKEN lang=$LANG id=$GPURENT_RESERVATION_ID\"; ",
            "id -u; cat /proc/self/cgroup; echo ---; cat /proc/1/cgroup"
        ))
    };
    let (out, err, status) = run_to_end(enter(&e, &id, request).await).await;
    assert_eq!(status, ExitStatus::Code(0), "{out}{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some(
            format!("cuda=GPU-aaaa,GPU-bbbb model=llama token=s3cret lang=C.UTF-8 id={id}")
                .as_str()
        ),
        "{out}"
    );
    assert_eq!(
        lines.next(),
        Some("0"),
        "the container's user (root): {out}"
    );
    let (mine, init) = out.split_once("---\n").unwrap();
    let mine: Vec<&str> = mine.lines().skip(2).collect();
    assert_eq!(
        mine,
        init.lines().collect::<Vec<_>>(),
        "the exec is in the container's cgroup"
    );
}

#[tokio::test]
async fn entry_docker_tcp_reaches_a_server_in_the_container() {
    let Some(e) = docker_executor().await else {
        return;
    };
    let id = unique("enter-dtcp");
    // The container's own loopback: nothing of it is published on the node.
    let _guard = start_container(
        &e,
        &id,
        IMAGE,
        sh("mkdir -p /www && echo hello-from-the-instance > /www/index.html && exec busybox httpd -f -p 127.0.0.1:8000 -h /www"),
    )
    .await;
    tcp_to_httpd(&e, &id, 8000).await;
}

/// Imports NO_SHELL_IMAGE: a tar holding only a static busybox, renamed.
fn import_image_without_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a static busybox on this machine (scripts/test.sh installs it)");
    std::fs::copy(busybox, dir.path().join("busybox")).unwrap();
    let tar = dir.path().join("image.tar");
    let made = std::process::Command::new("tar")
        .args(["-C"])
        .arg(dir.path())
        .args(["-cf"])
        .arg(&tar)
        .arg("busybox")
        .status()
        .unwrap();
    assert!(made.success());
    let imported = std::process::Command::new("docker")
        .args(["import"])
        .arg(&tar)
        .arg(NO_SHELL_IMAGE)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(imported.success(), "docker import failed");
}

#[tokio::test]
async fn entry_docker_image_without_a_shell_runs_commands_and_refuses_a_shell() {
    let Some(e) = docker_executor().await else {
        return;
    };
    import_image_without_a_shell();
    let id = unique("enter-nosh");
    let _guard = start_container(
        &e,
        &id,
        NO_SHELL_IMAGE,
        vec!["/busybox".into(), "sleep".into(), "300".into()],
    )
    .await;
    let (out, _, status) =
        run_to_end(enter(&e, &id, exec("/busybox echo 'two words' plain")).await).await;
    assert_eq!(
        (out.as_str(), status),
        ("two words plain\n", ExitStatus::Code(0))
    );
    let (_, _, status) = run_to_end(enter(&e, &id, exec("/busybox false")).await).await;
    assert_eq!(status, ExitStatus::Code(1));
    let refused = e
        .enter(
            &id,
            EntryRequest {
                kind: EntryKind::Shell,
                pty: None,
                env: vec![],
            },
        )
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        refused,
        Some(format!(
            "this image has no /bin/sh: run a command instead (ssh {id} -- CMD)"
        ))
    );
}
