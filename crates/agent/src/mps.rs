//! NVIDIA's Multi-Process Service (`--mps`): before the agent hands shares MPS limits, it
//! checks that the MPS control daemon answers, so that a node never promises limits that the
//! driver does not apply (a client that finds no daemon runs without MPS, unlimited).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// The MPS control program, found on `PATH`.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";
/// How long the daemon has to answer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);

const HOW_TO_START: &str = "start the daemon as root with `nvidia-cuda-mps-control -d` \
     (the GPUs in EXCLUSIVE_PROCESS compute mode: `nvidia-smi -c EXCLUSIVE_PROCESS`), check \
     that `echo get_server_list | nvidia-cuda-mps-control` answers at once, or run the agent \
     without --mps";

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("--mps: {MPS_CONTROL} is not on PATH: install the NVIDIA driver's MPS tools and {HOW_TO_START}")]
    Missing,
    #[error("--mps: the MPS control daemon did not answer `get_server_list` within {} s (is it running? did `nvidia-cuda-mps-control -d` hang?): {HOW_TO_START}", within.as_secs())]
    NoAnswer { within: Duration },
    #[error("--mps: `echo get_server_list | {}` failed ({status}): {output}; {HOW_TO_START}", path.display())]
    Failed {
        path: PathBuf,
        status: String,
        output: String,
    },
    #[error("--mps: cannot run {}: {source}", path.display())]
    Run {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Asks the daemon, through the `nvidia-cuda-mps-control` on the agent's `PATH`, for its
/// servers, within [`ANSWER_WITHIN`].
pub async fn check() -> Result<(), MpsError> {
    check_with(std::env::var_os("PATH"), ANSWER_WITHIN).await
}

/// As [`check`], with the control program looked for on `path`, answering within `within`.
pub async fn check_with(path: Option<OsString>, within: Duration) -> Result<(), MpsError> {
    let program = path
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(MPS_CONTROL))
        .find(|p| is_executable(p))
        .ok_or(MpsError::Missing)?;
    let run = |source| MpsError::Run {
        path: program.clone(),
        source,
    };
    let mut child = tokio::process::Command::new(&program)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its own group, so that whatever a hung one started goes with it.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(run)?;
    let group = child.id().and_then(|id| i32::try_from(id).ok());
    if let Some(mut stdin) = child.stdin.take() {
        // One that exits before reading is judged by its exit status below.
        let _ = stdin.write_all(b"get_server_list\n").await;
    }
    match tokio::time::timeout(within, child.wait_with_output()).await {
        Err(_) => {
            if let Some(group) = group {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(MpsError::NoAnswer { within })
        }
        Ok(Err(e)) => Err(run(e)),
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let mut output = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            if output.is_empty() {
                output = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            }
            if output.is_empty() {
                output = "no output".to_owned();
            }
            Err(MpsError::Failed {
                path: program.clone(),
                status: out.status.to_string(),
                output,
            })
        }
    }
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
