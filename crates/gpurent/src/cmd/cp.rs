//! `gpurent cp SRC DST`: files and (with -r) directories into or out of a running
//! reservation over SFTP, with gpurent's own SSH client; modes are kept. The same copies,
//! over SFTP on an upgraded API connection, serve `gpurent volumes cp`.

use std::io::IsTerminal;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use russh_sftp::client::SftpSession;
use russh_sftp::protocol::{FileAttributes, OpenFlags};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ssh_client;
use crate::api_client::{ApiClient, CliError};
use crate::cli::CpArgs;
use crate::output::{print_json, print_line};

/// Files at least this big get a progress line on a terminal.
const PROGRESS_MIN_BYTES: u64 = 4 * 1024 * 1024;

/// What one read or write moves at most.
const CHUNK: usize = 256 * 1024;

/// The SFTP client's settings: bigger writes and more of them in flight than the defaults
/// (32 KiB, 16), since a relayed link has latency to hide; the server's own limits still apply.
pub fn sftp_config() -> russh_sftp::client::Config {
    russh_sftp::client::Config {
        max_write_packet_len: 256 * 1024,
        max_concurrent_reads: 32,
        max_concurrent_writes: 32,
        // A request waits behind the ones before it (an fsync of a big file, say).
        request_timeout_secs: 120,
        ..russh_sftp::client::Config::default()
    }
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    /// `ID:PATH` (an empty path: the instance's working directory).
    Remote {
        id: String,
        path: String,
    },
}

impl Location {
    /// `ID:PATH` when there is a colon with no slash before it (as scp reads it: write
    /// `./a:b` for a local file with a colon), else a local path.
    pub fn parse(text: &str) -> Location {
        match text.split_once(':') {
            Some((id, path)) if !id.is_empty() && !id.contains('/') => Location::Remote {
                id: id.to_owned(),
                path: path.strip_prefix("~/").unwrap_or(path).to_owned(),
            },
            _ => Location::Local(PathBuf::from(text)),
        }
    }
}

fn local_error(what: &str, path: &Path, e: &dyn std::fmt::Display) -> CliError {
    CliError::new(
        "local_file",
        format!("cannot {what} {}: {e}", path.display()),
    )
}

fn remote_error(what: &str, path: &str, e: &dyn std::fmt::Display) -> CliError {
    CliError::new("remote_file", format!("cannot {what} {path:?}: {e}"))
}

/// `dir/name` in the instance.
fn remote_join(dir: &str, name: &str) -> String {
    match dir {
        "" | "." => name.to_owned(),
        d if d.ends_with('/') => format!("{d}{name}"),
        d => format!("{d}/{name}"),
    }
}

/// The last component of a path in the instance.
fn remote_name(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .unwrap_or("")
}

/// A progress line on stderr for big files on a terminal: bytes so far and the rate.
struct Progress {
    name: String,
    total: u64,
    done: u64,
    started: Instant,
    shown: Option<Instant>,
    enabled: bool,
}

impl Progress {
    fn new(name: &str, total: u64) -> Progress {
        Progress {
            name: name.to_owned(),
            total,
            done: 0,
            started: Instant::now(),
            shown: None,
            enabled: total >= PROGRESS_MIN_BYTES && std::io::stderr().is_terminal(),
        }
    }

    fn add(&mut self, n: usize) {
        self.done += n as u64;
        if self.enabled
            && self
                .shown
                .is_none_or(|t| t.elapsed() >= Duration::from_millis(200))
        {
            self.shown = Some(Instant::now());
            self.show("\r");
        }
    }

    fn show(&self, start: &str) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        eprint!(
            "{start}{}  {:.1} / {:.1} MiB  {:.1} MiB/s   ",
            crate::output::escape_control(&self.name),
            mib(self.done),
            mib(self.total),
            mib(self.done) / secs
        );
    }

    fn finish(&self) {
        if self.enabled {
            self.show("\r");
            eprintln!();
        }
    }
}

/// Copies a local file to `remote` (a file path), then gives it the local file's mode.
async fn upload_file(
    sftp: &SftpSession,
    local: &Path,
    remote: &str,
    mode: u32,
) -> Result<u64, CliError> {
    let mut file = tokio::fs::File::open(local)
        .await
        .map_err(|e| local_error("read", local, &e))?;
    let total = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let attrs = FileAttributes {
        permissions: Some(mode & 0o7777),
        ..FileAttributes::empty()
    };
    let mut out = sftp
        .open_with_flags_and_attributes(
            remote,
            OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::WRITE,
            attrs.clone(),
        )
        .await
        .map_err(|e| remote_error("create", remote, &e))?;
    let mut progress = Progress::new(&local.display().to_string(), total);
    let mut buf = vec![0u8; CHUNK];
    let copied = async {
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| local_error("read", local, &e))?;
            if n == 0 {
                break;
            }
            out.write_all(buf.get(..n).unwrap_or_default())
                .await
                .map_err(|e| remote_error("write", remote, &e))?;
            progress.add(n);
        }
        out.shutdown()
            .await
            .map_err(|e| remote_error("write", remote, &e))
    }
    .await;
    if let Err(e) = copied {
        // No partial file is left behind (a full disk, a local read error).
        let _ = sftp.remove_file(remote).await;
        return Err(e);
    }
    progress.finish();
    // The server's umask applied at creation; the mode is the local file's.
    sftp.set_metadata(remote, attrs)
        .await
        .map_err(|e| remote_error("set the mode of", remote, &e))?;
    Ok(progress.done)
}

