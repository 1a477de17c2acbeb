//! The bodies that carry frames: [`ChannelBody`] (what one side sends, fed by a
//! [`FrameSender`]) and [`FrameReceiver`] (frames out of what the other side sent).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame as BodyFrame};
use tokio::sync::mpsc;

use crate::frame::{Frame, FrameError, FrameReader};

/// Chunks queued per stream before the sender waits: HTTP/2's window is the real buffer.
const QUEUED_CHUNKS: usize = 8;

/// A pair: what is sent into the [`FrameSender`] comes out of the [`ChannelBody`].
pub fn frame_channel() -> (FrameSender, ChannelBody) {
    let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
    (FrameSender { tx }, ChannelBody { rx })
}

/// The sending half of a stream. Dropping every clone ends the body.
#[derive(Debug, Clone)]
pub struct FrameSender {
    tx: mpsc::Sender<Bytes>,
}

#[derive(Debug, thiserror::Error)]
#[error("the tunnel stream is closed")]
pub struct SendError;

impl FrameSender {
    /// Sends a frame, waiting while the peer does not read (back-pressure).
    pub async fn send(&self, frame: Frame) -> Result<(), SendError> {
        let (header, payload) = frame.encode();
        self.tx.send(header).await.map_err(|_| SendError)?;
        if !payload.is_empty() {
            self.tx.send(payload).await.map_err(|_| SendError)?;
        }
        Ok(())
    }
}

/// A request or response body fed by a [`FrameSender`].
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(BodyFrame::data(b))))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("the tunnel stream failed: {0}")]
    Body(String),
}

/// Frames out of a body the other side sends.
#[derive(Debug)]
pub struct FrameReceiver<B> {
    body: B,
    reader: FrameReader,
    done: bool,
}

impl<B> FrameReceiver<B>
where
    B: Body + Unpin,
    B::Error: std::fmt::Display,
{
    pub fn new(body: B) -> Self {
        FrameReceiver {
            body,
            reader: FrameReader::default(),
            done: false,
        }
    }

    /// The next frame; None once the body has ended cleanly.
    pub async fn next(&mut self) -> Result<Option<Frame>, RecvError> {
        loop {
            if let Some(frame) = self.reader.next_frame()? {
                return Ok(Some(frame));
            }
            if self.done {
                return if self.reader.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameError::Truncated.into())
                };
            }
            let next = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
            match next {
                None => self.done = true,
                Some(Err(e)) => return Err(RecvError::Body(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            let n = chunk.len();
                            self.reader.push(chunk);
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_cross_a_channel_body() {
        let (tx, body) = frame_channel();
        let sender = tokio::spawn(async move {
            for i in 0..100u8 {
                tx.send(Frame::Data(Bytes::from(vec![i; 1000])))
                    .await
                    .unwrap();
            }
            tx.send(Frame::Eof).await.unwrap();
        });
        let mut rx = FrameReceiver::new(body);
        for i in 0..100u8 {
            assert_eq!(
                rx.next().await.unwrap(),
                Some(Frame::Data(Bytes::from(vec![i; 1000])))
            );
        }
        assert_eq!(rx.next().await.unwrap(), Some(Frame::Eof));
        sender.await.unwrap();
        assert_eq!(rx.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_body_cut_inside_a_frame_is_an_error() {
        let body = http_body_util::Full::new(Bytes::from_static(&[4, 0, 0, 0, 9, 1, 2]));
        let mut rx = FrameReceiver::new(body);
        assert!(matches!(
            rx.next().await,
            Err(RecvError::Frame(FrameError::Truncated))
        ));
    }
}
