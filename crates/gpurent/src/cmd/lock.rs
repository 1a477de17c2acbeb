//! The data dir's lock and the URL it serves: one `up`/`server` per SQLite data dir
//! (`DATA_DIR/gpurent.lock`, an flock the kernel drops when the process ends, kill -9 too),
//! and `DATA_DIR/server.url`, which tells the CLI where the dir's admin token may be sent.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The lock file in a data dir: while a daemon runs, it holds the lock and its pid and URL.
pub const LOCK_FILE: &str = "gpurent.lock";

/// The URL the daemon of a data dir serves, written once it is ready.
pub const SERVER_URL_FILE: &str = "server.url";

/// Whether a daemon holds the lock of `dir` now: `Some(false)` when the lock file is there
/// and free (its daemon ended, kill -9 included, so its `server.url` is stale), `None` when
/// there is none to ask (a PostgreSQL `server` takes no lock).
pub fn is_held(dir: &Path) -> Option<bool> {
    let file = File::open(dir.join(LOCK_FILE)).ok()?;
    match file.try_lock_shared() {
        // Taken for a moment and released when `file` is dropped.
        Ok(()) => Some(false),
        Err(std::fs::TryLockError::WouldBlock) => Some(true),
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

/// A held data dir; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of `dir` or says who holds it.
    pub fn acquire(dir: &Path) -> anyhow::Result<DataDirLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                // Empty when the holder has not written yet: it is starting.
                let _ = file.read_to_string(&mut holder);
                bail!(
                    "the data dir {} is in use by another gpurent ({}; lock {}): stop it first, \
                     or give this one another --data-dir",
                    dir.display(),
                    describe_holder(&holder),
                    path.display()
                );
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
        let mut lock = DataDirLock { file, path };
        lock.record(None)?;
        Ok(lock)
    }

    /// Records the URL now served beside the pid, in the lock and in `server.url`.
    pub fn serving(&mut self, url: &str) -> anyhow::Result<()> {
        self.record(Some(url))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        write_server_url(dir, url)
    }

    fn record(&mut self, url: Option<&str>) -> anyhow::Result<()> {
        let mut text = format!("pid={}\n", std::process::id());
        if let Some(url) = url {
            text.push_str(&format!("url={url}\n"));
        }
        let write = |file: &mut File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            file.write_all(text.as_bytes())
        };
        write(&mut self.file).with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// "pid 123, serving http://..." from a lock file's text.
fn describe_holder(text: &str) -> String {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).map(str::trim).map(str::to_owned))
    };
    match (field("pid="), field("url=")) {
        (Some(pid), Some(url)) => format!("pid {pid}, serving {url}"),
        (Some(pid), None) => format!("pid {pid}, still starting"),
        _ => "starting".to_owned(),
    }
}

/// Writes `DATA_DIR/server.url` (atomically: a reader never sees half of it).
pub fn write_server_url(dir: &Path, url: &str) -> anyhow::Result<()> {
    let path = dir.join(SERVER_URL_FILE);
    let tmp = dir.join(format!("{SERVER_URL_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(format!("{url}\n").as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}

/// Removes `DATA_DIR/server.url` at a clean stop: the port may serve someone else next.
pub fn remove_server_url(dir: &Path) {
    let path = dir.join(SERVER_URL_FILE);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_dir_is_refused_naming_its_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = DataDirLock::acquire(dir.path()).unwrap();
        first.serving("http://127.0.0.1:8080").unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err().to_string();
        let pid = std::process::id().to_string();
        assert!(
            err.contains(&format!("pid {pid}, serving http://127.0.0.1:8080")),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join(SERVER_URL_FILE)).unwrap(),
            "http://127.0.0.1:8080\n"
        );
        drop(first);
        DataDirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_holder_that_is_starting_is_described_as_such() {
        assert_eq!(describe_holder("pid=7\n"), "pid 7, still starting");
        assert_eq!(describe_holder(""), "starting");
    }
}
