//! Volumes: a tenant's storage that outlives their instances. The routes of `gpurent volumes`
//! (make, list, get, grow, remove; their files in [`files`]), where a new one goes, and what a reservation's
//! `--volume NAME:PATH[:ro]` mounts and where it lets it run (docs/volumes.md).

pub mod billing;
pub mod files;
pub mod paths;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use gpurent_store::{NewVolume, NodeFilter, StoreError, VolumeMountRow, VolumeNode};
use gpurent_types::api::{
    format_size, CreateVolume, ErrorBody, MountVolume, ResizeVolume, Volume, VolumeKind,
    VolumeState, MOUNTS_MAX, VOLUME_MAX_BYTES, VOLUME_MIN_BYTES,
};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::pagination::PageQuery;
use crate::state::AppState;
use crate::teams::TeamAction;

/// `?team=NAME`: a team's volumes rather than one's own.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TeamQuery {
    /// A team of the caller's, whose volumes to act on (a token bound to a team acts on its
    /// team's without it).
    #[serde(default)]
    pub team: Option<String>,
}

/// `GET /api/v1/volumes`: a page of them, one's own or a team's ([`PageQuery`]'s fields, and
/// `team`).
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Most items in the answer: 1 to 1000, 100 by default.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// The id of the last item of the previous page (its `X-Next-After` header).
    #[serde(default)]
    pub after: Option<String>,
    /// A team of the caller's, whose volumes to list.
    #[serde(default)]
    pub team: Option<String>,
}

/// Whose volumes the caller acts on: their own, or a team's (named, or their token's) when
/// their role there allows `action` (else 403; a team not theirs is a 404). `None` for an
/// admin naming no team: anyone's.
pub(crate) async fn whose(
    state: &AppState,
    caller: &Caller,
    team: Option<&str>,
    action: TeamAction,
) -> Result<Option<String>, ApiError> {
    if caller.is_admin() && team.is_none() && caller.1.team_id.is_none() {
        return Ok(None);
    }
    Ok(Some(
        crate::teams::acting_for(state, caller, team, action)
            .await?
            .tenant_id,
    ))
}

/// The enforcements under which a node takes local volumes.
const ENFORCED: [&str; 2] = ["loop", "project-quota"];

fn check_size(size_bytes: u64) -> Result<(), ApiError> {
    if !(VOLUME_MIN_BYTES..=VOLUME_MAX_BYTES).contains(&size_bytes) {
        return Err(ApiError::Invalid(format!(
            "size_bytes: from {} to {} (asked {})",
            format_size(VOLUME_MIN_BYTES),
            format_size(VOLUME_MAX_BYTES),
            format_size(size_bytes)
        )));
    }
    Ok(())
}

/// The node a new local volume goes on: the one named (which must be live and keep volumes),
/// else the live node with the most room.
fn choose_node<'a>(
    nodes: &'a [VolumeNode],
    named: Option<&str>,
) -> Result<&'a VolumeNode, ApiError> {
    let keeps = |n: &VolumeNode| {
        n.enforcement
            .as_deref()
            .is_some_and(|e| ENFORCED.contains(&e))
    };
    let Some(named) = named else {
        return nodes
            .iter()
            .filter(|n| n.live && keeps(n))
            .max_by_key(|n| n.room_bytes)
            .ok_or_else(|| {
                StoreError::NoCapacity(
                    "no live node keeps volumes (agents with --volumes-dir, run as root); or make a shared one (--shared)".into(),
                )
                .into()
            });
    };
    let node = nodes
        .iter()
        .find(|n| n.name == named || n.id == named)
        .ok_or_else(|| ApiError::Invalid(format!("node: there is no node {named:?}")))?;
    if !keeps(node) {
        let why = match (&node.enforcement, &node.reason) {
            (_, Some(reason)) => reason.clone(),
            (None, None) => "its agent keeps no volumes (it has no --volumes-dir)".into(),
            (Some(e), None) => format!("its volumes are {e}"),
        };
        return Err(
            StoreError::Conflict(format!("node {} takes no volumes: {why}", node.name)).into(),
        );
    }
    if !node.live {
        return Err(StoreError::Conflict(format!(
            "node {} is not live; a volume is made on a node that is",
            node.name
        ))
        .into());
    }
    Ok(node)
}

