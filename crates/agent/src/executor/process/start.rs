//! Starting an instance: its directory, its uid (isolated), its cgroup, its environment, and
//! the wrapper shell that joins the cgroup, runs the command (in the sandbox or not) and records
//! its exit code.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

use gpurent_types::agent::Assignment;
use tokio::io::AsyncWriteExt;

use super::procfs::process_uids;
use super::{exec_error, set_mode, InstanceFile, ProcessExecutor};
use crate::executor::is_reserved_env;
use crate::executor::sandbox::{self, Sandbox};
use crate::AgentError;

/// Joins the instance's cgroups (the first `$1` arguments: `cgroup.procs` files), runs the
/// rest of its arguments (after the exit code file, `mv` and whether fd 3 gets the sandbox's
/// options from stdin) and records its exit code. It runs outside the sandbox, as the agent's
/// user, with the agent's environment: no tool it runs is found through the tenant's `PATH`.
const WRAPPER: &str = r#"n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done
ex=$1; mv=$2; feed=$3; shift 3
if [ "$feed" = 1 ]; then "$@" 3<&0 </dev/null; else "$@"; fi
code=$?
echo $code > "$ex.tmp" && "$mv" "$ex.tmp" "$ex"
exit $code"#;

impl ProcessExecutor {
    /// The instance of an assignment, started by the wrapper shell and recorded in
    /// `instance.json`.
    pub(super) async fn spawn_instance(
        &self,
        a: &Assignment,
        volume: Option<&Path>,
    ) -> Result<(), AgentError> {
        let id = &a.reservation_id;
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
        let Some((program, args)) = a.command.split_first() else {
            return Err(exec_error(
                "start",
                id,
                "the process executor needs a command",
            ));
        };
        let dir = self.instance_dir(id);
        let home = self.home_path(id);
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
        let mut command = tokio::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(WRAPPER)
            .arg("gpurent-instance")
            .arg(procs.len().to_string())
            .args(&procs)
            .arg(dir.join("exit_code"))
            .arg(&self.mv)
            .arg(if uid.is_some() { "1" } else { "0" })
            // Nothing of the agent's environment (its join token, say) leaks into the workload.
            .env_clear()
            .stdout(output)
            .stderr(errors)
            .process_group(0)
            .kill_on_drop(false);
        let options = match (&self.sandbox, uid) {
            (Some(sandbox), Some(uid)) => {
                // The wrapper runs with a fixed environment; the tenant's goes to bwrap's
                // options on the wrapper's stdin (fd 3 of bwrap), in no command line.
                command
                    .env("PATH", sandbox::SYSTEM_PATH)
                    .args(sandbox.command_prefix(uid))
                    .current_dir(&dir)
                    .stdin(std::process::Stdio::piped());
                let spec = sandbox::Spec {
                    home: &home,
                    volume,
                    env: &env,
                    gpus: &a.gpus,
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
                    .current_dir(&home)
                    .stdin(std::process::Stdio::null());
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
        };
        let json = serde_json::to_vec(&file).map_err(|e| exec_error("start", id, e))?;
        std::fs::write(dir.join("instance.json"), json).map_err(|e| exec_error("start", id, e))?;
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), child);
        tracing::info!(reservation_id = %id, pgid, ?uid, gpus = %a.gpus.join(","), confined = self.cgroup.is_some(), "process instance started");
        Ok(())
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
