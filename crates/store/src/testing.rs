//! Fresh, isolated databases for tests: a temporary SQLite file, or a new database on the
//! PostgreSQL server named by `GPURENT_TEST_DATABASE_URL` (started by `scripts/test.sh`).

use std::path::PathBuf;

use sqlx::Connection;

use crate::{Backend, Result};

pub const PG_URL_VAR: &str = "GPURENT_TEST_DATABASE_URL";

/// A database that lives as long as this value (SQLite) or the test server (PostgreSQL).
#[derive(Debug)]
pub struct TestDatabase {
    pub url: String,
    pub backend: Backend,
    _dir: Option<TempDir>,
}

/// A directory removed on drop, without pulling a temp-file crate into the library.
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TestDatabase {
    /// A fresh SQLite database and the store opened on it (the database lives as long as the
    /// first value).
    pub async fn sqlite_store() -> Result<(Self, crate::SqlStore)> {
        let db = TestDatabase::new(Backend::Sqlite).await?;
        let store = crate::SqlStore::connect(&db.url).await?;
        Ok((db, store))
    }

    pub async fn new(backend: Backend) -> Result<Self> {
        let name = format!("gpurent_test_{}", uuid::Uuid::new_v4().simple());
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(&name);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| crate::StoreError::Corrupt(e.to_string()))?;
                let url = format!("sqlite://{}/gpurent.db", dir.display());
                Ok(TestDatabase {
                    url,
                    backend,
                    _dir: Some(TempDir(dir)),
                })
            }
            Backend::Postgres => {
                let Ok(server) = std::env::var(PG_URL_VAR) else {
                    panic!("{PG_URL_VAR} is not set: run the tests with scripts/test.sh, which starts PostgreSQL");
                };
                let mut conn = sqlx::PgConnection::connect(&server).await?;
                sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await?;
                conn.close().await?;
                let base = server
                    .rsplit_once('/')
                    .map_or(server.as_str(), |(base, _)| base);
                Ok(TestDatabase {
                    url: format!("{base}/{name}"),
                    backend,
                    _dir: None,
                })
            }
        }
    }
}
