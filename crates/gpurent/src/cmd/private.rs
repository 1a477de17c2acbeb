//! Owner-only files of the daemons: data dirs 0700, secrets and SQLite databases 0600, made so
//! at every start (with a warning naming what an older version or an operator left readable).

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The secrets `up` and `server` keep in their data dir (`tls.key` and `ca.key*` only with TLS;
/// `admin.token.new` only for a moment at the first start).
const SERVER_SECRETS: [&str; 7] = [
    "admin.token",
    "admin.token.new",
    "master.key",
    "audit.key",
    "tls.key",
    "ca.key",
    "ca.key.sealed",
];

/// The secrets an agent keeps in its data dir: its node token and its client key.
const AGENT_SECRETS: [&str; 2] = ["node.json", "node.key"];

/// What SQLite keeps beside a database file: as secret as the database.
const SQLITE_SIDE_FILES: [&str; 3] = ["-wal", "-shm", "-journal"];

/// The control plane's data dir, 0700, and the secrets in it, 0600.
pub fn server_data_dir(dir: &Path) -> anyhow::Result<()> {
    private_dir(dir)?;
    for name in SERVER_SECRETS {
        private_file(&dir.join(name))?;
    }
    Ok(())
}

/// An agent's data dir, 0700, and its identity, 0600.
pub fn agent_data_dir(dir: &Path) -> anyhow::Result<()> {
    private_dir(dir)?;
    for name in AGENT_SECRETS {
        private_file(&dir.join(name))?;
    }
    Ok(())
}

/// A `sqlite://PATH` database made 0600 before SQLite opens it: SQLite creates `-wal` and
/// `-shm` with the mode of the database file, so they are born 0600 too; ones an older version
/// left readable are fixed. Anything else (PostgreSQL, `:memory:`) is left alone.
pub fn sqlite_database(url: &str) -> anyhow::Result<()> {
    let Some(path) = sqlite_path(url) else {
        return Ok(());
    };
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path);
    match created {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => private_file(&path)?,
        // A missing parent, say: SQLite's own error says it better.
        Err(_) => return Ok(()),
    }
    for suffix in SQLITE_SIDE_FILES {
        let mut side = path.clone().into_os_string();
        side.push(suffix);
        private_file(&PathBuf::from(side))?;
    }
    Ok(())
}

/// The file of a `sqlite://PATH[?options]` URL; `None` for other stores and in-memory ones.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://")?;
    let (path, options) = rest.split_once('?').unwrap_or((rest, ""));
    let in_memory = path.is_empty()
        || path.starts_with(":memory:")
        || options.split('&').any(|o| o == "mode=memory");
    (!in_memory).then(|| PathBuf::from(path))
}

/// A secret the operator keeps elsewhere (`--master-key-file`, `--audit-key`, `--tls-key`):
/// its mode is the operator's to choose, so one open to other users is only warned about.
pub fn warn_if_open(path: &Path) {
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = %format_args!("{mode:04o}"),
                "this secret is open to other users: make it 0600"
            );
        }
    }
}

/// Creates `dir` 0700 (with its parents), or makes an existing one 0700.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    restrict(dir, 0o700)
}

/// Makes an existing file 0600; a missing one is fine (it is made 0600 when it is made).
fn private_file(path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => restrict(path, 0o600),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot check the mode of {}", path.display())),
    }
}

/// Takes every permission of group and others from `path`, warning when there were some.
fn restrict(path: &Path, mode: u32) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot check the mode of {}", path.display()))?;
    let old = meta.permissions().mode() & 0o7777;
    if old & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).with_context(|| {
        format!(
            "{} is open to other users (mode {old:04o}) and cannot be made {mode:04o}",
            path.display()
        )
    })?;
    tracing::warn!(
        path = %path.display(),
        old_mode = %format_args!("{old:04o}"),
        new_mode = %format_args!("{mode:04o}"),
        "was open to other users: made private"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file_and_nothing_else_does() {
        assert_eq!(
            sqlite_path("sqlite:///var/lib/g/gpurent.db"),
            Some(PathBuf::from("/var/lib/g/gpurent.db"))
        );
        assert_eq!(
            sqlite_path("sqlite://data/x.db?mode=rwc"),
            Some(PathBuf::from("data/x.db"))
        );
        assert_eq!(sqlite_path("sqlite://:memory:"), None);
        assert_eq!(sqlite_path("sqlite://x.db?mode=memory"), None);
        assert_eq!(sqlite_path("postgres://u:p@h/db"), None);
    }

    #[test]
    fn an_open_file_is_made_private_and_a_private_one_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.db");
        std::fs::write(&db, b"").unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        let url = format!("sqlite://{}", db.display());
        sqlite_database(&url).unwrap();
        let mode = std::fs::metadata(&db).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let fresh = dir.path().join("new.db");
        sqlite_database(&format!("sqlite://{}", fresh.display())).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
