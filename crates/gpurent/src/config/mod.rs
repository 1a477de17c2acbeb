//! Configuration files: every option of `server`, `agent` and `up` can come from a TOML file
//! (`--config FILE`; `server` and `agent` read /etc/gpurent/server.toml and agent.toml when
//! present) whose keys are the flags' names; a flag or environment variable overrides it.

pub mod file;
pub mod print;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};

use crate::cli::{Cli, Daemon};
pub use file::{ConfigFile, FileError};

/// Where the packages put each daemon's file; read when present and no `--config` is given.
pub fn default_path(daemon: Daemon) -> Option<&'static Path> {
    match daemon {
        Daemon::Server => Some(Path::new("/etc/gpurent/server.toml")),
        Daemon::Agent => Some(Path::new("/etc/gpurent/agent.toml")),
        Daemon::Up => None,
    }
}

/// The command line as parsed, with the configuration file it read.
#[derive(Debug)]
pub struct Parsed {
    pub cli: Cli,
    pub matches: ArgMatches,
    pub file: Option<Loaded>,
}

/// A configuration file a daemon's options came from, and which.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    /// The argument ids the file set (not overridden), by key.
    pub set: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The command line itself: clap prints it (and help and version) as usual.
    #[error(transparent)]
    Usage(#[from] clap::Error),
    #[error(transparent)]
    File(#[from] FileError),
    /// The file's options together with the command line's.
    #[error("{path}: {message}")]
    WithFile { path: PathBuf, message: String },
}

/// Parses `args` (the program's name first), reading a daemon's configuration file.
pub fn parse(args: Vec<OsString>) -> Result<Parsed, ParseError> {
    let first = Cli::command().try_get_matches_from(&args)?;
    let daemon = first.subcommand_name().and_then(Daemon::from_name);
    let Some((daemon, sub)) = daemon.zip(first.subcommand().map(|(_, m)| m)) else {
        let cli = Cli::from_arg_matches(&first)?;
        return Ok(Parsed {
            cli,
            matches: first,
            file: None,
        });
    };
    let path = match sub.get_one::<PathBuf>("config") {
        Some(path) => Some(path.clone()),
        None => default_path(daemon)
            .filter(|p| p.exists())
            .map(Path::to_owned),
    };
    let Some(path) = path else {
        let cli = Cli::from_arg_matches(&first)?;
        return Ok(Parsed {
            cli,
            matches: first,
            file: None,
        });
    };
    let file = ConfigFile::read(&path)?;
    let root = Cli::command();
    let explicit: Vec<String> = sub
        .ids()
        .filter(|id| {
            matches!(
                sub.value_source(id.as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|id| id.to_string())
        .collect();
    let (flags, set) = file.flags(&root, daemon.name(), &explicit)?;
    let mut with_file = args;
    let at = with_file
        .iter()
        .position(|a| a == "--")
        .unwrap_or(with_file.len());
    with_file.splice(at..at, flags.into_iter().map(OsString::from));
    let matches = root
        .try_get_matches_from(&with_file)
        .map_err(|e| with_file_error(&path, &e))?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| with_file_error(&path, &e))?;
    Ok(Parsed {
        cli,
        matches,
        file: Some(Loaded { path, set }),
    })
}

/// clap's complaint about the file's options and the command line's together, in one line.
fn with_file_error(path: &Path, e: &clap::Error) -> ParseError {
    let detail = e.to_string();
    let message = detail
        .lines()
        .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
        .map(|l| l.trim().trim_start_matches("error: "))
        .collect::<Vec<_>>()
        .join(" ");
    ParseError::WithFile {
        path: path.to_owned(),
        message: format!("with this file's options: {message}"),
    }
}
