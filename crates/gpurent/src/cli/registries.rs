//! `gpurent registries`: your credentials for private image registries.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum RegistriesCommand {
    /// Keep a credential for a registry (HOST[:PORT], as your image names give it, or
    /// docker.io for images with no host in their name): your reservations' pulls from it use
    /// it. The password comes from GPURENT_REGISTRY_PASSWORD,
    /// else one line of stdin (never an argument), and is never shown again.
    #[command(after_help = "Example:\n  \
                            printf '%s\\n' \"$TOKEN\" | gpurent registries add registry.example:5000 --username ci\n  \
                            gpurent reserve --gpu rtx4090 --hours 1 --image registry.example:5000/team/train:3")]
    Add {
        host: String,
        #[arg(long)]
        username: String,
    },
    /// Your registry credentials (hosts and usernames only).
    Ls,
    /// Forget your credential for a registry host.
    Rm { host: String },
}
