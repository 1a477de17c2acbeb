//! The web console at `/`: pages rendered on the server (maud) for tenants, hosts and admins.
//! Pages call the JSON API in-process with the viewer's session token ([`api`]), so the policy
//! table, the handlers and the audit trail decide for the console exactly as for the CLI.

pub(crate) mod api;
mod assets;
pub(crate) mod charts;
pub(crate) mod lang;
pub(crate) mod layout;
mod pages;
pub(crate) mod report_cache;
pub(crate) mod session;
pub(crate) mod terminal;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use gpurent_types::Role;
use http_body_util::BodyExt;

use self::lang::Lang;
use self::layout::Ctx;
use self::session::NoSession;
use crate::state::AppState;

/// A console request made by `console.js` to refresh a live part of a page: not audited (the
/// page's first load was), and answered 401 rather than sent to the login page.
pub(crate) const LIVE_HEADER: &str = "x-gpurent-live";

/// The console's routes; each is in `policy::POLICY` as `Access::Page` (or `Public`).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(pages::home::home))
        .route("/login", get(pages::login::form).post(pages::login::submit))
        .route("/logout", post(pages::login::logout))
        .route(
            "/offers",
            get(pages::offers::page).post(pages::offers::reserve),
        )
        .route("/offers/quote", get(pages::offers::quote))
        .route("/instances", get(pages::instances::list))
        .route("/instances/{id}", get(pages::instance::page))
        .route("/instances/{id}/stop", post(pages::instance::stop))
        .route("/instances/{id}/log", get(pages::instance::log))
        .route("/instances/{id}/gpu.svg", get(pages::instance::gpu_chart))
        .route("/instances/{id}/terminal", get(terminal::handler))
        // To an app on the apps' site, for its owner only (`proxy/open.rs`).
        .route(
            "/instances/{id}/ports/{port}",
            get(crate::proxy::open::port),
        )
        .route("/open/{link}", get(crate::proxy::open::link))
        // Endpoints (pages/endpoints.rs).
        .route("/endpoints", get(pages::endpoints::list))
        .route("/endpoints/{name}", get(pages::endpoints::page))
        .route(
            "/endpoints/{name}/replicas.svg",
            get(pages::endpoints::replicas_chart),
        )
        // Billing, account and nodes (pages/billing.rs, account.rs, nodes.rs).
        .route("/billing", get(pages::billing::page))
        .route("/billing/invoice.csv", get(pages::billing::invoice_csv))
        .route("/billing/budget", post(pages::budget_view::set_own))
        .route(
            "/billing/budget/remove",
            post(pages::budget_view::remove_own),
        )
        .route("/account", get(pages::account::page))
        .route("/account/ssh-keys", post(pages::account::add_key))
        .route(
            "/account/ssh-keys/{id}/remove",
            post(pages::account::remove_key),
        )
        .route("/account/tokens", post(pages::account_tokens::create_token))
        .route(
            "/account/tokens/{id}/revoke",
            post(pages::account_tokens::revoke_token),
        )
        .route("/account/password", post(pages::account::change_password))
        // Teams (pages/teams.rs, team.rs).
        .route("/teams", get(pages::teams::list).post(pages::teams::create))
        .route("/teams/{name}", get(pages::team::page))
        .route("/teams/{name}/members", post(pages::team::set_member))
        .route(
            "/teams/{name}/members/{user}/remove",
            post(pages::team::remove_member),
        )
        .route("/teams/{name}/credit", post(pages::team::move_credit))
        .route("/teams/{name}/budget", post(pages::team::set_budget))
        .route(
            "/teams/{name}/budget/remove",
            post(pages::team::remove_budget),
        )
        .route(
            "/nodes",
            get(pages::nodes::page).post(pages::nodes::join_token),
        )
        .route("/nodes/{node}/cordon", post(pages::nodes::cordon))
        .route("/nodes/{node}/drain", post(pages::nodes::drain))
        .route("/nodes/{node}/uncordon", post(pages::nodes::uncordon))
        // The admin pages (`pages/admin*.rs`).
        .route("/admin", get(pages::admin::page))
        .route(
            "/admin/users",
            get(pages::admin_users::list).post(pages::admin_users::create),
        )
        .route("/admin/users/{id}/credit", post(pages::admin_users::credit))
        .route("/admin/users/{id}/limits", post(pages::admin_users::limits))
        .route(
            "/admin/users/{id}/password",
            post(pages::admin_users::password),
        )
        .route("/admin/reservations", get(pages::admin_reservations::list))
        .route("/admin/events", get(pages::admin_events::list))
        .route("/admin/audit", get(pages::admin_audit::search))
        .route("/admin/audit/verify", get(pages::admin_audit::verify))
        .route("/admin/reports", get(pages::admin_reports::page))
        .route(
            "/admin/reports/heatmap.svg",
            get(pages::admin_reports::heatmap),
        )
        .route(
            "/admin/reports/timeline.svg",
            get(pages::admin_reports::timeline),
        )
        .route("/admin/ledger", get(pages::admin_reports::ledger))
        .route("/assets/{name}", get(assets::serve))
        .layer(axum::middleware::from_fn(compress))
}

