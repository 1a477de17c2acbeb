//! Endpoints: an app behind one URL, served by replicas (reservations of its shape) that scale
//! with its traffic and to zero (docs/endpoints.md). The routes of `gpurent endpoints` are
//! here; what this control plane knows of each endpoint is in [`live`], the URL's proxy in
//! [`serve`], health checks in [`health`], the scaler in [`scaler`], its series in `/metrics`
//! in [`metrics`].

pub mod figures;
pub mod health;
pub mod keys;
pub mod live;
pub mod metrics;
pub mod scaler;
pub mod serve;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use gpurent_store::{EndpointRow, EndpointSpec, NewEndpoint};
use gpurent_types::api::{
    CreateEndpoint, CreateReservation, Endpoint, EndpointReplica, EndpointScaling, ErrorBody,
    UpdateEndpoint, ENDPOINT_MAX_BODY_MB, ENDPOINT_MAX_QUEUE, ENDPOINT_MAX_QUEUE_TIMEOUT_S,
    ENDPOINT_MAX_REPLICAS,
};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

pub use live::Endpoints;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::Invalid(message.into())
}

/// Whether a name can be the first label of a host name: lowercase letters, digits and `-`,
/// at most 40, neither end a `-`.
fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = (1..=40).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "name: {name:?} must be 1 to 40 lowercase letters, digits and '-', not starting or \
             ending with '-' (it is the first label of the endpoint's URL)"
        )))
    }
}

/// Whether the scaling settings are within their bounds.
fn check_scaling(s: &EndpointScaling) -> Result<(), ApiError> {
    if s.max_replicas == 0 || s.max_replicas > ENDPOINT_MAX_REPLICAS {
        return Err(invalid(format!(
            "max_replicas: from 1 to {ENDPOINT_MAX_REPLICAS} (asked {})",
            s.max_replicas
        )));
    }
    if s.min_replicas > s.max_replicas {
        return Err(invalid(format!(
            "min_replicas: at most max_replicas ({} > {})",
            s.min_replicas, s.max_replicas
        )));
    }
    if s.target_inflight == 0 || s.target_inflight > 10_000 {
        return Err(invalid("target_inflight: from 1 to 10000"));
    }
    if s.scale_down_after_s > 86_400 {
        return Err(invalid("scale_down_after_s: at most 86400 (a day)"));
    }
    if !s.health_path.starts_with('/')
        || s.health_path.len() > 256
        || !s.health_path.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(invalid(format!(
            "health_path: {:?} must start with '/' and be printable ASCII without spaces",
            s.health_path
        )));
    }
    if s.queue_timeout_s == 0 || s.queue_timeout_s > ENDPOINT_MAX_QUEUE_TIMEOUT_S {
        return Err(invalid(format!(
            "queue_timeout_s: from 1 to {ENDPOINT_MAX_QUEUE_TIMEOUT_S}"
        )));
    }
    if s.max_queue == 0 || s.max_queue > ENDPOINT_MAX_QUEUE {
        return Err(invalid(format!(
            "max_queue: from 1 to {ENDPOINT_MAX_QUEUE}"
        )));
    }
    if s.max_body_mb == 0 || s.max_body_mb > ENDPOINT_MAX_BODY_MB {
        return Err(invalid(format!(
            "max_body_mb: from 1 to {ENDPOINT_MAX_BODY_MB}"
        )));
    }
    Ok(())
}

/// Checks a spec as a reservation of its shape would be checked (the same messages).
fn check_spec(tenant: &str, spec: &EndpointSpec) -> Result<(), ApiError> {
    if spec.port == 0 {
        return Err(invalid("port: from 1 to 65535"));
    }
    let row = EndpointRow {
        id: String::new(),
        name: String::new(),
        tenant_id: tenant.to_owned(),
        spec: spec.clone(),
        scaling: EndpointScaling::default(),
        generation: 1,
        state: gpurent_types::api::EndpointState::Idle,
        message: None,
        failures: 0,
        retry_at: None,
        revision: 0,
        created_at: chrono::DateTime::UNIX_EPOCH,
    };
    crate::validate::reservation(tenant, &scaler::replica_body(&row), None, None).map(|_| ())
}

