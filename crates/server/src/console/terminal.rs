//! The instance page's web terminal: a WebSocket (`GET /instances/{id}/terminal`) relayed to a
//! shell in the instance through its node's tunnel, the relay `gpurent ssh` uses (its dial,
//! session cap, metrics, idle-reclaim activity and audit record, as `CONSOLE shell`).

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::Extension;
use chrono::Utc;
use futures_util::{SinkExt, StreamExt};
use gpurent_store::{AuthUser, Scope, StoreError, TokenCheck};
use gpurent_tunnel::{ExitStatus, Frame, PtySpec, StreamKind};
use gpurent_types::ReservationStatus;
use serde::{Deserialize, Serialize};

use crate::auth::hash_token;
use crate::console::session::{self, NoSession, Viewer};
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::ssh::{not_running, Counts, RelayContext, Slot, Via};
use crate::state::AppState;

/// How often an open terminal checks that its session is still on (no logout, not expired)
/// and its reservation still runs (the SSH endpoint's default recheck).
const RECHECK: Duration = Duration::from_secs(5);
/// The shell's `TERM`: xterm.js speaks xterm with 256 colours.
const TERM: &str = "xterm-256color";
/// The size until the browser says otherwise (a `resize` message).
const DEFAULT_SIZE: (u16, u16) = (80, 24);
/// WebSocket close codes (RFC 6455): the shell ended; the terminal ended for another reason.
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_ERROR: u16 = 1011;

/// The terminal's first size, from the page (`?cols=C&rows=R`), before its first resize.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Size {
    cols: Option<u16>,
    rows: Option<u16>,
}

/// What the browser sends as text (its keystrokes come as binary messages).
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientMessage {
    /// The terminal's window changed size.
    Resize { cols: u16, rows: u16 },
}

/// What the server sends as text (the shell's output comes as binary messages): the last
/// message before the socket closes.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ServerMessage {
    /// The shell ended: its exit code, or the signal that ended it.
    Exit {
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signal: Option<String>,
    },
    /// The terminal ended for another reason, or could not start: a stable code (the page
    /// words it in its language) and the server's own message (shown in the terminal).
    Error { code: Ending, message: String },
}

/// Why a terminal ended, other than its shell's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Ending {
    /// The reservation does not run (it stopped, or was rescheduled away).
    NotRunning,
    /// The reservation is no longer the viewer's to see.
    NotFound,
    /// The viewer's session ended (logout, expiry).
    SessionEnded,
    /// The instance could not be entered.
    CannotEnter,
    /// The stream to the instance broke, or ended without an exit status.
    InstanceLost,
}

impl ServerMessage {
    fn error(code: Ending, message: impl Into<String>) -> ServerMessage {
        ServerMessage::Error {
            code,
            message: message.into(),
        }
    }

    fn exit(status: ExitStatus) -> ServerMessage {
        match status {
            ExitStatus::Code(code) => ServerMessage::Exit {
                code: Some(code),
                signal: None,
            },
            ExitStatus::Signal { name, .. } => ServerMessage::Exit {
                code: None,
                signal: Some(name),
            },
        }
    }

    fn to_text(&self) -> String {
        // A derived Serialize of strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from(r#"{"type":"error"}"#))
    }
}

/// `GET /instances/{id}/terminal`: the WebSocket upgrade of the web terminal, for the
/// session's viewer (`policy::authorize` found it from the `gpurent_session` cookie).
pub(crate) async fn handler(
    State(state): State<AppState>,
    viewer: Viewer,
    ApiPath(id): ApiPath<String>,
    ApiQuery(size): ApiQuery<Size>,
    peer: Option<Extension<ConnectInfo<crate::tls::Peer>>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let peer = peer.map(|Extension(ConnectInfo(p))| p.addr);
    upgrade(state, viewer, id, size, peer, &headers, ws).await
}

/// Refuses a cross-origin upgrade (403), another's or an unknown reservation (404), one that
/// does not run (409, saying why) and one with all its sessions open (409); then upgrades.
async fn upgrade(
    state: AppState,
    viewer: Viewer,
    reservation_id: String,
    size: Size,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    same_origin(headers)?;
    admit(&state, &viewer.user, &reservation_id).await?;
    let slot = state.sessions.session(&reservation_id).ok_or_else(|| {
        ApiError::Store(StoreError::Conflict(format!(
            "reservation {reservation_id} has as many sessions open as it may; close one first"
        )))
    })?;
    let pty = PtySpec {
        term: TERM.to_owned(),
        cols: size.cols.filter(|c| *c > 0).unwrap_or(DEFAULT_SIZE.0),
        rows: size.rows.filter(|r| *r > 0).unwrap_or(DEFAULT_SIZE.1),
    };
    Ok(ws.on_upgrade(move |socket| async move {
        run(state, viewer, reservation_id, pty, peer, socket, slot).await
    }))
}