/// Lets a console request through when it has a session whose role the table allows, and
/// carries its CSRF token if it changes anything: the `Access::Page` half of
/// `policy::authorize`. Without a session, pages lead to the login page.
pub(crate) async fn guard(
    state: &AppState,
    mut request: Request,
    next: Next,
    roles: &[Role],
) -> Response {
    let lang = Lang::of(request.uri().query(), request.headers());
    let live = request.headers().contains_key(LIVE_HEADER);
    let viewer = match session::authenticate(state, request.headers()).await {
        Ok(viewer) => viewer,
        Err(NoSession::Store(e)) => {
            return layout::PageError::new(
                lang,
                StatusCode::SERVICE_UNAVAILABLE,
                "store",
                e.to_string(),
            )
            .into_response()
        }
        Err(_) if live => return StatusCode::UNAUTHORIZED.into_response(),
        Err(_) => {
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let to = if path == "/" || session::is_unsafe(request.method()) {
                "/login".to_owned()
            } else {
                format!("/login?next={}", api::enc(&path))
            };
            return Redirect::to(&to).into_response();
        }
    };
    crate::audit::note_caller(request.extensions(), &viewer.user.id);
    let path = request.uri().path().to_owned();
    let ctx = || Ctx::for_error(lang, Some(viewer.clone()), path.clone());
    if !roles.contains(&viewer.user.role) {
        return layout::error_page(&ctx(), StatusCode::FORBIDDEN, "forbidden", "");
    }
    if session::is_unsafe(request.method()) {
        let error_ctx = ctx();
        request = match session::check_csrf(request, &viewer.csrf).await {
            Ok(request) => request,
            Err(e) => {
                return layout::error_page(
                    &error_ctx,
                    StatusCode::FORBIDDEN,
                    "csrf",
                    &e.to_string(),
                )
            }
        };
    }
    request.extensions_mut().insert(viewer);
    let currency = state.live().prices.currency().to_owned();
    layout::CURRENCY.scope(currency, next.run(request)).await
}

/// Pages are gzipped for clients that take it (the static files are gzipped once, ahead).
async fn compress(request: Request, next: Next) -> Response {
    let gzip = assets::accepts_gzip(request.headers());
    let response = next.run(request).await;
    let html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/html"));
    if !gzip || !html || response.headers().contains_key(header::CONTENT_ENCODING) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = body
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
    else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    if bytes.len() < 1024 {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    let packed = assets::gzip(&bytes, flate2::Compression::fast());
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    parts
        .headers
        .insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    Response::from_parts(parts, axum::body::Body::from(packed))
}

/// The start page of each role, and where `/` leads.
pub(crate) fn home_of(role: Role) -> &'static str {
    match role {
        Role::Tenant => "/instances",
        Role::Host => "/nodes",
        Role::Admin => "/admin",
    }
}