/// Copies `remote` (a file) to a local file, then gives it the remote file's mode.
async fn download_file(
    sftp: &SftpSession,
    remote: &str,
    local: &Path,
    meta: &FileAttributes,
) -> Result<u64, CliError> {
    let mut file = sftp
        .open_with_flags(remote, OpenFlags::READ)
        .await
        .map_err(|e| remote_error("open", remote, &e))?;
    let mut out = tokio::fs::File::create(local)
        .await
        .map_err(|e| local_error("create", local, &e))?;
    let mut progress = Progress::new(remote, meta.len());
    let mut buf = vec![0u8; CHUNK];
    let copied = async {
        loop {
            let n = file
                .read(&mut buf)
                .await
                .map_err(|e| remote_error("read", remote, &e))?;
            if n == 0 {
                break;
            }
            out.write_all(buf.get(..n).unwrap_or_default())
                .await
                .map_err(|e| local_error("write", local, &e))?;
            progress.add(n);
        }
        out.sync_all()
            .await
            .map_err(|e| local_error("write", local, &e))
    }
    .await;
    if let Err(e) = copied {
        // No partial file is left behind.
        let _ = std::fs::remove_file(local);
        return Err(e);
    }
    progress.finish();
    let _ = file.shutdown().await;
    if let Some(mode) = meta.permissions {
        std::fs::set_permissions(local, std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| local_error("set the mode of", local, &e))?;
    }
    Ok(progress.done)
}

/// Whether `remote` is a directory (false when it does not exist).
async fn remote_is_dir(sftp: &SftpSession, remote: &str) -> bool {
    let path = if remote.is_empty() { "." } else { remote };
    sftp.metadata(path).await.is_ok_and(|m| m.is_dir())
}

/// Copies `local` into the instance at `remote`; into it when it is a directory.
pub async fn upload(
    sftp: &SftpSession,
    local: &Path,
    remote: &str,
    recursive: bool,
) -> Result<u64, CliError> {
    let meta = std::fs::metadata(local).map_err(|e| local_error("read", local, &e))?;
    let name = local
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| local_error("copy", local, &"it has no file name"))?;
    let into_dir = remote.is_empty() || remote.ends_with('/') || remote_is_dir(sftp, remote).await;
    let dest = if into_dir {
        remote_join(remote, &name)
    } else {
        remote.to_owned()
    };
    if meta.is_dir() {
        if !recursive {
            return Err(local_error("copy", local, &"it is a directory: give -r"));
        }
        return Box::pin(upload_dir(sftp, local, &dest)).await;
    }
    upload_file(sftp, local, &dest, meta.permissions().mode()).await
}

async fn upload_dir(sftp: &SftpSession, local: &Path, remote: &str) -> Result<u64, CliError> {
    let mode = std::fs::metadata(local)
        .map_err(|e| local_error("read", local, &e))?
        .permissions()
        .mode();
    if !remote_is_dir(sftp, remote).await {
        sftp.create_dir(remote)
            .await
            .map_err(|e| remote_error("create the directory", remote, &e))?;
    }
    let mut bytes = 0;
    let mut entries: Vec<_> = std::fs::read_dir(local)
        .map_err(|e| local_error("list", local, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| local_error("list", local, &e))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let dest = remote_join(remote, &name);
        let kind = entry
            .file_type()
            .map_err(|e| local_error("read", &path, &e))?;
        if kind.is_dir() {
            bytes += Box::pin(upload_dir(sftp, &path, &dest)).await?;
        } else if kind.is_file() {
            let mode = entry
                .metadata()
                .map_err(|e| local_error("read", &path, &e))?
                .permissions()
                .mode();
            bytes += upload_file(sftp, &path, &dest, mode).await?;
        } else {
            eprintln!(
                "skipped {} (a symbolic link or special file)",
                crate::output::escape_control(&path.display().to_string())
            );
        }
    }
    let attrs = FileAttributes {
        permissions: Some(mode & 0o7777),
        ..FileAttributes::empty()
    };
    sftp.set_metadata(remote, attrs)
        .await
        .map_err(|e| remote_error("set the mode of", remote, &e))?;
    Ok(bytes)
}

