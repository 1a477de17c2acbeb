//! What a stream asks the agent for: which instance, and a shell, a command, SFTP or a TCP
//! port inside it; or a volume's files, with no instance.

use serde::{Deserialize, Serialize};

/// The first frame of every stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenStream {
    pub reservation_id: String,
    /// The epoch the control plane placed on this node; an agent running another epoch
    /// refuses (the instance was rescheduled).
    pub epoch: i64,
    pub kind: StreamKind,
    /// A terminal, when the client asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySpec>,
    /// Variables the SSH client sent (`LANG`, ...); never overriding the instance's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamKind {
    /// A login shell.
    Shell,
    /// A command, as sshd runs it (`sh -c COMMAND`).
    Exec { command: String },
    /// The SFTP subsystem.
    Sftp,
    /// A TCP connection to a port inside the instance (`ssh -L`, published HTTP ports).
    Tcp { port: u16 },
    /// SFTP confined to a volume's directory, with no instance (`gpurent volumes cp`); the
    /// stream's reservation id is empty and its epoch 0.
    VolumeFiles { volume_id: String, shared: bool },
}

impl StreamKind {
    /// The word for audit records and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            StreamKind::Shell => "shell",
            StreamKind::Exec { .. } => "exec",
            StreamKind::Sftp => "sftp",
            StreamKind::Tcp { .. } => "tcp",
            StreamKind::VolumeFiles { .. } => "volume-files",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySpec {
    pub term: String,
    pub cols: u16,
    pub rows: u16,
}

/// How the process of a stream ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    Code(u32),
    /// Killed by a signal, by its SSH name (`INT`, `KILL`, `TERM`, ...).
    Signal {
        name: String,
        core_dumped: bool,
    },
}
