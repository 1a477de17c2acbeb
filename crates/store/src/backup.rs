//! The database's part of a backup: a consistent copy of a live database, and the way back.
//!
//! SQLite: `VACUUM INTO` on a connection of its own. It reads the database in one read
//! transaction, so the copy is the database as of one commit, while the server goes on writing
//! (WAL mode: a reader blocks no writer; the WAL only cannot be checkpointed past the copy's
//! snapshot until it ends). It needs no FFI (the workspace denies `unsafe`), and the copy is
//! compact and self-contained (no WAL beside it). SQLite's backup API (`sqlite3_backup_*`)
//! would report progress by pages, but it restarts whenever another process writes the source
//! during a step; copying all pages in one step is what `VACUUM INTO` does anyway.
//!
//! PostgreSQL: `pg_dump --format=custom`, in the snapshot of a transaction that also reads the
//! facts (schema version, reservations), so that the facts are those of the dump; and
//! `pg_restore` into an empty database. Both tools come from the PostgreSQL installation
//! (`PgTools`): a dump taken by a `pg_dump` older than the server is refused by it.
//!
//! The store applies, it does not decide: what goes into a backup, where, and when a restore is
//! refused are the binary's (`gpurent admin backup`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::{ConnectOptions, Connection, Row};

/// The tables a gpurent database has, checked in a dump's table of contents.
const TABLES: [&str; 4] = ["gpurent_migrations", "reservations", "transfers", "nodes"];

/// What can go wrong while copying or restoring a database.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("cannot open the database {what}")]
    Open {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("the database {what} is not a gpurent database (it has no {table} table)")]
    NotGpurent { what: String, table: &'static str },
    #[error("the database copy is damaged: {0}")]
    Damaged(String),
    #[error("cannot run {program} (give the directory of the PostgreSQL tools with --pg-bin)")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {stderr}")]
    Tool {
        program: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("the dump {path} lacks the table {table}: not a dump of a gpurent database")]
    DumpLacks { path: PathBuf, table: &'static str },
    #[error(
        "the database {what} is not empty ({tables} tables): restore into an empty database, \
         or give --force to replace what is there"
    )]
    NotEmpty { what: String, tables: i64 },
    #[error("database error while {doing}")]
    Database {
        doing: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

type Result<T, E = BackupError> = std::result::Result<T, E>;

fn db(doing: &'static str) -> impl FnOnce(sqlx::Error) -> BackupError {
    move |source| BackupError::Database { doing, source }
}

/// What a database copy holds, read in the copy's own snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatabaseFacts {
    /// The last migration applied.
    pub schema_version: i64,
    pub reservations: u64,
}

/// The last migration this binary knows: a copy of a later schema cannot be opened by it.
pub fn schema_version() -> i64 {
    crate::sql::latest_migration()
}

/// Reads the facts on a connection of either driver (their executors share no object type).
macro_rules! read_facts {
    ($conn:expr, $what:expr) => {{
        let what: String = $what;
        let not_ours = |table| {
            let what = what.clone();
            move |_| BackupError::NotGpurent { what, table }
        };
        let version: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM gpurent_migrations")
                .fetch_one(&mut *$conn)
                .await
                .map_err(not_ours("gpurent_migrations"))?;
        let reservations: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM reservations")
            .fetch_one(&mut *$conn)
            .await
            .map_err(not_ours("reservations"))?;
        DatabaseFacts {
            schema_version: version.unwrap_or(0),
            reservations: u64::try_from(reservations).unwrap_or(0),
        }
    }};
}

fn sqlite_options(path: &Path) -> sqlx::sqlite::SqliteConnectOptions {
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(false)
        // The server's writes are short; the copy waits for a lock rather than failing.
        .busy_timeout(Duration::from_secs(30))
        .log_statements(tracing::log::LevelFilter::Trace)
}

