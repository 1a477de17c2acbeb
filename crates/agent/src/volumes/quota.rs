//! Node-local volumes as directories with an ext4 or XFS project quota: each volume's directory
//! gets its own project id, inherited by all it holds, and the project a hard block limit.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::{mountinfo, statvfs_used, Inner, VolumeError, VolumeUsage};

/// Volumes take project ids from here up; a host that uses project quotas for other things
/// should keep its own ids below it.
pub const PROJECT_ID_BASE: u32 = 0x6770_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuotaKind {
    Ext4,
    Xfs,
}

/// The file system the volumes directory is on, with project quotas on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QuotaFs {
    pub kind: QuotaKind,
    pub mount_point: PathBuf,
}

/// What `<root>/<id>.quota` keeps: the quota's size is not readable back from every kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record {
    pub project: u32,
    pub size: u64,
}

impl Record {
    fn parse(text: &str) -> Result<Record, String> {
        let mut project = None;
        let mut size = None;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {line:?} is not key=value"))?;
            let bad = |e: std::num::ParseIntError| format!("{key}: {e}");
            match key {
                "project" => project = Some(value.parse::<u32>().map_err(bad)?),
                "size" => size = Some(value.parse::<u64>().map_err(bad)?),
                _ => return Err(format!("unknown key {key:?}")),
            }
        }
        match (project, size) {
            (Some(project), Some(size)) => Ok(Record { project, size }),
            _ => Err("it lacks project= or size=".to_owned()),
        }
    }

    fn text(&self) -> String {
        format!("project={}\nsize={}\n", self.project, self.size)
    }
}

pub(super) async fn ensure(inner: &Inner, id: &str, size: u64) -> Result<PathBuf, VolumeError> {
    let fs = quota_fs(inner, id)?;
    let dir = inner.dir(id);
    match read_record(inner, id)? {
        Some(record) => {
            if size < record.size {
                return Err(VolumeError::Shrink {
                    volume: id.to_owned(),
                    current: record.size,
                    requested: size,
                });
            }
            if !dir.is_dir() {
                make_dir(inner, id, record.project).await?;
            }
            if size > record.size {
                set_limit(inner, fs, id, record.project, size).await?;
                write_record(inner, id, Record { size, ..record })?;
                tracing::info!(volume = id, from = record.size, to = size, "volume grown");
            }
        }
        None => {
            let project = free_project(inner, id)?;
            make_dir(inner, id, project).await?;
            set_limit(inner, fs, id, project, size).await?;
            write_record(inner, id, Record { project, size })?;
            tracing::info!(
                volume = id,
                project,
                size,
                "volume made with a project quota"
            );
        }
    }
    Ok(dir)
}

/// Deletes the volume's directory, then lifts its quota; a directory left without a record by
/// an interrupted creation is deleted too.
pub(super) async fn remove(inner: &Inner, id: &str) -> Result<(), VolumeError> {
    let dir = inner.dir(id);
    let mounts = mountinfo::read()?;
    if !mountinfo::binds_of(&mounts, &dir).is_empty() {
        return Err(VolumeError::Busy {
            volume: id.to_owned(),
            mount_point: dir,
        });
    }
    let record = read_record(inner, id)?;
    let target = dir.clone();
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&target))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r);
    match removed {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(VolumeError::io(id, "delete", &dir)(e)),
    }
    let Some(record) = record else {
        return Ok(());
    };
    if let Some(fs) = &inner.quota {
        set_limit(inner, fs, id, record.project, 0).await?;
    }
    let path = inner.record(id);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(VolumeError::io(id, "delete", &path)(e)),
    }
}

/// statvfs of a directory with an inherited project id reports its project's limit and usage
/// (ext4 since Linux 4.5, XFS), so no quota tool is run.
pub(super) fn usage(inner: &Inner, id: &str) -> Result<VolumeUsage, VolumeError> {
    let Some(record) = read_record(inner, id)? else {
        return Err(VolumeError::NotFound {
            volume: id.to_owned(),
        });
    };
    let used_bytes = statvfs_used(id, &inner.dir(id))?;
    Ok(VolumeUsage {
        used_bytes,
        size_bytes: record.size,
    })
}

