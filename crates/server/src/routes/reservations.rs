//! Offers and reservations: create, list, get, stop, and the lifecycle log.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use gpurent_types::api::{
    CreateReservation, ErrorBody, GpuUsage, GpuUsageHour, Offer, Reservation, ReservationStopped,
};

use crate::audit::AuditNote;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{idempotency_key, ApiJson, ApiPath, ApiQuery};
use crate::pagination::PageQuery;
use crate::state::AppState;
use crate::teams::roles::TeamAction;
use crate::validate;

/// What can be rented now: free whole GPUs per type and their on-demand price.
#[utoipa::path(get, path = "/api/v1/offers", tag = "reservations", security(("bearer" = [])),
    responses((status = 200, body = [Offer]), (status = 401, body = ErrorBody)))]
pub(crate) async fn offers(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<Vec<Offer>>, ApiError> {
    Ok(Json(
        state
            .store
            .offers(&state.live().prices, state.live_since())
            .await?,
    ))
}

/// Reserve GPUs. Placement and the GPU allocation happen in one transaction; the
/// reservation starts `pending` until its node's agent picks it up. When nothing fits, the
/// answer is 409 `no_capacity`, or with `"queue": true` a `pending` reservation without a node
/// (its `queue_reason` says why it waits) that the scheduling loop places later.
#[utoipa::path(post, path = "/api/v1/reservations", tag = "reservations",
    security(("bearer" = [])), request_body = CreateReservation,
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$",
        description = "A retried request with the same key returns the first reservation")),
    responses((status = 201, body = Reservation), (status = 400, body = ErrorBody),
        (status = 402, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`team`: no team of yours has that name"),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    note: AuditNote,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateReservation>,
) -> Result<(StatusCode, Json<Reservation>), ApiError> {
    let body = crate::templates::apply(&state, &caller.0.id, body).await?;
    let card = card_vram_mb(&state, &body).await?;
    // Made for a team, it is the team's: paid from its balance, its volumes mounted.
    let payer = crate::teams::payer(&state, &caller, body.team.as_deref()).await?;
    let tenant = payer.tenant_id;
    let array = crate::arrays::spec(&body)?;
    let mut new = validate::reservation(&tenant, &body, idempotency_key(&headers)?, card)?;
    new.created_by = payer.team.is_some().then(|| caller.0.id.clone());
    new.limits = state.live().tenant_limits;
    (new.mounts, new.node_filter) = crate::volumes::mounts(
        &state,
        &tenant,
        &body.volumes,
        body.checkpoint_volume.as_deref(),
    )
    .await?;
    // The owner's credential for the image's registry goes with the secrets (a reserved name:
    // never in the instance's environment; not among the names a reservation shows).
    let mut secrets = body.secrets.clone();
    if let Some((name, auth)) =
        crate::registries::pull_secret(&state, &caller.0.id, body.image.as_deref()).await?
    {
        secrets.insert(name, auth);
    }
    if !secrets.is_empty() {
        new.sealed_secrets = Some(
            crate::secrets::seal(&*state.config.master_key, &secrets).map_err(ApiError::from)?,
        );
    }
    if let Some(spec) = array {
        let mut made = crate::arrays::create(&state, &body, spec, new).await?;
        made.team = made.team.or(payer.team);
        note.reservation(&made);
        return Ok((StatusCode::CREATED, Json(made)));
    }
    let now = state.now();
    let expected = state.expected.note(new.gpu_type.key(), new.want);
    let team = payer.team;
    let (mut reservation, nodes) = match note.within(&state) {
        Some(record) => {
            let reserved = state
                .store
                .reserve_recorded(
                    new,
                    &state.live().prices,
                    state.live_since(),
                    now,
                    &expected,
                    record,
                )
                .await?;
            if reserved.recorded {
                note.recorded();
            }
            (reserved.reservation, reserved.nodes)
        }
        None => {
            state
                .store
                .reserve(
                    new,
                    &state.live().prices,
                    state.live_since(),
                    now,
                    &expected,
                )
                .await?
        }
    };
    // Placed at once, and not the replay of an earlier request with its Idempotency-Key.
    if reservation.node.is_some()
        && reservation.created_at.timestamp_micros() == now.timestamp_micros()
    {
        state.metrics.observe_wait(std::time::Duration::ZERO);
    }
    for node in &nodes {
        state.wake.wake(node);
    }
    if reservation.queue_reason.is_some() {
        state.wake.wake_scheduler();
    }
    // The insert's answer does not read the team's name back.
    if reservation.tenant_id != caller.0.id {
        reservation.team = reservation.team.or(team);
    }
    note.reservation(&reservation);
    Ok((StatusCode::CREATED, Json(reservation)))
}

/// The memory of the largest card of the body's GPU type, when the body asks for a share (a
/// share is sized against it); `None` otherwise, or when no node has one.
pub(crate) async fn card_vram_mb(
    state: &AppState,
    body: &CreateReservation,
) -> Result<Option<u64>, ApiError> {
    if !validate::asks_share(body) {
        return Ok(None);
    }
    let Ok(gpu_type) = gpurent_types::GpuType::parse(&body.gpu_type) else {
        // Refused by validation, naming the field.
        return Ok(None);
    };
    Ok(state.store.gpu_vram_mb(&gpu_type).await?)
}

/// The caller's reservations, newest first (an admin sees all), a page at a time.
#[utoipa::path(get, path = "/api/v1/reservations", tag = "reservations",
    security(("bearer" = [])), params(PageQuery),
    responses((status = 200, body = [Reservation], headers(("X-Next-After" = String,
        description = "The cursor of the next page, when this one is full"))),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    uri: axum::http::Uri,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let page = query.page()?;
    let mut list = state
        .store
        .list_reservations(&caller.scope(), page.limit, page.after.as_deref())
        .await?;
    super::ssh::add_connection(&state, &headers, &uri, &mut list);
    let next = page.next_header(list.len(), list.last().map(|r| r.id.as_str()));
    Ok((axum::response::AppendHeaders(next), Json(list)))
}

/// One reservation. Another tenant's is reported as not found.
#[utoipa::path(get, path = "/api/v1/reservations/{id}", tag = "reservations",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 200, body = Reservation), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    note: AuditNote,
    headers: HeaderMap,
    uri: axum::http::Uri,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Reservation>, ApiError> {
    let scope = caller.scope();
    let id = crate::arrays::task_id(&state, id, &scope).await?;
    let mut reservation = match state.store.get_reservation(&id, &scope).await {
        // An array's id: the array as one reservation.
        Err(gpurent_store::StoreError::NotFound { .. }) => {
            crate::arrays::one(&state, &id, &scope).await?
        }
        found => found?,
    };
    note.reservation(&reservation);
    reservation.http = crate::proxy::endpoints(&state, &headers, &reservation);
    super::ssh::add_connection(
        &state,
        &headers,
        &uri,
        std::slice::from_mut(&mut reservation),
    );
    Ok(Json(reservation))
}

/// The longest stretch of a reservation's life its GPU figures cover: the latest of it.
const GPU_USAGE_SPAN: chrono::Duration = chrono::Duration::days(31);

/// What its GPUs did over its life, hour by hour (the last 31 days of a longer one): the mean
/// utilisation and memory used of each GPU in each UTC hour, from its nodes' telemetry. A
/// share's GPU is shared, and its figures are the whole GPU's. Another tenant's reservation is
/// reported as not found.
#[utoipa::path(get, path = "/api/v1/reservations/{id}/gpu-usage", tag = "reservations",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 200, body = GpuUsage), (status = 404, body = ErrorBody)))]
pub(crate) async fn gpu_usage(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<GpuUsage>, ApiError> {
    use chrono::DurationRound;

    let id = crate::arrays::task_id(&state, id, &caller.scope()).await?;
    let r = state.store.get_reservation(&id, &caller.scope()).await?;
    let shared = r.vram_gb.is_some();
    let to = r.ended_at.unwrap_or_else(|| state.now());
    let Some(started) = r.started_at.filter(|s| *s <= to) else {
        return Ok(Json(GpuUsage {
            from: r.created_at,
            to,
            shared,
            hours: Vec::new(),
        }));
    };
    let from = started.max(to - GPU_USAGE_SPAN);
    let from = from
        .duration_trunc(chrono::Duration::hours(1))
        .unwrap_or(from);
    let rows = state.store.gpu_hours_of(&r.gpus, from, to).await?;
    let hours = rows
        .into_iter()
        .filter(|h| h.samples > 0)
        .map(|h| {
            #[allow(clippy::cast_precision_loss)] // sums of an hour's samples
            let mean = |sum: i64| sum as f64 / h.samples as f64;
            GpuUsageHour {
                hour: h.hour,
                samples: u64::try_from(h.samples).unwrap_or(0),
                utilization_pct: mean(h.util_sum),
                memory_used_mb: mean(h.mem_used_mb_sum),
                memory_max_mb: u64::try_from(h.mem_max_mb).unwrap_or(0),
                gpu: h.gpu_uuid,
            }
        })
        .collect();
    Ok(Json(GpuUsage {
        from,
        to,
        shared,
        hours,
    }))
}

/// Stop a reservation: billing ends now, the instance is stopped, the GPUs are freed once its
/// agent confirms. Stopping an ended reservation changes nothing.
#[utoipa::path(post, path = "/api/v1/reservations/{id}/stop", tag = "reservations",
    security(("bearer" = [])), params(("id" = String, Path)),
    responses((status = 200, body = ReservationStopped), (status = 404, body = ErrorBody)))]
