//! Who may call which route: one table, enforced for every request by `authorize` (default
//! deny: a route missing from the table answers 403 to everyone).

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gpurent_types::{Role, TokenScope};

use crate::error::ApiError;
use crate::state::AppState;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token (health, metrics, the OpenAPI document, login).
    Public,
    /// A node agent with its own credential (a join token or a node token), which the
    /// handler checks; user tokens never pass.
    Node,
    /// A user with a valid token, one of these roles, and a token whose scopes cover the
    /// route. What the user may see within the route (its own reservations, its own user) is
    /// the handler's and the store's `Scope`.
    Roles(&'static [Role], Need),
    /// A console page for a logged-in user with one of these roles (the session cookie), and
    /// its CSRF token when it changes anything; without a session, the login page.
    Page(&'static [Role]),
}

/// What a token's scopes must allow for a route (`tokens create --scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// This scope.
    Scope(TokenScope),
    /// A token without scopes (a login, or a token made without `--scope`): the account's own
    /// settings, credentials, money moved, and every platform admin's and host's route.
    Unscoped,
    /// Any token; the handler bounds what it does by the token's scopes (`tokens create`).
    AnyToken,
    /// This scope, on the user's own resources (SSH keys, their balance): never a
    /// token bound to a team, which reaches only the team's reservations, statements and
    /// members.
    Personal(TokenScope),
}

const ALL: &[Role] = &[Role::Admin, Role::Host, Role::Tenant];
const READ: Access = Access::Roles(ALL, Need::Scope(TokenScope::Read));
const RESERVE: Access = Access::Roles(ALL, Need::Scope(TokenScope::Reserve));
const SSH: Access = Access::Roles(ALL, Need::Scope(TokenScope::Ssh));
const VOLUMES: Access = Access::Roles(ALL, Need::Scope(TokenScope::Volumes));
const BILLING: Access = Access::Roles(ALL, Need::Scope(TokenScope::Billing));
const TEAM_ADMIN: Access = Access::Roles(ALL, Need::Scope(TokenScope::Admin));
const OWN: Access = Access::Roles(ALL, Need::Unscoped);
const MY_READ: Access = Access::Roles(ALL, Need::Personal(TokenScope::Read));
const MY_RESERVE: Access = Access::Roles(ALL, Need::Personal(TokenScope::Reserve));
const MY_BILLING: Access = Access::Roles(ALL, Need::Personal(TokenScope::Billing));
const ANY_TOKEN: Access = Access::Roles(ALL, Need::AnyToken);
const ADMIN: Access = Access::Roles(&[Role::Admin], Need::Unscoped);
const ADMIN_HOST: Access = Access::Roles(&[Role::Admin, Role::Host], Need::Unscoped);
const PAGE_ANY: Access = Access::Page(&[Role::Admin, Role::Host, Role::Tenant]);
const PAGE_ADMIN: Access = Access::Page(&[Role::Admin]);
const PAGE_ADMIN_HOST: Access = Access::Page(&[Role::Admin, Role::Host]);