/// Make a volume: on a node's disk (`node`, or the live node with the most room), or on the
/// shared storage (`shared`). Billed per GB-month of its size from now until it is removed;
/// the balance must cover a day of it (402).
#[utoipa::path(post, path = "/api/v1/volumes", tag = "volumes", security(("bearer" = [])),
    request_body = CreateVolume,
    responses((status = 201, body = Volume), (status = 400, body = ErrorBody),
        (status = 402, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateVolume>,
) -> Result<(StatusCode, Json<Volume>), ApiError> {
    crate::validate::resource_name(&body.name)?;
    check_size(body.size_bytes)?;
    let nodes = state.store.volume_nodes(state.live_since()).await?;
    let (kind, node_id) = match (body.shared, body.node.as_deref()) {
        (true, Some(_)) => {
            return Err(ApiError::Invalid(
                "give node or shared, not both: a shared volume is on every node that mounts the shared storage".into(),
            ))
        }
        (true, None) => {
            if !nodes.iter().any(|n| n.shared) {
                return Err(StoreError::Conflict(
                    "no node mounts shared volume storage (agents with --shared-volumes-dir)"
                        .into(),
                )
                .into());
            }
            (VolumeKind::Shared, None)
        }
        (false, named) => {
            let node = choose_node(&nodes, named)?;
            if i64::try_from(body.size_bytes).unwrap_or(i64::MAX) > node.room_bytes {
                return Err(StoreError::NoCapacity(format!(
                    "node {} has room for {} more of volumes; this needs {}",
                    node.name,
                    format_size(u64::try_from(node.room_bytes).unwrap_or(0)),
                    format_size(body.size_bytes)
                ))
                .into());
            }
            (VolumeKind::Local, Some(node.id.clone()))
        }
    };
    let owner =
        crate::teams::acting_for(&state, &caller, body.team.as_deref(), TeamAction::Reserve)
            .await?
            .tenant_id;
    billing::check_credit(&state, &owner, body.size_bytes).await?;
    let (price_per_gb_month, host_share_bps) = billing::price(&state);
    let volume = state
        .store
        .create_volume(
            NewVolume {
                owner_id: owner,
                name: body.name,
                kind,
                node_id,
                size_bytes: body.size_bytes,
                price_per_gb_month,
                host_share_bps,
            },
            state.now(),
        )
        .await?;
    state.wake.wake_all();
    Ok((StatusCode::CREATED, Json(volume)))
}

/// The caller's volumes, or a team's (an admin naming no team: everyone's), newest first.
#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes", security(("bearer" = [])),
    params(ListQuery),
    responses((status = 200, body = [Volume], headers(("X-Next-After" = String,
        description = "The cursor of the next page, when this one is full"))),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let page = PageQuery {
        limit: query.limit,
        after: query.after,
    }
    .page()?;
    let owner = whose(&state, &caller, query.team.as_deref(), TeamAction::See).await?;
    let volumes = state
        .store
        .list_volumes(
            owner.as_deref(),
            page.limit,
            page.after.as_deref(),
            state.live_since(),
        )
        .await?;
    let next = page.next_header(volumes.len(), volumes.last().map(|v| v.id.as_str()));
    let volumes: Vec<Volume> = volumes
        .into_iter()
        .map(|v| billing::with_grace(&state, v))
        .collect();
    Ok((axum::response::AppendHeaders(next), Json(volumes)))
}

/// One volume, by name or id: its state, its node, what it uses, who mounts it. Another
/// user's is a 404.
#[utoipa::path(get, path = "/api/v1/volumes/{name}", tag = "volumes", security(("bearer" = [])),
    params(("name" = String, Path, description = "The volume's name or id"), TeamQuery),
    responses((status = 200, body = Volume), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TeamQuery>,
) -> Result<Json<Volume>, ApiError> {
    let owner = whose(&state, &caller, query.team.as_deref(), TeamAction::See).await?;
    let volume = state
        .store
        .volume(owner.as_deref(), &name, state.live_since())
        .await?;
    Ok(Json(billing::with_grace(&state, volume)))
}

/// Grow a volume (never shrink it): at once where it is free, while mounted too.
#[utoipa::path(patch, path = "/api/v1/volumes/{name}", tag = "volumes", security(("bearer" = [])),
    params(("name" = String, Path, description = "The volume's name or id"), TeamQuery),
    request_body = ResizeVolume,
    responses((status = 200, body = Volume), (status = 400, body = ErrorBody),
        (status = 402, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn resize(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TeamQuery>,
    ApiJson(body): ApiJson<ResizeVolume>,
) -> Result<Json<Volume>, ApiError> {
    check_size(body.size_bytes)?;
    let owner = whose(&state, &caller, query.team.as_deref(), TeamAction::Reserve).await?;
    let owner = owner.as_deref();
    let volume = state.store.volume(owner, &name, state.live_since()).await?;
    if volume.state == VolumeState::Unavailable {
        // Its node would grow it only once back, and it would be charged meanwhile.
        return Err(StoreError::Conflict(format!(
            "volume {} is unavailable: its node {} is not live; resize it once the node is back",
            volume.name,
            volume.node.as_deref().unwrap_or("-")
        ))
        .into());
    }
    billing::check_credit(&state, &volume.owner_id, body.size_bytes).await?;
    let (price_per_gb_month, _) = billing::price(&state);
    let volume = state
        .store
        .resize_volume(
            owner,
            &volume.id,
            body.size_bytes,
            price_per_gb_month,
            state.live_since(),
            state.now(),
        )
        .await?;
    state.wake.wake_all();
    Ok(Json(volume))
}

/// Remove a volume and its data, charged up to now. Refused while a live reservation mounts
/// it; an admin removes another user's only after its owner was unpaid for the storage grace.
#[utoipa::path(delete, path = "/api/v1/volumes/{name}", tag = "volumes", security(("bearer" = [])),
    params(("name" = String, Path, description = "The volume's name or id"), TeamQuery),
    responses((status = 200, body = Volume), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(query): ApiQuery<TeamQuery>,
) -> Result<Json<Volume>, ApiError> {
    let owner = whose(
        &state,
        &caller,
        query.team.as_deref(),
        TeamAction::RemoveVolumes,
    )
    .await?;
    let owner = owner.as_deref();
    let volume = state.store.volume(owner, &name, state.live_since()).await?;
    billing::check_removal(&state, owner, &volume).await?;
    let volume = state
        .store
        .remove_volume(owner, &volume.id, state.live_since(), state.now())
        .await?;
    state.wake.wake_all();
    Ok(Json(billing::with_grace(&state, volume)))
}

/// What a new reservation of `owner` mounts, checked: each volume theirs and usable, its path
/// allowed, no volume twice, and where the volumes let it run; a managed job's
/// `checkpoint_volume` goes read-write at `/checkpoint` (a path of the instance's own, free
/// when the node's checkpoint directory is not asked for). Whether another reservation mounts
/// one is checked by the store, under the volume's lock.
pub(crate) async fn mounts(
    state: &AppState,
    owner: &str,
    asked: &[MountVolume],
    checkpoint_volume: Option<&str>,
) -> Result<(Vec<VolumeMountRow>, NodeFilter), ApiError> {
    if asked.is_empty() && checkpoint_volume.is_none() {
        return Ok((Vec::new(), NodeFilter::Any));
    }
    if asked.len() > MOUNTS_MAX {
        return Err(ApiError::Invalid(format!(
            "volumes: at most {MOUNTS_MAX} per reservation"
        )));
    }
    for m in asked {
        if m.path.is_empty() {
            return Err(ApiError::Invalid(format!(
                "volumes: {:?} has no path: give NAME:PATH (data:/workspace), or a template with a volume mount",
                m.volume
            )));
        }
        paths::check(&m.path).map_err(|e| ApiError::Invalid(format!("volumes: {e}")))?;
    }
    paths::check_all(asked.iter().map(|m| m.path.as_str()))
        .map_err(|e| ApiError::Invalid(format!("volumes: {e}")))?;
    let checkpoint = checkpoint_volume.map(|name| MountVolume {
        volume: name.to_owned(),
        path: crate::validate::CHECKPOINT_VOLUME_PATH.to_owned(),
        read_only: false,
    });
    // Each mount, and whether it is the checkpoint volume.
    let asked: Vec<(&MountVolume, bool)> = asked
        .iter()
        .map(|m| (m, false))
        .chain(checkpoint.as_ref().map(|m| (m, true)))
        .collect();
    let mut rows: Vec<VolumeMountRow> = Vec::with_capacity(asked.len());
    let mut nodes = Vec::with_capacity(asked.len());
    for (m, is_checkpoint) in asked {
        let volume = state
            .store
            .volume(Some(owner), &m.volume, state.live_since())
            .await
            .map_err(|e| match e {
                StoreError::NotFound { .. } => ApiError::Invalid(format!(
                    "{}: you have no volume {:?} (gpurent volumes ls)",
                    if is_checkpoint {
                        "checkpoint_volume"
                    } else {
                        "volumes"
                    },
                    m.volume
                )),
                other => other.into(),
            })?;
        if rows.iter().any(|r| r.volume_id == volume.id) {
            return Err(ApiError::Invalid(format!(
                "volumes: {} is mounted twice; mount each volume once",
                volume.name
            )));
        }
        match volume.state {
            VolumeState::Creating | VolumeState::Ready | VolumeState::Resizing => {}
            // Its node is lost: the reservation waits for it in the queue, or is refused.
            VolumeState::Unavailable => {}
            VolumeState::Deleting | VolumeState::Failed => {
                return Err(StoreError::Conflict(format!(
                    "volume {} is {}{}",
                    volume.name,
                    volume.state.as_str(),
                    volume
                        .message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ))
                .into())
            }
        }
        let node_id = match volume.kind {
            VolumeKind::Local => Some(local_node_id(state, &volume).await?),
            VolumeKind::Shared => None,
        };
        let node_name = volume.node.clone();
        nodes.push((volume.kind, node_id.clone()));
        rows.push(VolumeMountRow {
            volume_id: volume.id,
            name: volume.name,
            kind: volume.kind,
            size_bytes: volume.size_bytes,
            path: m.path.trim_end_matches('/').to_owned(),
            read_only: m.read_only,
            node_id,
            node_name,
            checkpoint: is_checkpoint,
        });
    }
    let filter = NodeFilter::of(nodes.iter().map(|(k, n)| (*k, n.as_deref())))
        .map_err(|e| ApiError::Invalid(format!("volumes: {e}")))?;
    // A local volume's node must mount the shared storage too for a shared one beside it.
    if let (NodeFilter::Node(id), true) =
        (&filter, rows.iter().any(|r| r.kind == VolumeKind::Shared))
    {
        let shared = state
            .store
            .volume_nodes(state.live_since())
            .await?
            .into_iter()
            .any(|n| n.id == *id && n.shared);
        if !shared {
            return Err(ApiError::Invalid(
                "volumes: its local volume's node does not mount the shared volume storage its shared volume is on".into(),
            ));
        }
    }
    Ok((rows, filter))
}

/// The id of a local volume's node (the volume shows its name).
async fn local_node_id(state: &AppState, volume: &Volume) -> Result<String, ApiError> {
    let nodes = state.store.volume_nodes(state.live_since()).await?;
    nodes
        .into_iter()
        .find(|n| Some(&n.name) == volume.node.as_ref())
        .map(|n| n.id)
        .ok_or_else(|| StoreError::Corrupt(format!("volume {}'s node is gone", volume.id)).into())
}
