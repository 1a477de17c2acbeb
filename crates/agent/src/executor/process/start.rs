//! Starting an instance: its directory, its uid (isolated), its cgroup, its environment, and
//! the wrapper shell that joins the cgroup, runs the command (in the sandbox or not) and records
//! its exit code.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpurent_types::agent::Assignment;
use tokio::io::AsyncWriteExt;

use super::procfs::process_uids;
use super::{exec_error, network, set_mode, InstanceFile, ProcessExecutor};
use crate::executor::is_reserved_env;
use crate::executor::sandbox::{self, Sandbox};
use crate::AgentError;

/// Joins the instance's cgroups (the first `$1` arguments: `cgroup.procs` files), runs the
/// rest of its arguments (after the exit code file, `mv`, how the sandbox starts, and setpriv
/// and pasta or `-`) and records its exit code. It runs outside the sandbox, as the agent's
/// user, with the agent's environment: no tool it runs is found through the tenant's `PATH`.
/// `feed`: 0 unisolated; 1 sandboxed, fd 3 of bwrap its options from stdin; 2 the same with a
/// network of its own: bwrap writes its child's pid on fd 4 and waits for a byte on fd 5
/// (FIFOs in the instance's directory, the agent's only) while pasta attaches that child's
/// network namespace; pasta is killed once the sandbox ends.
const WRAPPER: &str = r#"n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done
ex=$1; mv=$2; feed=$3; setpriv=$4; pasta=$5; shift 5
if [ "$feed" = 2 ]; then
  d=${ex%/*}; rm -f "$d/net.info" "$d/net.go" "$d/pasta.pid"
  mkfifo -m 600 "$d/net.info" "$d/net.go" || exit 125
  exec 3<&0 </dev/null
  "$@" 4>"$d/net.info" 5<>"$d/net.go" &
  sb=$!
  exec 3<&-
  pid=$(sed -n 's/.*"child-pid": *\([0-9][0-9]*\).*/\1/p' "$d/net.info")
  if [ -n "$pid" ]; then
    if "$setpriv" @SETPRIV@ -- "$pasta" @PASTA@ -P "$d/pasta.pid" --netns /proc/self/fd/6 6<"/proc/$pid/ns/net"; then
      echo > "$d/net.go"
    else
      echo "gpurent: pasta could not attach the instance's network" >&2; kill -9 $sb
    fi
  fi
  wait $sb; code=$?
  if [ -s "$d/pasta.pid" ]; then
    read pp < "$d/pasta.pid"; kill -9 "$pp" 2>/dev/null
    while { read -r st < "/proc/$pp/stat"; } 2>/dev/null; do
      case "$st" in *") Z "*) break;; esac; sleep 0.01
    done
  fi
  rm -f "$d/net.info" "$d/net.go"
elif [ "$feed" = 1 ]; then "$@" 3<&0 </dev/null; code=$?
else "$@"; code=$?; fi
echo $code > "$ex.tmp" && "$mv" "$ex.tmp" "$ex"
exit $code"#;

/// The wrapper with pasta's and setpriv's flags in it.
fn wrapper() -> String {
    WRAPPER
        .replace("@SETPRIV@", network::SETPRIV_FLAGS)
        .replace("@PASTA@", network::PASTA_FLAGS)
}

