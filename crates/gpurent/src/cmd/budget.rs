//! The CLI's `budget set|get|rm`, and the budget lines of `balance`.

use gpurent_types::api::{BudgetStatus, SetBudget};

use super::access::time;
use super::client::{money, segment};
use crate::api_client::{ApiClient, CliError};
use crate::cli::BudgetCommand;
use crate::output::{print_json, print_line, print_table};

fn path(team: Option<&str>) -> String {
    match team {
        Some(t) => format!("/api/v1/budget?team={}", segment(t)),
        None => "/api/v1/budget".to_owned(),
    }
}

pub async fn budget(api: &ApiClient, command: BudgetCommand, json: bool) -> Result<(), CliError> {
    match command {
        BudgetCommand::Set {
            team,
            monthly,
            alert_at,
            stop_at_limit,
            low_balance_hours,
        } => {
            let body = SetBudget {
                team,
                monthly: money(&monthly, "--monthly")?,
                alert_at: Some(alert_at),
                stop_at_limit,
                low_balance_hours: Some(low_balance_hours),
            };
            let status: BudgetStatus = api.put("/api/v1/budget", &body).await?;
            if json {
                return print_json(&status);
            }
            print_status(&status);
        }
        BudgetCommand::Get { team } => {
            let status: BudgetStatus = api.get(&path(team.as_deref())).await?;
            if json {
                return print_json(&status);
            }
            print_status(&status);
        }
        BudgetCommand::Rm { team } => {
            api.delete_no_content(&path(team.as_deref())).await?;
            if json {
                return print_json(&serde_json::json!({"removed": true}));
            }
            print_line("budget removed");
        }
    }
    Ok(())
}

/// The lines `budget get` and `balance` print.
pub(super) fn summary(s: &BudgetStatus) -> Vec<String> {
    let whose = s
        .team
        .as_deref()
        .map_or_else(String::new, |t| format!(" of team {t}"));
    let mut lines = vec![format!(
        "budget{whose} for {}: spent {} of {} ({}), forecast {} at {} per hour",
        s.month,
        s.spent,
        s.monthly,
        if s.over {
            "spent: new reservations are refused"
        } else {
            "within it"
        },
        s.forecast,
        s.burn_per_hour
    )];
    if s.stop_at_limit {
        lines.push("at the limit, running reservations are stopped".to_owned());
    }
    lines
}

fn print_status(s: &BudgetStatus) {
    for line in summary(s) {
        print_line(&line);
    }
    let thresholds: Vec<String> = s.alert_at.iter().map(|p| format!("{p}%")).collect();
    print_line(&format!(
        "alerts at {}; low balance under {} hours of spend",
        thresholds.join(", "),
        s.low_balance_hours
    ));
    if !s.alerts.is_empty() {
        let rows: Vec<Vec<String>> = s
            .alerts
            .iter()
            .map(|a| {
                let what = if a.alert.chars().all(|c| c.is_ascii_digit()) {
                    format!("{}%", a.alert)
                } else {
                    a.alert.replace('_', " ")
                };
                vec![what, a.spent.to_string(), time(Some(a.fired_at))]
            })
            .collect();
        print_table(&["ALERT", "SPENT THEN", "FIRED"], &rows);
    }
}
