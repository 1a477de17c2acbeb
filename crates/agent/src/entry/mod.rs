//! Getting into a running instance on the node: a shell (with a PTY or not), the exec of a
//! command, an SFTP server or a TCP connection, inside the instance's namespaces, cgroup and
//! user, for the SSH channels the control plane relays to the agent.
//!
//! Executors implement [`crate::Executor::enter`] with the parts here: `confine` (namespaces
//! and privileges, between fork and exec), `pty`, `session` (a local process session),
//! `root` (files of an instance's root file system), `tcp` and `sftp` (the helper process).

pub mod confine;
pub(crate) mod docker_exec;
mod pty;
pub mod root;
pub(crate) mod session;
pub mod sftp;
pub(crate) mod tcp;

use std::ffi::OsString;

use async_trait::async_trait;
use nix::sys::signal::Signal;

pub use session::LocalTarget;

/// What a channel asks to run in the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A login shell.
    Shell,
    /// `sh -c COMMAND` (the command split into words where the image has no `/bin/sh`).
    Exec { command: String },
    /// An SFTP v3 server on stdin/stdout.
    Sftp,
    /// A connection to 127.0.0.1:PORT in the instance's network.
    Tcp { port: u16 },
}

/// The terminal an SSH client asked for (`pty-req`).
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
    /// What the SSH client sent (LANG, TERM...): never overrides a reserved variable
    /// (`executor::is_reserved_env`) nor one of the instance's own.
    pub env: Vec<(String, String)>,
}

/// How what ran in the instance ended, as SSH reports it (`exit-status`, `exit-signal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitStatus {
    Code(u32),
    /// `name` as SSH names signals: "INT", "KILL", "TERM"...
    Signal {
        name: String,
        core_dumped: bool,
    },
}

/// What a session reads from the client.
pub type Input = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;
/// What a session writes for the client.
pub type Output = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

/// A session's stdin whose shutdown closes it: a pipe has no half-close, so its reader sees
/// EOF only once the write end is gone, which the holder of an `Input` may keep.
pub(crate) struct CloseOnShutdown<W>(Option<W>);

impl<W: tokio::io::AsyncWrite + Unpin + Send + 'static> CloseOnShutdown<W> {
    pub(crate) fn boxed(inner: W) -> Input {
        Box::new(CloseOnShutdown(Some(inner)))
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CloseOnShutdown<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match &mut self.0 {
            Some(w) => std::pin::Pin::new(w).poll_write(cx, buf),
            None => std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.0 {
            Some(w) => std::pin::Pin::new(w).poll_flush(cx),
            None => std::task::Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Some(w) = &mut self.0 {
            std::task::ready!(std::pin::Pin::new(w).poll_shutdown(cx))?;
        }
        self.0 = None;
        std::task::Poll::Ready(Ok(()))
    }
}

/// A session in the instance: its streams and its control. Dropping it ends what runs.
pub struct Entered {
    pub stdin: Input,
    pub stdout: Output,
    /// None with a PTY (stderr is the terminal), for Sftp and Tcp.
    pub stderr: Option<Output>,
    pub control: Box<dyn EntryControl>,
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered")
            .field("stderr", &self.stderr.is_some())
            .finish_non_exhaustive()
    }
}

#[async_trait]
pub trait EntryControl: Send + Sync {
    /// A new window size (`window-change`); a no-op without a PTY.
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), EntryError>;
    /// Sends a signal, by its SSH name ("INT", "TERM"...; "SIGINT" is taken too).
    async fn signal(&self, name: &str) -> Result<(), EntryError>;
    /// How it ended, once it has (after stdout's EOF). A TCP connection: `Code(0)` at once.
    async fn wait(&mut self) -> Result<ExitStatus, EntryError>;
}

/// Why an instance could not be entered. The messages are shown to the tenant as they are.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("reservation {reservation_id} is not running on this node")]
    NotRunning { reservation_id: String },
    #[error(
        "reservation {reservation_id} is still starting on this node: its workload has not \
         started in {waited_s} s; try again in a moment"
    )]
    StillStarting {
        reservation_id: String,
        waited_s: u64,
    },
    #[error("the sim executor runs nothing: there is no instance to enter")]
    NothingToEnter,
    #[error("this image has no /bin/sh: run a command instead (ssh {reservation_id} -- CMD)")]
    NoShell { reservation_id: String },
    #[error("nothing listens on port {port} in the instance")]
    NothingListens { port: u16 },
    #[error("the command is empty: give one to run (ssh {reservation_id} -- CMD)")]
    EmptyCommand { reservation_id: String },
    #[error("{name:?} is not a signal SSH knows (INT, TERM, KILL, HUP, QUIT, USR1, USR2...)")]
    UnknownSignal { name: String },
    #[error("{what} is not available in reservation {reservation_id}'s instance: {why}")]
    Unsupported {
        what: &'static str,
        reservation_id: String,
        why: String,
    },
    #[error("cannot {action} in reservation {reservation_id}'s instance: {source}")]
    Io {
        action: &'static str,
        reservation_id: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot {action} in reservation {reservation_id}'s instance: the Docker Engine says: {message}")]
    Engine {
        action: &'static str,
        reservation_id: String,
        message: String,
    },
}

