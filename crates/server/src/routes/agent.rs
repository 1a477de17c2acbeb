//! The agent protocol: register with a join token, then sync (report actual state, get
//! desired state, long-polling until it changes).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_store::{NewNode, NodeCertificate};
use gpurent_types::agent::{
    InstanceState, NodeRegistered, RegisterNode, SyncRequest, SyncResponse, AGENT_EVENT_DETAIL_MAX,
};
use gpurent_types::api::ErrorBody;

use crate::auth::{hash_token, new_token, AgentNode};
use crate::error::ApiError;
use crate::extract::AgentJson;
use crate::health_rules::{breaches, burn_in_issue};
use crate::state::AppState;
use crate::tls::{NodeCa, PeerCert};
use crate::validate;
use crate::verification::verify;

const MAX_REPORTS: usize = 4096;
/// An agent's events per sync.
const MAX_EVENTS: usize = 1000;

/// Trade a join token for a node identity and credential.
#[utoipa::path(post, path = "/api/v1/agent/register", tag = "agent", request_body = RegisterNode,
    responses((status = 201, body = NodeRegistered), (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn register(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    AgentJson(mut body): AgentJson<RegisterNode>,
) -> Result<(StatusCode, Json<NodeRegistered>), ApiError> {
    crate::auth::agent_protocol(&headers).map_err(ApiError::AgentProtocol)?;
    let name_ok = !body.name.is_empty()
        && body.name.len() <= 64
        && body
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(ApiError::Invalid(
            "name must be 1-64 characters of letters, digits and - _ .".into(),
        ));
    }
    validate::inventory(&body.gpus)?;
    // Over TLS every node gets a client certificate, signed from its CSR.
    let node_ca = state.config.tls.as_ref().map(|tls| &tls.node_ca);
    let csr = match (node_ca, body.csr.take()) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(ApiError::Invalid(
                "over TLS, registration needs a certificate signing request (csr)".into(),
            ))
        }
        (Some(_), Some(csr)) => {
            NodeCa::check_csr(&csr).map_err(|e| ApiError::Invalid(e.to_string()))?;
            Some(csr)
        }
    };
    let verification = body
        .host
        .as_ref()
        .map(|host| verify(&state.live().host_policy, host, &body.gpus));
    // An agent that does not say is an older one, whose process executor did not isolate.
    let isolated = body
        .host
        .as_ref()
        .and_then(|h| h.isolated)
        .unwrap_or(body.executor != "process");
    // Nor did it give instances a network of their own.
    let shared_network = body
        .host
        .as_ref()
        .and_then(|h| h.shared_network)
        .unwrap_or(body.executor.contains("process"));
    let node_token = new_token("gpn");
    let node_id = state
        .store
        .register_node(
            NewNode {
                join_token_hash: hash_token(&body.join_token),
                node_token_hash: hash_token(&node_token),
                name: body.name,
                executor: body.executor,
                gpu_backend: body.gpu_backend,
                gpus: body.gpus,
                verification,
                isolated,
                shared_network,
            },
            state.now(),
        )
        .await?;
    let (certificate, ca_certificate) = match (node_ca, csr) {
        (Some(ca), Some(csr)) => {
            let signed = ca
                .sign(&csr, &node_id, state.now())
                .map_err(|e| ApiError::Invalid(e.to_string()))?;
            state
                .store
                .set_node_certificate(&node_id, &signed.sha256)
                .await?;
            (Some(signed.pem), Some(ca.cert_pem().to_owned()))
        }
        _ => (None, None),
    };
    // New GPUs: queued work may fit now.
    state.wake.wake_scheduler();
    Ok((
        StatusCode::CREATED,
        Json(NodeRegistered {
            node_id,
            node_token,
            certificate,
            ca_certificate,
        }),
    ))
}

