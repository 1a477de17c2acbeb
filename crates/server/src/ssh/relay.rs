//! Relays one SSH channel to the instance: a session channel (shell, exec, SFTP) or a
//! forwarded TCP connection, as one stream through the node's tunnel. [`RelayContext`] (the
//! dial, the counts, the activity and the audit record) serves the web console's terminal too.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use gpurent_audit::Entry;
use gpurent_store::{Scope, Store};
use gpurent_tunnel::{ExitStatus, Frame, OpenStream, PtySpec, StreamKind};
use gpurent_types::ReservationStatus;
use russh::server::{Handle, Msg};
use russh::{Channel, ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Sig};

use crate::audit::AuditTrail;
use crate::metrics::Metrics;
use crate::tunnel::{Stream, Tunnels};

/// Bytes relayed on one channel (or web terminal).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) inbound: AtomicU64,
    pub(crate) outbound: AtomicU64,
}

/// What a refused entry exits with (OpenSSH's own failures exit 255 too).
const REFUSED_STATUS: u32 = 255;
/// Environment variables a client may send per channel.
const MAX_ENV: usize = 64;

/// How a client entered the instance, in the audit trail and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// The SSH endpoint, with the key that got in (its SHA256 fingerprint).
    Ssh { fingerprint: String },
    /// The web console's terminal (`console::terminal`), as the logged-in user.
    Console,
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::Ssh { fingerprint } => write!(f, "key {fingerprint}"),
            Via::Console => f.write_str("web console"),
        }
    }
}

/// What every channel of one authenticated connection (or one web terminal) shares.
#[derive(Debug)]
pub struct RelayContext {
    pub store: Arc<dyn Store>,
    pub tunnels: Arc<Tunnels>,
    pub metrics: Arc<Metrics>,
    pub audit: Option<AuditTrail>,
    pub reservation_id: String,
    /// Who entered: the reservation's owner, whose key got in, or the console's user (the
    /// owner or an admin).
    pub user_id: String,
    pub peer: Option<SocketAddr>,
    pub via: Via,
    /// Where input counts as the reservation's activity (for idle reclaim).
    pub activity: Arc<crate::activity::Activity>,
    /// Bytes relayed, client to instance and back, over all of the connection's channels.
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
}

impl RelayContext {
    /// The client sent input: the reservation is in use (idle reclaim leaves it running).
    pub(crate) fn activity(&self) {
        self.activity
            .touch(&self.store, &self.reservation_id, Utc::now());
    }

    /// Counts bytes relayed for `/metrics`, the connection and the channel.
    pub(crate) fn count(&self, channel: &AtomicU64, inbound: bool, n: usize) {
        let n = n as u64;
        let (conn, total) = if inbound {
            (&self.bytes_in, &self.metrics.ssh.bytes_in)
        } else {
            (&self.bytes_out, &self.metrics.ssh.bytes_out)
        };
        conn.fetch_add(n, Ordering::Relaxed);
        total.fetch_add(n, Ordering::Relaxed);
        channel.fetch_add(n, Ordering::Relaxed);
    }

    /// The channel's record in the audit trail: who (the owner by key, or the console's
    /// user), what (shell, exec, sftp, tcp/PORT), from where, when, and the bytes each way;
    /// outcome 200 when the instance was entered, 403 when it was refused.
    pub(crate) async fn audit(
        &self,
        what: &str,
        started: DateTime<Utc>,
        counts: &Counts,
        entered: bool,
    ) {
        let Some(trail) = &self.audit else {
            return;
        };
        let ended = Utc::now();
        let (prefix, action, resource) = match &self.via {
            Via::Ssh { .. } => (
                "ssh",
                format!("SSH {what}"),
                format!("/ssh/{}/{what}", self.reservation_id),
            ),
            Via::Console => (
                "console",
                format!("CONSOLE {what}"),
                format!("/instances/{}/terminal", self.reservation_id),
            ),
        };
        trail
            .record(Entry {
                request_id: format!("{prefix}-{}", hex::encode(rand::random::<[u8; 8]>())),
                at: ended,
                user_id: Some(self.user_id.clone()),
                action,
                resource,
                allocation: Some(format!(
                    "{}; from {} to {}; {} bytes in, {} bytes out",
                    self.via,
                    started.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    ended.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    counts.inbound.load(Ordering::Relaxed),
                    counts.outbound.load(Ordering::Relaxed),
                )),
                outcome: if entered { 200 } else { 403 },
                client: self.peer.map(|p| p.to_string()).unwrap_or_default(),
            })
            .await;
    }

