//! The backup file: a POSIX tar (ustar) that `tar -tvf` lists and `tar -xf` unpacks by hand,
//! holding `gpurent-backup/manifest.json` first and then the files it lists, each with its size
//! and CRC-32. A restore reads the manifest before anything else, so it tells a file that is no
//! gpurent backup, one from a newer gpurent, a truncated one and a damaged one apart before it
//! puts anything in place. (Written here rather than with a tar crate: the few lines of one
//! format that we write and read ourselves.)

use std::io::{Read, Write};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What the manifest's `format` says.
pub const FORMAT: &str = "gpurent-backup";
/// The layout this binary writes and reads; a later one is refused.
pub const FORMAT_VERSION: u32 = 1;
/// Every entry is under this directory.
const ROOT: &str = "gpurent-backup/";
const MANIFEST: &str = "manifest.json";
/// A manifest larger than this is not ours.
const MANIFEST_MAX: u64 = 1 << 20;
const BLOCK: usize = 512;

/// What a backup holds and where it comes from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub gpurent_version: String,
    /// `sqlite` or `postgres`.
    pub store: String,
    pub created_at: DateTime<Utc>,
    /// The last migration applied to the database copied.
    pub schema_version: i64,
    pub reservations: u64,
    /// The files after the manifest, in order: the database's copy, then the data dir's.
    pub files: Vec<Entry>,
}

/// One file of a backup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the backup's root: `database.sqlite`, `database.pgdump`, `data/master.key`.
    pub name: String,
    pub bytes: u64,
    pub crc32: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a gpurent backup: {0}")]
    NotABackup(String),
    #[error("the backup is truncated: {0}")]
    Truncated(String),
    #[error("the backup is damaged: {0}")]
    Damaged(String),
    #[error("cannot {doing} {path}")]
    Io {
        doing: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl ArchiveError {
    pub fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError {
        let path = path.display().to_string();
        move |source| ArchiveError::Io {
            doing,
            path,
            source,
        }
    }
}

/// A file's size and CRC-32.
pub fn measure(path: &Path) -> Result<(u64, u32), ArchiveError> {
    let mut file = std::fs::File::open(path).map_err(ArchiveError::io("read", path))?;
    let mut crc = flate2::Crc::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(ArchiveError::io("read", path))?;
        if n == 0 {
            break;
        }
        crc.update(&buf[..n]);
    }
    Ok((u64::from(crc.amount()), crc.sum()))
}

fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

fn header(name: &str, size: u64, mtime: u64) -> Result<[u8; BLOCK], ArchiveError> {
    let mut h = [0u8; BLOCK];
    let full = format!("{ROOT}{name}");
    if full.len() >= 100 {
        return Err(ArchiveError::Damaged(format!(
            "the name {full} is too long"
        )));
    }
    h[..full.len()].copy_from_slice(full.as_bytes());
    octal(&mut h[100..108], 0o600);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    if size < 1 << 33 {
        octal(&mut h[124..136], size);
    } else {
        // GNU's base-256 size, for a database past 8 GiB.
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    octal(&mut h[136..148], mtime);
    h[148..156].fill(b' ');
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u64 = h.iter().map(|&b| u64::from(b)).sum();
    octal(&mut h[148..155], sum);
    h[155] = b' ';
    Ok(h)
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c| c == '\0' || c == ' ');
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// A header's name and size; `None` for the zero block that ends the archive.
fn parse_header(h: &[u8; BLOCK]) -> Result<Option<(String, u64)>, String> {
    if h.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let stored = parse_octal(&h[148..156]).ok_or("a header without a checksum")?;
    let sum: u64 = h
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(b)
            }
        })
        .sum();
    if stored != sum {
        return Err("a header's checksum does not match".to_owned());
    }
    let end = h[..100].iter().position(|&b| b == 0).unwrap_or(100);
    let name = String::from_utf8_lossy(&h[..end]).into_owned();
    let size = if h[124] & 0x80 != 0 {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&h[128..136]);
        u64::from_be_bytes(bytes)
    } else {
        parse_octal(&h[124..136]).ok_or("a header with a bad size")?
    };
    Ok(Some((name, size)))
}

fn padding(size: u64) -> usize {
    // Below BLOCK, so it fits.
    let rest = usize::try_from(size % BLOCK as u64).unwrap_or(0);
    if rest == 0 {
        0
    } else {
        BLOCK - rest
    }
}

