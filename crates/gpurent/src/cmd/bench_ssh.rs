//! `gpurent bench ssh`: getting into instances through the control plane, with the system's
//! OpenSSH client. A control plane with its SSH endpoint runs in this process, its agent as a
//! child process (a real executor), so that each side's memory is its own. Measured: the time
//! from starting `ssh ID echo ok` to its first output, a copy with `scp` through gpurent
//! against one to this machine's own sshd in the same run, and the memory each idle
//! interactive session costs the control plane and the agent.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gpurent_server::ssh::{SshLimits, SshServer};
use gpurent_store::prelude::*;
use serde::Serialize;
use serde_json::json;

use super::bench_common::{
    bench_tenant, control_plane, percentile_ms, rss_mib, JOIN_TOKEN, TENANT_TOKEN,
};
use crate::cli::{BenchSshArgs, ExecutorKind};
use crate::output::{print_json, print_table};

/// Session channels per reservation the endpoint allows (its default): the idle sessions are
/// spread over enough reservations.
const SESSIONS_PER_RESERVATION: u32 = 16;

#[derive(Debug, Serialize)]
struct SshBench {
    executor: String,
    connects: usize,
    connect_p50_ms: f64,
    connect_p99_ms: f64,
    connect_max_ms: f64,
    copy_mib: u64,
    scp_gpurent_mib_s: f64,
    scp_direct_mib_s: Option<f64>,
    /// gpurent's rate over the direct one.
    scp_ratio: Option<f64>,
    sessions: u32,
    control_plane_kib_per_session: f64,
    agent_kib_per_session: f64,
}

