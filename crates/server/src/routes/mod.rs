//! The HTTP routes, each registered once with its OpenAPI description (utoipa-axum).

mod admin;
pub(crate) mod agent;
mod audit;
mod events;
mod health;
mod login;
mod metrics;
mod nodes;
mod reports;
pub(crate) mod reservations;
mod ssh;
mod ssh_keys;
mod statements;
mod tokens;
mod usage;
mod users;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{Method, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::openapi::ApiDoc;
use crate::state::AppState;

/// Largest body an agent may send (a sync of a 256-GPU node with telemetry is ~60 KiB).
const AGENT_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// All documented routes; `router` serves them and `openapi_document` describes them.
pub(crate) fn api() -> OpenApiRouter<AppState> {
    use utoipa::OpenApi;
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(users::create_user, users::list_users))
        .routes(routes!(users::get_user, users::update_user))
        .routes(routes!(login::set_password))
        .routes(routes!(login::login))
        .routes(routes!(tokens::create, tokens::list))
        .routes(routes!(tokens::revoke))
        .routes(routes!(ssh_keys::add, ssh_keys::list))
        .routes(routes!(ssh_keys::remove))
        .routes(routes!(users::grant_credit))
        .routes(routes!(users::balance))
        .routes(routes!(usage::usage))
        .routes(routes!(statements::invoice))
        .routes(routes!(statements::earnings))
        .routes(routes!(reservations::offers))
        .routes(routes!(reservations::create, reservations::list))
        .routes(routes!(reservations::get))
        .routes(routes!(reservations::stop))
        .routes(routes!(reservations::logs))
        .routes(routes!(reservations::gpu_usage))
        .routes(routes!(crate::arrays::routes::list))
        .routes(routes!(crate::arrays::routes::tasks))
        .routes(routes!(crate::volumes::create, crate::volumes::list))
        .routes(routes!(crate::endpoints::create, crate::endpoints::list))
        .routes(routes!(
            crate::endpoints::get,
            crate::endpoints::update,
            crate::endpoints::remove
        ))
        .routes(routes!(
            crate::endpoints::keys::create,
            crate::endpoints::keys::list
        ))
        .routes(routes!(crate::endpoints::keys::remove))
        .routes(routes!(
            crate::volumes::get,
            crate::volumes::resize,
            crate::volumes::remove
        ))
        .routes(routes!(crate::volumes::files::files))
        .routes(routes!(crate::templates::create, crate::templates::list))
        .routes(routes!(crate::templates::get, crate::templates::remove))
        .routes(routes!(crate::registries::add, crate::registries::list))
        .routes(routes!(crate::registries::remove))
        .routes(routes!(crate::teams::create, crate::teams::list))
        .routes(routes!(crate::teams::get))
        .routes(routes!(
            crate::teams::set_member,
            crate::teams::remove_member
        ))
        .routes(routes!(crate::teams::move_credit))
        .routes(routes!(
            crate::notifications::add,
            crate::notifications::list
        ))
        .routes(routes!(crate::notifications::remove))
        .routes(routes!(
            crate::quotas::set,
            crate::quotas::list,
            crate::quotas::remove
        ))
        .routes(routes!(crate::notifications::test))
        .routes(routes!(crate::notifications::deliveries))
        .routes(routes!(
            crate::budgets::get,
            crate::budgets::set,
            crate::budgets::remove
        ))
        .routes(routes!(crate::proxy::links::create))
        .routes(routes!(ssh::ssh_endpoint))
        .routes(routes!(nodes::create_join_token))
        .routes(routes!(nodes::list))
        .routes(routes!(nodes::cordon))
        .routes(routes!(nodes::drain))
        .routes(routes!(nodes::uncordon))
        .routes(routes!(nodes::revoke))
        .routes(routes!(events::list))
        .merge(
            // Heartbeats of large nodes carry telemetry for every GPU.
            OpenApiRouter::new()
                .routes(routes!(agent::register))
                .routes(routes!(agent::sync))
                .routes(routes!(crate::tunnel::route::tunnel))
                .layer(DefaultBodyLimit::max(AGENT_BODY_LIMIT)),
        )
        .merge(
            // A relayed stream's body lasts as long as its SSH channel.
            OpenApiRouter::new()
                .routes(routes!(crate::tunnel::relay::relay))
                .layer(DefaultBodyLimit::disable()),
        )
        .routes(routes!(admin::ledger_check))
        .routes(routes!(admin::spot_stats))
        .routes(routes!(audit::search))
        .routes(routes!(audit::checkpoints))
        .routes(routes!(audit::verify))
        .routes(routes!(reports::daily))
        .routes(routes!(reports::weekly))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
}

