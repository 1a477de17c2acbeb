//! `gpurent admin restore`: a backup back into a data dir (and a PostgreSQL database), checked
//! whole before anything is put in place. The restored control plane is a point in the past:
//! migrations bring its schema up to date at its next start, and agents stop what it does not
//! know (docs/operations.md).

use std::path::Path;
use std::time::Instant;

use gpurent_store::backup::{self as db, PgTools};

use super::backup::{
    archive_error, io, is_postgres, known_name, mib, private_dirs, store_error, sync_dir, Progress,
    Stage, DATABASE_FILE, PG_DUMP, SQLITE_COPY,
};
use super::backup_archive::{self as archive, Manifest, FORMAT_VERSION};
use super::lock::{is_held, DataDirLock};
use crate::api_client::CliError;
use crate::cli::RestoreArgs;
use crate::output::{print_json, print_line};

/// The checks on the manifest alone: ours, not newer than this binary, of a store it can put
/// where it is asked to.
fn check_manifest(manifest: &Manifest, args: &RestoreArgs) -> Result<(), CliError> {
    if manifest.format_version > FORMAT_VERSION {
        return Err(CliError::new(
            "newer_backup",
            format!(
                "the backup's format is version {} and this gpurent ({}) reads up to {FORMAT_VERSION}: \
                 restore it with gpurent {} or later",
                manifest.format_version,
                env!("CARGO_PKG_VERSION"),
                manifest.gpurent_version
            ),
        ));
    }
    let known = db::schema_version();
    if manifest.schema_version > known {
        return Err(CliError::new(
            "newer_schema",
            format!(
                "the backup's database has schema version {} (gpurent {}), newer than this gpurent \
                 ({}) knows ({known}): restore it with gpurent {} or later",
                manifest.schema_version,
                manifest.gpurent_version,
                env!("CARGO_PKG_VERSION"),
                manifest.gpurent_version
            ),
        ));
    }
    if let Some(bad) = manifest.files.iter().find(|f| !known_name(&f.name)) {
        return Err(CliError::new(
            "not_a_backup",
            format!(
                "the backup names a file gpurent does not write: {:?}",
                bad.name
            ),
        ));
    }
    let to_postgres = args.database_url.as_deref().is_some_and(is_postgres);
    match manifest.store.as_str() {
        "sqlite" if to_postgres => Err(CliError::new(
            "wrong_store",
            "this is a backup of a SQLite control plane: restore it into a data dir, without \
             --database-url",
        )),
        "postgres" if !to_postgres => Err(CliError::new(
            "wrong_store",
            "this is a backup of a PostgreSQL control plane: give --database-url postgres://... \
             of an empty database to restore it into",
        )),
        "sqlite" | "postgres" => Ok(()),
        other => Err(CliError::new(
            "not_a_backup",
            format!("the backup's store is {other:?}"),
        )),
    }
}

/// Refuses a data dir that holds what the backup would replace, unless `--force`.
fn check_empty(dir: &Path, manifest: &Manifest, force: bool) -> Result<(), CliError> {
    if force {
        return Ok(());
    }
    let mut there: Vec<String> = manifest
        .files
        .iter()
        .filter_map(|f| f.name.strip_prefix("data/"))
        .filter(|f| dir.join(f).exists())
        .map(str::to_owned)
        .collect();
    if manifest.store == "sqlite"
        && std::fs::metadata(dir.join(DATABASE_FILE)).is_ok_and(|m| m.len() > 0)
    {
        there.insert(0, DATABASE_FILE.to_owned());
    }
    if there.is_empty() {
        return Ok(());
    }
    Err(CliError::new(
        "not_empty",
        format!(
            "the data dir {} already holds {}: restore into a new data dir, or give --force to \
             replace them",
            dir.display(),
            there.join(", ")
        ),
    ))
}