/// Kills its child when dropped, so that nothing outlives a failed run.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn run(args: BenchSshArgs, json_out: bool) -> anyhow::Result<()> {
    for tool in ["ssh", "scp", "ssh-keygen"] {
        if which(tool).is_none() {
            bail!("{tool} is not installed (Debian: openssh-client)");
        }
    }
    let dir = std::env::temp_dir().join(format!("gpurent-bench-ssh-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(dir.clone());
    let (store, server) = control_plane(&dir).await?;
    bench_tenant(&store, 1_000_000).await?;
    let ssh = SshServer::start(
        "127.0.0.1:0".parse()?,
        &dir,
        server.state.clone(),
        // Every client is on loopback: the per-address cap would refuse the idle sessions.
        SshLimits {
            max_connections_per_ip: 4096,
            ..SshLimits::default()
        },
    )
    .await?;
    let url = format!("http://{}", server.addr);
    let reservations = args.sessions.div_ceil(SESSIONS_PER_RESERVATION).max(1);
    let executor = match args.executor {
        ExecutorKind::Docker => "docker",
        ExecutorKind::Process => "process",
        other => bail!("bench ssh needs the docker or the process executor, not {other:?}"),
    };
    let mut agent_cmd = Command::new(std::env::current_exe()?);
    agent_cmd
        .args(["--server", &url, "agent", "--join-token", JOIN_TOKEN])
        .args(["--name", "bench-node", "--executor", executor])
        .arg("--sim-gpus")
        .arg(format!("{reservations}xRTX4090"))
        // Limits that fit a small machine: the bench is about the relay, not the instance.
        .args(["--cpus-per-gpu", "1", "--memory-per-gpu-gb", "4"])
        .arg("--data-dir")
        .arg(dir.join("agent"))
        .env("GPURENT_LOG", "warn")
        .stdout(Stdio::null());
    let agent = Killed(agent_cmd.spawn().context("start the agent")?);
    let agent_pid = agent.0.id();
    wait_for(
        Duration::from_secs(60),
        "the agent to connect its tunnel",
        || server.state.tunnels.is_connected("bench-node"),
    )
    .await?;

    let key = dir.join("id_ed25519");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-N", "", "-t", "ed25519", "-f"])
        .arg(&key)
        .status()?;
    anyhow::ensure!(made.success(), "ssh-keygen failed");
    let public = std::fs::read_to_string(key.with_extension("pub"))?;
    let http = reqwest::Client::new();
    let added = http
        .post(format!("{url}/api/v1/ssh-keys"))
        .bearer_auth(TENANT_TOKEN)
        .json(&json!({"public_key": public}))
        .send()
        .await?;
    anyhow::ensure!(
        added.status().is_success(),
        "adding the key: {}",
        added.status()
    );
    let mut ids = Vec::new();
    for _ in 0..reservations {
        // Not reclaimed while the bench waits between its phases (sim GPUs are always idle).
        let mut body = json!({"gpu_type": "rtx4090", "hours": 1, "idle_reclaim": false,
            "command": ["sleep", "3600"]});
        if executor == "docker" {
            body["image"] = json!(args.image);
        }
        let r: serde_json::Value = http
            .post(format!("{url}/api/v1/reservations"))
            .bearer_auth(TENANT_TOKEN)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        let id = r["id"]
            .as_str()
            .with_context(|| format!("reserve: {r}"))?
            .to_owned();
        ids.push(id);
    }
    for id in &ids {
        let id = id.clone();
        let store = store.clone();
        wait_for_async(Duration::from_secs(120), "the instances to run", || {
            let store = store.clone();
            let id = id.clone();
            async move {
                store
                    .get_reservation(&id, &gpurent_store::Scope::All)
                    .await
                    .is_ok_and(|r| r.status == gpurent_types::ReservationStatus::Running)
            }
        })
        .await?;
    }
    // The clients block (ssh, scp): off the runtime that serves them.
    let metrics = server.state.metrics.clone();
    let port = ssh.addr.port();
    let reserved = ids.clone();
    let (args, ids, dir_c, key_c, public_c) =
        (args, ids.clone(), dir.clone(), key.clone(), public.clone());
    // On disk in the instance (a process instance's /tmp is memory, counted in its limit).
    let remote = if executor == "process" {
        "/instance/copy.bin"
    } else {
        "/tmp/copy.bin"
    };
    let measured = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let (dir, key, public) = (dir_c, key_c, public_c);
        let client = Ssh {
            port,
            key: key.clone(),
            known_hosts: dir.join("known_hosts"),
        };
        // The first connect also checks that the instance can be entered.
        let first = client.command(&ids[0], &["echo", "ok"]).output()?;
        anyhow::ensure!(
            first.status.success() && first.stdout.starts_with(b"ok"),
            "ssh into the instance failed: {}",
            String::from_utf8_lossy(&first.stderr)
        );

        eprintln!("bench: {} connects", args.connects);
        let mut times = Vec::new();
        for _ in 0..args.connects {
            times.push(client.time_to_first_output(&ids[0])?);
        }
        times.sort();

        eprintln!("bench: scp of {} MiB", args.copy_mib);
        let file = dir.join("copy.bin");
        write_file(&file, args.copy_mib)?;
        let through = client.scp(
            &file,
            &format!("{}@127.0.0.1:{remote}", ids[0]),
            client.port,
        )?;
        let _ = client.command(&ids[0], &["rm", "-f", remote]).output();
        let direct = match DirectSshd::start(&dir, &public) {
            Ok(sshd) => {
                let direct = Ssh {
                    port: sshd.port,
                    key: key.clone(),
                    known_hosts: dir.join("known_hosts_direct"),
                };
                let target = dir.join("copied-direct.bin");
                let secs = direct.scp(
                    &file,
                    &format!("root@127.0.0.1:{}", target.display()),
                    sshd.port,
                )?;
                let _ = std::fs::remove_file(&target);
                Some(secs)
            }
            Err(e) => {
                eprintln!("bench: no direct sshd to compare with: {e:#}");
                None
            }
        };
        let _ = std::fs::remove_file(&file);

        eprintln!("bench: {} idle sessions", args.sessions);
        let before = (rss_mib(std::process::id()), rss_mib(agent_pid));
        let mut idle = Vec::new();
        for i in 0..args.sessions {
            let id = &ids[(i / SESSIONS_PER_RESERVATION) as usize];
            let mut cmd = client.command(id, &[]);
            cmd.arg("-tt")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            idle.push(Killed(cmd.spawn()?));
        }
        let want = u64::from(args.sessions);
        let deadline = Instant::now() + Duration::from_secs(120);
        while metrics
            .ssh
            .sessions
            .load(std::sync::atomic::Ordering::Relaxed)
            < want
        {
            anyhow::ensure!(Instant::now() < deadline, "the idle sessions did not open");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(3));
        let after = (rss_mib(std::process::id()), rss_mib(agent_pid));
        drop(idle);
        Ok((times, through, direct, before, after, args))
    })
    .await??;
    let (times, through, direct, before, after, args) = measured;
    let mib = args.copy_mib as f64;
    let per = |a: f64, b: f64| (a - b).max(0.0) * 1024.0 / f64::from(args.sessions.max(1));

    let through_rate = mib / through;
    let direct_rate = direct.map(|secs| mib / secs);
    let result = SshBench {
        executor: executor.to_owned(),
        connects: times.len(),
        connect_p50_ms: percentile_ms(&times, 0.50),
        connect_p99_ms: percentile_ms(&times, 0.99),
        connect_max_ms: percentile_ms(&times, 1.0),
        copy_mib: args.copy_mib,
        scp_gpurent_mib_s: through_rate,
        scp_direct_mib_s: direct_rate,
        scp_ratio: direct_rate.map(|d| through_rate / d),
        sessions: args.sessions,
        control_plane_kib_per_session: per(after.0, before.0),
        agent_kib_per_session: per(after.1, before.1),
    };
    // The instances go with the bench: stopped through the API (the agent ends containers and
    // process trees), and whatever is left of process instances killed by name.
    let ids = reserved;
    for id in &ids {
        let _ = http
            .post(format!("{url}/api/v1/reservations/{id}/stop"))
            .bearer_auth(TENANT_TOKEN)
            .send()
            .await;
    }
    let store_c = store.clone();
    let _ = wait_for_async(Duration::from_secs(60), "the instances to stop", || {
        let store = store_c.clone();
        let ids = ids.clone();
        async move {
            for id in &ids {
                let stopped = store
                    .get_reservation(id, &gpurent_store::Scope::All)
                    .await
                    .is_ok_and(|r| r.status == gpurent_types::ReservationStatus::Stopped);
                if !stopped {
                    return false;
                }
            }
            true
        }
    })
    .await;
    drop(agent);
    gpurent_agent::testing::kill_processes_naming(&dir);
    ssh.shutdown().await;
    server.shutdown().await?;
    if json_out {
        print_json(&result)?;
        return Ok(());
    }
    let na = || "n/a".to_owned();
    print_table(
        &[
            "executor",
            "connect p50 ms",
            "connect p99 ms",
            "scp MiB/s",
            "direct MiB/s",
            "ratio",
            "CP KiB/session",
            "agent KiB/session",
        ],
        &[vec![
            result.executor.clone(),
            format!("{:.1}", result.connect_p50_ms),
            format!("{:.1}", result.connect_p99_ms),
            format!("{:.1}", result.scp_gpurent_mib_s),
            result
                .scp_direct_mib_s
                .map_or_else(na, |r| format!("{r:.1}")),
            result.scp_ratio.map_or_else(na, |r| format!("{r:.2}")),
            format!("{:.1}", result.control_plane_kib_per_session),
            format!("{:.1}", result.agent_kib_per_session),
        ]],
    );
    Ok(())
}

