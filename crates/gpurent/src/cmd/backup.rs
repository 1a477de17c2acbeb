//! `gpurent admin backup` and `admin restore`: an online copy of the control plane (the
//! database as of one commit, and the data dir's keys without which it cannot be opened), and
//! its way back into a data dir a control plane starts on. Local operations on the data dir or
//! the database, not API calls: they need no token. The file's layout is `backup_archive`'s;
//! the database's copy and restore are the store's (`gpurent_store::backup`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpurent_store::backup::{self as db, BackupError, DatabaseFacts, PgTools};

use super::backup_archive::{self as archive, ArchiveError, Entry, Manifest};
use crate::api_client::CliError;
use crate::cli::{BackupArgs, RestoreArgs};
use crate::output::{print_json, print_line};

/// What a backup takes from the data dir besides the database, when there: the master key that
/// opens every sealed secret (tenants' secrets, and the node CA, audit key and SSH host key
/// sealed in the database), the admin token, the files the server keeps beside (the CA's
/// certificate, TLS, an older version's audit and CA keys), and `up`'s local agent's identity,
/// so that it resumes its node (a node's name is taken once). Not the lock, `server.url`,
/// `ssh.addr` (of a running server) or the agent's instances.
const DATA_FILES: [&str; 14] = [
    "master.key",
    "admin.token",
    "audit.key",
    "ca.pem",
    "ca.key",
    "ca.key.sealed",
    "tls.crt",
    "tls.key",
    "tls.fingerprint",
    gpurent_server::ssh::HOST_KEY_FILE,
    "agent/node.json",
    "agent/node.crt",
    "agent/node.key",
    "agent/node-ca.pem",
];

pub(super) const SQLITE_COPY: &str = "database.sqlite";
pub(super) const PG_DUMP: &str = "database.pgdump";
pub(super) const DATABASE_FILE: &str = "gpurent.db";

pub(super) fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> CliError {
    let message = format!("cannot {what} {}", path.display());
    move |e| CliError::new("io", format!("{message}: {e}"))
}

pub(super) fn store_error(e: BackupError) -> CliError {
    let code = match &e {
        BackupError::NotGpurent { .. } => "not_gpurent",
        BackupError::Damaged(_) | BackupError::DumpLacks { .. } => "damaged",
        BackupError::NotEmpty { .. } => "not_empty",
        BackupError::Spawn { .. } | BackupError::Tool { .. } => "tool_failed",
        BackupError::Open { .. } | BackupError::Database { .. } => "database",
    };
    CliError::new(code, chain(&e))
}

pub(super) fn archive_error(e: ArchiveError) -> CliError {
    let code = match &e {
        ArchiveError::NotABackup(_) => "not_a_backup",
        ArchiveError::Truncated(_) => "truncated",
        ArchiveError::Damaged(_) => "damaged",
        ArchiveError::Io { .. } => "io",
    };
    CliError::new(code, chain(&e))
}

/// An error and its causes, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// A directory of work files, removed whatever happens.
pub(super) struct Stage(pub(super) PathBuf);

impl Stage {
    pub(super) fn new(path: PathBuf) -> Result<Stage, CliError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(io("create the work directory", &path))?;
        Ok(Stage(path))
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Progress on stderr every few seconds of a long copy (stdout is for the result).
pub(super) struct Progress {
    what: String,
    total: u64,
    done: u64,
    last: Instant,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(2);

    pub(super) fn new(what: impl Into<String>, total: u64) -> Progress {
        Progress {
            what: what.into(),
            total,
            done: 0,
            last: Instant::now(),
        }
    }

    pub(super) fn advance(&mut self, n: u64) {
        self.done += n;
        if self.last.elapsed() >= Self::EVERY {
            self.last = Instant::now();
            let percent = (self.done * 100).checked_div(self.total).unwrap_or(100);
            eprintln!(
                "gpurent: {}: {} of {} ({percent}%)",
                self.what,
                mib(self.done),
                mib(self.total)
            );
        }
    }
}

pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// While the database is copied (one statement, or pg_dump), says how far the copy has grown.
fn watch_growth(path: PathBuf, what: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Progress::EVERY).await;
            let written = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            eprintln!("gpurent: {what}: {} written", mib(written));
        }
    })
}

/// The file of a `sqlite://PATH[?options]` URL.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://")?;
    Some(PathBuf::from(rest.split_once('?').map_or(rest, |(p, _)| p)))
}

pub(super) fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The master key as the server would find it: `GPURENT_MASTER_KEY`, `--master-key-file`,
/// else DATA_DIR/master.key; `None` when there is none to take.
fn master_key(args: &BackupArgs) -> Result<Option<Vec<u8>>, CliError> {
    if let Ok(hex) = std::env::var("GPURENT_MASTER_KEY") {
        return Ok(Some(format!("{}\n", hex.trim()).into_bytes()));
    }
    let path = match &args.master_key_file {
        Some(path) => path.clone(),
        None => args.data_dir.join("master.key"),
    };
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && args.master_key_file.is_none() => {
            Ok(None)
        }
        Err(e) => Err(io("read the master key", &path)(e)),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    use std::io::Write;
    if let Some(parent) = path.parent() {
        private_dirs(parent)?;
    }
    let mut file = archive::private_file(path).map_err(archive_error)?;
    file.write_all(bytes).map_err(io("write", path))
}

pub(super) fn private_dirs(dir: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("create", dir))
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), CliError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
}