/// A browser sends `Origin` with every WebSocket handshake, and a page of another site may
/// open one with this site's cookies (SameSite does not cover WebSockets, and the upgrade is
/// a GET without a CSRF token): the origin must be this host.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    if session::same_origin(headers) {
        return Ok(());
    }
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    Err(ApiError::Forbidden(format!(
        "the terminal's WebSocket must come from a page of this site, not Origin {origin:?}"
    )))
}

/// The user may enter the reservation now: it is theirs (an admin's: any; a team member's:
/// their team's), or it is a 404 as in the API (a 403 for a team's viewer); it runs, or it is a 409 with the SSH endpoint's words for why not.
async fn admit(state: &AppState, user: &AuthUser, reservation_id: &str) -> Result<(), ApiError> {
    let r = state
        .store
        .get_reservation(reservation_id, &Scope::of(user))
        .await?;
    // A team's instance is entered by its members and above, not its viewers.
    crate::teams::reservation_action(state, user, &r, crate::teams::roles::TeamAction::Enter)
        .await?;
    match (r.status, r.node) {
        (ReservationStatus::Running, Some(_)) => Ok(()),
        (status, _) => Err(ApiError::Store(StoreError::Conflict(not_running(
            &r.id, status, r.ended_at,
        )))),
    }
}

/// What the recheck of an open terminal asks: the viewer's session still holds (a logout
/// or its expiry ends the terminal too), and the reservation still admits them.
async fn still_on(
    state: &AppState,
    viewer: &Viewer,
    reservation_id: &str,
) -> Result<(), ServerMessage> {
    match state
        .store
        .check_token(&hash_token(&viewer.token), state.now())
        .await
    {
        Ok(TokenCheck::Valid(..)) => {}
        Ok(_) => {
            return Err(ServerMessage::error(
                Ending::SessionEnded,
                NoSession::Ended.to_string(),
            ))
        }
        // The store is briefly away: the next recheck decides.
        Err(e) => {
            tracing::warn!(error = %e, "console: cannot check the terminal's session");
            return Ok(());
        }
    }
    match admit(state, &viewer.user, reservation_id).await {
        Ok(()) => Ok(()),
        Err(ApiError::Store(e)) if e.is_overloaded() => Ok(()),
        Err(ApiError::Store(StoreError::Conflict(why))) => {
            Err(ServerMessage::error(Ending::NotRunning, why))
        }
        Err(e) => Err(ServerMessage::error(Ending::NotFound, e.to_string())),
    }
}

