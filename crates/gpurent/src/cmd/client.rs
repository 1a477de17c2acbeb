//! The CLI's API commands: each sends one request and prints the answer. This module picks
//! the token and dispatches; the commands are in one module per resource (reservations,
//! nodes, billing, admin) or in their own (`access`, `ssh_*`, `cp`, `report`, `audit`, ...).

mod admin;
mod billing;
mod nodes;
mod reservations;

pub(crate) use reservations::logs as reservation_logs;

use gpurent_types::Money;

use super::admin_token::{default_token, DefaultToken};
use crate::api_client::{ApiClient, CliError};
use crate::cli::{AdminCommand, ApiCommand as Command, CreditCommand, NodesCommand, UsersCommand};
use crate::output::print_json;

/// An id as one URL path segment: everything but unreserved characters percent-encoded, so
/// that an id can never reach another endpoint.
pub(crate) fn segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn money(s: &str, what: &str) -> Result<Money, CliError> {
    s.parse::<Money>()
        .map_err(|e| CliError::new("invalid_value", format!("{what}: {e}")))
}

fn opt_time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

pub async fn run(
    command: Command,
    server: &str,
    token: Option<String>,
    tls: &gpurent_agent::tls::ClientTls,
    json: bool,
) -> Result<(), CliError> {
    // Local operations on a data dir or database: no control plane, no token.
    let command = match command {
        Command::Admin(AdminCommand::Backup(args)) => {
            return super::backup::backup(args, json).await
        }
        Command::Admin(AdminCommand::Restore(args)) => {
            return super::backup::restore(args, json).await
        }
        command => command,
    };
    // An explicitly empty token means none: no fallback to the admin's.
    let (token, withheld) = match token {
        Some(t) if t.trim().is_empty() => (None, None),
        Some(t) => (Some(t), None),
        None => match default_token(server) {
            DefaultToken::Admin(t) => (Some(t), None),
            DefaultToken::Withheld(why) => (None, Some(why)),
            DefaultToken::None => (None, None),
        },
    };
    let api = ApiClient::with_tls(server, token, tls)?
        .unauthorized_hint(withheld)
        .retry(crate::api_client::Retry::from_env()?);
    match command {
        Command::Users(UsersCommand::Create { name, role, credit }) => {
            admin::create_user(&api, name, role, credit, json).await?
        }
        Command::Users(UsersCommand::Ls) => admin::users(&api, json).await?,
        Command::Credit(CreditCommand::Grant {
            user_id,
            amount,
            idempotency_key,
        }) => billing::grant_credit(&api, user_id, amount, idempotency_key, json).await?,
        Command::Balance => billing::balance(&api, json).await?,
        Command::Offers => reservations::offers(&api, json).await?,
        Command::Reserve(args) => reservations::reserve(&api, *args, json).await?,
        Command::Usage(window) => billing::usage(&api, window, json).await?,
        Command::Invoice {
            month,
            csv,
            user,
            team,
        } => billing::invoice(&api, month, csv, user, team, json).await?,
        Command::Earnings(window) => billing::earnings(&api, window, json).await?,
        Command::Admin(AdminCommand::Spot) => admin::spot(&api, json).await?,
        Command::Get { id } => reservations::get(&api, id, json).await?,
        Command::Open { id, port, browser } => {
            super::open::open(&api, &id, port, browser, json).await?
        }
        Command::Ls => reservations::ls(&api, json).await?,
        Command::Stop { id } => reservations::stop(&api, id, json).await?,
        Command::Ssh(args) => super::ssh::run(&api, args).await?,
        Command::SshConfig(args) => super::ssh_config::run(&api, args, json).await?,
        Command::Cp(args) => super::cp::run(&api, args, json).await?,
        Command::PortForward(args) => super::port_forward::run(&api, args, json).await?,
        Command::Logs { id, follow, out } => {
            reservations::logs(&api, &id, follow, out.as_deref()).await?
        }
        Command::Nodes(NodesCommand::JoinToken) => nodes::join_token(&api, json).await?,
        Command::Events { after, follow } => nodes::events(&api, after, follow, json).await?,
        Command::Nodes(NodesCommand::Cordon { node }) => {
            nodes::schedule_node(&api, &node, "cordon", json).await?;
        }
        Command::Nodes(NodesCommand::Drain { node }) => {
            nodes::schedule_node(&api, &node, "drain", json).await?;
        }
        Command::Nodes(NodesCommand::Uncordon { node }) => {
            nodes::schedule_node(&api, &node, "uncordon", json).await?;
        }
        Command::Nodes(NodesCommand::Revoke { node }) => nodes::revoke(&api, node, json).await?,
        Command::Nodes(NodesCommand::Ls) => nodes::ls(&api, json).await?,
        Command::Admin(AdminCommand::LedgerCheck) => admin::ledger_check(&api, json).await?,
        // Served above, without the API.
        Command::Admin(AdminCommand::Backup(_) | AdminCommand::Restore(_)) => {}
        Command::Report(report) => super::report::run(&api, report, json).await?,
        Command::Audit(audit) => super::audit::run(&api, audit, json).await?,
        Command::Users(UsersCommand::Passwd { user_id }) => {
            super::access::passwd(&api, user_id, json).await?;
        }
        Command::Users(UsersCommand::Limits {
            user_id,
            max_reservations,
            max_spend_per_hour,
        }) => {
            super::access::limits(&api, &user_id, max_reservations, max_spend_per_hour, json)
                .await?;
        }
        Command::Users(UsersCommand::Role { user_id, role }) => {
            super::access::role(&api, &user_id, &role, json).await?;
        }
        Command::Tokens(command) => super::access::tokens(&api, command, json).await?,
        Command::Keys(command) => super::ssh_keys::keys(&api, command, json).await?,
        Command::Volumes(command) => super::volumes::volumes(&api, command, json).await?,
        Command::Endpoints(command) => super::endpoints::endpoints(&api, command, json).await?,
        Command::Templates(command) => super::templates::templates(&api, command, json).await?,
        Command::Registries(command) => super::registries::registries(&api, command, json).await?,
        Command::Teams(command) => super::teams::teams(&api, command, json).await?,
        Command::Budget(command) => super::budget::budget(&api, command, json).await?,
        Command::Quotas(command) => super::quotas::quotas(&api, command, json).await?,
        Command::Notifications(command) => {
            super::notifications::notifications(&api, command, json).await?
        }
        Command::Credit(CreditCommand::Move {
            amount,
            to_team,
            idempotency_key,
        }) => super::teams::move_credit(&api, &amount, &to_team, idempotency_key, json).await?,
        Command::Login { name } => super::access::login(&api, &name, json).await?,
        Command::Openapi => {
            return print_json(&gpurent_server::openapi_document());
        }
    }
    Ok(())
}
