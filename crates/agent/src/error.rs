//! What can stop an agent, with the context to act on it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the control plane at {url} did not answer after {tries} tries")]
    Unreachable {
        url: String,
        tries: u32,
        #[source]
        source: reqwest::Error,
    },
    #[error("the control plane did not answer within {after:?}")]
    SyncTimedOut { after: std::time::Duration },
    #[error("the control plane refused {what}: {status} {message}")]
    Refused {
        what: &'static str,
        status: u16,
        message: String,
    },
    #[error("the tunnel to the control plane failed: {0}")]
    Tunnel(String),
    #[error("TLS to the control plane is not usable")]
    Tls(#[from] crate::tls::TlsError),
    #[error("this node has no identity in {dir} and no join token was given (--join-token)")]
    NoJoinToken { dir: PathBuf },
    #[error("cannot read or write the node identity at {path}")]
    Identity {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot keep the node's identity")]
    KeyFile(#[from] gpurent_types::keyfile::KeyFileError),
    #[error("the node identity at {path} is not valid JSON")]
    IdentityFormat {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot {what}: {message}")]
    Gpu { what: &'static str, message: String },
    #[error("invalid simulated GPU spec {spec:?}: {reason}")]
    SimSpec { spec: String, reason: String },
    #[error("cannot serve metrics on {addr}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("executor {executor} failed to {action} reservation {reservation_id}: {message}")]
    Executor {
        executor: &'static str,
        action: &'static str,
        reservation_id: String,
        message: String,
    },
    #[error("cannot mount volume {volume_id}: {message}")]
    Volume { volume_id: String, message: String },
    #[error("no Docker Engine answers on {socket} ({message})")]
    NoDockerEngine { socket: String, message: String },
    #[error("the NVIDIA Container Toolkit here is {version}, which has a known container escape (CVE-2024-0132, CVE-2025-23266); upgrade it to {safe} or later before this node takes work")]
    VulnerableToolkit { version: String, safe: String },
    #[error("the process executor cannot isolate instances on this host: {why}. Install bubblewrap and run the agent as root with a writable cgroup tree (--cgroup-root), use the docker executor, or pass --allow-unisolated to run tenants' commands with the agent's own rights (they can then read this node's credentials and each other's work)")]
    Unisolated { why: String },
    #[error("checkpoint volume of reservation {reservation_id}: {message}")]
    Checkpoint {
        reservation_id: String,
        message: String,
    },
}