impl ProcessExecutor {
    /// The instance of an assignment, started by the wrapper shell and recorded in
    /// `instance.json`.
    pub(super) async fn spawn_instance(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
        binds: &[crate::executor::Bind],
    ) -> Result<(), AgentError> {
        let id = &a.reservation_id;
        if !binds.is_empty() && self.sandbox.is_none() {
            return Err(exec_error(
                "start",
                id,
                "volumes are mounted into isolated instances only, and this node runs them unisolated",
            ));
        }
        // Run without its image, a job would get the node's own system instead of what it
        // asked for: refused, saying why, rather than run on the wrong software.
        if let Some(image) = &a.image {
            return Err(exec_error(
                "start",
                id,
                format!(
                    "this node runs no containers (no Docker Engine: its instances run as processes on the node's own system), so the image {image} cannot run here; reserve without --image"
                ),
            ));
        }
        // No command: an interactive instance, kept up for its hours for its owner to enter.
        let command = if a.command.is_empty() {
            crate::executor::interactive_keeper(id)
        } else {
            a.command.clone()
        };
        let Some((program, args)) = command.split_first() else {
            return Err(exec_error("start", id, "an empty command"));
        };
        let dir = self.instance_dir(id);
        std::fs::create_dir_all(&dir).map_err(|e| exec_error("start", id, e))?;
        let home = match (&self.sandbox, &self.scratch) {
            (Some(_), Some(scratch)) => scratch
                .mount(id, a.gpus.len())
                .await
                .map_err(|e| exec_error("start", id, e))?,
            _ => self.home_path(id),
        };
        std::fs::create_dir_all(&home).map_err(|e| exec_error("start", id, e))?;
        set_mode(&dir, 0o700).map_err(|e| exec_error("start", id, e))?;
        set_mode(&home, 0o700).map_err(|e| exec_error("start", id, e))?;
        let _ = std::fs::remove_file(dir.join("exit_code"));
        // The uid is chosen and recorded under one lock, so two starts never share one.
        let _uid_guard = self.uid_lock.lock().await;
        let uid = match &self.sandbox {
            Some(sandbox) => {
                let uid = self.free_uid(sandbox, id)?;
                chown_tree(&home, uid).map_err(|e| exec_error("start", id, e))?;
                if let Some(volume) = volume {
                    chown_tree(volume, uid).map_err(|e| {
                        exec_error("start", id, format!("chown {}: {e}", volume.display()))
                    })?;
                }
                // A volume it writes is its uid's; one it reads is left as it is.
                for bind in binds.iter().filter(|b| !b.read_only) {
                    crate::volumes::chown_tree(&bind.source, uid, uid).map_err(|e| {
                        exec_error("start", id, format!("chown {}: {e}", bind.source.display()))
                    })?;
                }
                Some(uid)
            }
            None => None,
        };
        let procs = match &self.cgroup {
            Some(cg) => cg
                .create(id, self.limits(a.gpus.len()))
                .map_err(|e| exec_error("start", id, e))?,
            None => Vec::new(),
        };
        let output = std::fs::File::create(dir.join("output.log"))
            .map_err(|e| exec_error("start", id, e))?;
        let errors = output.try_clone().map_err(|e| exec_error("start", id, e))?;
        let env = self.environment(a, &home, volume);
        let own_network = uid.is_some() && self.network.is_some();
        let mut command = tokio::process::Command::from(self.wrapper_command(
            &dir,
            &procs,
            uid.is_some(),
            output,
            errors,
        ));
        command.kill_on_drop(false);
        let options = match (&self.sandbox, uid) {
            (Some(sandbox), Some(uid)) => {
                // The wrapper runs with a fixed environment; the tenant's goes to bwrap's
                // options on the wrapper's stdin (fd 3 of bwrap), in no command line.
                command.args(sandbox.command_prefix(uid));
                let spec = sandbox::Spec {
                    home: &home,
                    volume,
                    binds,
                    env: &env,
                    gpus: &a.gpus,
                    own_network,
                    resolv_conf: self.network.as_ref().and_then(|n| n.resolv_conf()),
                };
                Some(
                    sandbox
                        .options_bytes(&spec)
                        .map_err(|e| exec_error("start", id, e))?,
                )
            }
            _ => {
                command
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .current_dir(&home);
                None
            }
        };
        command.arg(program).args(args);
        let mut child = command.spawn().map_err(|e| exec_error("start", id, e))?;
        if let (Some(options), Some(mut stdin)) = (options, child.stdin.take()) {
            // bwrap reads them all before it starts anything; a bwrap that failed before
            // reading them ends with its exit code, which the wrapper records.
            if let Err(e) = stdin.write_all(&options).await {
                tracing::warn!(reservation_id = %id, error = %e, "could not hand the sandbox its options");
            }
        }
        let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let file = InstanceFile {
            reservation_id: id.clone(),
            epoch: a.epoch,
            pgid,
            uid,
            own_network,
        };
        let json = serde_json::to_vec(&file).map_err(|e| exec_error("start", id, e))?;
        std::fs::write(dir.join("instance.json"), json).map_err(|e| exec_error("start", id, e))?;
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), child);
        tracing::info!(reservation_id = %id, pgid, ?uid, own_network, gpus = %a.gpus.join(","), confined = self.cgroup.is_some(), "process instance started");
        Ok(())
    }

    /// The wrapper shell of an instance whose directory is `dir` (the exit code, pasta's pid
    /// file and FIFOs go there), joining the cgroups whose `cgroup.procs` are `procs`; the
    /// command (the sandbox's, with the options on stdin, when `sandboxed`) follows.
    fn wrapper_command(
        &self,
        dir: &Path,
        procs: &[PathBuf],
        sandboxed: bool,
        output: std::fs::File,
        errors: std::fs::File,
    ) -> std::process::Command {
        let network = self.network.as_ref().filter(|_| sandboxed);
        let feed = match (sandboxed, network) {
            (false, _) => "0",
            (true, None) => "1",
            (true, Some(_)) => "2",
        };
        let tools: [OsString; 2] = match network {
            Some(net) => net.wrapper_args(),
            None => ["-".into(), "-".into()],
        };
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(wrapper())
            .arg("gpurent-instance")
            .arg(procs.len().to_string())
            .args(procs)
            .arg(dir.join("exit_code"))
            .arg(&self.mv)
            .arg(feed)
            .args(tools)
            // Nothing of the agent's environment (its join token, say) leaks into the workload.
            .env_clear()
            .stdout(output)
            .stderr(errors)
            .process_group(0);
        if sandboxed {
            command
                .env("PATH", sandbox::SYSTEM_PATH)
                .current_dir(dir)
                .stdin(std::process::Stdio::piped());
        } else {
            command.stdin(std::process::Stdio::null());
        }
        command
    }

    /// Runs `/bin/true` once the way instances with a network of their own run (the wrapper,
    /// bwrap, pasta), in `dir`: Err says why this host cannot give instances their own network.
    pub(super) fn probe_network(&self, dir: &Path) -> Result<(), String> {
        let (Some(sandbox), Some(_)) = (&self.sandbox, &self.network) else {
            return Err("no sandbox".into());
        };
        let home = dir.join("home");
        std::fs::create_dir_all(&home).map_err(|e| format!("{}: {e}", home.display()))?;
        let log = dir.join("output.log");
        let output = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let errors = output.try_clone().map_err(|e| e.to_string())?;
        let uid = sandbox.uids().start;
        let spec = sandbox::Spec {
            home: &home,
            volume: None,
            binds: &[],
            env: &[],
            gpus: &[],
            own_network: true,
            resolv_conf: self.network.as_ref().and_then(|n| n.resolv_conf()),
        };
        let options = sandbox.options_bytes(&spec)?;
        let mut child = self
            .wrapper_command(dir, &[], true, output, errors)
            .args(sandbox.command_prefix(uid))
            .arg("/bin/true")
            .spawn()
            .map_err(|e| format!("cannot run the wrapper: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = std::io::Write::write_all(&mut stdin, &options);
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_dir_all(dir);
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "a sandbox with a network of its own did not start ({status}): {}",
                said.trim()
            ))
        }
    }

    /// The lowest uid of the range that no instance of this executor has and no process of
    /// the node runs as (a leftover, or another agent's instance).
    fn free_uid(&self, sandbox: &Sandbox, id: &str) -> Result<u32, AgentError> {
        let range = sandbox.uids();
        let mut taken: BTreeSet<u32> = self
            .read_instances()
            .into_iter()
            .filter(|f| f.reservation_id != id)
            .filter_map(|f| f.uid)
            .collect();
        taken.extend(process_uids().into_iter().filter(|u| range.contains(u)));
        range.clone().find(|u| !taken.contains(u)).ok_or_else(|| {
            exec_error(
                "start",
                id,
                format!(
                    "all {} instance uids from {} are in use",
                    sandbox::UID_RANGE,
                    range.start
                ),
            )
        })
    }

    /// The instance's environment: defaults a tenant may change, the tenant's variables
    /// (less the reserved ones), then the reserved ones, which no tenant sets.
    fn environment(
        &self,
        a: &Assignment,
        home: &Path,
        volume: Option<&Path>,
    ) -> Vec<(String, OsString)> {
        let isolated = self.sandbox.is_some();
        let visible = a.gpus.join(",");
        let mut env: Vec<(String, OsString)> = Vec::new();
        let path = match std::env::var_os("PATH") {
            Some(p) if !isolated => p,
            _ => sandbox::SYSTEM_PATH.into(),
        };
        env.push(("PATH".into(), path));
        if let Some(ld) = std::env::var_os("LD_LIBRARY_PATH") {
            env.push(("LD_LIBRARY_PATH".into(), ld));
        }
        env.extend(
            a.env
                .iter()
                .chain(&a.secrets.0)
                .filter(|(k, _)| !is_reserved_env(k) && k.as_str() != "HOME")
                .map(|(k, v)| (k.clone(), OsString::from(v))),
        );
        let (home, checkpoint): (OsString, Option<OsString>) = if isolated {
            (
                sandbox::HOME.into(),
                volume.map(|_| sandbox::CHECKPOINT.into()),
            )
        } else {
            (home.into(), volume.map(Into::into))
        };
        env.push(("HOME".into(), home));
        env.push(("CUDA_VISIBLE_DEVICES".into(), visible.clone().into()));
        env.push(("NVIDIA_VISIBLE_DEVICES".into(), visible.into()));
        env.push((
            "GPURENT_RESERVATION_ID".into(),
            a.reservation_id.clone().into(),
        ));
        env.push(("GPURENT_EPOCH".into(), a.epoch.to_string().into()));
        env.push((
            "GPURENT_RESTART_COUNT".into(),
            a.restart_count.to_string().into(),
        ));
        if let Some(index) = a.array_index {
            env.push(("GPURENT_ARRAY_INDEX".into(), index.to_string().into()));
        }
        // A managed job's checkpoint volume, bound where the sandbox shows it.
        if let Some(m) = a.mounts.iter().find(|m| m.checkpoint) {
            env.push(("GPURENT_CHECKPOINT_DIR".into(), m.path.clone().into()));
        }
        if let (true, Some(scratch)) = (isolated, &self.scratch) {
            let mb = scratch.bytes_for(a.gpus.len()) / (1024 * 1024);
            env.push(("GPURENT_DISK_MB".into(), mb.to_string().into()));
        }
        env.extend(
            self.gpu_limits
                .env(a)
                .into_iter()
                .map(|(k, v)| (k, OsString::from(v))),
        );
        for (k, v) in self.resources.for_instance(a.gpus.len()).env() {
            env.push((k.into(), v.into()));
        }
        if let Some(dir) = checkpoint {
            env.push(("GPURENT_CHECKPOINT_DIR".into(), dir));
        }
        env
    }
}

/// Makes `uid` the owner of `root` and everything under it, links not followed (a directory
/// an earlier instance of the reservation, with another uid, wrote to).
fn chown_tree(root: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(root, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(root)?.is_dir() {
        for entry in std::fs::read_dir(root)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}