pub async fn backup(args: BackupArgs, json: bool) -> Result<(), CliError> {
    let started = Instant::now();
    let created_at = chrono::Utc::now();
    let name = args
        .file
        .file_name()
        .ok_or_else(|| CliError::new("invalid_value", "the backup FILE names no file"))?
        .to_string_lossy()
        .into_owned();
    let parent = match args.file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    // Beside the file: the same file system, so that the rename into place is atomic.
    let stage = Stage::new(parent.join(format!(".{name}.gpurent-backup-{}", std::process::id())))?;
    let url = args.database_url.clone();
    let (store, copy, facts) = match url.as_deref() {
        Some(url) if is_postgres(url) => {
            let dest = stage.0.join(PG_DUMP);
            let growth = watch_growth(dest.clone(), "pg_dump");
            let tools = PgTools {
                bin: args.pg_bin.clone(),
            };
            let facts = db::dump_postgres(url, &dest, &tools).await;
            growth.abort();
            ("postgres", PG_DUMP, facts.map_err(store_error)?)
        }
        Some(url) => {
            let path = sqlite_path(url).ok_or_else(|| {
                CliError::new(
                    "invalid_value",
                    "--database-url must be sqlite://PATH or postgres://...",
                )
            })?;
            ("sqlite", SQLITE_COPY, copy_sqlite(&path, &stage).await?)
        }
        None => {
            let path = args.data_dir.join(DATABASE_FILE);
            ("sqlite", SQLITE_COPY, copy_sqlite(&path, &stage).await?)
        }
    };
    let key = master_key(&args)?;
    if let Some(key) = &key {
        write_private(&stage.0.join("data/master.key"), key)?;
    } else {
        eprintln!(
            "warning: no master key found ({}, --master-key-file, GPURENT_MASTER_KEY): this \
             backup cannot open the secrets sealed in its database; keep the key apart",
            args.data_dir.join("master.key").display()
        );
    }
    let mut names = vec![copy.to_owned()];
    if key.is_some() {
        names.push("data/master.key".to_owned());
    }
    for file in DATA_FILES.iter().filter(|f| **f != "master.key") {
        match std::fs::read(args.data_dir.join(file)) {
            Ok(bytes) => {
                write_private(&stage.0.join("data").join(file), &bytes)?;
                names.push(format!("data/{file}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("read", &args.data_dir.join(file))(e)),
        }
    }
    let files = names
        .into_iter()
        .map(|name| {
            let (bytes, crc32) = archive::measure(&stage.0.join(&name)).map_err(archive_error)?;
            Ok(Entry { name, bytes, crc32 })
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let manifest = Manifest {
        format: archive::FORMAT.to_owned(),
        format_version: archive::FORMAT_VERSION,
        gpurent_version: env!("CARGO_PKG_VERSION").to_owned(),
        store: store.to_owned(),
        created_at,
        schema_version: facts.schema_version,
        reservations: facts.reservations,
        files,
    };
    let total = manifest.files.iter().map(|f| f.bytes).sum();
    let tmp = stage.0.join("backup.tar");
    let bytes = {
        let file = archive::private_file(&tmp).map_err(archive_error)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let mut progress = Progress::new("writing the backup", total);
        let bytes = archive::write(&mut out, &manifest, |name| stage.0.join(name), &mut |n| {
            progress.advance(n)
        })
        .map_err(archive_error)?;
        let file = out
            .into_inner()
            .map_err(|e| io("write", &tmp)(e.into_error()))?;
        file.sync_all().map_err(io("write", &tmp))?;
        bytes
    };
    std::fs::rename(&tmp, &args.file).map_err(io("write", &args.file))?;
    sync_dir(&parent)?;
    let seconds = started.elapsed().as_secs_f64();
    if json {
        return print_json(&serde_json::json!({
            "file": args.file.display().to_string(),
            "bytes": bytes,
            "store": store,
            "schema_version": facts.schema_version,
            "reservations": facts.reservations,
            "created_at": created_at,
            "files": manifest.files.iter().map(|f| &f.name).collect::<Vec<_>>(),
            "seconds": seconds,
        }));
    }
    print_line(&format!(
        "backup of the {store} control plane written to {} ({}, {} reservations, schema {}) in \
         {seconds:.1} s; it holds secrets (the master key): keep it as you keep that key",
        args.file.display(),
        mib(bytes),
        facts.reservations,
        facts.schema_version
    ));
    Ok(())
}

async fn copy_sqlite(path: &Path, stage: &Stage) -> Result<DatabaseFacts, CliError> {
    if !path.exists() {
        return Err(CliError::new(
            "not_found",
            format!(
                "no database at {}: give the control plane's --data-dir (or --database-url)",
                path.display()
            ),
        ));
    }
    let dest = stage.0.join(SQLITE_COPY);
    let growth = watch_growth(dest.clone(), "copying the database");
    let facts = db::copy_sqlite(path, &dest).await;
    growth.abort();
    facts.map_err(store_error)
}

/// The names a backup may hold: anything else in a manifest is refused (a hostile file must
/// not name a path outside the data dir).
pub(super) fn known_name(name: &str) -> bool {
    name == SQLITE_COPY
        || name == PG_DUMP
        || name
            .strip_prefix("data/")
            .is_some_and(|file| DATA_FILES.contains(&file))
}

pub async fn restore(args: RestoreArgs, json: bool) -> Result<(), CliError> {
    super::backup_restore::run(args, json).await
}