/// The endpoint as shown: its URLs at the host the client asked on, its replicas and figures.
pub(crate) fn view(state: &AppState, headers: &HeaderMap, row: &EndpointRow) -> Endpoint {
    let host = crate::proxy::request_host(headers).unwrap_or("127.0.0.1");
    let scheme = crate::proxy::scheme(state);
    let (replicas, figures): (Vec<EndpointReplica>, _) = match state.endpoints.get(&row.name) {
        Some(live) => {
            let inner = live.lock();
            let replicas = inner
                .slots
                .iter()
                .map(|s| EndpointReplica {
                    index: s.index,
                    id: s.reservation_id.clone(),
                    status: s.status,
                    ready: s.ready,
                    generation: s.generation,
                    node: (!s.node.is_empty()).then(|| s.node.clone()),
                    started_at: s.started_at,
                    inflight: s.inflight,
                })
                .collect();
            let figures = inner
                .figures
                .view(state.now(), inner.queued, inner.inflight());
            (replicas, figures)
        }
        None => (Vec::new(), Default::default()),
    };
    let ready_replicas = u32::try_from(replicas.iter().filter(|r| r.ready).count()).unwrap_or(0);
    let replicas_len = replicas.len();
    Endpoint {
        id: row.id.clone(),
        name: row.name.clone(),
        tenant_id: row.tenant_id.clone(),
        url: format!("{scheme}://{host}{}{}", serve::PREFIX, row.name),
        app_url: format!(
            "{scheme}://{}.e.{}{}/",
            row.name,
            state.config.apps_domain.trim_matches('.'),
            crate::proxy::listener_port(host)
        ),
        gpu_type: row.spec.gpu_type.clone(),
        gpu_count: row
            .spec
            .gpu_count
            .unwrap_or(u32::from(row.spec.vram_gb.is_none())),
        vram_gb: row.spec.vram_gb,
        tier: row.spec.tier,
        image: row.spec.image.clone(),
        command: row.spec.command.clone(),
        env: row.spec.env.keys().cloned().collect(),
        port: row.spec.port,
        scaling: row.scaling.clone(),
        generation: row.generation,
        status: shown_state(row.state, ready_replicas, replicas_len),
        ready_replicas,
        message: row.message.clone(),
        created_at: row.created_at,
        replicas,
        figures,
    }
}

/// The state shown: the scaler's (written at its last pass), brought up to what this control
/// plane sees now of its replicas.
fn shown_state(
    kept: gpurent_types::api::EndpointState,
    ready: u32,
    replicas: usize,
) -> gpurent_types::api::EndpointState {
    use gpurent_types::api::EndpointState::{Idle, Ready, Starting};
    match kept {
        _ if ready > 0 => Ready,
        Ready | Starting | Idle if replicas > 0 => Starting,
        Ready | Starting => Idle,
        other => other,
    }
}

/// The caller's endpoint of this name (an admin's: anyone's); another's is not found.
pub(crate) async fn owned(
    state: &AppState,
    caller: &Caller,
    name: &str,
) -> Result<EndpointRow, ApiError> {
    let row = state.store.endpoint_by_name(name).await?;
    if row.tenant_id != caller.0.id && !caller.is_admin() {
        return Err(gpurent_store::StoreError::not_found("endpoint", name).into());
    }
    Ok(row)
}

/// Create an endpoint. No replica starts until its first request (or `min_replicas`).
#[utoipa::path(post, path = "/api/v1/endpoints", tag = "endpoints", security(("bearer" = [])),
    request_body = CreateEndpoint,
    responses((status = 201, body = Endpoint), (status = 404, body = ErrorBody,
        description = "`template`: no template of that name"),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateEndpoint>,
) -> Result<(StatusCode, Json<Endpoint>), ApiError> {
    check_name(&body.name)?;
    check_scaling(&body.scaling)?;
    // A template gives the image, command and environment, as it does a reservation's.
    let shaped = crate::templates::apply(
        &state,
        &caller.0.id,
        CreateReservation {
            template: body.template.clone(),
            image: body.image.clone(),
            command: body.command.clone(),
            env: body.env.clone(),
            ..scaler::replica_body(&placeholder_row())
        },
    )
    .await?;
    let spec = EndpointSpec {
        gpu_type: body.gpu_type.clone(),
        gpu_count: body.gpu_count,
        vram_gb: body.vram_gb,
        tier: body.tier.unwrap_or_default(),
        image: shaped.image,
        command: shaped.command,
        env: shaped.env,
        port: body.port,
    };
    check_spec(&caller.0.id, &spec)?;
    let row = state
        .store
        .create_endpoint(
            NewEndpoint {
                name: body.name.clone(),
                tenant_id: caller.0.id.clone(),
                spec,
                scaling: body.scaling,
            },
            state.now(),
        )
        .await?;
    state.endpoints.put(row.clone());
    state.endpoints.scaler.notify_one();
    tracing::info!(endpoint = %row.name, tenant = %row.tenant_id, "endpoint created");
    Ok((StatusCode::CREATED, Json(view(&state, &headers, &row))))
}

