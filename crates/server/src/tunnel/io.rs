//! A tunnel stream as a byte stream (for hyper, or for a client's upgraded connection): one
//! end of an in-memory pipe, whose other end two pumps join to the stream's frames.

use std::time::Duration;

use bytes::BytesMut;
use gpurent_tunnel::Frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::Stream;

/// Bytes buffered between the byte stream and the tunnel stream, and read per data frame.
const BUFFER: usize = 64 * 1024;
/// How long the instance's side may go on sending after this side is done with a
/// connection, before the stream is dropped.
const LINGER: Duration = Duration::from_secs(30);

impl Stream {
    /// The stream's data both ways as bytes; its end (EOF or the exit status) as EOF.
    pub fn into_io(self) -> DuplexStream {
        let (near, far) = tokio::io::duplex(BUFFER);
        let (mut read, mut write) = tokio::io::split(far);
        let Stream { tx, mut rx } = self;
        tokio::spawn(async move {
            let up = async {
                let mut buf = BytesMut::with_capacity(BUFFER);
                loop {
                    buf.reserve(BUFFER);
                    match read.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if tx.send(Frame::Data(buf.split().freeze())).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = tx.send(Frame::Eof).await;
            };
            let down = async {
                loop {
                    match rx.next().await {
                        Ok(Some(Frame::Data(data))) => {
                            if write.write_all(&data).await.is_err() {
                                break;
                            }
                        }
                        Ok(Some(Frame::Eof | Frame::Exit(_)) | None) | Err(_) => break,
                        Ok(Some(_)) => {}
                    }
                }
                let _ = write.shutdown().await;
            };
            tokio::pin!(down);
            tokio::select! {
                () = up => {
                    // This side is done; the instance's may still be sending (a half close).
                    let _ = tokio::time::timeout(LINGER, &mut down).await;
                }
                () = &mut down => {}
            }
        });
        near
    }
}
