//! The CLI's `keys add|ls|rm`: the caller's SSH public keys.

use std::io::Read;

use gpurent_types::api::{AddSshKey, SshKey};

use super::access::time;
use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::cli::KeysCommand;
use crate::output::{print_json, print_line, print_table};

/// The key file's text; `-` reads stdin.
fn read_key(file: &std::path::Path) -> Result<String, CliError> {
    let unreadable = |e: std::io::Error| {
        CliError::new(
            "invalid_value",
            format!("cannot read the public key {}: {e}", file.display()),
        )
    };
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .take(64 * 1024)
            .read_to_string(&mut text)
            .map_err(unreadable)?;
        return Ok(text);
    }
    let text = std::fs::read_to_string(file).map_err(unreadable)?;
    // The private half has no place on a server: say so before sending anything.
    if text.contains("PRIVATE KEY") {
        return Err(CliError::new(
            "invalid_value",
            format!(
                "{} is a private key; give its public half ({}.pub)",
                file.display(),
                file.display()
            ),
        ));
    }
    Ok(text)
}

pub async fn keys(api: &ApiClient, command: KeysCommand, json: bool) -> Result<(), CliError> {
    match command {
        KeysCommand::Add { file, name } => {
            let body = AddSshKey {
                public_key: read_key(&file)?,
                name,
                // A `gpurent login` session older than 5 minutes needs the password.
                password: std::env::var("GPURENT_PASSWORD").ok(),
            };
            let key: SshKey = api.post("/api/v1/ssh-keys", &body, None).await?;
            if json {
                return print_json(&key);
            }
            print_line(&format!(
                "added key {} ({}, {})",
                key.id, key.name, key.fingerprint
            ));
        }
        KeysCommand::Ls => {
            let keys: Vec<SshKey> = api.get_all("/api/v1/ssh-keys").await?;
            if json {
                return print_json(&keys);
            }
            let rows: Vec<Vec<String>> = keys
                .iter()
                .map(|k| {
                    vec![
                        k.id.clone(),
                        k.name.clone(),
                        k.algorithm.clone(),
                        k.fingerprint.clone(),
                        time(Some(k.created_at)),
                    ]
                })
                .collect();
            print_table(&["ID", "NAME", "TYPE", "FINGERPRINT", "CREATED"], &rows);
        }
        KeysCommand::Rm { id } => {
            let key: SshKey = api
                .delete(&format!("/api/v1/ssh-keys/{}", segment(&id)))
                .await?;
            if json {
                return print_json(&serde_json::json!({"id": key.id}));
            }
            print_line(&format!("removed key {} ({})", key.id, key.fingerprint));
        }
    }
    Ok(())
}