/// A reservation body of no endpoint, for what only the template fills.
fn placeholder_row() -> EndpointRow {
    EndpointRow {
        id: String::new(),
        name: String::new(),
        tenant_id: String::new(),
        spec: EndpointSpec {
            gpu_type: String::new(),
            gpu_count: None,
            vram_gb: None,
            tier: Default::default(),
            image: None,
            command: Vec::new(),
            env: Default::default(),
            port: 0,
        },
        scaling: EndpointScaling::default(),
        generation: 1,
        state: gpurent_types::api::EndpointState::Idle,
        message: None,
        failures: 0,
        retry_at: None,
        revision: 0,
        created_at: chrono::DateTime::UNIX_EPOCH,
    }
}

/// The caller's endpoints (an admin's: all), by name.
#[utoipa::path(get, path = "/api/v1/endpoints", tag = "endpoints", security(("bearer" = [])),
    responses((status = 200, body = [Endpoint])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
) -> Result<Json<Vec<Endpoint>>, ApiError> {
    let tenant = (!caller.is_admin()).then_some(caller.0.id.as_str());
    let rows = state.store.list_endpoints(tenant).await?;
    Ok(Json(
        rows.iter().map(|r| view(&state, &headers, r)).collect(),
    ))
}

/// One endpoint with its replicas and figures. Another tenant's is not found.
#[utoipa::path(get, path = "/api/v1/endpoints/{name}", tag = "endpoints",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = Endpoint), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Endpoint>, ApiError> {
    let row = owned(&state, &caller, &name).await?;
    Ok(Json(view(&state, &headers, &row)))
}

/// Change an endpoint. A new image, command or environment rolls its replicas over: each new
/// one passes its health check before an old one stops. It also clears the failures that
/// stopped it starting replicas.
#[utoipa::path(patch, path = "/api/v1/endpoints/{name}", tag = "endpoints",
    security(("bearer" = [])), params(("name" = String, Path)), request_body = UpdateEndpoint,
    responses((status = 200, body = Endpoint), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn update(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateEndpoint>,
) -> Result<Json<Endpoint>, ApiError> {
    let row = owned(&state, &caller, &name).await?;
    let mut spec = row.spec.clone();
    let mut scaling = row.scaling.clone();
    if let Some(image) = body.image {
        spec.image = (!image.is_empty()).then_some(image);
    }
    if let Some(command) = body.command {
        spec.command = command;
    }
    if let Some(env) = body.env {
        spec.env = env;
    }
    let s = &mut scaling;
    s.min_replicas = body.min_replicas.unwrap_or(s.min_replicas);
    s.max_replicas = body.max_replicas.unwrap_or(s.max_replicas);
    s.target_inflight = body.target_inflight.unwrap_or(s.target_inflight);
    s.scale_down_after_s = body.scale_down_after_s.unwrap_or(s.scale_down_after_s);
    s.health_path = body.health_path.unwrap_or_else(|| s.health_path.clone());
    s.public = body.public.unwrap_or(s.public);
    s.queue_timeout_s = body.queue_timeout_s.unwrap_or(s.queue_timeout_s);
    s.max_queue = body.max_queue.unwrap_or(s.max_queue);
    s.max_body_mb = body.max_body_mb.unwrap_or(s.max_body_mb);
    check_scaling(&scaling)?;
    check_spec(&row.tenant_id, &spec)?;
    let new_generation = spec != row.spec || row.failures > 0;
    let row = state
        .store
        .update_endpoint(&row.id, &spec, &scaling, new_generation)
        .await?;
    state.endpoints.put(row.clone());
    state.endpoints.scaler.notify_one();
    Ok(Json(view(&state, &headers, &row)))
}

/// Remove an endpoint: its URL stops answering, its keys are dropped, its replicas stop
/// (requests in flight finish or get 503). Answers the endpoint as it was.
#[utoipa::path(delete, path = "/api/v1/endpoints/{name}", tag = "endpoints",
    security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, body = Endpoint), (status = 404, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Endpoint>, ApiError> {
    let row = owned(&state, &caller, &name).await?;
    let was = view(&state, &headers, &row);
    let live = state.endpoints.get(&row.name);
    // Its replicas here take no new request from now on.
    if let Some(live) = &live {
        for slot in &mut live.lock().slots {
            slot.draining = true;
        }
    }
    state.store.delete_endpoint(&row.id, state.now()).await?;
    let replicas = state
        .store
        .endpoint_replicas(std::slice::from_ref(&row.id), None)
        .await?;
    for r in replicas
        .into_iter()
        .filter(|r| !r.reservation.status.is_terminal())
    {
        match &live {
            // Stopped once the requests in flight on them are done.
            Some(live) => scaler::drain(&state, live, r.reservation.id),
            None => scaler::stop_replica(&state, &r.reservation.id).await,
        }
    }
    state.endpoints.scaler.notify_one();
    tracing::info!(endpoint = %row.name, "endpoint removed");
    Ok(Json(was))
}
