//! Getting into a running instance: a shell, a command, SFTP or a TCP port inside it, for
//! the tunnel's streams. (Placeholder API; each executor implements `Executor::enter`.)

use async_trait::async_trait;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Shell,
    Exec { command: String },
    Sftp,
    Tcp { port: u16 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pty {
    pub term: String,
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRequest {
    pub kind: EntryKind,
    pub pty: Option<Pty>,
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    Code(u32),
    Signal { name: String, core_dumped: bool },
}

pub struct Entered {
    pub stdin: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    pub stdout: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    pub stderr: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    pub control: Box<dyn EntryControl>,
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered").finish_non_exhaustive()
    }
}

#[async_trait]
pub trait EntryControl: Send + Sync {
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), EntryError>;
    async fn signal(&self, name: &str) -> Result<(), EntryError>;
    async fn wait(&mut self) -> Result<ExitStatus, EntryError>;
}

#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("the {executor} executor runs nothing: there is no instance to enter")]
    NothingToEnter { executor: &'static str },
    #[error("{0}")]
    Other(String),
}