pub(crate) fn router(state: AppState) -> Router {
    let (router, mut openapi) = api().split_for_parts();
    crate::openapi::common_responses(&mut openapi);
    let limit = state.config.max_body_bytes;
    let router = router
        .route(
            "/api/v1/openapi.json",
            get(move || async move { Json(openapi) }),
        )
        // Published HTTP ports: every method and path below them, so not in the OpenAPI
        // document (the app's API is the app's); the bodies stream both ways.
        .route("/proxy/{id}/{port}", any(crate::proxy::handle))
        .route("/proxy/{id}/{port}/", any(crate::proxy::handle))
        .route("/proxy/{id}/{port}/{*path}", any(crate::proxy::handle))
        // Endpoints' URLs on the control plane's host, for API clients; the same.
        .route("/e/{name}", any(crate::endpoints::serve::handle))
        .route("/e/{name}/", any(crate::endpoints::serve::handle))
        .route("/e/{name}/{*path}", any(crate::endpoints::serve::handle))
        // The web console: HTML pages, not in the OpenAPI document.
        .merge(crate::console::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::MethodNotAllowed(format!("{method} {}", uri.path()))
        })
        // Access control (issue 8): innermost, so that they run with the matched route.
        // `authorize` enforces `policy::POLICY`; `limit` answers 429 before any token lookup.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::policy::authorize,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::rate_limit::limit,
        ))
        .layer(DefaultBodyLimit::max(limit))
        // Inside `run_to_completion`: a request's record is written even if its client left.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::audit::record,
        ))
        // Inside `run_to_completion`: a request its client gave up on is timed to its end.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(axum::middleware::from_fn(run_to_completion))
        .layer(TraceLayer::new_for_http())
        .with_state(state.clone());
    // The console's pages call the API through this same router (with all its layers).
    let _ = state.console_api.set(router.clone());
    // Before routing: a request on the apps' site is routed as `/proxy/ID/PORT/...`, and the
    // console is kept off that site.
    // (The outer router's layer runs before the inner one routes.)
    Router::new()
        .fallback_service(router)
        .layer(axum::middleware::from_fn_with_state(
            state,
            crate::proxy::host::route,
        ))
}

/// An unknown path: the API's JSON 404, or a page for a browser.
async fn not_found(uri: Uri, headers: axum::http::HeaderMap) -> Response {
    let html = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if html && !uri.path().starts_with("/api/") {
        let lang = crate::console::lang::Lang::of(uri.query(), &headers);
        return crate::console::layout::PageError::new(
            lang,
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            uri.path(),
        )
        .into_response();
    }
    ApiError::NoRoute(uri.path().to_owned()).into_response()
}

/// A request, once received, is handled to the end in a task of its own, even if its client
/// goes away: an agent that drops a long poll, or a CLI stopped with Ctrl-C, must not cut a
/// store transaction in half (on SQLite that would leave the one connection unusable).
/// The handler learns that its client went away through `Departed` (an endpoint's queued
/// request gives up its place).
async fn run_to_completion(mut request: Request, next: Next) -> Response {
    let (client, departed) = tokio::sync::watch::channel(());
    request
        .extensions_mut()
        .insert(crate::endpoints::serve::Departed(departed));
    let handled = tokio::spawn(next.run(request)).await;
    drop(client);
    match handled {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "request handler panicked");
            ApiError::Store(gpurent_store::StoreError::Corrupt(
                "the request's handler failed".to_owned(),
            ))
            .into_response()
        }
    }
}