/// Copies the SQLite database at `source` (live or not) into the new file `dest`, as of one
/// commit, and returns the facts of the copy.
pub async fn copy_sqlite(source: &Path, dest: &Path) -> Result<DatabaseFacts> {
    let what = source.display().to_string();
    let mut conn = sqlite_options(source)
        .connect()
        .await
        .map_err(|e| BackupError::Open {
            what: what.clone(),
            source: e,
        })?;
    // A file that is not a gpurent database is said so, not copied.
    let _ = read_facts!(&mut conn, what.clone());
    let Some(into) = dest.to_str() else {
        return Err(BackupError::Damaged(format!(
            "{} is not a UTF-8 path",
            dest.display()
        )));
    };
    sqlx::query("VACUUM INTO $1")
        .bind(into)
        .execute(&mut conn)
        .await
        .map_err(db("copying the database (VACUUM INTO)"))?;
    let _ = conn.close().await;
    let mut copy = sqlite_options(dest)
        .connect()
        .await
        .map_err(|e| BackupError::Open {
            what: dest.display().to_string(),
            source: e,
        })?;
    let facts = read_facts!(&mut copy, dest.display().to_string());
    let _ = copy.close().await;
    Ok(facts)
}

/// Checks a SQLite copy before it is put in place (`PRAGMA quick_check`: every page and
/// index entry readable and well formed) and returns its facts.
pub async fn check_sqlite(path: &Path) -> Result<DatabaseFacts> {
    let what = path.display().to_string();
    let mut conn = sqlite_options(path)
        .read_only(true)
        .connect()
        .await
        .map_err(|e| BackupError::Open {
            what: what.clone(),
            source: e,
        })?;
    let rows = sqlx::query("PRAGMA quick_check")
        .fetch_all(&mut conn)
        .await
        .map_err(|e| BackupError::Damaged(e.to_string()))?;
    let verdict: Vec<String> = rows
        .iter()
        .filter_map(|r| r.try_get::<String, _>(0).ok())
        .collect();
    if verdict != ["ok"] {
        return Err(BackupError::Damaged(verdict.join("; ")));
    }
    let facts = read_facts!(&mut conn, what);
    let _ = conn.close().await;
    Ok(facts)
}

/// Where the PostgreSQL tools are: a directory (`--pg-bin`), else the `PATH`.
#[derive(Debug, Clone, Default)]
pub struct PgTools {
    pub bin: Option<PathBuf>,
}

