//! `GET /api/v1/volumes/{name}/files`: a volume's files with no instance (`gpurent volumes
//! cp`). The client's connection is upgraded to SFTP and relayed through the tunnel of a node
//! that holds the volume, whose agent serves it confined to the volume's directory. No GPU is
//! used or billed.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gpurent_store::StoreError;
use gpurent_tunnel::{OpenStream, StreamKind};
use gpurent_types::api::{ErrorBody, Volume, VolumeKind, VolumeState, VOLUME_FILES_UPGRADE};
use hyper_util::rt::TokioIo;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;
use crate::teams::TeamAction;

/// Upgrade to SFTP v3 on the volume (`Upgrade: gpurent-sftp/1`), its root the volume's root.
/// Only the volume's owner, or a member of its team who may enter the team's instances
/// (`?team=NAME`); another user's volume is a 404. Refused (409) while the volume is
/// not ready or its node is not live.
#[utoipa::path(get, path = "/api/v1/volumes/{name}/files", tag = "volumes",
    security(("bearer" = [])),
    params(("name" = String, Path, description = "The volume's name or id"),
        super::TeamQuery),
    responses((status = 101, description = "SFTP v3 follows, confined to the volume"),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub(crate) async fn files(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<super::TeamQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let asks = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(VOLUME_FILES_UPGRADE));
    if !asks {
        return Err(ApiError::Invalid(format!(
            "a volume's files are reached with the header Upgrade: {VOLUME_FILES_UPGRADE} (gpurent volumes cp speaks it)"
        )));
    }
    // Its owner's only (or a team member's who may enter the team's instances), admins
    // included: a volume's data is its owner's.
    let owner = crate::teams::acting_for(&state, &caller, query.team.as_deref(), TeamAction::Enter)
        .await?
        .tenant_id;
    let volume = state
        .store
        .volume(Some(&owner), &name, state.live_since())
        .await?;
    check_state(&volume)?;
    let node = serving_node(&state, &volume).await?;
    let open = OpenStream {
        reservation_id: String::new(),
        epoch: 0,
        kind: StreamKind::VolumeFiles {
            volume_id: volume.id.clone(),
            shared: volume.kind == VolumeKind::Shared,
        },
        pty: None,
        env: Vec::new(),
    };
    let stream = state.tunnels.dial(&node, open).await.map_err(|e| {
        ApiError::BadGateway(format!(
            "cannot reach volume {}'s files on node {node}: {e}",
            volume.name
        ))
    })?;
    tracing::info!(volume_id = %volume.id, %node, user_id = %caller.0.id, "volume files: serving");
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(error = %e, "volume files: the upgrade did not complete");
                return;
            }
        };
        let mut client = TokioIo::new(upgraded);
        let mut node_side = stream.into_io();
        let copied = tokio::io::copy_bidirectional(&mut client, &mut node_side).await;
        tracing::info!(volume_id = %volume.id, ?copied, "volume files: done");
    });
    Ok((
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, HeaderValue::from_static("upgrade")),
            (
                header::UPGRADE,
                HeaderValue::from_static(VOLUME_FILES_UPGRADE),
            ),
        ],
    )
        .into_response())
}

/// A volume's files are served while it is ready (or growing), and never while it is made,
/// removed, failed, or on a node that is lost.
fn check_state(volume: &Volume) -> Result<(), ApiError> {
    let why = match volume.state {
        VolumeState::Ready | VolumeState::Resizing => return Ok(()),
        VolumeState::Creating => "is still being made on its node; try again in a moment".into(),
        VolumeState::Unavailable => format!(
            "is unavailable: its node {} is not live; its data comes back with it",
            volume.node.as_deref().unwrap_or("-")
        ),
        VolumeState::Deleting => "is being removed".into(),
        VolumeState::Failed => format!(
            "failed{}",
            volume
                .message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        ),
    };
    Err(StoreError::Conflict(format!("volume {} {why}", volume.name)).into())
}

/// The node that serves the files: a local volume's own; for a shared one, a live node that
/// mounts the shared storage, one whose tunnel is held here first.
async fn serving_node(state: &AppState, volume: &Volume) -> Result<String, ApiError> {
    if volume.kind == VolumeKind::Local {
        return volume.node.clone().ok_or_else(|| {
            StoreError::Corrupt(format!("local volume {} has no node", volume.id)).into()
        });
    }
    let nodes = state.store.volume_nodes(state.live_since()).await?;
    let mut live: Vec<String> = nodes
        .into_iter()
        .filter(|n| n.live && n.shared)
        .map(|n| n.name)
        .collect();
    live.sort_by_key(|name| !state.tunnels.is_connected(name));
    live.into_iter().next().ok_or_else(|| {
        StoreError::Conflict(format!(
            "volume {} is on the shared storage, and no live node mounts it now",
            volume.name
        ))
        .into()
    })
}
