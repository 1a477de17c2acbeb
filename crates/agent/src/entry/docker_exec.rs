//! Sessions in a Docker container: `docker exec` through the Engine API (so the container's
//! namespaces, cgroup, user and capabilities apply), its output split into stdout and
//! stderr through small pipes that hold the Engine back when the client reads slowly.

use async_trait::async_trait;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::ResizeExecOptions;
use bollard::Docker;
use futures_util::StreamExt;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;

use super::{Entered, EntryControl, EntryError, ExitStatus, Output, Pty};

/// What each of stdout and stderr holds before the Engine's stream waits for the client.
const PIPE_BYTES: usize = 64 * 1024;

fn engine(action: &'static str, id: &str, e: impl std::fmt::Display) -> EntryError {
    EntryError::Engine {
        action,
        reservation_id: id.to_owned(),
        message: e.to_string(),
    }
}

/// Runs `cmd` in the container as `user` (the container's own where empty) with `env`
/// added to the container's.
pub async fn exec(
    docker: &Docker,
    reservation_id: &str,
    container: &str,
    cmd: Vec<String>,
    user: &str,
    env: Vec<String>,
    pty: Option<&Pty>,
) -> Result<Entered, EntryError> {
    let id = reservation_id;
    let config = ExecConfig {
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(pty.is_some()),
        console_size: pty.map(|p| vec![usize::from(p.rows), usize::from(p.cols)]),
        env: Some(env),
        cmd: Some(cmd),
        user: (!user.is_empty()).then(|| user.to_owned()),
        privileged: Some(false),
        ..Default::default()
    };
    let created = docker
        .create_exec(container, config)
        .await
        .map_err(|e| engine("start a session", id, e))?;
    let start = StartExecOptions {
        detach: false,
        tty: pty.is_some(),
        output_capacity: None,
    };
    let StartExecResults::Attached { mut output, input } = docker
        .start_exec(&created.id, Some(start))
        .await
        .map_err(|e| engine("start a session", id, e))?
    else {
        return Err(engine("start a session", id, "the exec started detached"));
    };
    let (mut out_w, out_r) = tokio::io::duplex(PIPE_BYTES);
    let (mut err_w, err_r) = tokio::io::duplex(PIPE_BYTES);
    let tty = pty.is_some();
    let pump = tokio::spawn(async move {
        while let Some(item) = output.next().await {
            let Ok(item) = item else { break };
            let (to_err, bytes) = match item {
                bollard::container::LogOutput::StdErr { message } => (true, message),
                bollard::container::LogOutput::StdOut { message }
                | bollard::container::LogOutput::Console { message } => (false, message),
                bollard::container::LogOutput::StdIn { .. } => continue,
            };
            let sink = if to_err && !tty {
                &mut err_w
            } else {
                &mut out_w
            };
            if sink.write_all(&bytes).await.is_err() {
                // The reader is gone: what remains is still drained, so the exec ends.
                continue;
            }
        }
        let _ = out_w.shutdown().await;
        let _ = err_w.shutdown().await;
    });
    let pid = exec_pid(docker, &created.id).await;
    let control = ExecControl {
        docker: docker.clone(),
        reservation_id: id.to_owned(),
        exec_id: created.id,
        tty,
        pid,
        pump: Some(pump),
        ended: false,
    };
    if let Some(p) = pty {
        // Also after the start: an Engine that ignores `ConsoleSize` still gets the size.
        let _ = control.resize(p.cols, p.rows).await;
    }
    Ok(Entered {
        stdin: super::CloseOnShutdown::boxed(input),
        stdout: Box::new(out_r),
        stderr: (!tty).then(|| Box::new(err_r) as Output),
        control: Box::new(control),
    })
}

/// The exec's process as the node sees it, while it runs (the Engine says 0 until it has
/// recorded it, which may be after the first output).
async fn exec_pid(docker: &Docker, exec_id: &str) -> Option<i32> {
    let inspect = docker.inspect_exec(exec_id).await.ok()?;
    if inspect.running != Some(true) {
        return None;
    }
    inspect
        .pid
        .and_then(|p| i32::try_from(p).ok())
        .filter(|&p| p > 0)
}

/// `exec_pid`, waited for up to 5 s while the exec runs.
async fn running_pid(docker: &Docker, exec_id: &str) -> Option<i32> {
    for _ in 0..250 {
        if let Some(pid) = exec_pid(docker, exec_id).await {
            return Some(pid);
        }
        match docker.inspect_exec(exec_id).await {
            Ok(i) if i.exit_code.is_some() && i.running != Some(true) => return None,
            Err(_) => return None,
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    None
}

struct ExecControl {
    docker: Docker,
    reservation_id: String,
    exec_id: String,
    tty: bool,
    /// The exec's process as the node sees it.
    pid: Option<i32>,
    pump: Option<tokio::task::JoinHandle<()>>,
    ended: bool,
}

#[async_trait]
impl EntryControl for ExecControl {
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), EntryError> {
        if !self.tty {
            return Ok(());
        }
        let size = ResizeExecOptions {
            h: i32::from(rows),
            w: i32::from(cols),
        };
        self.docker
            .resize_exec(&self.exec_id, size)
            .await
            .map_err(|e| engine("resize the terminal", &self.reservation_id, e))
    }

    async fn signal(&self, name: &str) -> Result<(), EntryError> {
        let signal = super::parse_signal(name)?;
        if self.ended {
            return Ok(());
        }
        let pid = match self.pid {
            Some(pid) => pid,
            // Not recorded yet, or it ended already (then there is nothing to signal).
            None => match running_pid(&self.docker, &self.exec_id).await {
                Some(pid) => pid,
                None => return Ok(()),
            },
        };
        match kill(Pid::from_raw(pid), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(EntryError::io(
                "send a signal",
                &self.reservation_id,
                e.into(),
            )),
        }
    }

    /// The Engine reports an exit code only: a process killed by signal N ends with 128+N.
    async fn wait(&mut self) -> Result<ExitStatus, EntryError> {
        if let Some(pump) = self.pump.take() {
            let _ = pump.await;
        }
        // The exec's output ended; the Engine records its code a moment later.
        for _ in 0..500 {
            let inspect = self
                .docker
                .inspect_exec(&self.exec_id)
                .await
                .map_err(|e| engine("wait for the session", &self.reservation_id, e))?;
            if inspect.running != Some(true) {
                if let Some(code) = inspect.exit_code {
                    self.ended = true;
                    return Ok(ExitStatus::Code(u32::try_from(code).unwrap_or(255)));
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Err(engine(
            "wait for the session",
            &self.reservation_id,
            "the Engine never reported how the exec ended",
        ))
    }
}

impl Drop for ExecControl {
    /// A session given up (its channel closed) ends its process.
    fn drop(&mut self) {
        if let Some(pump) = self.pump.take() {
            pump.abort();
        }
        if self.ended {
            return;
        }
        let (docker, exec_id) = (self.docker.clone(), self.exec_id.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Only while the Engine says it runs: a pid of an ended exec may be reused.
                if let Some(pid) = exec_pid(&docker, &exec_id).await {
                    let _ = kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
            });
        }
    }
}
