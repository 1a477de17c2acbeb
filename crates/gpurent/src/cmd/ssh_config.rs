//! `gpurent ssh-config [ID]`: OpenSSH `Host` blocks for running reservations, and the
//! known_hosts file (in the CLI's config dir) that pins the control plane's host key for them
//! and for `gpurent ssh`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gpurent_server::ssh::SshEndpointInfo;
use gpurent_types::api::Reservation;
use gpurent_types::ReservationStatus;

use crate::api_client::{ApiClient, CliError};
use crate::cli::SshConfigArgs;
use crate::output::{print_json, print_raw};

/// A host key pinned in a known_hosts file under a name of its own (`HostKeyAlias`), so that
/// it holds whatever name or address the endpoint is reached by.
#[derive(Debug, Clone)]
pub struct Pin {
    pub known_hosts: PathBuf,
    pub alias: String,
}

/// The CLI's own files: `$XDG_CONFIG_HOME/gpurent`, else `~/.config/gpurent`.
pub fn config_dir() -> Result<PathBuf, CliError> {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    from("XDG_CONFIG_HOME")
        .or_else(|| from("HOME").map(|h| h.join(".config")))
        .map(|d| d.join("gpurent"))
        .ok_or_else(|| {
            CliError::new(
                "no_config_dir",
                "neither XDG_CONFIG_HOME nor HOME is set: nowhere to keep the known_hosts file",
            )
        })
}

/// The name the endpoint's key is pinned under: one per control plane endpoint.
pub fn alias(info: &SshEndpointInfo) -> String {
    let host: String = info
        .host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("gpurent-endpoint.{host}.{}", info.port)
}

/// Writes (or updates) the known_hosts file with the endpoint's host key under its alias,
/// leaving the other lines as they were. Owner-only, replaced in one rename.
pub fn pin_host_key(info: &SshEndpointInfo) -> Result<Pin, CliError> {
    let failed = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        CliError::new(
            "local_file",
            format!("cannot {what} {}: {e}", path.display()),
        )
    };
    let dir = config_dir()?;
    super::private::private_dir(&dir).map_err(|e| failed("create", &dir, &format!("{e:#}")))?;
    let known_hosts = dir.join("known_hosts");
    let alias = alias(info);
    let key: Vec<&str> = info.host_key.split_whitespace().take(2).collect();
    if key.len() != 2 || key.iter().any(|k| k.contains(',')) {
        return Err(CliError::new(
            "bad_response",
            format!(
                "the control plane's SSH host key {:?} is not an OpenSSH key",
                info.host_key
            ),
        ));
    }
    let line = format!("{alias} {}", key.join(" "));
    let old = match std::fs::read_to_string(&known_hosts) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(failed("read", &known_hosts, &e)),
    };
    let prefix = format!("{alias} ");
    let mut lines: Vec<&str> = old.lines().filter(|l| !l.starts_with(&prefix)).collect();
    let unchanged = old.lines().any(|l| l == line);
    lines.push(&line);
    if !unchanged || old.lines().filter(|l| l.starts_with(&prefix)).count() != 1 {
        let tmp = dir.join(format!("known_hosts.{}.tmp", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| failed("write", &tmp, &e))?;
        let mut text = lines.join("\n");
        text.push('\n');
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| failed("write", &tmp, &e))?;
        std::fs::rename(&tmp, &known_hosts).map_err(|e| failed("write", &known_hosts, &e))?;
    }
    Ok(Pin { known_hosts, alias })
}

/// A value for ssh_config, quoted where it has a space.
fn quoted(path: &Path) -> String {
    let text = path.display().to_string();
    if text.contains([' ', '\t']) {
        format!("\"{text}\"")
    } else {
        text
    }
}

/// The `Host` block of one reservation.
pub fn host_block(
    r: &Reservation,
    info: &SshEndpointInfo,
    pin: &Pin,
    identity: Option<&Path>,
) -> String {
    let mut block = format!(
        "# gpurent reservation {id}: {count}x {gpu}\n\
         Host gpurent-{id}\n  \
         HostName {host}\n  \
         Port {port}\n  \
         User {id}\n  \
         HostKeyAlias {alias}\n  \
         UserKnownHostsFile {known_hosts}\n  \
         StrictHostKeyChecking yes\n",
        id = r.id,
        count = r.gpu_count,
        // A comment ends at a newline: none gets in.
        gpu = r.gpu_type.replace(|c: char| c.is_control(), "?"),
        host = info.host,
        port = info.port,
        alias = pin.alias,
        known_hosts = quoted(&pin.known_hosts),
    );
    if let Some(identity) = identity {
        let identity = std::path::absolute(identity).unwrap_or_else(|_| identity.to_owned());
        block.push_str(&format!(
            "  IdentityFile {}\n  IdentitiesOnly yes\n",
            quoted(&identity)
        ));
    }
    block
}

/// One line of `--json` output per block.
#[derive(Debug, serde::Serialize)]
struct HostEntry<'a> {
    host_alias: String,
    host: &'a str,
    port: u16,
    user: &'a str,
    known_hosts: &'a Path,
    host_key_alias: &'a str,
}

/// An id or a name the server sent, checked before it goes into a config file: an id with a
/// space or a newline could add directives of its own.
fn plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub async fn run(api: &ApiClient, args: SshConfigArgs, json: bool) -> Result<(), CliError> {
    let reservations: Vec<Reservation> = match &args.id {
        Some(id) => vec![super::ssh::running(api, id).await?],
        None => api
            .get_all::<Reservation>("/api/v1/reservations")
            .await?
            .into_iter()
            .filter(|r| r.status == ReservationStatus::Running)
            .collect(),
    };
    let info = super::ssh::endpoint(api).await?;
    if !gpurent_server::ssh::valid_host(&info.host) {
        return Err(CliError::new(
            "bad_response",
            format!(
                "the control plane's SSH host {:?} is not a host name",
                info.host
            ),
        ));
    }
    let pin = pin_host_key(&info)?;
    let reservations: Vec<&Reservation> = reservations.iter().filter(|r| plain(&r.id)).collect();
    if json {
        let entries: Vec<HostEntry<'_>> = reservations
            .iter()
            .map(|r| HostEntry {
                host_alias: format!("gpurent-{}", r.id),
                host: &info.host,
                port: info.port,
                user: &r.id,
                known_hosts: &pin.known_hosts,
                host_key_alias: &pin.alias,
            })
            .collect();
        return print_json(&entries);
    }
    if reservations.is_empty() {
        eprintln!("no running reservation: nothing to connect to");
    }
    let blocks: Vec<String> = reservations
        .iter()
        .map(|r| host_block(r, &info, &pin, args.identity.as_deref()))
        .collect();
    print_raw(&blocks.join("\n"));
    Ok(())
}
