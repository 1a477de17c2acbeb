//! Streams between replicas: a replica that an SSH client reached, when the node's agent
//! holds its tunnel to another replica, opens `POST /api/v1/internal/relay/{node}` there
//! (the holder's relay token, from the store, as bearer); frames flow through both ways.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::Response;
use gpurent_store::TunnelHolder;
use gpurent_tunnel::{frame_channel, Frame, FrameReceiver, OpenStream};
use gpurent_types::api::ErrorBody;
use http_body_util::BodyExt;

use super::{opened, DialError, Stream, OPEN_TIMEOUT};
use crate::error::ApiError;
use crate::state::AppState;

/// The path, below the holder's URL.
pub const PATH: &str = "/api/v1/internal/relay";

/// This side: sends `open` to the holder and hands back the stream it relays.
pub(super) async fn dial(
    client: &reqwest::Client,
    node: &str,
    holder: &TunnelHolder,
    open: OpenStream,
) -> Result<Stream, DialError> {
    let (tx, body) = frame_channel();
    tx.send(Frame::Open(open))
        .await
        .map_err(|e| DialError::Tunnel(e.to_string()))?;
    let url = format!("{}{PATH}/{node}", holder.replica_url);
    let relayed = async {
        let response = client
            .post(&url)
            .bearer_auth(&holder.relay_token)
            .body(reqwest::Body::wrap(body))
            .send()
            .await
            .map_err(|e| DialError::Tunnel(format!("the replica at {url}: {e}")))?;
        match response.status() {
            s if s.is_success() => {}
            // The holder has no such tunnel (any more): the agent is between replicas.
            reqwest::StatusCode::NOT_FOUND => return Err(DialError::NotConnected(node.to_owned())),
            s => {
                return Err(DialError::Tunnel(format!(
                    "the replica at {url} answered {s}"
                )))
            }
        }
        let body = http::Response::from(response)
            .into_body()
            .map_err(|e| e.to_string())
            .boxed_unsync();
        opened(FrameReceiver::new(body)).await
    };
    let rx = tokio::time::timeout(OPEN_TIMEOUT, relayed)
        .await
        .map_err(|_| DialError::Timeout)??;
    Ok(Stream { tx, rx })
}

/// Relay a stream through this replica's tunnel to `node` (for another replica; the bearer
/// is the tunnel's relay token). The bodies are the stream's frames both ways.
#[utoipa::path(post, path = "/api/v1/internal/relay/{node}", tag = "agent",
    params(("node" = String, Path, description = "the node's name")),
    security(("bearer" = [])),
    responses((status = 200, description = "the stream's frames follow"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub(crate) async fn relay(
    State(state): State<AppState>,
    Path(node): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let token = crate::auth::bearer(request.headers())?;
    if !state.tunnels.relay_token_matches(&node, token) {
        // The same answer for a wrong token and for no tunnel: nothing is learnt by guessing.
        return Err(ApiError::Store(gpurent_store::StoreError::NotFound {
            what: "tunnel of node",
            id: node,
        }));
    }
    let mut inbound = FrameReceiver::new(request.into_body());
    let open = match tokio::time::timeout(OPEN_TIMEOUT, inbound.next()).await {
        Ok(Ok(Some(Frame::Open(open)))) => open,
        _ => {
            return Err(ApiError::Invalid(
                "a relayed stream starts with its open frame".into(),
            ))
        }
    };
    let (out, body) = frame_channel();
    match state.tunnels.dial_here(&node, open).await {
        Err(e) => {
            let _ = out.send(Frame::Refused(e.to_string())).await;
        }
        Ok(Stream { tx, mut rx }) => {
            let _ = out.send(Frame::Opened).await;
            tokio::spawn(async move {
                let to_agent = async {
                    while let Ok(Some(frame)) = inbound.next().await {
                        if tx.send(frame).await.is_err() {
                            break;
                        }
                    }
                };
                let from_agent = async {
                    while let Ok(Some(frame)) = rx.next().await {
                        if out.send(frame).await.is_err() {
                            break;
                        }
                    }
                };
                // Either side ending ends the stream (dropping the other half).
                tokio::select! {
                    _ = to_agent => {}
                    _ = from_agent => {}
                }
            });
        }
    }
    Ok(Response::new(Body::new(body)))
}