/// Every route: (method, route template as axum matches it, who may call it); method `*`:
/// every method.
pub const POLICY: &[(&str, &str, Access)] = &[
    ("GET", "/healthz", Access::Public),
    ("GET", "/readyz", Access::Public),
    ("GET", "/metrics", Access::Public),
    ("GET", "/api/v1/openapi.json", Access::Public),
    ("POST", "/api/v1/login", Access::Public),
    ("POST", "/api/v1/agent/register", Access::Node),
    ("POST", "/api/v1/agent/sync", Access::Node),
    ("GET", "/api/v1/agent/tunnel", Access::Node),
    // Another replica, with the tunnel's relay token, which the handler checks.
    ("POST", "/api/v1/internal/relay/{node}", Access::Node),
    ("POST", "/api/v1/users", ADMIN),
    ("GET", "/api/v1/users", ADMIN),
    ("GET", "/api/v1/users/{id}", MY_READ),
    ("PATCH", "/api/v1/users/{id}", ADMIN),
    ("POST", "/api/v1/users/{id}/credit", ADMIN),
    ("POST", "/api/v1/users/{id}/password", OWN),
    ("POST", "/api/v1/tokens", ANY_TOKEN),
    ("GET", "/api/v1/tokens", MY_READ),
    ("DELETE", "/api/v1/tokens/{id}", OWN),
    ("POST", "/api/v1/ssh-keys", OWN),
    ("GET", "/api/v1/ssh-keys", MY_READ),
    ("DELETE", "/api/v1/ssh-keys/{id}", OWN),
    ("GET", "/api/v1/balance", MY_BILLING),
    // Within a team, what a member may do is its role's (`teams/roles.rs`); a token's scopes
    // bound it further.
    ("POST", "/api/v1/teams", OWN),
    ("GET", "/api/v1/teams", READ),
    ("GET", "/api/v1/teams/{name}", READ),
    ("PUT", "/api/v1/teams/{name}/members/{user}", TEAM_ADMIN),
    ("DELETE", "/api/v1/teams/{name}/members/{user}", TEAM_ADMIN),
    ("POST", "/api/v1/teams/{name}/credit", OWN),
    ("GET", "/api/v1/budget", BILLING),
    ("PUT", "/api/v1/quotas", ADMIN),
    ("GET", "/api/v1/quotas", READ),
    ("DELETE", "/api/v1/quotas", ADMIN),
    ("POST", "/api/v1/notifications", TEAM_ADMIN),
    ("GET", "/api/v1/notifications", TEAM_ADMIN),
    ("DELETE", "/api/v1/notifications/{id}", TEAM_ADMIN),
    ("POST", "/api/v1/notifications/{id}/test", TEAM_ADMIN),
    ("GET", "/api/v1/notifications/{id}/deliveries", TEAM_ADMIN),
    ("PUT", "/api/v1/budget", TEAM_ADMIN),
    ("DELETE", "/api/v1/budget", TEAM_ADMIN),
    ("GET", "/api/v1/usage", BILLING),
    ("GET", "/api/v1/invoices/{month}", BILLING),
    ("GET", "/api/v1/earnings", MY_BILLING),
    ("GET", "/api/v1/offers", READ),
    ("POST", "/api/v1/reservations", RESERVE),
    ("GET", "/api/v1/reservations", READ),
    ("GET", "/api/v1/reservations/{id}", READ),
    ("POST", "/api/v1/reservations/{id}/stop", RESERVE),
    ("GET", "/api/v1/reservations/{id}/logs", READ),
    ("GET", "/api/v1/reservations/{id}/gpu-usage", READ),
    ("GET", "/api/v1/reservations/{id}/tasks", READ),
    ("GET", "/api/v1/arrays", READ),
    ("POST", "/api/v1/reservations/{id}/proxy-links", SSH),
    ("POST", "/api/v1/volumes", VOLUMES),
    ("GET", "/api/v1/volumes", READ),
    ("GET", "/api/v1/volumes/{name}", READ),
    ("PATCH", "/api/v1/volumes/{name}", VOLUMES),
    ("DELETE", "/api/v1/volumes/{name}", VOLUMES),
    ("GET", "/api/v1/volumes/{name}/files", VOLUMES),
    ("POST", "/api/v1/endpoints", MY_RESERVE),
    ("GET", "/api/v1/endpoints", MY_READ),
    ("GET", "/api/v1/endpoints/{name}", MY_READ),
    ("PATCH", "/api/v1/endpoints/{name}", MY_RESERVE),
    ("DELETE", "/api/v1/endpoints/{name}", MY_RESERVE),
    ("POST", "/api/v1/endpoints/{name}/keys", MY_RESERVE),
    ("GET", "/api/v1/endpoints/{name}/keys", MY_READ),
    ("DELETE", "/api/v1/endpoints/{name}/keys/{id}", MY_RESERVE),
    ("POST", "/api/v1/templates", MY_RESERVE),
    ("GET", "/api/v1/templates", READ),
    ("GET", "/api/v1/templates/{name}", READ),
    ("DELETE", "/api/v1/templates/{name}", MY_RESERVE),
    ("POST", "/api/v1/registries", OWN),
    ("GET", "/api/v1/registries", MY_READ),
    ("DELETE", "/api/v1/registries/{host}", OWN),
    // Published HTTP ports, any method: the proxy lets in only the reservation's owner (a
    // bearer token, or a proxy cookie from a one-time link) and answers 404 to anyone else.
    ("*", "/proxy/{id}/{port}", Access::Public),
    ("*", "/proxy/{id}/{port}/", Access::Public),
    ("*", "/proxy/{id}/{port}/{*path}", Access::Public),
    // Endpoints' URLs: the handler lets in the endpoint's keys (or anyone, when it is public).
    ("*", "/e/{name}", Access::Public),
    ("*", "/e/{name}/", Access::Public),
    ("*", "/e/{name}/{*path}", Access::Public),
    ("GET", "/api/v1/ssh", SSH),
    ("POST", "/api/v1/nodes/join-token", ADMIN_HOST),
    ("GET", "/api/v1/nodes", ADMIN_HOST),
    ("POST", "/api/v1/nodes/{node}/cordon", ADMIN_HOST),
    ("POST", "/api/v1/nodes/{node}/drain", ADMIN_HOST),
    ("POST", "/api/v1/nodes/{node}/uncordon", ADMIN_HOST),
    ("POST", "/api/v1/nodes/{node}/revoke", ADMIN),
    ("GET", "/api/v1/events", ADMIN),
    ("GET", "/api/v1/audit", ADMIN),
    ("GET", "/api/v1/audit/checkpoints", ADMIN),
    ("GET", "/api/v1/audit/verify", ADMIN),
    ("GET", "/api/v1/admin/ledger-check", ADMIN),
    ("GET", "/api/v1/admin/spot", ADMIN),
    ("GET", "/api/v1/reports/daily", ADMIN),
    ("GET", "/api/v1/reports/weekly", ADMIN),
    // The web console (`console/`): pages, what their forms post, and its static files.
    ("GET", "/assets/{name}", Access::Public),
    ("GET", "/login", Access::Public),
    // The login form carries its own CSRF token (a cookie and a field), checked by its handler.
    ("POST", "/login", Access::Public),
    ("POST", "/logout", PAGE_ANY),
    ("GET", "/", PAGE_ANY),
    ("GET", "/offers", PAGE_ANY),
    ("POST", "/offers", PAGE_ANY),
    ("GET", "/offers/quote", PAGE_ANY),
    ("GET", "/instances", PAGE_ANY),
    ("GET", "/instances/{id}", PAGE_ANY),
    ("POST", "/instances/{id}/stop", PAGE_ANY),
    ("GET", "/instances/{id}/log", PAGE_ANY),
    ("GET", "/instances/{id}/gpu.svg", PAGE_ANY),
    // The web terminal's WebSocket: the viewer's own running reservation (an admin's: any).
    ("GET", "/instances/{id}/terminal", PAGE_ANY),
    ("GET", "/instances/{id}/ports/{port}", PAGE_ANY),
    ("GET", "/open/{link}", PAGE_ANY),
    // Endpoints (console/pages/endpoints.rs).
    ("GET", "/endpoints", PAGE_ANY),
    ("GET", "/endpoints/{name}", PAGE_ANY),
    ("GET", "/endpoints/{name}/replicas.svg", PAGE_ANY),
    // Billing, account and nodes (console/pages/billing.rs, account.rs, nodes.rs).
    ("GET", "/billing", PAGE_ANY),
    ("GET", "/billing/invoice.csv", PAGE_ANY),
    ("POST", "/billing/budget", PAGE_ANY),
    ("POST", "/billing/budget/remove", PAGE_ANY),
    ("GET", "/account", PAGE_ANY),
    ("POST", "/account/ssh-keys", PAGE_ANY),
    ("POST", "/account/ssh-keys/{id}/remove", PAGE_ANY),
    ("POST", "/account/tokens", PAGE_ANY),
    ("POST", "/account/tokens/{id}/revoke", PAGE_ANY),
    ("POST", "/account/password", PAGE_ANY),
    // Teams (console/pages/teams.rs, team.rs): what a member may do is the API's, by role.
    ("GET", "/teams", PAGE_ANY),
    ("POST", "/teams", PAGE_ANY),
    ("GET", "/teams/{name}", PAGE_ANY),
    ("POST", "/teams/{name}/members", PAGE_ANY),
    ("POST", "/teams/{name}/members/{user}/remove", PAGE_ANY),
    ("POST", "/teams/{name}/credit", PAGE_ANY),
    ("POST", "/teams/{name}/budget", PAGE_ANY),
    ("POST", "/teams/{name}/budget/remove", PAGE_ANY),
    ("GET", "/nodes", PAGE_ADMIN_HOST),
    ("POST", "/nodes", PAGE_ADMIN_HOST),
    ("POST", "/nodes/{node}/cordon", PAGE_ADMIN_HOST),
    ("POST", "/nodes/{node}/drain", PAGE_ADMIN_HOST),
    ("POST", "/nodes/{node}/uncordon", PAGE_ADMIN_HOST),
    // The admin pages (`console/pages/admin*.rs`).
    ("GET", "/admin", PAGE_ADMIN),
    ("GET", "/admin/users", PAGE_ADMIN),
    ("POST", "/admin/users", PAGE_ADMIN),
    ("POST", "/admin/users/{id}/credit", PAGE_ADMIN),
    ("POST", "/admin/users/{id}/limits", PAGE_ADMIN),
    ("POST", "/admin/users/{id}/password", PAGE_ADMIN),
    ("GET", "/admin/reservations", PAGE_ADMIN),
    ("GET", "/admin/events", PAGE_ADMIN),
    ("GET", "/admin/audit", PAGE_ADMIN),
    ("GET", "/admin/audit/verify", PAGE_ADMIN),
    ("GET", "/admin/reports", PAGE_ADMIN),
    ("GET", "/admin/reports/heatmap.svg", PAGE_ADMIN),
    ("GET", "/admin/reports/timeline.svg", PAGE_ADMIN),
    ("GET", "/admin/ledger", PAGE_ADMIN),
];

