//! The CLI's `volumes create|ls|get|resize|rm|cp`: the caller's volumes.

use std::time::Duration;

use gpurent_types::api::{
    format_size, parse_size, CreateVolume, ResizeVolume, Volume, VolumeKind, VolumeState,
    VOLUME_FILES_UPGRADE,
};

use std::time::Instant;

use russh_sftp::client::SftpSession;

use super::access::time;
use super::client::segment;
use super::cp::{self, Location};
use crate::api_client::{ApiClient, CliError};
use crate::cli::VolumesCommand;
use crate::output::{print_json, print_line, print_table};

/// How long `create` and `resize` wait for the node to make or grow the volume.
const WAIT: Duration = Duration::from_secs(120);

fn size_of(text: &str) -> Result<u64, CliError> {
    parse_size(text).map_err(|e| CliError::new("invalid_value", format!("--size {e}")))
}

/// A volume's path, of a team's with `team`.
fn path_of(name: &str, team: Option<&str>) -> String {
    format!("/api/v1/volumes/{}{}", segment(name), with_team(team))
}

fn with_team(team: Option<&str>) -> String {
    team.map_or_else(String::new, |t| format!("?team={}", segment(t)))
}

/// One volume as a table row.
fn row(v: &Volume) -> Vec<String> {
    vec![
        v.name.clone(),
        v.id.clone(),
        match v.kind {
            VolumeKind::Local => v.node.clone().unwrap_or_else(|| "-".into()),
            VolumeKind::Shared => "shared".into(),
        },
        format_size(v.size_bytes),
        v.used_bytes.map_or_else(|| "-".into(), format_size),
        match (&v.message, v.deletable_after) {
            (Some(m), _) => format!("{}: {m}", v.state.as_str()),
            (None, Some(after)) => format!(
                "{}, unpaid: may be deleted after {}",
                v.state.as_str(),
                time(Some(after))
            ),
            (None, None) => v.state.as_str().to_owned(),
        },
        format!("{}/GB-mo", v.price_per_gb_month),
        v.charged.to_string(),
        v.used_by
            .iter()
            .map(|u| {
                if u.read_only {
                    format!("{} (ro)", u.reservation_id)
                } else {
                    u.reservation_id.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", "),
        time(Some(v.created_at)),
    ]
}

const HEADER: [&str; 10] = [
    "NAME",
    "ID",
    "WHERE",
    "SIZE",
    "USED",
    "STATE",
    "PRICE",
    "CHARGED",
    "MOUNTED BY",
    "CREATED",
];

/// Waits, saying so on stderr, while the volume's node makes or grows it; the volume as it
/// is at the end.
async fn settled(api: &ApiClient, mut v: Volume, team: Option<&str>) -> Result<Volume, CliError> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut said = false;
    while matches!(v.state, VolumeState::Creating | VolumeState::Resizing)
        && tokio::time::Instant::now() < deadline
    {
        if !said {
            eprintln!(
                "{} volume {} on node {}...",
                if v.state == VolumeState::Creating {
                    "making"
                } else {
                    "growing"
                },
                v.name,
                v.node.as_deref().unwrap_or("?")
            );
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        v = api.get(&path_of(&v.id, team)).await?;
    }
    Ok(v)
}

pub async fn volumes(api: &ApiClient, command: VolumesCommand, json: bool) -> Result<(), CliError> {
    match command {
        VolumesCommand::Create {
            name,
            size,
            node,
            shared,
            team,
        } => {
            let body = CreateVolume {
                name,
                size_bytes: size_of(&size)?,
                node,
                shared,
                team: team.clone(),
            };
            let v: Volume = api.post("/api/v1/volumes", &body, None).await?;
            let v = settled(api, v, team.as_deref()).await?;
            if json {
                return print_json(&v);
            }
            print_table(&HEADER, &[row(&v)]);
            failed(&v)?;
        }
        VolumesCommand::Ls { team } => {
            let path = format!("/api/v1/volumes{}", with_team(team.as_deref()));
            let vs: Vec<Volume> = api.get_all(&path).await?;
            if json {
                return print_json(&vs);
            }
            print_table(&HEADER, &vs.iter().map(row).collect::<Vec<_>>());
        }
        VolumesCommand::Get { name, team } => {
            let v: Volume = api.get(&path_of(&name, team.as_deref())).await?;
            if json {
                return print_json(&v);
            }
            print_table(&HEADER, &[row(&v)]);
            if let Some(e) = &v.enforcement {
                print_line(&format!("size enforced by: {e}"));
            }
        }
        VolumesCommand::Resize { name, size, team } => {
            let body = ResizeVolume {
                size_bytes: size_of(&size)?,
            };
            let v: Volume = api.patch(&path_of(&name, team.as_deref()), &body).await?;
            let v = settled(api, v, team.as_deref()).await?;
            if json {
                return print_json(&v);
            }
            print_table(&HEADER, &[row(&v)]);
            failed(&v)?;
        }
        VolumesCommand::Cp {
            src,
            dst,
            recursive,
            team,
        } => return copy(api, (&src, &dst), recursive, team.as_deref(), json).await,
        VolumesCommand::Rm { name, team } => {
            let v: Volume = api.delete(&path_of(&name, team.as_deref())).await?;
            if json {
                return print_json(&v);
            }
            print_line(&format!(
                "removed volume {} ({}); its node deletes its data",
                v.name, v.id
            ));
        }
    }
    Ok(())
}

/// `volumes cp`: SFTP on an upgraded API connection, relayed by the control plane to an agent
/// that holds the volume and serves it confined to it; no instance is needed.
async fn copy(
    api: &ApiClient,
    (src, dst): (&str, &str),
    recursive: bool,
    team: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let (name, upload_from, remote, download_to) =
        match (Location::parse(src), Location::parse(dst)) {
            (Location::Local(src), Location::Remote { id, path }) => (id, Some(src), path, None),
            (Location::Remote { id, path }, Location::Local(dst)) => (id, None, path, Some(dst)),
            (Location::Local(_), Location::Local(_)) => {
                return Err(CliError::new(
                    "invalid_value",
                    "neither side is in a volume: write one of them as NAME:PATH",
                ))
            }
            (Location::Remote { .. }, Location::Remote { .. }) => {
                return Err(CliError::new(
                    "invalid_value",
                    "both sides are in volumes: copy through a local file",
                ))
            }
        };
    // Paths start at the volume's root, absolute or not.
    let remote = remote.trim_start_matches('/').to_owned();
    // The whole volume copied into a local directory goes under the volume's name.
    let download_to = match download_to {
        Some(local) if remote.is_empty() && local.is_dir() => Some(local.join(&name)),
        other => other,
    };
    let started = Instant::now();
    let io = api
        .upgrade(
            &format!(
                "/api/v1/volumes/{}/files{}",
                segment(&name),
                with_team(team)
            ),
            VOLUME_FILES_UPGRADE,
        )
        .await?;
    let sftp = SftpSession::new_with_config(io, cp::sftp_config())
        .await
        .map_err(|e| {
            CliError::new(
                "volume_files",
                format!("volume {name}'s node did not start serving its files: {e}"),
            )
        })?;
    let bytes = match (upload_from, download_to) {
        (Some(local), _) => cp::upload(&sftp, &local, &remote, recursive).await,
        (_, Some(local)) => cp::download(&sftp, &remote, &local, recursive).await,
        (None, None) => Ok(0),
    };
    let _ = sftp.close().await;
    cp::report(bytes?, started, json)
}

/// A volume its node could not make or grow is this command's failure.
fn failed(v: &Volume) -> Result<(), CliError> {
    match (&v.message, v.state) {
        (Some(m), _) => Err(CliError::new(
            "volume_failed",
            format!("volume {}: {m}", v.name),
        )),
        (None, VolumeState::Failed) => Err(CliError::new(
            "volume_failed",
            format!("volume {} failed", v.name),
        )),
        _ => Ok(()),
    }
}