    /// The node and epoch the reservation runs on now, or why it cannot be entered.
    async fn target(&self) -> Result<(String, i64), String> {
        let r = self
            .store
            .get_reservation(&self.reservation_id, &Scope::All)
            .await
            .map_err(|e| format!("cannot look up reservation {}: {e}", self.reservation_id))?;
        match (r.status, r.node) {
            (ReservationStatus::Running, Some(node)) => Ok((node, r.epoch)),
            (status, _) => Err(format!(
                "reservation {} is {}; connect while it runs",
                r.id,
                status.as_str()
            )),
        }
    }

    /// Enters the instance: a stream of `kind` through the tunnel of the node it runs on.
    pub(crate) async fn dial(
        &self,
        kind: StreamKind,
        pty: Option<PtySpec>,
        env: Vec<(String, String)>,
    ) -> Result<Stream, String> {
        let (node, epoch) = self.target().await?;
        let open = OpenStream {
            reservation_id: self.reservation_id.clone(),
            epoch,
            kind,
            pty,
            env,
        };
        self.tunnels
            .dial(&node, open)
            .await
            .map_err(|e| e.to_string())
    }
}

/// A session channel: waits for its pty and env requests and its shell, exec or SFTP
/// request, enters the instance and pipes the channel through until either side ends.
pub async fn session(channel: Channel<Msg>, ctx: Arc<RelayContext>, handle: Handle) {
    let id = channel.id();
    let (mut read, write) = channel.split();
    let mut pty = None;
    let mut env = Vec::new();
    let kind = loop {
        match read.wait().await {
            Some(ChannelMsg::RequestPty {
                term,
                col_width,
                row_height,
                ..
            }) => {
                pty = Some(PtySpec {
                    term,
                    cols: dimension(col_width),
                    rows: dimension(row_height),
                })
            }
            Some(ChannelMsg::SetEnv {
                variable_name,
                variable_value,
                ..
            }) if env.len() < MAX_ENV => env.push((variable_name, variable_value)),
            Some(ChannelMsg::RequestShell { .. }) => break StreamKind::Shell,
            Some(ChannelMsg::Exec { command, .. }) => {
                break StreamKind::Exec {
                    command: String::from_utf8_lossy(&command).into_owned(),
                }
            }
            Some(ChannelMsg::RequestSubsystem { name, .. }) if name == "sftp" => {
                break StreamKind::Sftp
            }
            // The handler refused other subsystems; the client may ask again.
            Some(ChannelMsg::Close) | None => return,
            Some(_) => {}
        }
    };
    let what = kind.as_str();
    let started = Utc::now();
    let counts = Counts::default();
    match ctx.dial(kind, pty, env).await {
        Ok(stream) => {
            tracing::info!(reservation = %ctx.reservation_id, peer = ?ctx.peer, what, "ssh: entered the instance");
            pump(read, write, stream, &ctx, &counts, Some((&handle, id))).await;
            ctx.audit(what, started, &counts, true).await;
        }
        Err(why) => {
            tracing::info!(reservation = %ctx.reservation_id, peer = ?ctx.peer, what, %why, "ssh: cannot enter the instance");
            let _ = write
                .extended_data_bytes(1, Bytes::from(format!("gpurent: {why}\r\n")))
                .await;
            let _ = write.exit_status(REFUSED_STATUS).await;
            let _ = write.eof().await;
            let _ = write.close().await;
            ctx.audit(what, started, &counts, false).await;
        }
    }
}

/// A forwarded TCP connection (`ssh -L`), already connected through the tunnel.
pub async fn forwarded(channel: Channel<Msg>, stream: Stream, ctx: Arc<RelayContext>, port: u16) {
    let started = Utc::now();
    let counts = Counts::default();
    let (read, write) = channel.split();
    pump(read, write, stream, &ctx, &counts, None).await;
    ctx.audit(&format!("tcp/{port}"), started, &counts, true)
        .await;
}

/// A forwarding that could not connect, for the audit trail.
pub async fn forward_refused(ctx: &RelayContext, port: u16) {
    ctx.audit(
        &format!("tcp/{port}"),
        Utc::now(),
        &Counts::default(),
        false,
    )
    .await;
}

/// Opens the stream a `direct-tcpip` channel asks for, before it is accepted (a port where
/// nothing listens is refused as the channel's open failure, as sshd does).
pub async fn dial_port(ctx: &RelayContext, port: u16) -> Result<Stream, String> {
    ctx.dial(StreamKind::Tcp { port }, None, Vec::new()).await
}

