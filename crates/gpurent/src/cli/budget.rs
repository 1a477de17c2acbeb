//! `gpurent budget`: the most a month may spend, its alerts and what happens at the limit.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BudgetCommand {
    /// Set your monthly budget (or a team's: its admins and owners). It counts what the month
    /// (UTC) already spent; at the limit new reservations are refused.
    #[command(after_help = "Example:\n  \
                            gpurent budget set --monthly 500.00 --alert-at 50,80,100\n  \
                            gpurent budget set --team lab --monthly 2000 --stop-at-limit")]
    Set {
        /// A team of yours.
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
        /// The most a calendar month spends, e.g. 500.00.
        #[arg(long, value_name = "AMOUNT")]
        monthly: String,
        /// Percentages of it at which an alert fires, once each per month.
        #[arg(
            long,
            value_name = "PERCENTS",
            value_delimiter = ',',
            default_value = "50,80,100"
        )]
        alert_at: Vec<u32>,
        /// At the limit, stop running reservations too (reserved blocks, paid, never).
        #[arg(long)]
        stop_at_limit: bool,
        /// Alert when the balance covers fewer hours than this of current spend (0: never).
        #[arg(long, value_name = "HOURS", default_value_t = 24)]
        low_balance_hours: u32,
    },
    /// The month's spend against your budget (or a team's), the forecast and the alerts fired.
    Get {
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
    },
    /// Remove your budget (or a team's), and the refusal with it.
    Rm {
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
    },
}