/// Report the node's GPUs and instances; answer with its desired state. With `known_version`
/// and `wait_ms`, the answer waits until the desired state is newer or the wait is over.
/// Over TLS the connection must carry the node's own client certificate; a node whose
/// certificate was revoked is refused (403).
#[utoipa::path(post, path = "/api/v1/agent/sync", tag = "agent", request_body = SyncRequest,
    security(("bearer" = [])),
    responses((status = 200, body = SyncResponse), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn sync(
    State(state): State<AppState>,
    AgentNode(node_id): AgentNode,
    AgentJson(body): AgentJson<SyncRequest>,
) -> Result<Json<SyncResponse>, ApiError> {
    validate::inventory(&body.gpus)?;
    if body.instances.len() > MAX_REPORTS {
        return Err(ApiError::Invalid(format!(
            "at most {MAX_REPORTS} instance reports per sync"
        )));
    }
    if body.events.len() > MAX_EVENTS {
        return Err(ApiError::Invalid(format!(
            "at most {MAX_EVENTS} events per sync"
        )));
    }
    if let Some(e) = body
        .events
        .iter()
        .find(|e| e.detail.len() > AGENT_EVENT_DETAIL_MAX)
    {
        return Err(ApiError::Invalid(format!(
            "an event's detail is at most {AGENT_EVENT_DETAIL_MAX} bytes ({} has {})",
            e.kind.as_str(),
            e.detail.len()
        )));
    }
    // Details are shown in terminals (`gpurent events`, a tenant's `gpurent logs`).
    if let Some(e) = body
        .events
        .iter()
        .find(|e| e.detail.chars().any(char::is_control))
    {
        return Err(ApiError::Invalid(format!(
            "an event's detail may hold no control characters ({})",
            e.kind.as_str()
        )));
    }
    let wait = Duration::from_millis(body.wait_ms.unwrap_or(0)).min(state.config.max_sync_wait);
    let held = body.known_version.filter(|_| !wait.is_zero());
    // Listening before the sync writes: a change after the version it reads back wakes it.
    let notify = held.map(|_| state.wake.for_node(&node_id));
    let mut notified = notify.as_ref().map(|n| Box::pin(n.notified()));
    if let Some(n) = &mut notified {
        n.as_mut().enable();
    }
    let synced = state.store.sync_node(&node_id, &body, state.now()).await?;
    // The GPUs' health, from this sample: a breach keeps the node out of placement. The sync
    // read what is recorded: the same issues again need no more.
    if let Some(telemetry) = &body.telemetry {
        let mut issues = breaches(&state.live().health_rules, &telemetry.gpus);
        issues.extend(burn_in_issue(telemetry.burn_in.as_ref()));
        if !issues.is_empty() {
            tracing::warn!(%node_id, ?issues, "GPU health rules breached");
        }
        if !synced.health_is(&issues)
            && state
                .store
                .record_health(&node_id, &issues, state.now())
                .await?
        {
            state.wake.wake_scheduler();
        }
    }
    // The host as the agent found it when it started, with the inventory it sent.
    if let Some(host) = &body.host {
        // What the node is comes before the verification that lets it take work: a client
        // that sees it ready sees its isolation, network and capacity too.
        if let Some(isolated) = host.isolated {
            if !isolated {
                tracing::warn!(%node_id, "node runs instances unisolated (--allow-unisolated)");
            }
            state.store.set_isolation(&node_id, isolated).await?;
        }
        if let Some(shared) = host.shared_network {
            if shared {
                tracing::warn!(%node_id, "node's instances share its network (network: shared)");
            }
            state.store.set_shared_network(&node_id, shared).await?;
        }
        state
            .store
            .set_volume_facts(&node_id, host.volumes.as_ref())
            .await?;
        if host.cpus.is_some() || host.memory_mb.is_some() {
            state
                .store
                .set_capacity(&node_id, host.cpus, host.memory_mb)
                .await?;
        }
        let verification = verify(&state.live().host_policy, host, &body.gpus);
        if !verification.ok {
            tracing::warn!(%node_id, checks = ?verification.checks, "node failed host verification");
        }
        state
            .store
            .set_verification(&node_id, &verification)
            .await?;
        if verification.ok {
            state.wake.wake_scheduler();
        }
    }
    if let Some(images) = &body.images {
        let images = &images[..images.len().min(gpurent_types::agent::NODE_IMAGES_MAX)];
        state.store.set_node_images(&node_id, images).await?;
    }
    if !body.volumes.is_empty() || body.volume_free_bytes.is_some() {
        state
            .store
            .apply_volume_reports(&node_id, &body.volumes, body.volume_free_bytes, state.now())
            .await?;
    }
    // An instance that ended freed its GPUs: queued work may fit now.
    let freed = body.instances.iter().any(|i| {
        matches!(
            i.state,
            InstanceState::Stopped | InstanceState::Exited | InstanceState::Failed
        )
    });
    if freed {
        state.wake.wake_scheduler();
    }
    // The version the answer must be of, and whether it must be read again anyway.
    let (mut last, mut fresh) = (synced.desired_version, false);
    if let (Some(known), Some(notify), Some(mut notified)) = (held, &notify, notified) {
        let deadline = tokio::time::Instant::now() + wait;
        // Woken by a change made here, or by one made at another replica (on PostgreSQL
        // `jobs/versions.rs` reads every node's version once a second); `last` is the version
        // read again after each wake.
        while last == known && !state.wake.is_shutting_down() {
            let woken = tokio::select! {
                _ = notified.as_mut() => true,
                _ = tokio::time::sleep_until(deadline) => false,
            };
            if !woken {
                // Nothing changed: the answer is what the sync read (no query).
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                fresh = true;
                break;
            }
            notified = Box::pin(notify.notified());
            notified.as_mut().enable();
            last = state.store.desired_version(&node_id).await?;
        }
    }
    // What the sync read beside its write is the answer while the version is the same.
    let (version, mut assignments) = match synced.desired_state {
        Some((v, assignments)) if v == last && !fresh => (v, assignments),
        _ => state.store.desired_state(&node_id).await?,
    };
    // Secrets are opened for this answer only (it goes over TLS beyond loopback).
    for a in &mut assignments {
        if let Some(sealed) = a.sealed_secrets.take() {
            match crate::secrets::open(&*state.config.master_key, &sealed) {
                Ok(secrets) => a.secrets = gpurent_types::agent::Secrets(secrets),
                Err(e) => {
                    tracing::error!(reservation_id = %a.reservation_id, error = %e, "cannot open a reservation's secrets; its instance starts without them");
                }
            }
        }
    }
    // The rooms are those of the node's live reservations, which its assignments are: a node
    // with none (most of a fleet, most of the time) needs no query for them.
    let log_room = if assignments.is_empty() {
        BTreeMap::new()
    } else {
        state.store.log_rooms(&node_id).await?
    };
    // The volumes the node keeps, whenever its desired state is new to it (a volume made,
    // grown or removed bumps the version): an answer it knew already needs no query.
    let volumes = if body.known_version == Some(version) {
        Vec::new()
    } else {
        state.store.node_volumes(&node_id).await?
    };
    Ok(Json(SyncResponse {
        node_id,
        version,
        server_time: state.now(),
        assignments,
        log_room,
        volumes,
    }))
}

/// The node token names the node; its certificate must agree (defense in depth: a stolen
/// token alone is not enough over TLS), and must not be revoked. `AgentNode` checks it on
/// every agent request.
/// A known node's agent speaks a protocol this control plane does not serve: said in its
/// host verification (so `nodes ls` shows why, and it gets no work) and in the log.
pub(crate) async fn refuse_protocol(state: &AppState, node_id: &str, why: &str) {
    tracing::warn!(%node_id, "agent refused: {why}");
    let verification = gpurent_types::api::HostVerification {
        ok: false,
        checks: vec![gpurent_types::api::HostCheck {
            name: "agent".into(),
            ok: false,
            detail: why.to_owned(),
        }],
    };
    if let Err(e) = state.store.set_verification(node_id, &verification).await {
        tracing::warn!(%node_id, error = %e, "cannot record the refused agent");
    }
}

pub(crate) async fn check_node_cert(
    state: &AppState,
    node_id: &str,
    peer: &PeerCert,
) -> Result<(), ApiError> {
    let cert = state.store.node_certificate(node_id).await?;
    cert_agrees(state, node_id, &cert, peer)
}

/// `check_node_cert` on a certificate read already.
pub(crate) fn cert_agrees(
    state: &AppState,
    node_id: &str,
    cert: &NodeCertificate,
    peer: &PeerCert,
) -> Result<(), ApiError> {
    if cert.revoked {
        tracing::warn!(%node_id, "sync of a revoked node refused");
        return Err(ApiError::Forbidden(
            "this node's certificate is revoked".into(),
        ));
    }
    if state.config.tls.is_none() {
        return Ok(());
    }
    match (&peer.0, &cert.sha256) {
        (Some(presented), Some(issued)) if presented == issued => Ok(()),
        (None, _) => Err(ApiError::Forbidden(
            "the agent protocol needs the node's client certificate (mutual TLS)".into(),
        )),
        _ => Err(ApiError::Forbidden(
            "the client certificate is not the one issued to this node".into(),
        )),
    }
}
