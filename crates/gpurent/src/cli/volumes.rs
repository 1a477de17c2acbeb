//! `gpurent volumes`: storage that outlives instances, and its arguments.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum VolumesCommand {
    /// Make a volume: on a node's disk (`--node`, or the node with the most room), or on the
    /// storage every node of the shared kind mounts (`--shared`). Billed per GB-month of its
    /// size until it is removed.
    Create {
        name: String,
        /// Its size: 100GB, 500GiB, 1.5TB (GB and TB are powers of ten, GiB and TiB of two).
        #[arg(long)]
        size: String,
        /// The node whose disk holds it (its name or id); work that mounts it runs there.
        #[arg(long, conflicts_with = "shared")]
        node: Option<String>,
        /// On the shared volume storage: work that mounts it runs on any node that mounts
        /// that storage, and moves with its data when its node is lost.
        #[arg(long)]
        shared: bool,
        /// Make it for a team of yours (member or above): billed to the team, mounted by its
        /// reservations.
        #[arg(long)]
        team: Option<String>,
    },
    /// Your volumes (admin: everyone's), or a team's, with their state, node and use.
    Ls {
        /// A team of yours: its volumes.
        #[arg(long)]
        team: Option<String>,
    },
    /// One volume, by name or id.
    Get {
        name: String,
        /// A team of yours: its volume (a token bound to a team: its team's).
        #[arg(long)]
        team: Option<String>,
    },
    /// Grow a volume (a volume never shrinks), mounted or not.
    Resize {
        name: String,
        #[arg(long)]
        size: String,
        /// A team of yours: its volume (a token bound to a team: its team's).
        #[arg(long)]
        team: Option<String>,
    },
    /// Remove a volume and its data; refused while a reservation mounts it (a team's: its
    /// admins and owners).
    Rm {
        name: String,
        /// A team of yours: its volume (a token bound to a team: its team's).
        #[arg(long)]
        team: Option<String>,
    },
    /// Copy files into or out of a volume with no instance running (no GPU is billed): one
    /// side is NAME:PATH in the volume (its root is `/`), the other a local path.
    #[command(
        after_help = "Examples:\n  gpurent volumes cp ./data.tar data:/\n                              gpurent volumes cp -r ./dataset data:/datasets/\n                              gpurent volumes cp -r data:/checkpoints ./"
    )]
    Cp {
        /// What to copy: a local path, or NAME:PATH in a volume.
        src: String,
        /// Where to: a local path, or NAME:PATH (a directory: into it, under the source's name).
        dst: String,
        /// Copy a directory and everything in it.
        #[arg(short = 'r', long)]
        recursive: bool,
        /// A team of yours: its volume (a token bound to a team: its team's).
        #[arg(long)]
        team: Option<String>,
    },
}
