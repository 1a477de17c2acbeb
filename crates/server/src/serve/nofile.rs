//! The process's open-files limit (RLIMIT_NOFILE): every connection is a file descriptor.

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Linux never allows more open files than `fs.nr_open` (2^20 by default); an "infinite"
/// hard limit is taken as that.
const MOST_FILES: u64 = 1 << 20;

/// The soft and hard open-files limits, before and after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft open-files limit to the hard one (many systems start processes at 1,024
/// while allowing far more); returns the limits as they are afterwards.
pub fn raise_open_files_limit() -> Result<OpenFiles, nix::Error> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let target = if hard == RLIM_INFINITY {
        MOST_FILES
    } else {
        hard
    };
    if soft != RLIM_INFINITY && soft < target {
        setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
        return Ok(OpenFiles { soft: target, hard });
    }
    Ok(OpenFiles { soft, hard })
}

/// The soft open-files limit now, if it can be read (and is not infinite).
pub fn open_files_limit() -> Option<u64> {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) if soft != RLIM_INFINITY => Some(soft),
        Ok(_) => Some(MOST_FILES),
        Err(_) => None,
    }
}
