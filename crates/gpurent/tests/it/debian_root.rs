//! A fresh Debian root (debootstrap's `minbase` with systemd, from this host's own Debian
//! mirror and release) in a temporary directory: for installing the package, running
//! commands in a chroot, or booting it with systemd-nspawn.
//!
//! The first use makes the root with debootstrap (a minute or two) and caches it as a tarball
//! in `${XDG_CACHE_HOME:-$HOME/.cache}/gpurent-test/`; later ones only extract it. Dropping a
//! `DebianRoot` kills every process still running in it, unmounts everything under it (lazily
//! where a plain unmount fails) and removes it, whether its test passed or not.
//!
//! Needs root, debootstrap and (to boot) systemd-nspawn; `scripts/test.sh` installs them.
//! `GPURENT_TEST_DEBIAN_ROOT=0` skips the tests that use it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// What debootstrap installs besides `minbase`: systemd (for `systemd-analyze verify` and to
/// boot), and D-Bus, which systemd's tools expect. Neither bubblewrap nor passt.
const INCLUDE: &str = "systemd,dbus";
const VARIANT: &str = "minbase";

/// The environment of commands in the root: nothing of the test's.
const ENV: [(&str, &str); 5] = [
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("HOME", "/root"),
    ("LANG", "C.UTF-8"),
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("TERM", "dumb"),
];

pub struct DebianRoot {
    /// Holds `root/` and the logs beside it.
    dir: tempfile::TempDir,
    root: PathBuf,
    /// /proc, /sys and /dev are mounted for `run`.
    mounted: bool,
}

