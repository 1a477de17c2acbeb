//! `gpurent ssh ID [-- CMD...]`: the system's `ssh` into a running reservation, with the
//! control plane's host key pinned; and how every SSH command learns where to connect.

use std::path::Path;

use gpurent_server::ssh::SshEndpointInfo;
use gpurent_types::api::Reservation;
use gpurent_types::ReservationStatus;
use russh::keys::ssh_key::PublicKey;

use super::client::segment;
use super::ssh_client::Target;
use super::ssh_config::{pin_host_key, Pin};
use crate::api_client::{ApiClient, CliError};
use crate::cli::{SshArgs, SshClientArgs};

/// The SSH endpoint of the control plane, with a clear message where it has none.
pub async fn endpoint(api: &ApiClient) -> Result<SshEndpointInfo, CliError> {
    api.get("/api/v1/ssh")
        .await
        .map_err(|e| match e.code.as_str() {
            "not_found" => CliError::new(
                "no_ssh_endpoint",
                "this control plane does not tell where its SSH endpoint is (a version before \
             instance access?)",
            ),
            _ => e,
        })
}

/// A reservation that can be entered now: it runs. Otherwise says what it is instead.
pub async fn running(api: &ApiClient, id: &str) -> Result<Reservation, CliError> {
    let r: Reservation = api
        .get(&format!("/api/v1/reservations/{}", segment(id)))
        .await?;
    if let Some(a) = &r.array {
        return Err(CliError::new(
            "invalid_value",
            format!(
                "{} is a job array of {} tasks: name one as {}[INDEX]",
                r.id, a.tasks, r.id
            ),
        ));
    }
    if r.status != ReservationStatus::Running {
        let when = match (r.status, r.ended_at) {
            (ReservationStatus::Pending | ReservationStatus::Starting, _) => {
                " (not started yet: wait until `gpurent get` says running)".to_owned()
            }
            (_, Some(at)) => format!(
                " (ended at {})",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            _ => String::new(),
        };
        return Err(CliError::new(
            "not_running",
            format!(
                "reservation {} is {}{when}: only a running reservation can be entered",
                r.id, r.status
            ),
        ));
    }
    Ok(r)
}

/// The host key line the API gave, parsed.
pub fn host_key(info: &SshEndpointInfo) -> Result<PublicKey, CliError> {
    PublicKey::from_openssh(&info.host_key).map_err(|e| {
        CliError::new(
            "bad_response",
            format!("the control plane's SSH host key does not parse: {e}"),
        )
    })
}

/// Where gpurent's own client connects for reservation `id`: the control plane's endpoint
/// (the reservation must run), or with `--direct` the given server as user `id`.
pub async fn target(api: &ApiClient, id: &str, args: &SshClientArgs) -> Result<Target, CliError> {
    if let (Some(direct), Some(key_file)) = (&args.direct, &args.direct_host_key) {
        return direct_target(direct, key_file, id);
    }
    let r = running(api, id).await?;
    let info = endpoint(api).await?;
    Ok(Target {
        host_key: host_key(&info)?,
        host: info.host,
        port: info.port,
        user: r.id,
    })
}

fn direct_target(direct: &str, key_file: &Path, user: &str) -> Result<Target, CliError> {
    let bad = |why: String| CliError::new("invalid_value", why);
    let (host, port) = direct
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
        .ok_or_else(|| bad(format!("--direct {direct:?}: give HOST:PORT")))?;
    let host_key = russh::keys::load_public_key(key_file)
        .map_err(|e| bad(format!("--direct-host-key {}: {e}", key_file.display())))?;
    Ok(Target {
        host: host.to_owned(),
        port,
        user: user.to_owned(),
        host_key,
    })
}

/// The `ssh` command line for reservation `user` at the endpoint, trusting `pin` only.
pub fn ssh_command(
    info: &SshEndpointInfo,
    user: &str,
    pin: &Pin,
    identity: Option<&Path>,
    command: &[String],
) -> std::process::Command {
    let mut ssh = std::process::Command::new("ssh");
    ssh.arg("-p").arg(info.port.to_string());
    ssh.arg("-o")
        .arg(format!("UserKnownHostsFile={}", pin.known_hosts.display()));
    ssh.args(["-o", "StrictHostKeyChecking=yes"]);
    ssh.arg("-o").arg(format!("HostKeyAlias={}", pin.alias));
    if let Some(identity) = identity {
        ssh.arg("-i").arg(identity);
    }
    ssh.arg(format!("{user}@{}", info.host));
    ssh.args(command);
    ssh
}

/// Replaces this process with `ssh` (the terminal is the user's); returns only on failure.
pub async fn run(api: &ApiClient, args: SshArgs) -> Result<(), CliError> {
    let r = running(api, &args.id).await?;
    let info = endpoint(api).await?;
    let pin = pin_host_key(&info)?;
    let mut ssh = ssh_command(&info, &r.id, &pin, args.identity.as_deref(), &args.command);
    use std::os::unix::process::CommandExt;
    let e = ssh.exec();
    Err(if e.kind() == std::io::ErrorKind::NotFound {
        CliError::new(
            "ssh_not_installed",
            "ssh is not installed: install OpenSSH's client (Debian and Ubuntu: apt install \
             openssh-client); `gpurent cp` and `gpurent port-forward` work without it",
        )
    } else {
        CliError::new("ssh_failed", format!("cannot run ssh: {e}"))
    })
}