impl PgTools {
    fn program(&self, name: &str) -> PathBuf {
        match &self.bin {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    /// Runs `name args` with the password in `PGPASSWORD`; its stdout.
    async fn run(&self, name: &str, args: &[&str], password: Option<&str>) -> Result<String> {
        let program = self.program(name);
        let mut command = tokio::process::Command::new(&program);
        command.args(args).stdin(std::process::Stdio::null());
        if let Some(password) = password {
            command.env("PGPASSWORD", password);
        }
        let out = command
            .output()
            .await
            .map_err(|source| BackupError::Spawn {
                program: program.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(BackupError::Tool {
                program,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `url` without its password, and the password (percent-decoded): the tools get it in
/// `PGPASSWORD`, since a command line is visible to every user of the machine.
fn split_password(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None);
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None);
    };
    let Some((user, password)) = rest[..at].split_once(':') else {
        return (url.to_owned(), None);
    };
    let decoded = percent_decode(password);
    (
        format!("{scheme}://{user}@{}", &rest[at + 1..]),
        Some(decoded),
    )
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The URL with its password hidden, for messages.
pub fn redact(url: &str) -> String {
    match split_password(url) {
        (_, None) => url.to_owned(),
        (bare, Some(_)) => bare.replacen('@', ":***@", 1),
    }
}

async fn connect_pg(url: &str) -> Result<sqlx::PgConnection> {
    let open = |source| BackupError::Open {
        what: redact(url),
        source,
    };
    sqlx::postgres::PgConnectOptions::from_str(url)
        .map_err(open)?
        .log_statements(tracing::log::LevelFilter::Trace)
        .connect()
        .await
        .map_err(open)
}

/// Dumps the PostgreSQL database at `url` into `dest` (`pg_dump --format=custom`), in the
/// snapshot its facts are read in, and checks the dump (`check_dump`).
pub async fn dump_postgres(url: &str, dest: &Path, tools: &PgTools) -> Result<DatabaseFacts> {
    let what = redact(url);
    let (bare, password) = split_password(url);
    let out = dest.to_string_lossy().into_owned();
    let mut conn = connect_pg(url).await?;
    let mut tx = conn.begin().await.map_err(db("beginning the snapshot"))?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db("beginning the snapshot"))?;
    // The transaction only holds the snapshot while pg_dump takes it up: not idle by mistake.
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
        .execute(&mut *tx)
        .await
        .map_err(db("beginning the snapshot"))?;
    let facts = read_facts!(&mut *tx, what);
    let snapshot: String = sqlx::query_scalar("SELECT pg_export_snapshot()")
        .fetch_one(&mut *tx)
        .await
        .map_err(db("exporting the snapshot"))?;
    tools
        .run(
            "pg_dump",
            &[
                "--format=custom",
                "--snapshot",
                &snapshot,
                "--file",
                &out,
                "--dbname",
                &bare,
            ],
            password.as_deref(),
        )
        .await?;
    tx.commit().await.map_err(db("ending the snapshot"))?;
    let _ = conn.close().await;
    check_dump(dest, tools).await?;
    Ok(facts)
}

/// Checks a dump with `pg_restore --list`: it must read whole and name gpurent's tables.
pub async fn check_dump(dump: &Path, tools: &PgTools) -> Result<()> {
    let path = dump.to_string_lossy().into_owned();
    let list = tools.run("pg_restore", &["--list", &path], None).await?;
    for table in TABLES {
        let named = list.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.windows(3).any(|w| w[0] == "TABLE" && w[2] == table)
        });
        if !named {
            return Err(BackupError::DumpLacks {
                path: dump.to_owned(),
                table,
            });
        }
    }
    Ok(())
}

/// Restores `dump` into the database at `url` (`pg_restore`, in one transaction): refused
/// when the database has tables, unless `replace` (then what the dump holds replaces them).
pub async fn restore_postgres(
    url: &str,
    dump: &Path,
    tools: &PgTools,
    replace: bool,
) -> Result<DatabaseFacts> {
    let what = redact(url);
    let (bare, password) = split_password(url);
    let mut conn = connect_pg(url).await?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(db("looking for tables"))?;
    if tables > 0 && !replace {
        return Err(BackupError::NotEmpty { what, tables });
    }
    let path = dump.to_string_lossy().into_owned();
    let mut args = vec![
        "--no-owner",
        "--no-privileges",
        "--exit-on-error",
        "--single-transaction",
        "--dbname",
        &bare,
    ];
    if replace {
        args.extend(["--clean", "--if-exists"]);
    }
    args.push(&path);
    tools.run("pg_restore", &args, password.as_deref()).await?;
    let facts = read_facts!(&mut conn, what);
    let _ = conn.close().await;
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_goes_to_the_environment_not_the_command_line() {
        let (bare, pw) =
            split_password("postgres://gpurent:s%40cret@db:5432/gpurent?sslmode=require");
        assert_eq!(bare, "postgres://gpurent@db:5432/gpurent?sslmode=require");
        assert_eq!(pw.as_deref(), Some("s@cret"));
        assert_eq!(
            split_password("postgres://gpurent@db/x"),
            ("postgres://gpurent@db/x".to_owned(), None)
        );
        assert_eq!(redact("postgres://u:p@h/d"), "postgres://u:***@h/d");
    }

    #[tokio::test]
    async fn a_sqlite_copy_holds_the_facts_and_passes_its_check() {
        let (db, store) = crate::testing::TestDatabase::sqlite_store().await.unwrap();
        let path = PathBuf::from(db.url.trim_start_matches("sqlite://"));
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy.db");
        let facts = copy_sqlite(&path, &copy).await.unwrap();
        assert_eq!(facts.schema_version, schema_version());
        assert_eq!(facts.reservations, 0);
        assert_eq!(check_sqlite(&copy).await.unwrap(), facts);
        drop(store);
        // A file that is no database is refused by the check.
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, vec![7u8; 8192]).unwrap();
        assert!(check_sqlite(&junk).await.is_err());
    }
}
