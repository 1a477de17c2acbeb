//! The CLI's `registries add|ls|rm`.

use std::io::BufRead;

use gpurent_types::api::{AddRegistry, Registry};

use super::access::time;
use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::cli::RegistriesCommand;
use crate::output::{print_json, print_line, print_table};

/// The password from GPURENT_REGISTRY_PASSWORD, else the first line of stdin.
fn read_password() -> Result<String, CliError> {
    if let Ok(p) = std::env::var("GPURENT_REGISTRY_PASSWORD") {
        return Ok(p);
    }
    eprintln!("the registry's password or token (one line on stdin):");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| CliError::new("invalid_value", format!("cannot read the password: {e}")))?;
    let password = line.trim_end_matches(['\r', '\n']).to_owned();
    if password.is_empty() {
        return Err(CliError::new(
            "invalid_value",
            "no password: give it on stdin or in GPURENT_REGISTRY_PASSWORD",
        ));
    }
    Ok(password)
}

pub async fn registries(
    api: &ApiClient,
    command: RegistriesCommand,
    json: bool,
) -> Result<(), CliError> {
    let header = ["HOST", "USERNAME", "ADDED"];
    let row = |r: &Registry| vec![r.host.clone(), r.username.clone(), time(Some(r.created_at))];
    match command {
        RegistriesCommand::Add { host, username } => {
            let body = AddRegistry {
                host,
                username,
                password: read_password()?,
            };
            let r: Registry = api.post("/api/v1/registries", &body, None).await?;
            if json {
                return print_json(&r);
            }
            print_line(&format!(
                "kept your credential for {} (user {}); your pulls from it use it",
                r.host, r.username
            ));
        }
        RegistriesCommand::Ls => {
            let rs: Vec<Registry> = api.get("/api/v1/registries").await?;
            if json {
                return print_json(&rs);
            }
            print_table(&header, &rs.iter().map(row).collect::<Vec<_>>());
        }
        RegistriesCommand::Rm { host } => {
            let r: Registry = api
                .delete(&format!("/api/v1/registries/{}", segment(&host)))
                .await?;
            if json {
                return print_json(&r);
            }
            print_line(&format!("forgot your credential for {}", r.host));
        }
    }
    Ok(())
}