pub(crate) async fn stop(
    State(state): State<AppState>,
    caller: Caller,
    note: AuditNote,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ReservationStopped>, ApiError> {
    let scope = caller.scope();
    let id = crate::arrays::task_id(&state, id, &scope).await?;
    // A team's reservation is stopped by its members and above, not its viewers.
    let current = match state.store.get_reservation(&id, &scope).await {
        Err(gpurent_store::StoreError::NotFound { .. }) => {
            // An array's id: the array stops, and each of its live tasks.
            let array = crate::arrays::one(&state, &id, &scope).await?;
            crate::teams::reservation_action(&state, &caller.0, &array, TeamAction::Stop).await?;
            let stopped = crate::arrays::stop(&state, &id, &scope).await?;
            note.reservation(&array);
            return Ok(Json(stopped));
        }
        found => found?,
    };
    crate::teams::reservation_action(&state, &caller.0, &current, TeamAction::Stop).await?;
    let (r, node) = state.store.request_stop(&id, &scope, state.now()).await?;
    if let Some(node) = node {
        state.wake.wake(&node);
    }
    state.wake.wake_scheduler();
    tracing::info!(reservation_id = %r.id, status = %r.status, "stop requested");
    note.reservation(&r);
    Ok(Json(ReservationStopped {
        id: r.id,
        status: r.status,
    }))
}

/// Where `GET .../logs` resumes.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogsQuery {
    /// Byte offset to read from: 0, or the `X-Log-Next-Offset` of the previous answer.
    #[serde(default)]
    #[param(required = false)]
    offset: u64,
}