/// Writes a backup: `manifest`, then each of its files from `source(name)`.
pub fn write(
    out: &mut impl Write,
    manifest: &Manifest,
    source: impl Fn(&str) -> std::path::PathBuf,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, ArchiveError> {
    let target = Path::new("the backup");
    let fail = ArchiveError::io;
    let mtime = u64::try_from(manifest.created_at.timestamp()).unwrap_or(0);
    let json = serde_json::to_vec_pretty(manifest)
        .map_err(|e| ArchiveError::Damaged(format!("the manifest: {e}")))?;
    let mut written = 0u64;
    let mut put = |out: &mut dyn Write, bytes: &[u8]| -> Result<(), ArchiveError> {
        out.write_all(bytes).map_err(fail("write", target))?;
        written += bytes.len() as u64;
        Ok(())
    };
    put(out, &header(MANIFEST, json.len() as u64, mtime)?)?;
    put(out, &json)?;
    put(out, &vec![0u8; padding(json.len() as u64)])?;
    let mut buf = vec![0u8; 1 << 20];
    for entry in &manifest.files {
        let path = source(&entry.name);
        let mut file = std::fs::File::open(&path).map_err(fail("read", &path))?;
        put(out, &header(&entry.name, entry.bytes, mtime)?)?;
        let mut crc = flate2::Crc::new();
        let mut left = entry.bytes;
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            file.read_exact(&mut buf[..want])
                .map_err(fail("read", &path))?;
            crc.update(&buf[..want]);
            put(out, &buf[..want])?;
            progress(want as u64);
            left -= want as u64;
        }
        // The file changed since it was measured: what is written is not what the manifest says.
        if crc.sum() != entry.crc32 {
            return Err(ArchiveError::Damaged(format!(
                "{} changed while it was being written",
                path.display()
            )));
        }
        put(out, &vec![0u8; padding(entry.bytes)])?;
    }
    put(out, &[0u8; 2 * BLOCK])?;
    Ok(written)
}

/// Reads a backup's entries in order.
pub struct Reader<R> {
    input: R,
}

impl<R: Read> Reader<R> {
    pub fn new(input: R) -> Self {
        Reader { input }
    }

    fn block(&mut self, what: &str) -> Result<Option<[u8; BLOCK]>, ArchiveError> {
        let mut h = [0u8; BLOCK];
        let mut filled = 0;
        while filled < BLOCK {
            match self.input.read(&mut h[filled..]) {
                Ok(0) if filled == 0 => return Ok(None),
                Ok(0) => {
                    return Err(ArchiveError::Truncated(format!("it ends inside {what}")));
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ArchiveError::io("read", Path::new("the backup"))(e)),
            }
        }
        Ok(Some(h))
    }

    /// The manifest, which must come first.
    pub fn manifest(&mut self) -> Result<Manifest, ArchiveError> {
        let not_ours = |why: &str| ArchiveError::NotABackup(why.to_owned());
        let h = self
            .block("its first header")?
            .ok_or_else(|| not_ours("the file is empty"))?;
        let (name, size) = parse_header(&h)
            .map_err(|_| not_ours("it is not a tar file"))?
            .ok_or_else(|| not_ours("it is an empty tar file"))?;
        if name != format!("{ROOT}{MANIFEST}") || size > MANIFEST_MAX {
            return Err(not_ours(&format!(
                "its first entry is {name:?}, not {ROOT}{MANIFEST}"
            )));
        }
        let mut json = vec![0u8; usize::try_from(size).unwrap_or(0)];
        self.exact(&mut json, "the manifest")?;
        self.skip(padding(size), "the manifest")?;
        let manifest: Manifest = serde_json::from_slice(&json)
            .map_err(|e| not_ours(&format!("its manifest does not parse: {e}")))?;
        if manifest.format != FORMAT {
            return Err(not_ours(&format!(
                "its manifest's format is {:?}",
                manifest.format
            )));
        }
        Ok(manifest)
    }

