//! Users, their tokens and prepaid credit.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{AppendHeaders, IntoResponse};
use axum::Json;
use gpurent_store::NewUser;
use gpurent_types::api::{
    Balance, CreateUser, CreditGranted, ErrorBody, GrantCredit, UpdateUser, User, UserCreated,
};

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::{idempotency_key, ApiJson, ApiPath, ApiQuery};
use crate::idempotency::{self, Idempotent};
use crate::pagination::PageQuery;
use crate::state::AppState;
use crate::validate;

/// Create a user (admin). The token in the answer is shown only this once, or again to a
/// retry with the same `Idempotency-Key`.
#[utoipa::path(post, path = "/api/v1/users", tag = "users", request_body = CreateUser,
    security(("bearer" = [])),
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$",
        description = "A retried request with the same key returns the first answer, token included")),
    responses((status = 201, body = UserCreated), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn create_user(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateUser>,
) -> Result<Idempotent<UserCreated>, ApiError> {
    let (name, role, credit) = validate::user(&body)?;
    let request_hash = validate::request_hash(&body);
    let store = state.store.clone();
    let now = state.now();
    let op = async move {
        let token = new_token("gpr");
        let new = NewUser {
            name,
            role,
            token_hash: hash_token(&token),
            credit,
        };
        let user = store.create_user(new, now).await?;
        tracing::info!(user_id = %user.id, role = %user.role, "user created");
        let created = UserCreated {
            id: user.id,
            name: user.name,
            role: user.role,
            token,
        };
        Ok((StatusCode::CREATED, created))
    };
    idempotency::once(
        &state,
        &headers,
        "users.create",
        &caller.0.id,
        request_hash,
        op,
    )
    .await
}

/// List users (admin), oldest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/users", tag = "users", security(("bearer" = [])),
    params(PageQuery),
    responses((status = 200, body = [User], headers(("X-Next-After" = String,
        description = "The cursor of the next page, when this one is full"))),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn list_users(
    State(state): State<AppState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let page = query.page()?;
    let users = state
        .store
        .list_users(page.limit, page.after.as_deref())
        .await?;
    let next = page.next_header(users.len(), users.last().map(|u| u.id.as_str()));
    Ok((AppendHeaders(next), Json(users)))
}

/// One user: an admin may see anyone, others only themselves.
#[utoipa::path(get, path = "/api/v1/users/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = String, Path)),
    responses((status = 200, body = User), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_user(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<User>, ApiError> {
    if !caller.is_admin() && caller.0.id != id {
        return Err(gpurent_store::StoreError::NotFound { what: "user", id }.into());
    }
    Ok(Json(state.store.get_user(&id).await?))
}

/// The highest cap on live reservations an admin may set (the schema's `maximum`).
const MAX_RESERVATIONS_CAP: u32 = 1_000_000;

/// Set a user's role, and its overrides of the platform's caps on live reservations and spend
/// per hour (admin). The last admin cannot lose its role (409).
#[utoipa::path(patch, path = "/api/v1/users/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = String, Path)), request_body = UpdateUser,
    responses((status = 200, body = User), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn update_user(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateUser>,
) -> Result<Json<User>, ApiError> {
    if body
        .max_reservations
        .is_some_and(|n| n > MAX_RESERVATIONS_CAP)
    {
        return Err(ApiError::Invalid(format!(
            "max_reservations: must be at most {MAX_RESERVATIONS_CAP}"
        )));
    }
    if body.max_spend_per_hour.is_some_and(|m| m.micros() <= 0) {
        return Err(ApiError::Invalid(
            "max_spend_per_hour: must be more than 0".into(),
        ));
    }
    if let Some(role) = body.role {
        state.store.set_role(&id, role).await?;
        tracing::info!(user_id = %id, by = %caller.0.id, %role, "role set");
    }
    let user = state
        .store
        .set_limits(&id, body.max_reservations, body.max_spend_per_hour)
        .await?;
    tracing::info!(user_id = %id, by = %caller.0.id, max_reservations = ?body.max_reservations,
        max_spend_per_hour = ?body.max_spend_per_hour, "caps set");
    Ok(Json(user))
}

/// Grant prepaid credit (admin). With an `Idempotency-Key`, a retried grant is applied once.
#[utoipa::path(post, path = "/api/v1/users/{id}/credit", tag = "users", security(("bearer" = [])),
    params(("id" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    request_body = GrantCredit,
    responses((status = 200, body = CreditGranted), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn grant_credit(
    State(state): State<AppState>,
    _caller: Caller,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<GrantCredit>,
) -> Result<Json<CreditGranted>, ApiError> {
    let amount = validate::grant_amount(body.amount)?;
    let transfer_id = match idempotency_key(&headers)? {
        Some(key) => format!("grant:{id}:key:{key}"),
        None => format!("grant:{id}:once:{}", uuid_like()),
    };
    let balance = state
        .store
        .grant_credit(&id, amount, &transfer_id, state.now())
        .await?;
    tracing::info!(user_id = %id, %amount, "credit granted");
    Ok(Json(CreditGranted {
        user_id: id,
        balance,
    }))
}

/// The caller's balance, what is held for its reservations and what it earned as a host.
#[utoipa::path(get, path = "/api/v1/balance", tag = "users", security(("bearer" = [])),
    responses((status = 200, body = Balance), (status = 401, body = ErrorBody)))]
pub(crate) async fn balance(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Balance>, ApiError> {
    let (balance, held, earnings) = state.store.accounts(&caller.0.id).await?;
    Ok(Json(Balance {
        balance,
        currency: state.live().prices.currency().to_owned(),
        held,
        earnings,
    }))
}

fn uuid_like() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}
