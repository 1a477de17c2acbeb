//! `gpurent instance-sftp` (hidden): the SFTP v3 server of an instance's SSH sessions, on
//! stdin/stdout. It first enters the instance's mount namespace and root (while the process
//! is still single-threaded, before any runtime exists), so every path and symlink resolves
//! inside the instance and never on the node, and its PID namespace, so that it ends with
//! the instance; then it becomes the instance's user. A volume served with no instance is
//! made the root (chroot) instead, and its owner becomes the user.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use russh_sftp::protocol::{
    Attrs, Data, ExtendedReply, File, FileAttributes, Handle, Name, OpenFlags, Packet, Status,
    StatusCode, Version,
};
use russh_sftp::server::{Handler, StatusReply};

use crate::cli::InstanceSftpArgs;

/// The largest packet a client may send (russh-sftp's limit).
const MAX_PACKET: u32 = 256 * 1024;
/// The most a read answers with and a write should carry: a packet less room for headers
/// (OpenSSH asks for what `limits@openssh.com` says).
const MAX_READ: u32 = 255 * 1024;
/// Directory entries per READDIR answer.
const DIR_BATCH: usize = 128;
/// Open handles per session: a client that opens without closing is told no.
const MAX_HANDLES: usize = 4096;

/// Runs the helper; called by `main` before the async runtime starts.
pub fn run(args: &InstanceSftpArgs) -> ExitCode {
    if let Err(e) = confine(args) {
        eprintln!("error: instance-sftp: {e}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: instance-sftp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let (done, ended) = tokio::sync::oneshot::channel::<()>();
        let stream = tokio::io::join(tokio::io::stdin(), tokio::io::stdout());
        russh_sftp::server::run(
            stream,
            Sftp {
                home: args.home.to_string_lossy().into_owned(),
                handles: HashMap::new(),
                next: 0,
                _done: done,
            },
        )
        .await;
        // The server's task drops the handler (and so `done`) when the client is gone.
        let _ = ended.await;
    });
    ExitCode::SUCCESS
}

fn confine(args: &InstanceSftpArgs) -> io::Result<()> {
    if let Some(pid) = args.pid {
        // In the instance's PID namespace, the server ends with the instance.
        gpurent_agent::entry::confine::fork_into_pid_namespace_of(pid).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot join the PID namespace of process {pid}: {e}"),
            )
        })?;
        gpurent_agent::entry::confine::enter_root_of(pid).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot enter the root of process {pid}: {e}"),
            )
        })?;
    }
    if let Some(dir) = &args.chroot {
        gpurent_agent::entry::confine::chroot_into(dir).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot make {} the root: {e}", dir.display()),
            )
        })?;
    }
    if let Some(uid) = args.uid {
        gpurent_agent::entry::confine::drop_privileges(uid, args.gid.unwrap_or(uid))
            .map_err(|e| io::Error::new(e.kind(), format!("cannot become uid {uid}: {e}")))?;
    }
    if std::env::set_current_dir(&args.home).is_err() {
        std::env::set_current_dir("/")?;
    }
    Ok(())
}

enum Open {
    File(fs::File),
    /// The entries not yet sent; None once all were.
    Dir(Option<Vec<File>>),
}

struct Sftp {
    /// Where `~` is.
    home: String,
    handles: HashMap<String, Open>,
    next: u64,
    _done: tokio::sync::oneshot::Sender<()>,
}

fn reply(e: io::Error) -> StatusReply {
    let code = match e.kind() {
        io::ErrorKind::NotFound => StatusCode::NoSuchFile,
        io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
        _ => StatusCode::Failure,
    };
    code.with_message(e.to_string())
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".to_owned(),
        language_tag: "en-US".to_owned(),
    }
}

