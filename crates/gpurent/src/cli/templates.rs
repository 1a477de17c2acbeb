//! `gpurent templates`: named instance setups that `reserve --template NAME` starts from.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum TemplatesCommand {
    /// Make a template of yours (an admin's `--public` one: everyone's).
    #[command(
        after_help = "Example:\n  gpurent templates create lab --image jupyter/base-notebook \\\n    \
                            --command 'jupyter lab --ip=0.0.0.0 --port=8888' --http-port 8888 \\\n    \
                            --volume-mount /home/jovyan/work\n  \
                            gpurent reserve --template lab --gpu rtx4090 --hours 4 --volume data"
    )]
    Create {
        name: String,
        /// The image its instances run; none: an isolated process.
        #[arg(long)]
        image: Option<String>,
        /// The command line (run by `sh -c` when it uses the shell); none: the image's own.
        #[arg(long)]
        command: Option<String>,
        /// Environment variables, K=V; repeatable.
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// A port to publish over HTTP through the control plane; repeatable.
        #[arg(long = "http-port", value_name = "PORT")]
        http_ports: Vec<u16>,
        /// Where `reserve --template NAME --volume VOL` mounts a volume given without a path.
        #[arg(long, value_name = "PATH")]
        volume_mount: Option<String>,
        /// A line saying what it is for.
        #[arg(long)]
        description: Option<String>,
        /// For everyone (admins only).
        #[arg(long)]
        public: bool,
    },
    /// The templates you may use: yours and the public ones (shell, jupyter, pytorch, ...).
    Ls,
    /// One template, by name or id: everything it sets.
    Get { name: String },
    /// Remove a template of yours (an admin: a public one too).
    Rm { name: String },
}
