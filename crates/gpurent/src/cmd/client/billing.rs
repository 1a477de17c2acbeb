//! Money: the balance, credit grants, usage, invoices and hosts' earnings.

use gpurent_types::api::{
    format_size, Balance, CreditGranted, Earnings, GrantCredit, Invoice, Usage,
};
use gpurent_types::Money;

use super::{money, segment};
use crate::api_client::{ApiClient, CliError};
use crate::cli::Window;
use crate::output::{print_json, print_line, print_raw, print_table};

/// `gpurent credit grant`.
pub(super) async fn grant_credit(
    api: &ApiClient,
    user_id: String,
    amount: String,
    idempotency_key: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let body = GrantCredit {
        amount: money(&amount, "amount")?,
    };
    let path = format!("/api/v1/users/{}/credit", segment(&user_id));
    let g: CreditGranted = api.post(&path, &body, idempotency_key.as_deref()).await?;
    if json {
        return print_json(&g);
    }
    print_line(&format!("balance of {}: {}", g.user_id, g.balance));

    Ok(())
}

/// `gpurent balance`.
pub(super) async fn balance(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let b: Balance = api.get("/api/v1/balance").await?;
    if json {
        return print_json(&b);
    }
    print_line(&format!("{} {}", b.balance, b.currency));
    if b.held != Money::ZERO {
        print_line(&format!("held for reservations: {} {}", b.held, b.currency));
    }
    if b.earnings != Money::ZERO {
        print_line(&format!("earned as a host: {} {}", b.earnings, b.currency));
    }
    // Spend against the budget, where there is one (a 404 is none).
    match api
        .get::<gpurent_types::api::BudgetStatus>("/api/v1/budget")
        .await
    {
        Ok(status) => {
            for line in super::super::budget::summary(&status) {
                print_line(&line);
            }
        }
        Err(e) if e.code == "not_found" || e.code == "forbidden" => {}
        Err(e) => return Err(e),
    }

    Ok(())
}

/// The id of the team named `name` (`--team`), for a statement's `user_id`.
pub(super) async fn team_id(api: &ApiClient, name: &str) -> Result<String, CliError> {
    let team: gpurent_types::api::Team =
        api.get(&format!("/api/v1/teams/{}", segment(name))).await?;
    Ok(team.id)
}

/// `--team NAME` as the statement's `user_id`.
async fn for_team(api: &ApiClient, mut window: Window) -> Result<Window, CliError> {
    if let Some(name) = window.team.take() {
        window.user = Some(team_id(api, &name).await?);
    }
    Ok(window)
}

/// `gpurent usage`.
pub(super) async fn usage(api: &ApiClient, window: Window, json: bool) -> Result<(), CliError> {
    let window = for_team(api, window).await?;
    let u: Usage = api
        .get(&format!("/api/v1/usage?{}", window.query()))
        .await?;
    if json {
        return print_json(&u);
    }
    let rows: Vec<Vec<String>> = u
        .days
        .iter()
        .map(|d| vec![d.date.clone(), d.charged.to_string()])
        .collect();
    print_table(&["DAY (UTC)", "CHARGED"], &rows);
    print_line("");
    let rows: Vec<Vec<String>> = u
        .reservations
        .iter()
        .map(|r| vec![r.reservation_id.clone(), r.charged.to_string()])
        .collect();
    print_table(&["RESERVATION", "CHARGED"], &rows);
    if !u.volumes.is_empty() {
        print_line("");
        let rows: Vec<Vec<String>> = u
            .volumes
            .iter()
            .map(|v| vec![v.name.clone(), v.volume_id.clone(), v.charged.to_string()])
            .collect();
        print_table(&["VOLUME", "ID", "CHARGED"], &rows);
    }
    print_line(&format!("total {}", u.total));

    Ok(())
}

/// `gpurent invoice`: a table, JSON or CSV.
pub(super) async fn invoice(
    api: &ApiClient,
    month: String,
    csv: bool,
    user: Option<String>,
    team: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let user = match team {
        Some(name) => Some(team_id(api, &name).await?),
        None => user,
    };
    let mut path = format!("/api/v1/invoices/{}", segment(&month));
    if let Some(user) = &user {
        path.push_str(&format!("?user_id={}", segment(user)));
    }
    if csv {
        let sep = if user.is_some() { '&' } else { '?' };
        let (text, _) = api.get_text(&format!("{path}{sep}format=csv"), "").await?;
        print_raw(&text);
        return Ok(());
    }
    let invoice: Invoice = api.get(&path).await?;
    if json {
        return print_json(&invoice);
    }
    print_line(&format!(
        "invoice {} for {} ({}), {}",
        invoice.number, invoice.user_name, invoice.user_id, invoice.month
    ));
    let rows: Vec<Vec<String>> = invoice
        .lines
        .iter()
        .map(|l| {
            vec![
                l.reservation_id.clone(),
                match l.vram_gb {
                    Some(gb) => format!("{} {gb} GB", l.gpu_type),
                    None => format!("{}x {}", l.gpu_count, l.gpu_type),
                },
                l.tier.to_string(),
                l.price_per_hour.to_string(),
                l.amount.to_string(),
            ]
        })
        .collect();
    print_table(&["RESERVATION", "GPUS", "TIER", "PRICE/H", "AMOUNT"], &rows);
    if !invoice.storage.is_empty() {
        print_line("");
        let rows: Vec<Vec<String>> = invoice
            .storage
            .iter()
            .map(|l| {
                vec![
                    l.name.clone(),
                    l.volume_id.clone(),
                    format_size(l.size_bytes),
                    l.price_per_gb_month.to_string(),
                    l.amount.to_string(),
                ]
            })
            .collect();
        print_table(&["VOLUME", "ID", "SIZE", "PRICE/GB-MO", "AMOUNT"], &rows);
    }
    print_line(&format!("total {} {}", invoice.total, invoice.currency));

    Ok(())
}

/// `gpurent earnings`.
pub(super) async fn earnings(api: &ApiClient, window: Window, json: bool) -> Result<(), CliError> {
    let window = for_team(api, window).await?;
    let e: Earnings = api
        .get(&format!("/api/v1/earnings?{}", window.query()))
        .await?;
    if json {
        return print_json(&e);
    }
    let rows: Vec<Vec<String>> = e
        .nodes
        .iter()
        .map(|n| vec![n.node.clone(), n.node_id.clone(), n.earned.to_string()])
        .collect();
    print_table(&["NODE", "ID", "EARNED"], &rows);
    print_line(&format!("total {}", e.total));

    Ok(())
}