/// Copies `remote` out of the instance to `local`; into it when it is a directory.
pub async fn download(
    sftp: &SftpSession,
    remote: &str,
    local: &Path,
    recursive: bool,
) -> Result<u64, CliError> {
    let path = if remote.is_empty() { "." } else { remote };
    let meta = sftp
        .metadata(path)
        .await
        .map_err(|e| remote_error("read", path, &e))?;
    let dest = if local.is_dir() {
        let name = remote_name(path);
        if name.is_empty() {
            return Err(remote_error("copy", path, &"it has no file name"));
        }
        local.join(name)
    } else {
        local.to_owned()
    };
    if meta.is_dir() {
        if !recursive {
            return Err(remote_error("copy", path, &"it is a directory: give -r"));
        }
        return Box::pin(download_dir(sftp, path, &dest, &meta)).await;
    }
    download_file(sftp, path, &dest, &meta).await
}

async fn download_dir(
    sftp: &SftpSession,
    remote: &str,
    local: &Path,
    meta: &FileAttributes,
) -> Result<u64, CliError> {
    if !local.is_dir() {
        std::fs::create_dir(local).map_err(|e| local_error("create", local, &e))?;
    }
    let mut entries: Vec<_> = sftp
        .read_dir(remote)
        .await
        .map_err(|e| remote_error("list", remote, &e))?
        .filter(|e| e.file_name() != "." && e.file_name() != "..")
        .collect();
    entries.sort_by_key(|e| e.file_name());
    let mut bytes = 0;
    for entry in entries {
        let name = entry.file_name();
        // A name from the server is one path component, never a way out of `local`.
        if name.contains('/') || name.is_empty() {
            continue;
        }
        let source = remote_join(remote, &name);
        let dest = local.join(&name);
        let entry_meta = entry.metadata();
        let kind = entry.file_type();
        if kind.is_dir() {
            bytes += Box::pin(download_dir(sftp, &source, &dest, &entry_meta)).await?;
        } else if kind.is_file() {
            bytes += download_file(sftp, &source, &dest, &entry_meta).await?;
        } else {
            eprintln!(
                "skipped {} (a symbolic link or special file)",
                crate::output::escape_control(&source)
            );
        }
    }
    if let Some(mode) = meta.permissions {
        std::fs::set_permissions(local, std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| local_error("set the mode of", local, &e))?;
    }
    Ok(bytes)
}

pub async fn run(api: &ApiClient, args: CpArgs, json: bool) -> Result<(), CliError> {
    let (id, upload_from, remote, download_to) =
        match (Location::parse(&args.src), Location::parse(&args.dst)) {
            (Location::Local(src), Location::Remote { id, path }) => (id, Some(src), path, None),
            (Location::Remote { id, path }, Location::Local(dst)) => (id, None, path, Some(dst)),
            (Location::Local(_), Location::Local(_)) => {
                return Err(CliError::new(
                    "invalid_value",
                    "neither side is in a reservation: write one of them as ID:PATH",
                ))
            }
            (Location::Remote { .. }, Location::Remote { .. }) => {
                return Err(CliError::new(
                    "invalid_value",
                    "both sides are in reservations: copy through a local file",
                ))
            }
        };
    let target = super::ssh::target(api, &id, &args.ssh).await?;
    let connection = ssh_client::connect(&target, args.ssh.identity.as_deref()).await?;
    let sftp = connection.sftp().await?;
    let started = Instant::now();
    let bytes = match (upload_from, download_to) {
        (Some(local), _) => upload(&sftp, &local, &remote, args.recursive).await,
        (_, Some(local)) => download(&sftp, &remote, &local, args.recursive).await,
        (None, None) => Ok(0),
    };
    let _ = sftp.close().await;
    connection.close().await;
    report(bytes?, started, json)
}

/// Says what a copy moved: `{"bytes"}`, or a line with its rate.
pub fn report(bytes: u64, started: Instant, json: bool) -> Result<(), CliError> {
    if json {
        return print_json(&serde_json::json!({ "bytes": bytes }));
    }
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    print_line(&format!(
        "copied {bytes} bytes ({:.1} MiB/s)",
        bytes as f64 / (1024.0 * 1024.0) / secs
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_read_as_scp_reads_them() {
        assert_eq!(
            Location::parse("r-1:/data/x"),
            Location::Remote {
                id: "r-1".into(),
                path: "/data/x".into()
            }
        );
        assert_eq!(
            Location::parse("r-1:"),
            Location::Remote {
                id: "r-1".into(),
                path: String::new()
            }
        );
        assert_eq!(
            Location::parse("r-1:~/x"),
            Location::Remote {
                id: "r-1".into(),
                path: "x".into()
            }
        );
        assert_eq!(
            Location::parse("./a:b"),
            Location::Local(PathBuf::from("./a:b"))
        );
        assert_eq!(
            Location::parse("/tmp/x"),
            Location::Local(PathBuf::from("/tmp/x"))
        );
        assert_eq!(Location::parse(":x"), Location::Local(PathBuf::from(":x")));
    }

    #[test]
    fn remote_paths_join_and_name() {
        assert_eq!(remote_join("", "f"), "f");
        assert_eq!(remote_join("/d/", "f"), "/d/f");
        assert_eq!(remote_join("/d", "f"), "/d/f");
        assert_eq!(remote_name("/d/f/"), "f");
        assert_eq!(remote_name(".."), "");
    }
}
