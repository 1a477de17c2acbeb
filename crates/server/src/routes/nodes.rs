//! Nodes for admins and hosts: join tokens for new agents, the inventory, taking nodes out of
//! placement (cordon, drain) and back (uncordon), and (admins) cutting one off (revoke).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use gpurent_types::api::{ErrorBody, JoinToken, Node, NodeRevoked, NodeScheduled};

use crate::auth::{hash_token, new_token, Caller};
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::idempotency::{self, Idempotent};
use crate::pagination::PageQuery;
use crate::state::AppState;
use crate::validate;

/// How long a join token may be used to register agents.
const JOIN_TOKEN_TTL: chrono::Duration = chrono::Duration::hours(24);

/// Make a join token (admin or host) for `gpurent agent --join-token`. Valid for 24 hours;
/// the nodes it registers belong to the caller, who earns the host share of their work.
/// The request has no parameters: its body, if any, is ignored.
#[utoipa::path(post, path = "/api/v1/nodes/join-token", tag = "nodes", security(("bearer" = [])),
    params(("Idempotency-Key" = Option<String>, Header, pattern = r"^[!-~]{1,255}$",
        description = "A retried request with the same key returns the first join token")),
    responses((status = 201, body = JoinToken), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn create_join_token(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
) -> Result<Idempotent<JoinToken>, ApiError> {
    // Every join-token request is the same request: the body `{}`.
    let request_hash = validate::request_hash(&serde_json::json!({}));
    let store = state.store.clone();
    let now = state.now();
    let created_by = caller.0.id.clone();
    let op = async move {
        let token = new_token("gpj");
        let expires_at = now + JOIN_TOKEN_TTL;
        store
            .create_join_token(&hash_token(&token), &created_by, expires_at, now)
            .await?;
        Ok((StatusCode::CREATED, JoinToken { token, expires_at }))
    };
    idempotency::once(
        &state,
        &headers,
        "nodes.join_token",
        &caller.0.id,
        request_hash,
        op,
    )
    .await
}

/// Nodes and their GPUs: all of them for an admin, a host's own for a host; by id, a page
/// at a time.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", security(("bearer" = [])),
    params(PageQuery),
    responses((status = 200, body = [Node], headers(("X-Next-After" = String,
        description = "The cursor of the next page, when this one is full"))),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let page = query.page()?;
    let owner = (!caller.is_admin()).then_some(caller.0.id.as_str());
    // A fleet is hundreds of nodes, read whole for their GPUs and figures; the answer is
    // paged all the same, so that no list endpoint is unbounded.
    let mut nodes = state.store.list_nodes(state.live_since(), owner).await?;
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let nodes: Vec<Node> = nodes
        .into_iter()
        .filter(|n| page.after.as_deref().is_none_or(|a| n.id.as_str() > a))
        .take(usize::try_from(page.limit).unwrap_or(usize::MAX))
        .collect();
    let next = page.next_header(nodes.len(), nodes.last().map(|n| n.id.as_str()));
    Ok((axum::response::AppendHeaders(next), Json(nodes)))
}

/// Cordons, drains or uncordons a node: any node for an admin, only its own for a host (another
/// host's node, like one that does not exist, is a 404).
async fn schedule(
    state: &AppState,
    caller: &Caller,
    node: &str,
    action: gpurent_store::NodeAction,
) -> Result<Json<NodeScheduled>, ApiError> {
    let target = if caller.is_admin() {
        node.to_owned()
    } else {
        // The host's own node by id or name, then acted on by its id: a name that is another
        // node's id never reaches that node.
        state
            .store
            .list_nodes(state.live_since(), Some(&caller.0.id))
            .await?
            .into_iter()
            .find(|n| n.id == node || n.name == node)
            .map(|n| n.id)
            .ok_or_else(|| gpurent_store::StoreError::NotFound {
                what: "node",
                id: node.to_owned(),
            })?
    };
    let done = state
        .store
        .schedule_node(&target, action, state.now())
        .await?;
    // The node's agent learns at once what no longer runs there; moved work is placed now.
    state.wake.wake(&done.node_id);
    state.wake.wake_scheduler();
    Ok(Json(NodeScheduled {
        node_id: done.node_id,
        status: done.status.as_str().to_owned(),
        moved: done.moved,
    }))
}

/// Cordon a node (by id or name; a host: its own): no new work lands on it; what runs there
/// keeps running.
#[utoipa::path(post, path = "/api/v1/nodes/{node}/cordon", tag = "nodes",
    security(("bearer" = [])), params(("node" = String, Path)),
    responses((status = 200, body = NodeScheduled), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn cordon(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(node): ApiPath<String>,
) -> Result<Json<NodeScheduled>, ApiError> {
    schedule(&state, &caller, &node, gpurent_store::NodeAction::Cordon).await
}

/// Drain a node (a host: its own): cordon it and move what runs there to other nodes. Each
/// reservation is billed to now here, queued again with the next epoch, and billed again from
/// when it runs elsewhere; the node's agent stops its copy.
#[utoipa::path(post, path = "/api/v1/nodes/{node}/drain", tag = "nodes",
    security(("bearer" = [])), params(("node" = String, Path)),
    responses((status = 200, body = NodeScheduled), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn drain(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(node): ApiPath<String>,
) -> Result<Json<NodeScheduled>, ApiError> {
    schedule(&state, &caller, &node, gpurent_store::NodeAction::Drain).await
}

/// Uncordon a node (a host: its own): it takes new work again.
#[utoipa::path(post, path = "/api/v1/nodes/{node}/uncordon", tag = "nodes",
    security(("bearer" = [])), params(("node" = String, Path)),
    responses((status = 200, body = NodeScheduled), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub(crate) async fn uncordon(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(node): ApiPath<String>,
) -> Result<Json<NodeScheduled>, ApiError> {
    schedule(&state, &caller, &node, gpurent_store::NodeAction::Uncordon).await
}

/// Revoke a node's certificate (by id or name): its agent's syncs are refused (403) from now
/// on, so the node is fenced as lost after its TTL and its work rescheduled elsewhere.
#[utoipa::path(post, path = "/api/v1/nodes/{node}/revoke", tag = "nodes",
    security(("bearer" = [])), params(("node" = String, Path)),
    responses((status = 200, body = NodeRevoked), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn revoke(
    State(state): State<AppState>,
    _caller: Caller,
    ApiPath(node): ApiPath<String>,
) -> Result<Json<NodeRevoked>, ApiError> {
    let node_id = state.store.revoke_node(&node, state.now()).await?;
    // A sync held in a long poll answers now; the next one is refused.
    state.wake.wake(&node_id);
    Ok(Json(NodeRevoked {
        node_id,
        revoked: true,
    }))
}
