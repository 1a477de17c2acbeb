//! Admin: users, and checks of the platform's books (spot outcomes, the ledger).

use gpurent_types::api::{CreateUser, LedgerReport, SpotStats, User, UserCreated};
use gpurent_types::Role;

use super::money;
use crate::api_client::{ApiClient, CliError};
use crate::output::{print_json, print_line, print_table};

/// `gpurent users create`.
pub(super) async fn create_user(
    api: &ApiClient,
    name: String,
    role: String,
    credit: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let role = role
        .parse::<Role>()
        .map_err(|e| CliError::new("invalid_value", e.to_string()))?;
    let credit = credit.as_deref().map(|c| money(c, "credit")).transpose()?;
    let body = CreateUser {
        name,
        role: Some(role),
        credit,
    };
    let u: UserCreated = api.post("/api/v1/users", &body, None).await?;
    if json {
        return print_json(&u);
    }
    print_line(&format!("created {} {} ({})", u.role, u.name, u.id));
    print_line(&format!("token (shown once): {}", u.token));

    Ok(())
}

/// `gpurent users ls`.
pub(super) async fn users(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let users: Vec<User> = api.get_all("/api/v1/users").await?;
    if json {
        return print_json(&users);
    }
    let rows = users
        .iter()
        .map(|u| {
            vec![
                u.id.clone(),
                u.name.clone(),
                u.role.to_string(),
                u.balance.to_string(),
            ]
        })
        .collect::<Vec<_>>();
    print_table(&["ID", "NAME", "ROLE", "BALANCE"], &rows);

    Ok(())
}

/// `gpurent admin spot`.
pub(super) async fn spot(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let stats: SpotStats = api.get("/api/v1/admin/spot").await?;
    if json {
        return print_json(&stats);
    }
    print_line(&format!(
        "{} spot instances ended: {} completed, {} preempted, {} interrupted in all; success rate {}",
        stats.ended,
        stats.completed,
        stats.preempted,
        stats.interrupted,
        stats
            .success_rate
            .map_or("n/a".to_owned(), |r| format!("{:.4}%", r * 100.0))
    ));

    Ok(())
}

/// `gpurent admin ledger-check`: exits 1 (after printing) when the books do not balance.
pub(super) async fn ledger_check(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let report: LedgerReport = api.get("/api/v1/admin/ledger-check").await?;
    if json {
        print_json(&report)?;
    } else {
        print_line(&format!(
            "{}: {} transfers, balances sum to {}, {} mismatched accounts",
            if report.ok { "ok" } else { "BROKEN" },
            report.transfers,
            report.sum,
            report.mismatched.len()
        ));
        for m in &report.mismatched {
            print_line(&format!(
                "  {}: cached {} but transfers say {}",
                m.account, m.cached, m.derived
            ));
        }
        for p in &report.problems {
            print_line(&format!("  {p}"));
        }
    }
    if !report.ok {
        // Exit 1 with the report already printed: not an error of the command.
        std::process::exit(1);
    }

    Ok(())
}