/// The system's OpenSSH client, pointed at one endpoint with one key, never prompting.
struct Ssh {
    port: u16,
    key: PathBuf,
    known_hosts: PathBuf,
}

impl Ssh {
    fn options(&self, cmd: &mut Command) {
        cmd.arg("-i")
            .arg(&self.key)
            .args([
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
            ])
            .args(["-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", self.known_hosts.display()));
    }

    fn command(&self, user: &str, remote: &[&str]) -> Command {
        let mut cmd = Command::new("ssh");
        self.options(&mut cmd);
        cmd.args(["-p", &self.port.to_string()])
            .arg(format!("{user}@127.0.0.1"))
            .args(remote);
        cmd
    }

    /// From starting `ssh ID echo ok` to the first byte of its output.
    fn time_to_first_output(&self, user: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut child = self
            .command(user, &["echo", "ok"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut stdout = child.stdout.take().context("stdout")?;
        let mut byte = [0u8; 1];
        let n = stdout.read(&mut byte)?;
        let elapsed = started.elapsed();
        let status = child.wait()?;
        anyhow::ensure!(
            n == 1 && status.success(),
            "ssh {user} echo ok failed: {status}"
        );
        Ok(elapsed)
    }

    /// Seconds `scp` takes to copy `file` to `target`.
    fn scp(&self, file: &Path, target: &str, port: u16) -> anyhow::Result<f64> {
        let mut cmd = Command::new("scp");
        self.options(&mut cmd);
        cmd.args(["-q", "-P", &port.to_string()])
            .arg(file)
            .arg(target);
        let started = Instant::now();
        let out = cmd.output()?;
        anyhow::ensure!(
            out.status.success(),
            "scp to {target} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(started.elapsed().as_secs_f64())
    }
}

/// This machine's own sshd on a free loopback port, for the direct copy.
struct DirectSshd {
    port: u16,
    _daemon: Killed,
}

impl DirectSshd {
    fn start(dir: &Path, public: &str) -> anyhow::Result<DirectSshd> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .context("sshd is not installed (Debian: openssh-server)")?;
        let home = dir.join("sshd");
        std::fs::create_dir_all(&home)?;
        let host_key = home.join("host_ed25519");
        Command::new("ssh-keygen")
            .args(["-q", "-N", "", "-t", "ed25519", "-f"])
            .arg(&host_key)
            .status()?;
        let authorized = home.join("authorized_keys");
        std::fs::write(&authorized, public)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let config = home.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PasswordAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n\
                 UsePAM no\nPidFile {}\nSubsystem sftp internal-sftp\n",
                host_key.display(),
                authorized.display(),
                home.join("sshd.pid").display()
            ),
        )?;
        // sshd wants its privilege-separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let daemon = Killed(
            Command::new(&sshd)
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start sshd")?,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "sshd did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(DirectSshd {
            port,
            _daemon: daemon,
        })
    }
}

/// `mib` MiB of bytes that do not compress to nothing.
fn write_file(path: &Path, mib: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut block = vec![0u8; 1024 * 1024];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..mib {
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        out.write_all(&block)?;
    }
    out.flush()?;
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

async fn wait_for(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !check() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn wait_for_async<F, Fut>(within: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