pub(super) fn read_record(inner: &Inner, id: &str) -> Result<Option<Record>, VolumeError> {
    let path = inner.record(id);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(VolumeError::io(id, "read", &path)(e)),
    };
    Record::parse(&text)
        .map(Some)
        .map_err(|reason| VolumeError::Record {
            volume: id.to_owned(),
            path,
            reason,
        })
}

fn write_record(inner: &Inner, id: &str, record: Record) -> Result<(), VolumeError> {
    let path = inner.record(id);
    let temporary = inner.hidden(id, "quota.new");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(record.text().as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    };
    write().map_err(VolumeError::io(id, "write", &path))
}

fn quota_fs<'a>(inner: &'a Inner, id: &str) -> Result<&'a QuotaFs, VolumeError> {
    inner.quota.as_ref().ok_or_else(|| VolumeError::QuotaGone {
        volume: id.to_owned(),
        reason: format!(
            "the volumes directory's file system no longer has project quotas, or their tools \
             are gone (this node now uses: {})",
            inner.enforcement.reason()
        ),
    })
}

/// The lowest id from [`PROJECT_ID_BASE`] that no other volume's record holds.
fn free_project(inner: &Inner, id: &str) -> Result<u32, VolumeError> {
    let mut taken = BTreeSet::new();
    for other in inner.ids()? {
        if let Some(record) = read_record(inner, &other)? {
            taken.insert(record.project);
        }
    }
    (PROJECT_ID_BASE..=u32::MAX)
        .find(|p| !taken.contains(p))
        .ok_or_else(|| VolumeError::NoProjectId {
            volume: id.to_owned(),
        })
}

async fn make_dir(inner: &Inner, id: &str, project: u32) -> Result<(), VolumeError> {
    let dir = inner.dir(id);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(VolumeError::io(id, "create", &dir)(e)),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(VolumeError::io(id, "inspect", &dir))?;
    if !meta.is_dir() {
        let not_dir = std::io::Error::other("it is not a directory");
        return Err(VolumeError::io(id, "use", &dir)(not_dir));
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(VolumeError::io(id, "set the mode of", &dir))?;
    // +P makes all made under it inherit the project id; chattr sets both on ext4 and XFS.
    let project = project.to_string();
    let args = [
        OsStr::new("+P"),
        OsStr::new("-p"),
        OsStr::new(&project),
        dir.as_os_str(),
    ];
    inner.tools.run(id, "chattr", &args).await?;
    Ok(())
}

/// Sets the project's hard block limit; 0 lifts it.
async fn set_limit(
    inner: &Inner,
    fs: &QuotaFs,
    id: &str,
    project: u32,
    size: u64,
) -> Result<(), VolumeError> {
    let args = limit_args(fs, project, size);
    let args: Vec<&OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let tool = match fs.kind {
        QuotaKind::Ext4 => "setquota",
        QuotaKind::Xfs => "xfs_quota",
    };
    inner.tools.run(id, tool, &args).await?;
    Ok(())
}

pub(super) fn limit_args(fs: &QuotaFs, project: u32, size: u64) -> Vec<std::ffi::OsString> {
    let kib = size.div_ceil(1024).to_string();
    let mount_point = fs.mount_point.as_os_str().to_owned();
    match fs.kind {
        // setquota -P project block-soft block-hard inode-soft inode-hard fs, blocks in KiB.
        QuotaKind::Ext4 => vec![
            "-P".into(),
            project.to_string().into(),
            "0".into(),
            kib.into(),
            "0".into(),
            "0".into(),
            mount_point,
        ],
        QuotaKind::Xfs => vec![
            "-x".into(),
            "-c".into(),
            format!("limit -p bhard={kib}k {project}").into(),
            mount_point,
        ],
    }
}
