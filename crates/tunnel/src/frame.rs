//! Frames: a tag byte, a big-endian u32 payload length, the payload. Both directions of a
//! stream use the same framing; which frames each side sends is in [`Frame`]'s docs.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::open::{ExitStatus, OpenStream};

/// The largest payload a frame may carry; a peer announcing more is broken or hostile.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

const HEADER: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Control plane → agent, first: what the stream is for.
    Open(OpenStream),
    /// Agent → control plane, first: the instance was entered.
    Opened,
    /// Agent → control plane, first: why it could not be entered (shown to the tenant).
    Refused(String),
    /// Bytes of stdin (to the agent) or stdout (from it); a TCP stream's bytes.
    Data(Bytes),
    /// Bytes of stderr, from the agent.
    Stderr(Bytes),
    /// No more data from this side (stdin closed; stdout ended).
    Eof,
    /// The client's terminal changed size.
    Resize { cols: u16, rows: u16 },
    /// A signal for the process, by its SSH name.
    Signal(String),
    /// Agent → control plane, last: how the process ended.
    Exit(ExitStatus),
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("tunnel frame of {0} bytes is over the limit of {MAX_PAYLOAD}")]
    TooLong(usize),
    #[error("unknown tunnel frame tag {0}")]
    UnknownTag(u8),
    #[error("malformed tunnel frame: {0}")]
    Malformed(String),
    #[error("the tunnel stream ended inside a frame")]
    Truncated,
}

impl Frame {
    fn tag(&self) -> u8 {
        match self {
            Frame::Open(_) => 1,
            Frame::Opened => 2,
            Frame::Refused(_) => 3,
            Frame::Data(_) => 4,
            Frame::Stderr(_) => 5,
            Frame::Eof => 6,
            Frame::Resize { .. } => 7,
            Frame::Signal(_) => 8,
            Frame::Exit(_) => 9,
        }
    }

    /// The frame as its header and its payload, two buffers so that data is not copied.
    pub fn encode(self) -> (Bytes, Bytes) {
        let tag = self.tag();
        let payload = match self {
            Frame::Open(open) => json(&open),
            Frame::Exit(status) => json(&status),
            Frame::Opened | Frame::Eof => Bytes::new(),
            Frame::Refused(text) | Frame::Signal(text) => Bytes::from(text.into_bytes()),
            Frame::Data(data) | Frame::Stderr(data) => data,
            Frame::Resize { cols, rows } => {
                let mut b = BytesMut::with_capacity(4);
                b.put_u16(cols);
                b.put_u16(rows);
                b.freeze()
            }
        };
        let mut header = BytesMut::with_capacity(HEADER);
        header.put_u8(tag);
        // Payloads we make are bounded far below u32::MAX (data is chunked by the senders).
        header.put_u32(u32::try_from(payload.len()).unwrap_or(u32::MAX));
        (header.freeze(), payload)
    }

    fn decode(tag: u8, payload: Bytes) -> Result<Frame, FrameError> {
        let text = |p: Bytes| {
            String::from_utf8(p.to_vec())
                .map_err(|_| FrameError::Malformed("text is not UTF-8".into()))
        };
        Ok(match tag {
            1 => Frame::Open(from_json(&payload)?),
            2 => Frame::Opened,
            3 => Frame::Refused(text(payload)?),
            4 => Frame::Data(payload),
            5 => Frame::Stderr(payload),
            6 => Frame::Eof,
            7 => {
                if payload.len() != 4 {
                    return Err(FrameError::Malformed("resize needs 4 bytes".into()));
                }
                let mut p = payload;
                Frame::Resize {
                    cols: p.get_u16(),
                    rows: p.get_u16(),
                }
            }
            8 => Frame::Signal(text(payload)?),
            9 => Frame::Exit(from_json(&payload)?),
            other => return Err(FrameError::UnknownTag(other)),
        })
    }
}

fn json<T: serde::Serialize>(value: &T) -> Bytes {
    // Serializing these plain structs cannot fail.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

fn from_json<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Cuts frames out of the chunks a body delivers, however they are split.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: BytesMut,
}

impl FrameReader {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole frame, if the bytes so far hold one.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let tag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLong(len));
        }
        if self.buf.len() < HEADER + len {
            self.buf.reserve(HEADER + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER);
        let payload = self.buf.split_to(len).freeze();
        Frame::decode(tag, payload).map(Some)
    }

    /// Whether bytes of an unfinished frame are left (at the end of a body: truncated).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open::{PtySpec, StreamKind};
    use proptest::prelude::*;

    fn frames() -> Vec<Frame> {
        vec![
            Frame::Open(OpenStream {
                reservation_id: "r1".into(),
                epoch: 2,
                kind: StreamKind::Exec {
                    command: "echo ü; exit 3".into(),
                },
                pty: Some(PtySpec {
                    term: "xterm".into(),
                    cols: 80,
                    rows: 24,
                }),
                env: vec![("LANG".into(), "C.UTF-8".into())],
            }),
            Frame::Opened,
            Frame::Refused("no".into()),
            Frame::Data(Bytes::from_static(b"abc")),
            Frame::Data(Bytes::new()),
            Frame::Stderr(Bytes::from_static(b"err")),
            Frame::Eof,
            Frame::Resize {
                cols: 132,
                rows: 43,
            },
            Frame::Signal("INT".into()),
            Frame::Exit(ExitStatus::Code(3)),
            Frame::Exit(ExitStatus::Signal {
                name: "KILL".into(),
                core_dumped: false,
            }),
        ]
    }

    fn wire(frames: &[Frame]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            let (h, p) = f.clone().encode();
            out.extend_from_slice(&h);
            out.extend_from_slice(&p);
        }
        out
    }

    proptest! {
        /// However the bytes are cut into chunks, the same frames come out.
        #[test]
        fn frames_survive_any_chunking(cuts in proptest::collection::vec(0usize..200, 0..20)) {
            let sent = frames();
            let bytes = wire(&sent);
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                let end = (at + cut).min(bytes.len());
                reader.push(&bytes[at..end]);
                at = end;
                while let Some(f) = reader.next_frame().unwrap() {
                    got.push(f);
                }
            }
            reader.push(&bytes[at..]);
            while let Some(f) = reader.next_frame().unwrap() {
                got.push(f);
            }
            prop_assert_eq!(got, sent);
            prop_assert!(reader.is_empty());
        }

        /// Garbage never panics: it is a frame, an error, or a wait for more.
        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut reader = FrameReader::default();
            reader.push(&bytes);
            for _ in 0..64 {
                match reader.next_frame() {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_buffered() {
        let mut reader = FrameReader::default();
        reader.push(&[4, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(reader.next_frame(), Err(FrameError::TooLong(_))));
    }
}