impl DebianRoot {
    /// A fresh copy of the cached root. None (saying why on stderr) only where it cannot work:
    /// not root, or `GPURENT_TEST_DEBIAN_ROOT=0`; anything else that fails panics with why.
    pub fn fresh() -> Option<DebianRoot> {
        if std::env::var("GPURENT_TEST_DEBIAN_ROOT").as_deref() == Ok("0") {
            eprintln!("SKIPPED: GPURENT_TEST_DEBIAN_ROOT=0");
            return None;
        }
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: a Debian root needs root (debootstrap, chroot, mounts)");
            return None;
        }
        let tarball = cached_tarball();
        let dir = tempfile::Builder::new()
            .prefix("gpurent-debian-")
            .tempdir()
            .expect("a temporary directory");
        let root = dir.path().join("root");
        std::fs::create_dir(&root).expect("mkdir root");
        let out = Command::new("tar")
            .args(["--numeric-owner", "-xzpf"])
            .arg(&tarball)
            .arg("-C")
            .arg(&root)
            .output()
            .expect("run tar");
        assert!(
            out.status.success(),
            "cannot extract {}: {}",
            tarball.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(DebianRoot {
            dir,
            root,
            mounted: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// A directory beside the root (not in it), for logs and files to copy in.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// `sh -c CMD` in a chroot of the root, with /proc, /sys (and /sys/fs/cgroup), /dev and
    /// /dev/pts mounted and the host's /etc/resolv.conf copied in; its output.
    pub fn run(&mut self, cmd: &str) -> Output {
        self.mount_api();
        let mut command = Command::new("chroot");
        command
            .arg(&self.root)
            .args(["/bin/sh", "-c", cmd])
            .env_clear()
            .envs(ENV)
            .current_dir("/")
            .stdin(Stdio::null());
        command.output().expect("run chroot")
    }

    /// `run`, which must succeed: its stdout.
    pub fn ok(&mut self, cmd: &str) -> String {
        let out = self.run(cmd);
        assert!(
            out.status.success(),
            "in the Debian root, `{cmd}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn mount_api(&mut self) {
        if self.mounted {
            return;
        }
        self.mounted = true;
        let root = self.root.display().to_string();
        // rslave: unmounting these again never propagates back to the host's /sys and /dev.
        let script = format!(
            "set -e; cp -L /etc/resolv.conf '{root}/etc/resolv.conf'
             mount -t proc proc '{root}/proc'
             mount --rbind /sys '{root}/sys'; mount --make-rslave '{root}/sys'
             mount --rbind /dev '{root}/dev'; mount --make-rslave '{root}/dev'"
        );
        sh_ok(&script);
    }

    /// Unmounts what `run` mounted (before booting: systemd-nspawn mounts its own).
    fn unmount_api(&mut self) {
        if self.mounted {
            unmount_under(&self.root);
            self.mounted = false;
        }
    }

    /// Boots the root with systemd-nspawn (`--boot`, a private network with only its own
    /// loopback) and waits for systemd to be up. The container is ended when the result is
    /// dropped.
    pub fn boot(&mut self) -> Booted<'_> {
        self.unmount_api();
        let log_path = self.dir.path().join("nspawn.log");
        let log = std::fs::File::create(&log_path).expect("nspawn.log");
        let machine = format!(
            "gpurent-test-{}-{}",
            std::process::id(),
            self.dir
                .path()
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("root")
                .trim_start_matches("gpurent-debian-")
        );
        // No systemd on the host to register with or to make a scope: --register=no and
        // --keep-unit. --console=read-only: the boot's messages go to the log.
        let nspawn = Command::new("systemd-nspawn")
            .arg("--directory")
            .arg(&self.root)
            .args([
                "--boot",
                "--register=no",
                "--keep-unit",
                "--private-network",
            ])
            .args(["--console=read-only", "--machine", &machine])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("run systemd-nspawn (apt-get install systemd-container)");
        let mut booted = Booted {
            root: self,
            nspawn,
            leader: 0,
            log: log_path,
        };
        booted.wait_for_systemd();
        booted
    }
}

impl Drop for DebianRoot {
    fn drop(&mut self) {
        kill_processes_in(&self.root);
        unmount_under(&self.root);
        // The TempDir removes the rest.
    }
}

/// A booted root: its systemd as PID 1 in a container.
pub struct Booted<'a> {
    root: &'a mut DebianRoot,
    nspawn: Child,
    /// The container's PID 1, as the host sees it.
    leader: i32,
    log: PathBuf,
}

impl Booted<'_> {
    /// `sh -c CMD` inside the container (all its namespaces, from /), as root.
    pub fn run(&self, cmd: &str) -> Output {
        Command::new("nsenter")
            .args(["--target", &self.leader.to_string()])
            .args(["--mount", "--uts", "--ipc", "--net", "--pid"])
            .args(["--root", "--wd"])
            .args(["/bin/sh", "-c", cmd])
            .env_clear()
            .envs(ENV)
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter")
    }

    /// `run`, which must succeed: its stdout.
    pub fn ok(&self, cmd: &str) -> String {
        let out = self.run(cmd);
        assert!(
            out.status.success(),
            "in the container, `{cmd}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The boot's console output so far.
    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for_systemd(&mut self) {
        let start = Instant::now();
        let pid = i32::try_from(self.nspawn.id()).expect("a pid");
        loop {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                panic!(
                    "systemd-nspawn ended ({status}) before systemd was up; its output:\n{}",
                    self.console()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "systemd did not come up in the container within 90 s; the console:\n{}",
                self.console()
            );
            // nspawn's child becomes the container's PID 1 once it has exec'd systemd.
            self.leader = child_of(pid)
                .filter(|c| {
                    std::fs::read_to_string(format!("/proc/{c}/comm"))
                        .is_ok_and(|comm| comm.trim() == "systemd")
                })
                .unwrap_or(0);
            if self.leader != 0 {
                let out = self.run("systemctl is-system-running");
                let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                if state == "running" || state == "degraded" {
                    if state == "degraded" {
                        let failed = self.run("systemctl --failed --no-legend --plain");
                        eprintln!(
                            "the container's systemd is degraded (fine for these tests): {}",
                            String::from_utf8_lossy(&failed.stdout).trim()
                        );
                    }
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Booted<'_> {
    fn drop(&mut self) {
        // SIGTERM: systemd-nspawn shuts the container down in order; SIGKILL after 20 s.
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.nspawn.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if matches!(self.nspawn.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        kill_processes_in(&self.root.root);
    }
}

/// A child of `parent` (the container's PID 1 is systemd-nspawn's only child).
fn child_of(parent: i32) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let ppid: i32 = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))?
                .trim()
                .parse()
                .ok()?;
            (ppid == parent).then_some(pid)
        })
}

/// The tarball of a fresh root for this host's Debian release, made once (under a lock, so
/// that tests running at once make it once).
fn cached_tarball() -> PathBuf {
    let (mirror, suite) = host_mirror();
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME")
        .join("gpurent-test");
    std::fs::create_dir_all(&cache).expect("the cache directory");
    let tarball = cache.join(format!(
        "debian-{suite}-{VARIANT}-{}.tar.gz",
        INCLUDE.replace(',', "+")
    ));
    if tarball.exists() {
        return tarball;
    }
    assert!(
        Path::new("/usr/sbin/debootstrap").exists(),
        "debootstrap is not installed (apt-get install debootstrap; scripts/test.sh does)"
    );
    eprintln!(
        "making a Debian {suite} root with debootstrap for {}: this takes a minute or two, once \
         (later runs extract it)",
        tarball.display()
    );
    let t = tarball.display();
    let lock = cache.join("debootstrap.lock");
    // Under flock: one maker at a time; one that waited finds the tarball made.
    let script = format!(
        "set -e; [ -e '{t}' ] && exit 0
         work=$(mktemp -d '{cache}/work.XXXXXX'); trap 'rm -rf \"$work\"' EXIT
         debootstrap --variant={VARIANT} --include={INCLUDE} {suite} \"$work/root\" '{mirror}' \
             > \"$work/log\" 2>&1 || {{ tail -n 40 \"$work/log\" >&2; exit 1; }}
         rm -f \"$work\"/root/var/cache/apt/archives/*.deb
         tar --numeric-owner -czpf \"$work/root.tar.gz\" -C \"$work/root\" .
         mv \"$work/root.tar.gz\" '{t}'",
        cache = cache.display()
    );
    let out = Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", &script])
        .output()
        .expect("run flock");
    assert!(
        out.status.success(),
        "cannot make the Debian root with debootstrap from {mirror} ({suite}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tarball
}

/// The host's own Debian mirror and release, from its apt sources: the first `deb` source
/// of a release that is not an update or security suite (`bookworm`, not
/// `bookworm-updates`).
fn host_mirror() -> (String, String) {
    let mut texts = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let ext = path.extension().and_then(|e| e.to_str());
            if matches!(ext, Some("sources" | "list")) {
                texts.push((
                    ext == Some("sources"),
                    std::fs::read_to_string(&path).unwrap_or_default(),
                ));
            }
        }
    }
    texts.push((
        false,
        std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default(),
    ));
    for (deb822, text) in texts {
        let found = if deb822 {
            deb822_mirror(&text)
        } else {
            one_line_mirror(&text)
        };
        if let Some(found) = found {
            return found;
        }
    }
    panic!("no Debian mirror in this host's apt sources (/etc/apt/sources.list{{,.d/*}})");
}

/// A main suite: not `-updates`, `-security`, `-backports`, `-proposed-updates`.
fn main_suite(suite: &str) -> bool {
    !suite.contains('-') && !suite.contains('/')
}

fn deb822_mirror(text: &str) -> Option<(String, String)> {
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name).map(str::trim))
                .unwrap_or("")
        };
        if !field("Types:").split_whitespace().any(|t| t == "deb") || field("Enabled:") == "no" {
            continue;
        }
        let uri = field("URIs:").split_whitespace().next()?.to_owned();
        if let Some(suite) = field("Suites:").split_whitespace().find(|s| main_suite(s)) {
            return Some((uri, suite.to_owned()));
        }
    }
    None
}

