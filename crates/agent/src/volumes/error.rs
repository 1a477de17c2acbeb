//! What can go wrong with a volume, naming the volume and, where a tool failed, its stderr.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume id {id:?} is not 1 to 64 letters, digits, '_' or '-'")]
    InvalidId { id: String },
    #[error("volume {volume}: node-local volumes are unavailable on this node: {reason}")]
    Unavailable { volume: String, reason: String },
    #[error("volume {volume}: this node has no shared volumes directory (--shared-volumes-dir)")]
    NoSharedRoot { volume: String },
    #[error("volume {volume} has {current} bytes; shrinking it to {requested} bytes is refused")]
    Shrink {
        volume: String,
        current: u64,
        requested: u64,
    },
    #[error(
        "volume {volume}: {requested} bytes is less than the smallest volume, {minimum} bytes"
    )]
    TooSmall {
        volume: String,
        requested: u64,
        minimum: u64,
    },
    #[error("volume {volume} is in use at {mount_point} (open files or a mount under it); stop what uses it, then remove it again")]
    Busy {
        volume: String,
        mount_point: PathBuf,
    },
    #[error("volume {volume} cannot grow now: {reason}")]
    CannotGrow { volume: String, reason: String },
    #[error("volume {volume} is not mounted at {mount_point}")]
    NotMounted {
        volume: String,
        mount_point: PathBuf,
    },
    #[error("volume {volume} does not exist on this node")]
    NotFound { volume: String },
    #[error("volume {volume} was made with a project quota, but {reason}")]
    QuotaGone { volume: String, reason: String },
    #[error("volume {volume}: {mount_point} is mounted from {device}, not from its image {image}")]
    ForeignMount {
        volume: String,
        mount_point: PathBuf,
        device: String,
        image: PathBuf,
    },
    #[error("volume {volume}: its record {path} is damaged: {reason}")]
    Record {
        volume: String,
        path: PathBuf,
        reason: String,
    },
    #[error("volume {volume}: no project id is left to give it")]
    NoProjectId { volume: String },
    #[error("volume {volume}: cannot {action} {path}")]
    Io {
        volume: String,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot use {path} as the {role} volumes directory")]
    Root {
        role: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read this node's mount table")]
    MountTable {
        #[source]
        source: std::io::Error,
    },
    #[error("volume {volume}: {tool} is not installed on this node")]
    MissingTool { volume: String, tool: &'static str },
    #[error("volume {volume}: `{command}` failed ({status}): {stderr}")]
    Tool {
        volume: String,
        command: String,
        status: String,
        stderr: String,
    },
    #[error("volume {volume}: cannot run `{command}`")]
    Spawn {
        volume: String,
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume {volume}: `{command}` did not finish within {after:?}")]
    ToolTimedOut {
        volume: String,
        command: String,
        after: Duration,
    },
}

impl VolumeError {
    pub(super) fn io(
        volume: &str,
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> VolumeError {
        let volume = volume.to_owned();
        let path = path.to_path_buf();
        move |source| VolumeError::Io {
            volume,
            action,
            path,
            source,
        }
    }
}
