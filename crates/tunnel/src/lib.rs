//! The tunnel an agent opens to the control plane (`GET /api/v1/agent/tunnel`, upgraded to
//! reverse HTTP/2: the control plane is the HTTP/2 client, the agent the server), so GPU hosts
//! need no inbound port. Each SSH channel or forwarded connection is one HTTP/2 stream whose
//! request and response bodies carry [`Frame`]s; HTTP/2's windows give each stream its
//! back-pressure. This crate is the protocol only: what a stream asks for ([`OpenStream`]),
//! the frames, and the bodies that carry them.

mod body;
mod frame;
mod open;

pub use body::{frame_channel, ChannelBody, FrameReceiver, FrameSender, RecvError, SendError};
pub use frame::{Frame, FrameError, FrameReader, MAX_PAYLOAD};
pub use open::{ExitStatus, OpenStream, PtySpec, StreamKind};

/// The protocol named in the `Upgrade` header of the tunnel request.
pub const UPGRADE: &str = "gpurent-tunnel/1";

/// The path of the tunnel request.
pub const PATH: &str = "/api/v1/agent/tunnel";

/// HTTP/2 flow-control windows of the tunnel, each side's receive windows: big enough that a
/// copy through one stream is not held back by round trips, small enough that a slow reader
/// holds little.
pub const STREAM_WINDOW: u32 = 1024 * 1024;
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