impl EntryError {
    pub(crate) fn io(action: &'static str, reservation_id: &str, source: std::io::Error) -> Self {
        EntryError::Io {
            action,
            reservation_id: reservation_id.to_owned(),
            source,
        }
    }
}

/// The signal an SSH signal name means ("INT" or "SIGINT").
pub fn parse_signal(name: &str) -> Result<Signal, EntryError> {
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    format!("SIG{bare}")
        .parse::<Signal>()
        .map_err(|_| EntryError::UnknownSignal {
            name: name.to_owned(),
        })
}

/// The SSH name of a signal number ("TERM" for 15); the number itself where unknown.
pub fn signal_name(signal: i32) -> String {
    match Signal::try_from(signal) {
        Ok(s) => s.as_str().trim_start_matches("SIG").to_owned(),
        Err(_) => signal.to_string(),
    }
}

impl From<std::process::ExitStatus> for ExitStatus {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitStatus::Code(u32::try_from(code).unwrap_or(255)),
            (None, Some(signal)) => ExitStatus::Signal {
                name: signal_name(signal),
                core_dumped: status.core_dumped(),
            },
            (None, None) => ExitStatus::Code(255),
        }
    }
}

/// The session's environment: the instance's own, then what the client sent where it
/// names no reserved variable and none of the instance's, then `TERM` from the PTY.
pub fn session_env(
    instance: &[(OsString, OsString)],
    request: &EntryRequest,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = instance.to_vec();
    for (name, value) in &request.env {
        let valid = !name.is_empty()
            && !name.contains(['=', '\0'])
            && !value.contains('\0')
            && !crate::executor::is_reserved_env(name);
        if valid && !env.iter().any(|(n, _)| n.as_os_str() == name.as_str()) {
            env.push((name.into(), value.into()));
        }
    }
    if let Some(pty) = &request.pty {
        env.retain(|(n, _)| n != "TERM");
        let term = if pty.term.is_empty() || pty.term.contains('\0') {
            "xterm"
        } else {
            &pty.term
        };
        env.push(("TERM".into(), term.into()));
    }
    env
}

/// The words of an exec request in an image without a shell: split at whitespace, with
/// single and double quotes kept together (no expansion: there is no shell to do any).
pub fn split_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_without_a_shell() {
        assert_eq!(split_words("/bin/true"), vec!["/bin/true"]);
        assert_eq!(
            split_words(r#" echo  'a b' "c \"d\"" e\ f "#),
            vec!["echo", "a b", r#"c "d""#, "e f"]
        );
        assert_eq!(split_words("x ''"), vec!["x", ""]);
        assert!(split_words("   ").is_empty());
    }

    #[test]
    fn the_client_never_overrides_the_instance_or_reserved_variables() {
        let instance = vec![
            ("HOME".into(), "/instance".into()),
            ("CUDA_VISIBLE_DEVICES".into(), "GPU-a".into()),
            ("TERM".into(), "dumb".into()),
        ];
        let request = EntryRequest {
            kind: EntryKind::Shell,
            pty: Some(Pty {
                term: "xterm-256color".into(),
                cols: 80,
                rows: 24,
            }),
            env: vec![
                ("HOME".into(), "/root".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "all".into()),
                ("GPURENT_EPOCH".into(), "9".into()),
                ("LANG".into(), "C.UTF-8".into()),
                ("A=B".into(), "x".into()),
            ],
        };
        let env = session_env(&instance, &request);
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(get("HOME"), Some("/instance".into()));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("GPU-a".into()));
        assert_eq!(get("GPURENT_EPOCH"), None);
        assert_eq!(get("LANG"), Some("C.UTF-8".into()));
        assert_eq!(get("TERM"), Some("xterm-256color".into()));
        assert_eq!(env.len(), 4);
    }

    #[test]
    fn signal_names_are_ssh_names() {
        assert_eq!(signal_name(15), "TERM");
        assert_eq!(parse_signal("INT").ok(), Some(Signal::SIGINT));
        assert_eq!(parse_signal("SIGKILL").ok(), Some(Signal::SIGKILL));
        assert!(parse_signal("NOPE").is_err());
    }
}