/// The upgraded terminal: enters the instance with a shell and relays until the shell
/// exits, the browser goes, the session ends, or the reservation stops.
async fn run(
    state: AppState,
    viewer: Viewer,
    reservation_id: String,
    pty: PtySpec,
    peer: Option<SocketAddr>,
    socket: WebSocket,
    _slot: Slot,
) {
    let user = &viewer.user;
    let ctx = RelayContext {
        store: state.store.clone(),
        tunnels: state.tunnels.clone(),
        metrics: state.metrics.clone(),
        audit: state.audit.clone(),
        reservation_id: reservation_id.clone(),
        user_id: user.id.clone(),
        peer,
        via: Via::Console,
        activity: state.activity.clone(),
        bytes_in: AtomicU64::new(0),
        bytes_out: AtomicU64::new(0),
    };
    let started = Utc::now();
    let counts = Counts::default();
    let (mut sink, stream) = socket.split();
    let instance = match ctx.dial(StreamKind::Shell, Some(pty), Vec::new()).await {
        Ok(instance) => instance,
        Err(why) => {
            tracing::info!(reservation = %reservation_id, user = %user.id, %why, "console: cannot enter the instance");
            let message = ServerMessage::error(Ending::CannotEnter, why);
            close(&mut sink, &message, CLOSE_ERROR).await;
            ctx.audit("shell", started, &counts, false).await;
            return;
        }
    };
    tracing::info!(reservation = %reservation_id, user = %user.id, ?peer, "console: entered the instance");
    let crate::tunnel::Stream { tx, mut rx } = instance;
    // Ends when the browser goes; a shell that stopped reading (it exited) must not cut off
    // its last output and exit status, so the browser's input is then dropped.
    let inbound = async {
        let mut stream = stream;
        let mut forwarding = true;
        while let Some(Ok(msg)) = stream.next().await {
            let frame = match msg {
                Message::Binary(data) => {
                    ctx.count(&counts.inbound, true, data.len());
                    ctx.activity();
                    Frame::Data(data)
                }
                Message::Text(text) => match serde_json::from_str::<ClientMessage>(&text) {
                    Ok(ClientMessage::Resize { cols, rows }) if cols > 0 && rows > 0 => {
                        Frame::Resize { cols, rows }
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "console: a text message that is no resize");
                        continue;
                    }
                },
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if forwarding && tx.send(frame).await.is_err() {
                forwarding = false;
            }
        }
    };
    let outbound = async {
        let mut recheck = tokio::time::interval(RECHECK);
        recheck.tick().await;
        let (message, code) = loop {
            tokio::select! {
                frame = rx.next() => match frame {
                    Ok(Some(Frame::Data(data) | Frame::Stderr(data))) => {
                        ctx.count(&counts.outbound, false, data.len());
                        if sink.send(Message::Binary(data)).await.is_err() {
                            return;
                        }
                    }
                    Ok(Some(Frame::Exit(status))) => {
                        break (ServerMessage::exit(status), CLOSE_NORMAL);
                    }
                    Ok(Some(Frame::Eof)) => {}
                    Ok(Some(other)) => {
                        tracing::debug!(?other, "console: unexpected frame from the agent");
                    }
                    Ok(None) => break (
                        ServerMessage::error(Ending::InstanceLost, "the shell ended without an exit status"),
                        CLOSE_ERROR,
                    ),
                    Err(e) => {
                        tracing::info!(reservation = %reservation_id, error = %e, "console: the stream to the instance failed");
                        break (
                            ServerMessage::error(
                                Ending::InstanceLost,
                                format!("the connection to the instance was lost ({e})"),
                            ),
                            CLOSE_ERROR,
                        );
                    }
                },
                _ = recheck.tick() => {
                    if let Err(why) = still_on(&state, &viewer, &reservation_id).await {
                        tracing::info!(reservation = %reservation_id, user = %user.id, ?why, "console: ending the terminal");
                        break (why, CLOSE_ERROR);
                    }
                }
            }
        };
        close(&mut sink, &message, code).await;
    };
    tokio::select! {
        _ = outbound => {}
        _ = inbound => {}
    }
    ctx.audit("shell", started, &counts, true).await;
}

/// Sends the last text message and closes the socket.
async fn close(
    sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    message: &ServerMessage,
    code: u16,
) {
    let _ = sink.send(Message::Text(message.to_text().into())).await;
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: "".into(),
        })))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::assets::ASSETS;
    use sha2::{Digest, Sha256};

    /// CI proves the binary serves exactly the locked files (scripts/vendor-assets.sh
    /// --check proves, with the network, that the locked files are the registry's).
    #[test]
    fn the_embedded_vendor_files_are_the_locked_ones() {
        let lock = include_str!("../../assets/vendor/vendor.lock");
        let mut locked = Vec::new();
        for line in lock.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let ["file", package, inner, name, sha256] = fields[..] else {
                continue;
            };
            let asset = ASSETS
                .iter()
                .find(|a| a.name == name)
                .unwrap_or_else(|| panic!("{name} ({package} {inner}) is locked but not served"));
            assert_eq!(
                hex::encode(Sha256::digest(asset.bytes)),
                sha256,
                "{name} is not the locked {package} {inner}: run scripts/vendor-assets.sh --check"
            );
            locked.push(name);
        }
        for name in ["xterm.js", "xterm.css", "addon-fit.js"] {
            assert!(locked.contains(&name), "{name} is locked and served");
        }
    }

    #[test]
    fn messages_are_the_pages_protocol() {
        assert_eq!(
            serde_json::from_str::<ClientMessage>(r#"{"type":"resize","cols":120,"rows":40}"#)
                .unwrap(),
            ClientMessage::Resize {
                cols: 120,
                rows: 40
            }
        );
        assert_eq!(
            ServerMessage::exit(ExitStatus::Code(3)).to_text(),
            r#"{"type":"exit","code":3}"#
        );
        assert_eq!(
            ServerMessage::exit(ExitStatus::Signal {
                name: "KILL".into(),
                core_dumped: false
            })
            .to_text(),
            r#"{"type":"exit","signal":"KILL"}"#
        );
        assert_eq!(
            ServerMessage::error(Ending::SessionEnded, "log in again").to_text(),
            r#"{"type":"error","code":"session_ended","message":"log in again"}"#
        );
    }
}
