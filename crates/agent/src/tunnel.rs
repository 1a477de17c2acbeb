//! The tunnel this agent holds open to the control plane (so tenants reach its instances
//! with no inbound port on the node): reconnects while the agent runs, and serves each
//! stream the control plane opens by entering the instance it names.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gpurent_tunnel::{
    frame_channel, ExitStatus, Frame, FrameReceiver, FrameSender, OpenStream, StreamKind,
};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::client::ControlPlane;
use crate::entry::{Entered, EntryKind, EntryRequest, Pty};
use crate::executor::Executor;
use crate::reconcile::ObservedState;
use crate::run::volumes::Keeper;

/// Bytes read from an instance per data frame.
const CHUNK: usize = 32 * 1024;
/// How long the control plane has to name what a new stream is for.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
const KEEPALIVE: Duration = Duration::from_secs(20);
/// Waits between reconnects: from the first to the last, doubling.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(10));
/// Streams at once over one tunnel.
const MAX_STREAMS: u32 = 4096;

/// Holds the tunnel open until `shutdown` turns true.
pub(crate) async fn hold(
    client: ControlPlane,
    token: String,
    executor: Arc<dyn Executor>,
    volumes: Arc<Keeper>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut wait = BACKOFF.0;
    while !*shutdown.borrow() {
        let served = async {
            let upgraded = client.open_tunnel(&token).await?;
            tracing::info!("tunnel to the control plane open");
            serve(upgraded, executor.clone(), volumes.clone()).await;
            Ok::<_, crate::AgentError>(())
        };
        let started = tokio::time::Instant::now();
        tokio::select! {
            outcome = served => match outcome {
                Ok(()) => tracing::info!("tunnel to the control plane closed; reopening"),
                Err(e) => tracing::warn!(error = %e, "cannot open the tunnel to the control plane; retrying"),
            },
            _ = shutdown.wait_for(|s| *s) => return,
        }
        // A tunnel that served a while reconnects at once; failures back off.
        wait = if started.elapsed() > BACKOFF.1 {
            BACKOFF.0
        } else {
            (wait * 2).min(BACKOFF.1)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

/// Serves HTTP/2 on the tunnel, this side the server, until it closes.
async fn serve(upgraded: reqwest::Upgraded, executor: Arc<dyn Executor>, volumes: Arc<Keeper>) {
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let executor = executor.clone();
        let volumes = volumes.clone();
        async move {
            let (tx, body) = frame_channel();
            tokio::spawn(stream(request.into_body(), tx, executor, volumes));
            Ok::<_, Infallible>(hyper::Response::new(body))
        }
    });
    let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(gpurent_tunnel::STREAM_WINDOW)
        .initial_connection_window_size(gpurent_tunnel::CONNECTION_WINDOW)
        .keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .max_concurrent_streams(MAX_STREAMS)
        .serve_connection(TokioIo::new(upgraded), service)
        .await;
    if let Err(e) = served {
        tracing::info!(error = %e, "tunnel ended");
    }
}

/// One stream: enters the instance it names (or serves the volume it names) and pipes it both
/// ways.
async fn stream(
    body: Incoming,
    tx: FrameSender,
    executor: Arc<dyn Executor>,
    volumes: Arc<Keeper>,
) {
    let mut rx = FrameReceiver::new(body);
    let open = match tokio::time::timeout(OPEN_TIMEOUT, rx.next()).await {
        Ok(Ok(Some(Frame::Open(open)))) => open,
        other => {
            tracing::debug!(?other, "tunnel: a stream without an open frame");
            let _ = tx
                .send(Frame::Refused(
                    "the stream did not say what it is for".into(),
                ))
                .await;
            return;
        }
    };
    let reservation = open.reservation_id.clone();
    let what = open.kind.as_str();
    let entered = match open.kind {
        StreamKind::VolumeFiles { volume_id, shared } => {
            volume_files(&volumes, &volume_id, shared).await
        }
        _ => enter(&*executor, open).await,
    };
    let entered = match entered {
        Ok(entered) => entered,
        Err(why) => {
            tracing::info!(%reservation, what, %why, "tunnel: cannot enter the instance");
            let _ = tx.send(Frame::Refused(why)).await;
            return;
        }
    };
    tracing::info!(%reservation, what, "tunnel: entered the instance");
    if tx.send(Frame::Opened).await.is_err() {
        return;
    }
    pipe(entered, what == "tcp", rx, tx).await;
    tracing::debug!(%reservation, what, "tunnel: stream ended");
}

/// A volume's files over SFTP, confined to it, with no instance.
async fn volume_files(volumes: &Keeper, volume_id: &str, shared: bool) -> Result<Entered, String> {
    let dir = volumes.dir_of(volume_id, shared).await?;
    crate::entry::sftp::serve_volume(&crate::entry::sftp::default_helper(), volume_id, &dir)
}

/// Checks that the instance runs here at the epoch the control plane placed, then enters it.
async fn enter(executor: &dyn Executor, open: OpenStream) -> Result<Entered, String> {
    let running = executor
        .list()
        .await
        .map_err(|e| format!("the node cannot list its instances: {e}"))?
        .into_iter()
        .find(|o| o.reservation_id == open.reservation_id);
    match running {
        Some(o) if o.epoch == open.epoch && o.state == ObservedState::Running => {}
        Some(o) if o.epoch != open.epoch => {
            return Err(format!(
                "reservation {} runs here as epoch {}, not {} (it was moved)",
                open.reservation_id, o.epoch, open.epoch
            ))
        }
        Some(_) => {
            return Err(format!(
                "the instance of reservation {} has ended on its node",
                open.reservation_id
            ))
        }
        None if executor.name() == "sim" => {
            // The sim executor says itself that there is nothing to enter.
        }
        None => {
            return Err(format!(
                "reservation {} has no instance on its node (yet)",
                open.reservation_id
            ))
        }
    }
    let request = EntryRequest {
        kind: match open.kind {
            StreamKind::Shell => EntryKind::Shell,
            StreamKind::Exec { command } => EntryKind::Exec { command },
            StreamKind::Sftp => EntryKind::Sftp,
            StreamKind::Tcp { port } => EntryKind::Tcp { port },
            StreamKind::VolumeFiles { .. } => {
                return Err("a volume's files are not in an instance".to_owned())
            }
        },
        pty: open.pty.map(|p| Pty {
            term: p.term,
            cols: p.cols,
            rows: p.rows,
        }),
        env: open.env,
    };
    executor
        .enter(&open.reservation_id, request)
        .await
        .map_err(|e| e.to_string())
}

/// Pipes an entered instance and a stream: the client's frames to stdin (and resizes and
/// signals to the process), stdout and stderr to frames, then the exit status. A client
/// that goes away hangs the session up.
async fn pipe(entered: Entered, tcp: bool, mut rx: FrameReceiver<Incoming>, tx: FrameSender) {
    let Entered {
        mut stdin,
        stdout,
        stderr,
        mut control,
    } = entered;
    let (inbound_done, inbound_over) = tokio::sync::oneshot::channel::<()>();
    let control_ref = &mut control;
    let (resize_tx, mut resizes) = tokio::sync::mpsc::channel::<Frame>(16);
    let inbound = async {
        loop {
            match rx.next().await {
                Ok(Some(Frame::Data(data))) => {
                    if stdin.write_all(&data).await.is_err() {
                        // The process closed its stdin: what the client sends is dropped.
                        continue;
                    }
                }
                Ok(Some(Frame::Eof)) => {
                    let _ = stdin.shutdown().await;
                }
                Ok(Some(frame @ (Frame::Resize { .. } | Frame::Signal(_)))) => {
                    let _ = resize_tx.try_send(frame);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let _ = inbound_done.send(());
    };
    let outbound = async {
        let out = forward(stdout, &tx, false);
        let err = async {
            if let Some(stderr) = stderr {
                forward(stderr, &tx, true).await;
            }
        };
        // Resizes and signals reach the process while it writes.
        let controls = async {
            while let Some(frame) = resizes.recv().await {
                let _ = match frame {
                    Frame::Resize { cols, rows } => control_ref.resize(cols, rows).await,
                    Frame::Signal(name) => control_ref.signal(&name).await,
                    _ => Ok(()),
                };
            }
        };
        tokio::select! {
            _ = async { tokio::join!(out, err) } => {}
            _ = controls => {}
        }
        let _ = tx.send(Frame::Eof).await;
        if tcp {
            // The client may still send after the port's side ended.
            let _ = inbound_over.await;
            return;
        }
        let status = match control_ref.wait().await {
            Ok(crate::entry::ExitStatus::Code(code)) => ExitStatus::Code(code),
            Ok(crate::entry::ExitStatus::Signal { name, core_dumped }) => {
                ExitStatus::Signal { name, core_dumped }
            }
            Err(e) => {
                let _ = tx
                    .send(Frame::Stderr(Bytes::from(format!(
                        "gpurent: cannot tell how the command ended: {e}\r\n"
                    ))))
                    .await;
                ExitStatus::Code(255)
            }
        };
        let _ = tx.send(Frame::Exit(status)).await;
    };
    tokio::select! {
        _ = outbound => {}
        _ = async { inbound.await; if tcp { std::future::pending::<()>().await } } => {
            // The client went away: hang the session up, as sshd does.
            if !tcp {
                let _ = control.signal("HUP").await;
            }
        }
    }
}

/// Sends what `from` gives as data (or stderr) frames until it ends or the stream closes.
async fn forward(mut from: Box<dyn AsyncRead + Send + Unpin>, tx: &FrameSender, stderr: bool) {
    let mut buf = BytesMut::with_capacity(CHUNK);
    loop {
        buf.reserve(CHUNK);
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let data = buf.split().freeze();
                let frame = if stderr {
                    Frame::Stderr(data)
                } else {
                    Frame::Data(data)
                };
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        }
    }
}
