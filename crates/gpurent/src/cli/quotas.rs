//! `gpurent quotas`: guaranteed GPUs of a type per team, and how many more it may borrow.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum QuotasCommand {
    /// Give a team guaranteed GPUs of a type (admins). Within it, its work takes back GPUs
    /// others borrowed; beyond it, it borrows idle ones up to --borrow-limit.
    #[command(after_help = "Example:\n  \
                            gpurent quotas set lab --gpu h100 --gpus 16 --borrow-limit 8")]
    Set {
        /// The team (or user), by name.
        team: String,
        /// The GPU type.
        #[arg(long, value_name = "TYPE")]
        gpu: String,
        /// Guaranteed GPUs (a share counts as its fraction: 1.5 is allowed).
        #[arg(long, value_name = "N")]
        gpus: String,
        /// How many more it may borrow while they are idle (default: any that are idle).
        #[arg(long, value_name = "N")]
        borrow_limit: Option<String>,
    },
    /// The quotas you can see (admins: all), with what each team uses now.
    Ls,
    /// Remove a team's quota of a type (admins).
    Rm {
        team: String,
        #[arg(long, value_name = "TYPE")]
        gpu: String,
    },
}