fn attributes(m: &fs::Metadata) -> FileAttributes {
    let secs = |t: i64| u32::try_from(t.max(0)).unwrap_or(u32::MAX);
    FileAttributes {
        size: Some(m.len()),
        uid: Some(m.uid()),
        user: None,
        gid: Some(m.gid()),
        group: None,
        // The mode with its file type bits, as stat(2) gives it.
        permissions: Some(m.mode()),
        atime: Some(secs(m.atime())),
        mtime: Some(secs(m.mtime())),
    }
}

/// Applies SETSTAT's attributes to a path (links followed).
fn set_attributes(path: &Path, a: &FileAttributes) -> io::Result<()> {
    if let Some(size) = a.size {
        fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len(size)?;
    }
    if let Some(mode) = a.permissions {
        fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))?;
    }
    if a.uid.is_some() || a.gid.is_some() {
        std::os::unix::fs::chown(path, a.uid, a.gid)?;
    }
    if let (Some(atime), Some(mtime)) = (a.atime, a.mtime) {
        let times = fs::FileTimes::new()
            .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(atime.into()))
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.into()));
        fs::File::options()
            .write(true)
            .open(path)
            .or_else(|_| fs::File::open(path))?
            .set_times(times)?;
    }
    Ok(())
}

fn set_file_attributes(file: &fs::File, a: &FileAttributes) -> io::Result<()> {
    if let Some(size) = a.size {
        file.set_len(size)?;
    }
    if let Some(mode) = a.permissions {
        file.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
    }
    if a.uid.is_some() || a.gid.is_some() {
        std::os::unix::fs::fchown(file, a.uid, a.gid)?;
    }
    if let (Some(atime), Some(mtime)) = (a.atime, a.mtime) {
        let times = fs::FileTimes::new()
            .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(atime.into()))
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.into()));
        file.set_times(times)?;
    }
    Ok(())
}

/// `path` made absolute and free of `.` and `..` without the file system (for a path
/// whose last part does not exist yet).
fn normalize(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut out = PathBuf::from("/");
    for part in cwd.join(path).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

/// Reads the SSH strings of an extended request's data.
fn ssh_strings(mut data: &[u8], n: usize) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let len = usize::try_from(u32::from_be_bytes(data.get(..4)?.try_into().ok()?)).ok()?;
        let bytes = data.get(4..4 + len)?;
        out.push(String::from_utf8_lossy(bytes).into_owned());
        data = &data[4 + len..];
    }
    Some(out)
}

impl Sftp {
    fn add(&mut self, open: Open) -> Result<String, StatusReply> {
        if self.handles.len() >= MAX_HANDLES {
            return Err(StatusCode::Failure.with_message("too many open handles"));
        }
        self.next += 1;
        let handle = self.next.to_string();
        self.handles.insert(handle.clone(), open);
        Ok(handle)
    }

    fn file(&self, handle: &str) -> Result<&fs::File, StatusReply> {
        match self.handles.get(handle) {
            Some(Open::File(f)) => Ok(f),
            _ => Err(StatusCode::Failure.with_message("no such open file")),
        }
    }

    fn statvfs(id: u32, path: &str) -> Result<Packet, StatusReply> {
        let s = nix::sys::statvfs::statvfs(path).map_err(|e| reply(e.into()))?;
        let fields: [u64; 11] = [
            s.block_size(),
            s.fragment_size(),
            s.blocks(),
            s.blocks_free(),
            s.blocks_available(),
            s.files(),
            s.files_free(),
            s.files_available(),
            s.filesystem_id(),
            s.flags().bits(),
            s.name_max(),
        ];
        let data = fields.iter().flat_map(|f| f.to_be_bytes()).collect();
        Ok(Packet::ExtendedReply(ExtendedReply { id, data }))
    }
}

