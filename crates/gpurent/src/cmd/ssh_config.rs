//! `gpurent ssh-config [ID]`: OpenSSH `Host` blocks for running reservations, and the
//! known_hosts file (in the CLI's config dir) that pins the control plane's host key for them
//! and for `gpurent ssh`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use gpurent_server::ssh::SshEndpointInfo;
use gpurent_types::api::Reservation;
use gpurent_types::ReservationStatus;

use crate::api_client::{ApiClient, CliError};
use crate::cli::SshConfigArgs;
use crate::output::{escape_control, print_json, print_raw};

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

fn file_error(what: &str, path: &Path, e: &dyn std::fmt::Display) -> CliError {
    CliError::new(
        "local_file",
        format!("cannot {what} {}: {e}", path.display()),
    )
}

/// Replaces `path` with `text` in one rename, so that a reader sees the old file or the new
/// one; the new file has `mode`.
fn replace_file(path: &Path, text: &str, mode: u32) -> Result<(), CliError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(file_error("write", &tmp, &e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_error("write", path, &e)
    })
}

/// A file's text, "" when it is not there.
fn read_or_empty(path: &Path) -> Result<String, CliError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(file_error("read", path, &e)),
    }
}

/// The CLI's config dir, made owner-only.
fn private_config_dir() -> Result<PathBuf, CliError> {
    let dir = config_dir()?;
    super::private::private_dir(&dir).map_err(|e| file_error("create", &dir, &format!("{e:#}")))?;
    Ok(dir)
}

/// Writes (or updates) the known_hosts file with the endpoint's host key under its alias,
/// leaving the other lines as they were. Owner-only.
pub fn pin_host_key(info: &SshEndpointInfo) -> Result<Pin, CliError> {
    let dir = private_config_dir()?;
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
    let old = read_or_empty(&known_hosts)?;
    let prefix = format!("{alias} ");
    let mut lines: Vec<&str> = old.lines().filter(|l| !l.starts_with(&prefix)).collect();
    let pinned: Vec<&str> = old.lines().filter(|l| l.starts_with(&prefix)).collect();
    if pinned != [line.as_str()] {
        lines.push(&line);
        let mut text = lines.join("\n");
        text.push('\n');
        replace_file(&known_hosts, &text, 0o600)?;
    }
    Ok(Pin { known_hosts, alias })
}

/// `--write`: the blocks into the CLI's own ssh_config, and an `Include` of it at the top of
/// ~/.ssh/config (where it applies to every host) unless one is there. Returns (the file,
/// whether the Include was added).
fn write_config(blocks: &str) -> Result<(PathBuf, Option<PathBuf>), CliError> {
    let file = private_config_dir()?.join("ssh_config");
    replace_file(&file, blocks, 0o600)?;
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| CliError::new("no_config_dir", "HOME is not set: no ~/.ssh/config"))?;
    let ssh_dir = home.join(".ssh");
    // Made 0700 when missing; an existing one's mode is its owner's business.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&ssh_dir)
        .map_err(|e| file_error("create", &ssh_dir, &e))?;
    // A ~/.ssh/config that is a link (a dotfiles checkout) is edited where it points.
    let user_config = ssh_dir.join("config");
    let user_config = std::fs::canonicalize(&user_config).unwrap_or(user_config);
    let old = read_or_empty(&user_config)?;
    let include = format!("Include {}", quoted(&file));
    if old.lines().any(|l| l.trim() == include) {
        return Ok((file, None));
    }
    let mode = std::fs::metadata(&user_config)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
        .unwrap_or(0o600);
    let text = format!("# Added by gpurent ssh-config --write\n{include}\n\n{old}");
    replace_file(&user_config, &text, mode)?;
    Ok((file, Some(user_config)))
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
    let blocks: Vec<String> = reservations
        .iter()
        .map(|r| host_block(r, &info, &pin, args.identity.as_deref()))
        .collect();
    let blocks = blocks.join("\n");
    if args.write {
        let (file, included) = write_config(&blocks)?;
        eprintln!(
            "wrote {} Host block(s) to {}",
            reservations.len(),
            escape_control(&file.display().to_string())
        );
        if let Some(user_config) = included {
            eprintln!(
                "added `Include {}` at the top of {}",
                escape_control(&file.display().to_string()),
                escape_control(&user_config.display().to_string())
            );
        }
    }
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
    if !args.write {
        print_raw(&blocks);
    }
    Ok(())
}
