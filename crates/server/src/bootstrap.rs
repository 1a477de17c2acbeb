//! First start: create the admin user and write its token to `DATA_DIR/admin.token` (0600).

use std::path::{Path, PathBuf};

use gpurent_store::Store;
use gpurent_types::keyfile::{write_private, KeyFileError};
use gpurent_types::Clock;

use crate::auth::{hash_token, new_token};

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    #[error("cannot create the admin user")]
    Store(#[from] gpurent_store::StoreError),
}

/// Makes sure an admin exists. Returns the path of a newly written token file, if any.
///
/// The token is written to `admin.token.new` before the admin row is committed and renamed
/// after, so a crash in between leaves a usable token that the next start adopts.
pub async fn bootstrap_admin(
    store: &dyn Store,
    clock: &dyn Clock,
    data_dir: &Path,
) -> Result<Option<PathBuf>, BootstrapError> {
    let path = data_dir.join("admin.token");
    let pending = data_dir.join("admin.token.new");
    if let Ok(token) = std::fs::read_to_string(&pending) {
        if store
            .authenticate(&hash_token(token.trim()))
            .await?
            .is_some()
        {
            rename(&pending, &path)?;
            return Ok(Some(path));
        }
    }
    let token = new_token("gpr");
    write_private(&pending, format!("{token}\n").as_bytes())?;
    let created = store.ensure_admin(&hash_token(&token), clock.now()).await?;
    if created {
        rename(&pending, &path)?;
        tracing::info!(path = %path.display(), "created the admin user; its token is in this file");
        Ok(Some(path))
    } else {
        let _ = std::fs::remove_file(&pending);
        if !path.exists() {
            tracing::warn!(
                path = %path.display(),
                "an admin exists but this data dir has no admin.token; use the token from the data dir of the first start"
            );
        }
        Ok(None)
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), BootstrapError> {
    std::fs::rename(from, to).map_err(|source| BootstrapError::Write {
        path: to.to_owned(),
        source,
    })
}
