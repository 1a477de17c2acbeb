//! Checkpoint volumes: kept across a reservation's runs, restored and saved through the
//! owner's hook, owner-only, pruned when old; the process executor hands the volume over.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use gpurent_agent::executor::{ProcessExecutor, ResourcesPerGpu};
use gpurent_agent::reconcile::ObservedState;
use gpurent_agent::{CheckpointConfig, Executor};
use gpurent_types::agent::Assignment;

use crate::support::wait_for;

fn assignment(id: &str, epoch: i64, script: &str) -> Assignment {
    Assignment {
        reservation_id: id.to_owned(),
        epoch,
        restart_count: 0,
        array_index: None,
        gpus: vec!["GPU-aaaa".into()],
        vram_mb: None,
        image: None,
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: Default::default(),
        run: true,
        log_offset: 0,
        stop_grace_s: None,
        checkpoint: true,
        secrets: Default::default(),
        sealed_secrets: None,
        ports: vec![],
        mounts: Vec::new(),
    }
}

/// Counts its runs in the volume and says which one it is.
const RESUMING: &str = r#"n=$(cat "$GPURENT_CHECKPOINT_DIR/n" 2>/dev/null || echo 0)
echo "epoch $GPURENT_EPOCH resumed from $n"
echo $((n + 1)) > "$GPURENT_CHECKPOINT_DIR/n"
exit 0"#;

async fn output_of(e: &ProcessExecutor, id: &str) -> String {
    wait_for(e, id, ObservedState::Exited(0)).await;
    std::fs::read_to_string(e.output_path(id)).unwrap()
}

#[tokio::test]
async fn a_second_run_resumes_from_the_first_through_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let hook_log = dir.path().join("hook.log");
    let mut config = CheckpointConfig::new(dir.path().join("volumes"));
    config.hook = Some(format!(
        "echo \"$GPURENT_CHECKPOINT_ACTION $GPURENT_RESERVATION_ID ${{GPURENT_EPOCH:-}} $(ls \"$GPURENT_CHECKPOINT_DIR\")\" >> {}",
        hook_log.display()
    ));
    let e = ProcessExecutor::unisolated(&dir.path().join("node"), None, ResourcesPerGpu::default())
        .unwrap()
        .with_grace(Duration::from_secs(1));

    let first = assignment("r1", 1, RESUMING);
    let volume = config.prepare(&first).await.unwrap();
    assert_eq!(volume, config.volume("r1"));
    e.start(&first, Some(&volume)).await.unwrap();
    assert_eq!(output_of(&e, "r1").await.trim(), "epoch 1 resumed from 0");
    e.stop("r1", None).await.unwrap();
    config.save("r1").await;

    let second = assignment("r1", 2, RESUMING);
    let volume = config.prepare(&second).await.unwrap();
    e.start(&second, Some(&volume)).await.unwrap();
    assert_eq!(output_of(&e, "r1").await.trim(), "epoch 2 resumed from 1");
    assert_eq!(
        std::fs::read_to_string(volume.join("n")).unwrap().trim(),
        "2"
    );

    let hooks = std::fs::read_to_string(&hook_log).unwrap();
    assert_eq!(
        hooks.lines().collect::<Vec<_>>(),
        ["restore r1 1 ", "save r1  n", "restore r1 2 n"]
    );
    // Nobody else on the node reads a tenant's checkpoints.
    for d in [dir.path().join("volumes"), volume] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", d.display());
    }
    // A reservation without a volume here saves nothing.
    config.save("never-ran").await;
    assert_eq!(
        std::fs::read_to_string(&hook_log).unwrap().lines().count(),
        3
    );
}

#[tokio::test]
async fn a_failing_hook_does_not_keep_the_instance_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CheckpointConfig::new(dir.path().join("volumes"));
    config.hook = Some("echo cannot reach the bucket >&2; exit 3".to_owned());
    let volume = config
        .prepare(&assignment("r2", 1, RESUMING))
        .await
        .unwrap();
    assert!(volume.is_dir());
}

#[tokio::test]
async fn old_volumes_are_pruned_but_not_those_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CheckpointConfig::new(dir.path().join("volumes"));
    for id in ["old", "running"] {
        config.prepare(&assignment(id, 1, RESUMING)).await.unwrap();
    }
    // Kept a week by default: nothing goes.
    assert_eq!(config.prune(&[]), 0);
    config.keep = Duration::ZERO;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(config.prune(&["running"]), 1);
    assert!(!config.volume("old").exists());
    assert!(config.volume("running").is_dir());
}