/// Pipes a channel and a stream both ways until the instance's side ends (then the channel
/// is closed) or the client closes the channel (then the stream is dropped, which ends the
/// process in the instance).
async fn pump(
    mut read: ChannelReadHalf,
    write: ChannelWriteHalf<Msg>,
    stream: Stream,
    ctx: &RelayContext,
    counts: &Counts,
    session: Option<(&Handle, russh::ChannelId)>,
) {
    let Stream { tx, mut rx } = stream;
    // Ends only when the client closes the channel: an instance side that stopped reading
    // (a command that exited before the client's EOF got there) must not cut off what it
    // still sends, its exit status above all; the client's messages are then dropped.
    let inbound = async {
        let mut forwarding = true;
        while let Some(msg) = read.wait().await {
            if !forwarding && !matches!(msg, ChannelMsg::Close) {
                continue;
            }
            let frame = match msg {
                ChannelMsg::Data { data } => {
                    ctx.count(&counts.inbound, true, data.len());
                    ctx.activity();
                    Frame::Data(data)
                }
                ChannelMsg::Eof => Frame::Eof,
                ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                } => Frame::Resize {
                    cols: dimension(col_width),
                    rows: dimension(row_height),
                },
                ChannelMsg::Signal { signal } => Frame::Signal(signal_name(&signal)),
                ChannelMsg::Close => break,
                _ => continue,
            };
            if tx.send(frame).await.is_err() {
                forwarding = false;
            }
        }
    };
    let outbound = async {
        loop {
            match rx.next().await {
                Ok(Some(Frame::Data(data))) => {
                    ctx.count(&counts.outbound, false, data.len());
                    if write.data_bytes(data).await.is_err() {
                        break;
                    }
                }
                Ok(Some(Frame::Stderr(data))) => {
                    ctx.count(&counts.outbound, false, data.len());
                    if write.extended_data_bytes(1, data).await.is_err() {
                        break;
                    }
                }
                Ok(Some(Frame::Eof)) => {
                    let _ = write.eof().await;
                }
                Ok(Some(Frame::Exit(status))) => {
                    if let Some((handle, id)) = session {
                        let _ = match status {
                            ExitStatus::Code(code) => write.exit_status(code).await.map_err(|_| ()),
                            ExitStatus::Signal { name, core_dumped } => {
                                handle
                                    .exit_signal_request(
                                        id,
                                        signal(&name),
                                        core_dumped,
                                        String::new(),
                                        String::new(),
                                    )
                                    .await
                            }
                        };
                    }
                }
                Ok(Some(other)) => {
                    tracing::debug!(?other, "ssh: unexpected frame from the agent");
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::info!(reservation = %ctx.reservation_id, error = %e, "ssh: the stream to the instance failed");
                    if session.is_some() {
                        let _ = write
                            .extended_data_bytes(
                                1,
                                Bytes::from(format!(
                                    "gpurent: the connection to the instance was lost ({e})\r\n"
                                )),
                            )
                            .await;
                        let _ = write.exit_status(REFUSED_STATUS).await;
                    }
                    break;
                }
            }
        }
        let _ = write.eof().await;
        let _ = write.close().await;
    };
    tokio::select! {
        _ = outbound => {}
        _ = inbound => {}
    }
}

fn dimension(v: u32) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

fn signal_name(sig: &Sig) -> String {
    match sig {
        Sig::ABRT => "ABRT",
        Sig::ALRM => "ALRM",
        Sig::FPE => "FPE",
        Sig::HUP => "HUP",
        Sig::ILL => "ILL",
        Sig::INT => "INT",
        Sig::KILL => "KILL",
        Sig::PIPE => "PIPE",
        Sig::QUIT => "QUIT",
        Sig::SEGV => "SEGV",
        Sig::TERM => "TERM",
        Sig::USR1 => "USR1",
        Sig::Custom(name) => name,
    }
    .to_owned()
}

fn signal(name: &str) -> Sig {
    match name {
        "ABRT" => Sig::ABRT,
        "ALRM" => Sig::ALRM,
        "FPE" => Sig::FPE,
        "HUP" => Sig::HUP,
        "ILL" => Sig::ILL,
        "INT" => Sig::INT,
        "KILL" => Sig::KILL,
        "PIPE" => Sig::PIPE,
        "QUIT" => Sig::QUIT,
        "SEGV" => Sig::SEGV,
        "TERM" => Sig::TERM,
        "USR1" => Sig::USR1,
        other => Sig::Custom(other.to_owned()),
    }
}