impl Handler for Sftp {
    type Error = StatusReply;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported.into()
    }

    async fn init(
        &mut self,
        _version: u32,
        _extensions: HashMap<String, String>,
    ) -> Result<Version, Self::Error> {
        let mut version = Version::new();
        for (name, v) in [
            ("posix-rename@openssh.com", "1"),
            ("statvfs@openssh.com", "2"),
            ("hardlink@openssh.com", "1"),
            ("fsync@openssh.com", "1"),
            ("limits@openssh.com", "1"),
            ("expand-path@openssh.com", "1"),
        ] {
            version.extensions.insert(name.to_owned(), v.to_owned());
        }
        Ok(version)
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let mut options: fs::OpenOptions = pflags.into();
        options.mode(attrs.permissions.map_or(0o666, |m| m & 0o7777));
        let file = options.open(&filename).map_err(reply)?;
        let handle = self.add(Open::File(file))?;
        Ok(Handle { id, handle })
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        match self.handles.remove(&handle) {
            Some(_) => Ok(ok(id)),
            None => Err(StatusCode::Failure.with_message("no such handle")),
        }
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        let file = self.file(&handle)?;
        let mut data = vec![0; len.min(MAX_READ) as usize];
        let mut filled = 0;
        while filled < data.len() {
            match file.read_at(&mut data[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reply(e)),
            }
        }
        if filled == 0 && len > 0 {
            return Err(StatusCode::Eof.into());
        }
        data.truncate(filled);
        Ok(Data { id, data })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        self.file(&handle)?
            .write_all_at(&data, offset)
            .map_err(reply)?;
        Ok(ok(id))
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let m = fs::symlink_metadata(&path).map_err(reply)?;
        Ok(Attrs {
            id,
            attrs: attributes(&m),
        })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let m = fs::metadata(&path).map_err(reply)?;
        Ok(Attrs {
            id,
            attrs: attributes(&m),
        })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let m = self.file(&handle)?.metadata().map_err(reply)?;
        Ok(Attrs {
            id,
            attrs: attributes(&m),
        })
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        set_attributes(Path::new(&path), &attrs).map_err(reply)?;
        Ok(ok(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        set_file_attributes(self.file(&handle)?, &attrs).map_err(reply)?;
        Ok(ok(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let mut files = Vec::new();
        for dot in [".", ".."] {
            if let Ok(m) = fs::metadata(Path::new(&path).join(dot)) {
                files.push(File::new(dot, attributes(&m)));
            }
        }
        for entry in fs::read_dir(&path).map_err(reply)? {
            let entry = entry.map_err(reply)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            match entry.metadata() {
                Ok(m) => files.push(File::new(name, attributes(&m))),
                Err(_) => files.push(File::new(name, FileAttributes::empty())),
            }
        }
        let handle = self.add(Open::Dir(Some(files)))?;
        Ok(Handle { id, handle })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        let Some(Open::Dir(pending)) = self.handles.get_mut(&handle) else {
            return Err(StatusCode::Failure.with_message("no such open directory"));
        };
        match pending {
            Some(files) if !files.is_empty() => {
                let rest = files.split_off(files.len().min(DIR_BATCH));
                let batch = std::mem::replace(files, rest);
                Ok(Name { id, files: batch })
            }
            _ => {
                *pending = None;
                Err(StatusCode::Eof.into())
            }
        }
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        fs::remove_file(&filename).map_err(reply)?;
        Ok(ok(id))
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        fs::DirBuilder::new()
            .mode(attrs.permissions.map_or(0o777, |m| m & 0o7777))
            .create(&path)
            .map_err(reply)?;
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        fs::remove_dir(&path).map_err(reply)?;
        Ok(ok(id))
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let path = if path.is_empty() {
            ".".to_owned()
        } else {
            path
        };
        let real = fs::canonicalize(&path).unwrap_or_else(|_| normalize(Path::new(&path)));
        Ok(Name {
            id,
            files: vec![File::dummy(real.to_string_lossy())],
        })
    }

    /// SSH_FXP_RENAME of version 3 does not replace an existing file.
    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        if fs::symlink_metadata(&newpath).is_ok() {
            return Err(StatusCode::Failure.with_message(format!("{newpath} exists")));
        }
        fs::rename(&oldpath, &newpath).map_err(reply)?;
        Ok(ok(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let target = fs::read_link(&path).map_err(reply)?;
        Ok(Name {
            id,
            files: vec![File::dummy(target.to_string_lossy())],
        })
    }

    /// OpenSSH sends the link's target first and the link second (the reverse of the
    /// draft), and so do the clients that work with it.
    async fn symlink(
        &mut self,
        id: u32,
        linkpath: String,
        targetpath: String,
    ) -> Result<Status, Self::Error> {
        std::os::unix::fs::symlink(&linkpath, &targetpath).map_err(reply)?;
        Ok(ok(id))
    }

    async fn extended(
        &mut self,
        id: u32,
        request: String,
        data: Vec<u8>,
    ) -> Result<Packet, Self::Error> {
        let bad = || StatusReply::from(StatusCode::BadMessage);
        match request.as_str() {
            "posix-rename@openssh.com" => {
                let paths = ssh_strings(&data, 2).ok_or_else(bad)?;
                fs::rename(&paths[0], &paths[1]).map_err(reply)?;
                Ok(Packet::Status(ok(id)))
            }
            "hardlink@openssh.com" => {
                let paths = ssh_strings(&data, 2).ok_or_else(bad)?;
                fs::hard_link(&paths[0], &paths[1]).map_err(reply)?;
                Ok(Packet::Status(ok(id)))
            }
            "statvfs@openssh.com" => {
                let path = ssh_strings(&data, 1).ok_or_else(bad)?;
                Self::statvfs(id, &path[0])
            }
            "limits@openssh.com" => {
                let limits = [
                    u64::from(MAX_PACKET),
                    u64::from(MAX_READ),
                    u64::from(MAX_READ),
                    MAX_HANDLES as u64,
                ];
                let data = limits.iter().flat_map(|f| f.to_be_bytes()).collect();
                Ok(Packet::ExtendedReply(ExtendedReply { id, data }))
            }
            // scp and sftp send `~/x` paths through it.
            "expand-path@openssh.com" => {
                let path = ssh_strings(&data, 1).ok_or_else(bad)?.remove(0);
                let expanded = match path.strip_prefix('~') {
                    Some("") => self.home.clone(),
                    Some(rest) if rest.starts_with('/') => format!("{}{rest}", self.home),
                    Some(_) => {
                        return Err(StatusCode::NoSuchFile
                            .with_message("only your own home (~) is known in the instance"))
                    }
                    None => path,
                };
                let real =
                    fs::canonicalize(&expanded).unwrap_or_else(|_| normalize(Path::new(&expanded)));
                Ok(Packet::Name(Name {
                    id,
                    files: vec![File::dummy(real.to_string_lossy())],
                }))
            }
            "fsync@openssh.com" => {
                let handle = ssh_strings(&data, 1).ok_or_else(bad)?;
                self.file(&handle[0])?.sync_all().map_err(reply)?;
                Ok(Packet::Status(ok(id)))
            }
            _ => Err(StatusCode::OpUnsupported.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_requests_read_ssh_strings() {
        let data = [
            &3u32.to_be_bytes()[..],
            b"abc",
            &0u32.to_be_bytes(),
            b"rest",
        ]
        .concat();
        assert_eq!(
            ssh_strings(&data, 2),
            Some(vec!["abc".to_owned(), String::new()])
        );
        assert_eq!(ssh_strings(&data[..5], 1), None, "a string cut short");
        assert_eq!(ssh_strings(&[0, 0, 0, 9, b'x'], 1), None);
    }

    #[test]
    fn paths_normalize_without_leaving_the_root() {
        assert_eq!(
            normalize(Path::new("/a/../../b/./c")),
            PathBuf::from("/b/c")
        );
        assert_eq!(normalize(Path::new("/../..")), PathBuf::from("/"));
    }
}
