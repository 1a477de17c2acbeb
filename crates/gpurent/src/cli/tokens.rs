//! `gpurent tokens`: API tokens, with an expiry, scopes and a team.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Create an API token for yourself; prints it once.
    #[command(
        after_help = "Example, a CI token that can only reserve for team render:\n  \
                            gpurent tokens create --name ci --team render --scope reserve,read --expires 30d"
    )]
    Create {
        /// A label for `tokens ls`.
        #[arg(long)]
        name: Option<String>,
        /// Valid for this many days, and never longer than the token you make it with
        /// (default: as long as that token; until revoked only for an admin or with
        /// `--with-password`). Revoking that token revokes this one.
        #[arg(long, value_name = "N", conflicts_with = "expires")]
        expires_in_days: Option<u32>,
        /// The same as --expires-in-days, as days: 30d (or 30).
        #[arg(long, value_name = "DAYS", value_parser = days)]
        expires: Option<u32>,
        /// What it may do, comma-separated: read, reserve, ssh, volumes, billing, admin
        /// (default: everything the token you make it with may). Never more than that token.
        #[arg(long, value_delimiter = ',', value_name = "SCOPES", value_parser = scope)]
        scope: Vec<gpurent_types::TokenScope>,
        /// Bind it to a team of yours: it reserves for that team and sees only its
        /// reservations; its scopes within what your role there allows.
        #[arg(long, value_name = "NAME")]
        team: Option<String>,
        /// Give your password (GPURENT_PASSWORD, else a line on stdin): the token is then
        /// one of its own, which may never expire and outlives the token you used.
        #[arg(long)]
        with_password: bool,
    },
    /// Your tokens (admin: everyone's), never their secrets.
    Ls,
    /// Revoke a token by its id: your own (admin: any).
    Revoke { id: String },
}

/// `30d` or `30`: days.
fn days(text: &str) -> Result<u32, String> {
    text.strip_suffix('d')
        .unwrap_or(text)
        .parse()
        .map_err(|_| format!("{text:?} is not a number of days, such as 30d"))
}

fn scope(text: &str) -> Result<gpurent_types::TokenScope, String> {
    text.parse().map_err(|_| {
        format!("{text:?} is not a scope: read, reserve, ssh, volumes, billing or admin")
    })
}
