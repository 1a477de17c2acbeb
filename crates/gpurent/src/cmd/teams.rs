//! The CLI's `teams create|ls|get|add|rm` and `credit move --to-team`.

use gpurent_types::api::{CreateTeam, CreditMoved, MoveCredit, SetMember, Team, TeamMember};

use super::access::time;
use super::client::{money, segment};
use crate::api_client::{ApiClient, CliError};
use crate::cli::TeamsCommand;
use crate::output::{print_json, print_line, print_table};

fn role(team: &Team) -> String {
    team.role.map_or_else(|| "-".to_owned(), |r| r.to_string())
}

pub async fn teams(api: &ApiClient, command: TeamsCommand, json: bool) -> Result<(), CliError> {
    match command {
        TeamsCommand::Create { name } => {
            let team: Team = api
                .post("/api/v1/teams", &CreateTeam { name }, None)
                .await?;
            if json {
                return print_json(&team);
            }
            print_line(&format!(
                "made team {} ({}); you are its owner. Next: gpurent teams add {} USER --role member, gpurent credit move AMOUNT --to-team {}",
                team.name, team.id, team.name, team.name
            ));
        }
        TeamsCommand::Ls => {
            let teams: Vec<Team> = api.get("/api/v1/teams").await?;
            if json {
                return print_json(&teams);
            }
            let rows: Vec<Vec<String>> = teams
                .iter()
                .map(|t| vec![t.name.clone(), role(t), t.balance.to_string(), t.id.clone()])
                .collect();
            print_table(&["TEAM", "YOUR ROLE", "BALANCE", "ID"], &rows);
        }
        TeamsCommand::Get { name } => {
            let team: Team = api
                .get(&format!("/api/v1/teams/{}", segment(&name)))
                .await?;
            if json {
                return print_json(&team);
            }
            print_line(&format!("team {} ({})", team.name, team.id));
            print_line(&format!("balance: {}", team.balance));
            print_line(&format!("your role: {}", role(&team)));
            let rows: Vec<Vec<String>> = team
                .members
                .iter()
                .map(|m| vec![m.name.clone(), m.role.to_string(), time(Some(m.added_at))])
                .collect();
            print_table(&["MEMBER", "ROLE", "ADDED"], &rows);
        }
        TeamsCommand::Add { team, user, role } => {
            let path = format!(
                "/api/v1/teams/{}/members/{}",
                segment(&team),
                segment(&user)
            );
            let member: TeamMember = api.put(&path, &SetMember { role: role.into() }).await?;
            if json {
                return print_json(&member);
            }
            print_line(&format!(
                "{} is {} of team {team}",
                member.name, member.role
            ));
        }
        TeamsCommand::Rm { team, user } => {
            let path = format!(
                "/api/v1/teams/{}/members/{}",
                segment(&team),
                segment(&user)
            );
            let member: TeamMember = api.delete(&path).await?;
            if json {
                return print_json(&member);
            }
            print_line(&format!("{} is no longer in team {team}", member.name));
        }
    }
    Ok(())
}

/// `gpurent credit move AMOUNT --to-team TEAM`.
pub async fn move_credit(
    api: &ApiClient,
    amount: &str,
    team: &str,
    idempotency_key: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let body = MoveCredit {
        amount: money(amount, "amount")?,
    };
    let path = format!("/api/v1/teams/{}/credit", segment(team));
    // Always keyed, so that a retry after a lost answer moves it once.
    let key = idempotency_key.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let moved: CreditMoved = api.post(&path, &body, Some(&key)).await?;
    if json {
        return print_json(&moved);
    }
    print_line(&format!(
        "moved {} into team {team}: its balance {}, yours {}",
        moved.amount, moved.team_balance, moved.balance
    ));
    Ok(())
}
