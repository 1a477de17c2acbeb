//! `gpurent notifications`: webhooks for your events or a team's.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum NotificationsCommand {
    /// Add a webhook; its HMAC-SHA256 secret is printed now and never again.
    #[command(after_help = "Events: budget_alert, low_balance, reservation_ended, \
                            reservation_placed, reservation_restarted, node_lost, \
                            node_unhealthy (default: all).\n\
                            Each delivery is a JSON POST with X-Gpurent-Signature: sha256=HEX, \
                            the HMAC-SHA256 of the body under the secret.\n\n\
                            Example:\n  \
                            gpurent notifications add https://hooks.example.com/gpurent \
                            --events budget_alert,reservation_ended")]
    Add {
        url: String,
        /// A team of yours (its admins and owners manage its webhooks).
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
        /// The events it gets, comma-separated.
        #[arg(long, value_name = "EVENTS", value_delimiter = ',')]
        events: Vec<String>,
    },
    /// Your webhooks (or a team's).
    Ls {
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
    },
    /// Remove a webhook and its deliveries.
    Rm { id: String },
    /// Send a test event now and say how its first attempt went.
    Test { id: String },
    /// A webhook's latest deliveries, each attempt with its answer.
    Deliveries { id: String },
}