fn one_line_mirror(text: &str) -> Option<(String, String)> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace().filter(|w| !w.starts_with('['));
        if words.next()? != "deb" {
            return None;
        }
        let uri = words.next()?;
        let suite = words.next().filter(|s| main_suite(s))?;
        Some((uri.to_owned(), suite.to_owned()))
    })
}

fn sh_ok(script: &str) {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGKILLs every process whose root directory is `root` (chroots and the container's), until
/// none is left (10 s at most).
fn kill_processes_in(root: &Path) {
    let Ok(meta) = std::fs::metadata(root) else {
        return;
    };
    let target = (meta.dev(), meta.ino());
    let start = Instant::now();
    loop {
        let mut left = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            // Following /proc/PID/root gives the process's root as a directory, even where its
            // link's text is only "/" (another mount namespace).
            let Ok(m) = std::fs::metadata(entry.path().join("root")) else {
                continue;
            };
            if (m.dev(), m.ino()) == target {
                left += 1;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if left == 0 || start.elapsed() > Duration::from_secs(10) {
            if left > 0 {
                eprintln!(
                    "{left} processes still run in {} after SIGKILL",
                    root.display()
                );
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Unmounts every mount at or under `root`, deepest first, until none is left; lazily where
/// plain unmounts do not get there.
fn unmount_under(root: &Path) {
    let prefix = root.display().to_string();
    let inside = format!("{prefix}/");
    for attempt in 0..6 {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| *p == prefix || p.starts_with(&inside))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let mut umount = Command::new("umount");
            if attempt >= 3 {
                umount.arg("--lazy");
            }
            let _ = umount.arg(point).stderr(Stdio::null()).status();
        }
    }
    eprintln!("mounts are left under {prefix}");
}