/// Most output returned by one `GET .../logs`.
const LOGS_PAGE_BYTES: u64 = 1024 * 1024;

/// The instance's output (stdout and stderr), its bytes from byte `offset` on as its agent
/// shipped them (not necessarily UTF-8), at most 1 MiB. The `X-Log-Next-Offset` header says
/// where the next read starts (`gpurent logs --follow`); an empty answer, that there is
/// nothing more for now. Past 16 MiB a log keeps the end of each run, after a line
/// `[gpurent: N bytes of output left out here; ...]`. Kept until `--log-retention-days` after
/// the reservation ended.
#[utoipa::path(get, path = "/api/v1/reservations/{id}/logs", tag = "reservations",
    security(("bearer" = [])), params(("id" = String, Path), LogsQuery),
    responses((status = 200, body = String, content_type = "text/plain",
        headers(("X-Log-Next-Offset" = u64, description = "Offset of the next read"))),
        (status = 404, body = ErrorBody)))]
pub(crate) async fn logs(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<LogsQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let id = crate::arrays::task_id(&state, id, &caller.scope()).await?;
    let (bytes, next) = state
        .store
        .read_logs(&id, &caller.scope(), query.offset, LOGS_PAGE_BYTES)
        .await?;
    // Not `charset=utf-8`: the bytes are the instance's, whatever they are; and never taken
    // for anything but text (a tenant's output may look like HTML).
    let headers = [
        (header::CONTENT_TYPE, "text/plain".to_owned()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        (
            HeaderName::from_static("x-log-next-offset"),
            next.to_string(),
        ),
    ];
    Ok((headers, bytes))
}