pub async fn run(args: RestoreArgs, json: bool) -> Result<(), CliError> {
    let started = Instant::now();
    let dir = args.data_dir.clone();
    let file = std::fs::File::open(&args.file).map_err(io("open", &args.file))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut reader = archive::Reader::new(std::io::BufReader::with_capacity(1 << 20, file));
    let manifest = reader.manifest().map_err(archive_error)?;
    check_manifest(&manifest, &args)?;
    if is_held(&dir) == Some(true) {
        // The lock's own message names the holder.
        let why = DataDirLock::acquire(&dir).err().map(|e| format!("{e:#}"));
        return Err(CliError::new(
            "in_use",
            why.unwrap_or_else(|| format!("the data dir {} is in use", dir.display())),
        ));
    }
    super::private::server_data_dir(&dir).map_err(|e| CliError::new("io", format!("{e:#}")))?;
    // Held to the end: no server starts on the dir while it is being restored.
    let _lock =
        DataDirLock::acquire(&dir).map_err(|e| CliError::new("in_use", format!("{e:#}")))?;
    check_empty(&dir, &manifest, args.force)?;
    let stage = Stage::new(dir.join(format!(".restore-{}", std::process::id())))?;
    let mut progress = Progress::new("reading the backup", size);
    for entry in &manifest.files {
        let dest = stage.0.join(&entry.name);
        if let Some(parent) = dest.parent() {
            private_dirs(parent)?;
        }
        reader
            .extract(entry, &dest, &mut |n| progress.advance(n))
            .map_err(archive_error)?;
    }
    reader.end().map_err(archive_error)?;
    let facts = if manifest.store == "postgres" {
        let url = args.database_url.as_deref().unwrap_or_default();
        let tools = PgTools {
            bin: args.pg_bin.clone(),
        };
        let dump = stage.0.join(PG_DUMP);
        db::check_dump(&dump, &tools).await.map_err(store_error)?;
        db::restore_postgres(url, &dump, &tools, args.force)
            .await
            .map_err(store_error)?
    } else {
        db::check_sqlite(&stage.0.join(SQLITE_COPY))
            .await
            .map_err(store_error)?
    };
    if facts.schema_version != manifest.schema_version
        || facts.reservations != manifest.reservations
    {
        return Err(CliError::new(
            "damaged",
            format!(
                "the restored database has schema {} and {} reservations, the manifest says {} \
                 and {}",
                facts.schema_version,
                facts.reservations,
                manifest.schema_version,
                manifest.reservations
            ),
        ));
    }
    put_in_place(&dir, &stage, &manifest)?;
    let seconds = started.elapsed().as_secs_f64();
    let has_key = manifest.files.iter().any(|f| f.name == "data/master.key");
    if !has_key {
        eprintln!(
            "warning: the backup holds no master key: put the one it was made with at {} (or \
             in GPURENT_MASTER_KEY) before starting",
            dir.join("master.key").display()
        );
    }
    if json {
        return print_json(&serde_json::json!({
            "data_dir": dir.display().to_string(),
            "store": manifest.store,
            "schema_version": manifest.schema_version,
            "reservations": manifest.reservations,
            "created_at": manifest.created_at,
            "gpurent_version": manifest.gpurent_version,
            "master_key": has_key,
            "seconds": seconds,
        }));
    }
    print_line(&format!(
        "restored the backup of {} (gpurent {}, schema {}, {} reservations, {}) into {} in \
         {seconds:.1} s. Start the control plane on it (`gpurent up` or `gpurent server` with \
         --data-dir {}): it migrates the schema, and agents stop the work it does not know.",
        manifest
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        manifest.gpurent_version,
        manifest.schema_version,
        manifest.reservations,
        mib(size),
        dir.display(),
        dir.display()
    ));
    Ok(())
}

/// Moves the checked files into the data dir: the keys, then the database (its stale WAL and
/// shared memory removed first: SQLite would apply another database's WAL to this one).
fn put_in_place(dir: &Path, stage: &Stage, manifest: &Manifest) -> Result<(), CliError> {
    for entry in &manifest.files {
        let Some(name) = entry.name.strip_prefix("data/") else {
            continue;
        };
        let to = dir.join(name);
        if let Some(parent) = to.parent() {
            private_dirs(parent)?;
        }
        std::fs::rename(stage.0.join(&entry.name), &to).map_err(io("write", &to))?;
    }
    if manifest.store == "sqlite" {
        let db = dir.join(DATABASE_FILE);
        for suffix in ["-wal", "-shm", "-journal"] {
            let mut side = db.clone().into_os_string();
            side.push(suffix);
            match std::fs::remove_file(&side) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove", Path::new(&side))(e)),
            }
        }
        std::fs::rename(stage.0.join(SQLITE_COPY), &db).map_err(io("write", &db))?;
    }
    // Left by a server that ran on the dir before: not this one's.
    for stale in [super::lock::SERVER_URL_FILE, super::server::SSH_ADDR_FILE] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    sync_dir(dir)?;
    if dir.join("agent").exists() {
        sync_dir(&dir.join("agent"))?;
    }
    Ok(())
}
