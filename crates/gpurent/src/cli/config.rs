//! `gpurent config`: check a configuration file, or print the configuration a daemon would
//! run with and where each value comes from.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check FILE: every key an option of the command, every value one it accepts; exit 1
    /// naming the first key that is not.
    Check {
        file: PathBuf,
        /// The command the file configures (default: from the file's name, `server.toml`,
        /// `agent.toml` or `up.toml`).
        #[arg(long = "for", value_name = "COMMAND")]
        command: Option<Daemon>,
    },
    /// The effective configuration of `gpurent COMMAND ARGS...` (its config file, environment
    /// and ARGS), each value with where it came from; secrets redacted.
    Print {
        #[arg(value_enum, default_value = "server")]
        command: Daemon,
        /// The command's own options, as it would be started (`--config FILE` among them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// The commands a configuration file configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Daemon {
    Server,
    Agent,
    Up,
}

impl Daemon {
    pub fn name(self) -> &'static str {
        match self {
            Daemon::Server => "server",
            Daemon::Agent => "agent",
            Daemon::Up => "up",
        }
    }

    pub fn from_name(name: &str) -> Option<Daemon> {
        [Daemon::Server, Daemon::Agent, Daemon::Up]
            .into_iter()
            .find(|d| d.name() == name)
    }
}