    fn exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), ArchiveError> {
        self.input.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                ArchiveError::Truncated(format!("it ends inside {what}"))
            }
            _ => ArchiveError::io("read", Path::new("the backup"))(e),
        })
    }

    fn skip(&mut self, n: usize, what: &str) -> Result<(), ArchiveError> {
        let mut pad = [0u8; BLOCK];
        self.exact(&mut pad[..n], what)
    }

    /// The next entry, which must be `entry`, written to the new file `dest` (0600) with its
    /// size and CRC-32 checked.
    pub fn extract(
        &mut self,
        entry: &Entry,
        dest: &Path,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), ArchiveError> {
        let what = format!("{ROOT}{}", entry.name);
        let h = self
            .block(&what)?
            .ok_or_else(|| ArchiveError::Truncated(format!("it ends before {what}")))?;
        let (name, size) = parse_header(&h)
            .map_err(|why| ArchiveError::Damaged(format!("{why} (before {what})")))?
            .ok_or_else(|| ArchiveError::Truncated(format!("it ends before {what}")))?;
        if name != what || size != entry.bytes {
            return Err(ArchiveError::Damaged(format!(
                "found {name} of {size} bytes where the manifest says {what} of {} bytes",
                entry.bytes
            )));
        }
        let mut file = private_file(dest)?;
        let mut crc = flate2::Crc::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            self.exact(&mut buf[..want], &what)?;
            crc.update(&buf[..want]);
            file.write_all(&buf[..want])
                .map_err(ArchiveError::io("write", dest))?;
            progress(want as u64);
            left -= want as u64;
        }
        file.sync_all().map_err(ArchiveError::io("write", dest))?;
        if crc.sum() != entry.crc32 {
            return Err(ArchiveError::Damaged(format!(
                "{what}'s CRC-32 is {:08x}, the manifest says {:08x}",
                crc.sum(),
                entry.crc32
            )));
        }
        self.skip(padding(size), &what)
    }

    /// The end of the archive, after the last entry.
    pub fn end(&mut self) -> Result<(), ArchiveError> {
        match self.block("the end marker")? {
            Some(h) if h.iter().all(|&b| b == 0) => Ok(()),
            Some(_) => Err(ArchiveError::Damaged(
                "it has entries the manifest does not list".to_owned(),
            )),
            None => Err(ArchiveError::Truncated(
                "its end marker is missing".to_owned(),
            )),
        }
    }
}

/// A new file readable by its owner only.
pub fn private_file(path: &Path) -> Result<std::fs::File, ArchiveError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(ArchiveError::io("create", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> (Manifest, Vec<u8>) {
        std::fs::write(dir.join("a"), b"hello").unwrap();
        std::fs::write(dir.join("b"), vec![7u8; 1300]).unwrap();
        let files = ["a", "b"]
            .iter()
            .map(|name| {
                let (bytes, crc32) = measure(&dir.join(name)).unwrap();
                Entry {
                    name: (*name).to_owned(),
                    bytes,
                    crc32,
                }
            })
            .collect();
        let manifest = Manifest {
            format: FORMAT.to_owned(),
            format_version: FORMAT_VERSION,
            gpurent_version: "0.0.0".to_owned(),
            store: "sqlite".to_owned(),
            created_at: Utc::now(),
            schema_version: 1,
            reservations: 0,
            files,
        };
        let mut out = Vec::new();
        write(&mut out, &manifest, |n| dir.join(n), &mut |_| {}).unwrap();
        (manifest, out)
    }

    #[test]
    fn what_is_written_reads_back_and_every_bad_copy_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (manifest, bytes) = sample(dir.path());
        assert_eq!(bytes.len() % BLOCK, 0);
        let read_all = |bytes: &[u8], into: &str| -> Result<(), ArchiveError> {
            let out = dir.path().join(into);
            std::fs::create_dir(&out).unwrap();
            let mut r = Reader::new(bytes);
            let m = r.manifest()?;
            for e in &m.files {
                r.extract(e, &out.join(&e.name), &mut |_| {})?;
            }
            r.end()
        };
        read_all(&bytes, "ok").unwrap();
        assert_eq!(std::fs::read(dir.path().join("ok/a")).unwrap(), b"hello");
        assert_eq!(manifest.files.len(), 2);
        let truncated = read_all(&bytes[..bytes.len() - 1500], "cut").unwrap_err();
        assert!(
            matches!(truncated, ArchiveError::Truncated(_)),
            "{truncated}"
        );
        let mut flipped = bytes.clone();
        // A byte of `b`'s contents (after the manifest, a's block and b's header).
        let at = bytes.len() - 2 * BLOCK - 600;
        flipped[at] ^= 1;
        let damaged = read_all(&flipped, "flip").unwrap_err();
        assert!(matches!(damaged, ArchiveError::Damaged(_)), "{damaged}");
        let garbage = read_all(&[b'x'; 4096], "junk").unwrap_err();
        assert!(matches!(garbage, ArchiveError::NotABackup(_)), "{garbage}");
        let empty = read_all(&[], "empty").unwrap_err();
        assert!(matches!(empty, ArchiveError::NotABackup(_)), "{empty}");
    }

    #[test]
    fn sizes_past_eight_gib_use_base_256() {
        let h = header("database.sqlite", 10 << 30, 0).unwrap();
        assert_eq!(
            parse_header(&h).unwrap(),
            Some(("gpurent-backup/database.sqlite".to_owned(), 10 << 30))
        );
    }
}