/// What the table says for a method and route template: `None` when the route is not there
/// at all, `Some(None)` when the route is there but not with this method.
pub fn lookup(method: &str, route: &str) -> Option<Option<Access>> {
    let mut known = false;
    for &(m, r, access) in POLICY {
        if r == route {
            if m == "*" || m.eq_ignore_ascii_case(method) {
                return Some(Some(access));
            }
            known = true;
        }
    }
    known.then_some(None)
}

/// Authenticates the caller where the route needs a user, and lets the request through only
/// when the table allows its role. The caller found is kept in the request's extensions for
/// the `Caller` extractor. Unmatched paths go on to the router's 404.
pub(crate) async fn authorize(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(route) = request.extensions().get::<MatchedPath>().cloned() else {
        return next.run(request).await;
    };
    let method = request.method().as_str().to_owned();
    let (roles, need) = match lookup(&method, route.as_str()) {
        Some(Some(Access::Public | Access::Node)) => return next.run(request).await,
        Some(Some(Access::Roles(roles, need))) => (roles, need),
        Some(Some(Access::Page(roles))) => {
            return crate::console::guard(&state, request, next, roles).await
        }
        Some(None) => {
            return ApiError::MethodNotAllowed(format!("{method} {}", request.uri().path()))
                .into_response()
        }
        None => {
            tracing::error!(route = route.as_str(), %method, "route has no access policy");
            return ApiError::Forbidden("this route has no access policy".into()).into_response();
        }
    };
    // A console page's own call: its viewer was authenticated for the page (extensions
    // come only from inside the process).
    let known = request
        .extensions()
        .get::<crate::console::api::Internal>()
        .and_then(|_| request.extensions().get::<crate::auth::Caller>().cloned());
    let caller = match known {
        Some(caller) => caller,
        None => match crate::auth::authenticate(&state, request.headers()).await {
            Ok(caller) => caller,
            Err(e) => return e.into_response(),
        },
    };
    crate::audit::note_caller(request.extensions(), &caller.0.id);
    if !roles.contains(&caller.0.role) {
        let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        return ApiError::Forbidden(format!("this needs one of the roles: {}", names.join(", ")))
            .into_response();
    }
    if let Err(refused) = covers(&caller.1, need) {
        return refused.into_response();
    }
    if let Err(refused) = crate::teams::still_member(&state, &caller).await {
        return refused.into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Whether the token's scopes cover what the route needs; else a 403 saying what it lacks.
fn covers(token: &gpurent_store::TokenFacts, need: Need) -> Result<(), ApiError> {
    if token.team_id.is_some() && matches!(need, Need::Unscoped | Need::Personal(_)) {
        return Err(ApiError::Forbidden(
            "this token is bound to a team: it reaches only the team's reservations, statements and members, not your own account"
                .into(),
        ));
    }
    let Some(scopes) = &token.scopes else {
        return Ok(());
    };
    let have = || {
        scopes
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match need {
        Need::AnyToken => Ok(()),
        Need::Scope(scope) | Need::Personal(scope) if scopes.contains(&scope) => Ok(()),
        Need::Scope(scope) | Need::Personal(scope) => Err(ApiError::Forbidden(format!(
            "this token's scopes ({}) do not include {scope}",
            have()
        ))),
        Need::Unscoped => Err(ApiError::Forbidden(format!(
            "this needs a token without scopes (a login, or one made without --scope); this token's are {}",
            have()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_unique() {
        for (i, (m, r, _)) in POLICY.iter().enumerate() {
            assert!(
                !POLICY[i + 1..].iter().any(|(m2, r2, _)| m2 == m && r2 == r),
                "{m} {r} twice"
            );
        }
    }

    #[test]
    fn unknown_routes_are_denied() {
        assert_eq!(lookup("GET", "/api/v1/secret"), None);
        assert_eq!(lookup("PUT", "/api/v1/users"), Some(None));
        assert_eq!(lookup("get", "/healthz"), Some(Some(Access::Public)));
    }
}
