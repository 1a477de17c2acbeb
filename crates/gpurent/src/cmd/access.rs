//! The CLI's access commands: `login`, `users passwd`, `users limits`, `tokens
//! create|ls|revoke`.

use std::io::BufRead;

use gpurent_types::api::{
    CreateToken, Login, Session, SetPassword, Token, TokenCreated, UpdateUser, User,
};

use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::cli::TokensCommand;
use crate::output::{print_json, print_line, print_table};

/// The password from GPURENT_PASSWORD, else the first line of stdin (never an argument: it
/// would show in `ps` and the shell's history).
fn read_password() -> Result<String, CliError> {
    if let Ok(p) = std::env::var("GPURENT_PASSWORD") {
        return Ok(p);
    }
    eprintln!("password (one line on stdin):");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| CliError::new("invalid_value", format!("cannot read the password: {e}")))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

pub(crate) fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

pub async fn login(api: &ApiClient, name: &str, json: bool) -> Result<(), CliError> {
    let body = Login {
        name: name.to_owned(),
        password: read_password()?,
    };
    let session: Session = api.post("/api/v1/login", &body, None).await?;
    if json {
        return print_json(&session);
    }
    print_line(&format!(
        "session token (shown once, valid until {}): {}",
        time(Some(session.expires_at)),
        session.token
    ));
    Ok(())
}

pub async fn passwd(api: &ApiClient, user_id: Option<String>, json: bool) -> Result<(), CliError> {
    let id = user_id.unwrap_or_else(|| "me".to_owned());
    // Your own needs the current one (an admin's, when its login session is old):
    // GPURENT_CURRENT_PASSWORD, so that the new one can still come on stdin.
    let body = SetPassword {
        password: read_password()?,
        current_password: std::env::var("GPURENT_CURRENT_PASSWORD").ok(),
    };
    api.post_no_content(&format!("/api/v1/users/{}/password", segment(&id)), &body)
        .await?;
    if json {
        return print_json(&serde_json::json!({"user_id": id, "password_set": true}));
    }
    print_line("password set");
    Ok(())
}

/// `gpurent users role USER_ID ROLE`.
pub async fn role(api: &ApiClient, user_id: &str, role: &str, json: bool) -> Result<(), CliError> {
    let role = role
        .parse()
        .map_err(|e: gpurent_types::UnknownValue| CliError::new("invalid_value", e.to_string()))?;
    let body = UpdateUser {
        role: Some(role),
        ..UpdateUser::default()
    };
    let user: User = api
        .patch(&format!("/api/v1/users/{}", segment(user_id)), &body)
        .await?;
    if json {
        return print_json(&user);
    }
    print_line(&format!("{}: {}", user.name, user.role));
    Ok(())
}

pub async fn limits(
    api: &ApiClient,
    user_id: &str,
    max_reservations: Option<u32>,
    max_spend_per_hour: Option<String>,
    json: bool,
) -> Result<(), CliError> {
    let max_spend_per_hour = max_spend_per_hour
        .map(|m| {
            m.parse()
                .map_err(|e| CliError::new("invalid_value", format!("max_spend_per_hour: {e}")))
        })
        .transpose()?;
    let body = UpdateUser {
        max_reservations,
        max_spend_per_hour,
        role: None,
    };
    let user: User = api
        .patch(&format!("/api/v1/users/{}", segment(user_id)), &body)
        .await?;
    if json {
        return print_json(&user);
    }
    print_line(&format!(
        "{}: max_reservations {}, max_spend_per_hour {}",
        user.name,
        user.max_reservations
            .map_or_else(|| "default".to_owned(), |n| n.to_string()),
        user.max_spend_per_hour
            .map_or_else(|| "default".to_owned(), |m| m.to_string()),
    ));
    Ok(())
}

pub async fn tokens(api: &ApiClient, command: TokensCommand, json: bool) -> Result<(), CliError> {
    match command {
        TokensCommand::Create {
            name,
            expires_in_days,
            expires,
            scope,
            team,
            with_password,
        } => {
            let team_name = team.clone();
            let body = CreateToken {
                name,
                expires_in_days: expires_in_days.or(expires),
                password: with_password.then(read_password).transpose()?,
                scopes: (!scope.is_empty()).then_some(scope),
                team,
            };
            let created: TokenCreated = api.post("/api/v1/tokens", &body, None).await?;
            if json {
                return print_json(&created);
            }
            let scopes = created.info.scopes.as_ref().map_or_else(
                || "every scope".to_owned(),
                |s| s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","),
            );
            print_line(&format!(
                "token {} (expires {}; {scopes}{}), shown once: {}",
                created.info.id,
                time(created.info.expires_at),
                // The team by the name asked for (a token bound to one: its id).
                team_name
                    .as_ref()
                    .or(created.info.team_id.as_ref())
                    .map(|t| format!("; for team {t}"))
                    .unwrap_or_default(),
                created.token
            ));
        }
        TokensCommand::Ls => {
            let tokens: Vec<Token> = api.get_all("/api/v1/tokens").await?;
            if json {
                return print_json(&tokens);
            }
            let rows: Vec<Vec<String>> = tokens
                .iter()
                .map(|t| {
                    vec![
                        t.id.clone(),
                        t.user_id.clone(),
                        t.kind.clone(),
                        t.name.clone().unwrap_or_else(|| "-".to_owned()),
                        time(Some(t.created_at)),
                        time(t.expires_at),
                        time(t.revoked_at),
                        t.scopes.as_ref().map_or_else(
                            || "all".to_owned(),
                            |s| s.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","),
                        ),
                        t.team_id.clone().unwrap_or_else(|| "-".to_owned()),
                    ]
                })
                .collect();
            print_table(
                &[
                    "ID", "USER", "KIND", "NAME", "CREATED", "EXPIRES", "REVOKED", "SCOPES", "TEAM",
                ],
                &rows,
            );
        }
        TokensCommand::Revoke { id } => {
            let token: Token = api
                .delete(&format!("/api/v1/tokens/{}", segment(&id)))
                .await?;
            if json {
                return print_json(&token);
            }
            print_line(&format!(
                "revoked {} at {}",
                token.id,
                time(token.revoked_at)
            ));
        }
    }
    Ok(())
}
