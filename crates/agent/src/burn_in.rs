//! Periodic burn-in of idle GPUs: when the node has had no work for a while and the last
//! burn-in is older than the period, the owner's stress command runs on all its GPUs for the
//! burn-in length. Meanwhile, and after a failed run until one passes, the telemetry says so
//! and the control plane keeps the node out of placement (a health rule); work that lands
//! anyway (placed just before) stops the burn-in at once.

use std::process::Stdio;
use std::time::{Duration, Instant};

use gpurent_types::agent::BurnInState;
use tokio::process::{Child, Command};

/// What to run and how often.
#[derive(Debug, Clone)]
pub struct BurnInConfig {
    /// Run with `sh -c`, with `CUDA_VISIBLE_DEVICES` set to the node's GPUs and
    /// `GPURENT_BURN_IN_SECONDS` to the length; exit status 0 passes.
    pub command: String,
    /// Default 2 hours (the seeds).
    pub every: Duration,
    /// Default 10 minutes (the seeds); a run still going after twice this fails.
    pub length: Duration,
}

#[derive(Debug)]
pub(crate) struct BurnIn {
    config: Option<BurnInConfig>,
    /// When the last run ended (or the agent started: the first comes a period later).
    last: Instant,
    running: Option<(Child, Instant)>,
    failed: Option<String>,
}

impl BurnIn {
    pub(crate) fn new(config: Option<BurnInConfig>) -> Self {
        BurnIn {
            config,
            last: Instant::now(),
            running: None,
            failed: None,
        }
    }

    /// One step of the agent's loop: `busy` when the node has any instance or assignment.
    pub(crate) async fn step(&mut self, busy: bool, gpus: &[String]) {
        let Some(config) = self.config.clone() else {
            return;
        };
        if let Some((child, since)) = &mut self.running {
            if busy {
                let _ = child.kill().await;
                tracing::info!("burn-in stopped: work arrived");
                self.running = None;
                self.last = Instant::now();
                return;
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.failed =
                        (!status.success()).then(|| format!("the command exited with {status}"));
                    tracing::info!(passed = self.failed.is_none(), "burn-in done");
                    self.running = None;
                    self.last = Instant::now();
                }
                Ok(None) if since.elapsed() > config.length * 2 => {
                    let _ = child.kill().await;
                    self.failed = Some(format!(
                        "still running after {} s",
                        (config.length * 2).as_secs()
                    ));
                    self.running = None;
                    self.last = Instant::now();
                }
                Ok(None) => {}
                Err(e) => {
                    self.failed = Some(format!("cannot wait for the command: {e}"));
                    self.running = None;
                    self.last = Instant::now();
                }
            }
            return;
        }
        if busy || gpus.is_empty() || self.last.elapsed() < config.every {
            return;
        }
        let spawned = Command::new("sh")
            .arg("-c")
            .arg(&config.command)
            .env("CUDA_VISIBLE_DEVICES", gpus.join(","))
            .env(
                "GPURENT_BURN_IN_SECONDS",
                config.length.as_secs().to_string(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Ok(child) => {
                tracing::info!(gpus = gpus.len(), "burn-in started");
                self.running = Some((child, Instant::now()));
            }
            Err(e) => {
                self.failed = Some(format!("cannot start the command: {e}"));
                self.last = Instant::now();
            }
        }
    }

    /// What the telemetry says: `None` when burn-in is off, or idle and passing.
    pub(crate) fn state(&self) -> Option<BurnInState> {
        self.config.as_ref()?;
        let running = self.running.is_some();
        (running || self.failed.is_some()).then(|| BurnInState {
            running,
            failed: self.failed.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(command: &str) -> Option<BurnInConfig> {
        Some(BurnInConfig {
            command: command.into(),
            every: Duration::ZERO,
            length: Duration::from_secs(5),
        })
    }

    async fn until_done(b: &mut BurnIn) {
        for _ in 0..200 {
            b.step(false, &["GPU-0".into()]).await;
            if b.running.is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the burn-in did not end");
    }

    #[tokio::test]
    async fn a_passing_run_clears_and_a_failing_one_sticks() {
        let mut b = BurnIn::new(config(
            "test \"$CUDA_VISIBLE_DEVICES\" = GPU-0 && test \"$GPURENT_BURN_IN_SECONDS\" = 5",
        ));
        b.step(false, &["GPU-0".into()]).await;
        assert_eq!(
            b.state(),
            Some(BurnInState {
                running: true,
                failed: None
            })
        );
        until_done(&mut b).await;
        assert_eq!(b.state(), None);

        let mut b = BurnIn::new(config("exit 3"));
        b.step(false, &["GPU-0".into()]).await;
        until_done(&mut b).await;
        let state = b.state().expect("failed");
        assert!(!state.running);
        assert!(state.failed.is_some_and(|f| f.contains('3')));
    }

    #[tokio::test]
    async fn work_stops_it_and_a_busy_node_never_starts_it() {
        let mut b = BurnIn::new(config("sleep 30"));
        b.step(true, &["GPU-0".into()]).await;
        assert_eq!(b.state(), None, "a busy node is not burnt in");
        b.step(false, &["GPU-0".into()]).await;
        assert!(b.state().is_some_and(|s| s.running));
        b.step(true, &["GPU-0".into()]).await;
        assert_eq!(b.state(), None);
        assert!(BurnIn::new(None).state().is_none());
    }
}
