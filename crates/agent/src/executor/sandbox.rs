//! The process executor's sandbox: bubblewrap (`bwrap`) puts each instance in mount, PID, IPC
//! and UTS namespaces of its own, and `setpriv` runs its command there as a uid of its own
//! with no capabilities and `no_new_privs`. The instance sees the node's system directories
//! read-only, its own directory, its checkpoint volume, a private `/tmp` and its GPUs' device
//! files; nothing else of the node (the agent's data dir, other instances) exists for it.
//!
//! With `Spec::own_network`, a network namespace of its own too (`process::network`).
//!
//! bwrap runs as root without a user namespace (so hosts that forbid unprivileged user
//! namespaces work too) and `setpriv`, inside, drops to the instance's uid before the
//! tenant's command starts.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where the instance's own directory is inside the sandbox (its `HOME` and working dir).
pub const HOME: &str = "/instance";
/// Where its checkpoint volume is inside the sandbox (as in a Docker container).
pub const CHECKPOINT: &str = "/checkpoint";
/// How many uids the agent owns from `--instance-uid-base` on: one per live instance.
pub const UID_RANGE: u32 = 65536;
/// `PATH` inside the sandbox unless the tenant sets one.
pub const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The node's directories an instance sees, read-only.
const SYSTEM_DIRS: [&str; 3] = ["/usr", "/etc", "/opt"];
/// Top-level directories that are links into `/usr` on merged-/usr systems, else bound
/// read-only.
const SYSTEM_LINKS: [&str; 6] = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// What of `/sys` GPU libraries read (devices and buses); not the cgroup tree.
const SYS_DIRS: [&str; 4] = ["/sys/bus", "/sys/class", "/sys/dev", "/sys/devices"];
/// NVIDIA device files every GPU process needs, whichever its GPUs.
const NVIDIA_CONTROL: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// How instances are sandboxed on this node, found to work when the agent started.
#[derive(Debug, Clone)]
pub struct Sandbox {
    bwrap: PathBuf,
    setpriv: PathBuf,
    uid_base: u32,
    /// Paths of the node an instance must never see though they lie under a system
    /// directory it sees (the agent's data dir under `/etc`, say): covered by an empty tmpfs.
    hidden: Vec<PathBuf>,
}

/// One instance's sandbox.
#[derive(Debug)]
pub struct Spec<'a> {
    /// Its own directory on the node (mounted on `HOME`).
    pub home: &'a Path,
    pub volume: Option<&'a Path>,
    /// The tenant's volumes.
    pub binds: &'a [super::Bind],
    /// Its whole environment, in order (a later variable overrides an earlier one).
    pub env: &'a [(String, OsString)],
    /// Its GPUs' UUIDs: only their device files are in its `/dev`.
    pub gpus: &'a [String],
    /// A network namespace of its own: bwrap tells the wrapper its pid on fd 4 and waits on
    /// fd 5 until pasta has attached the namespace to the node's network.
    pub own_network: bool,
    /// With `own_network`: the file that is its `/etc/resolv.conf` (name servers its
    /// network reaches: `process::network::resolv_conf`), and where it is bound (where the
    /// node's `/etc/resolv.conf` leads).
    pub resolv_conf: Option<(&'a Path, &'a Path)>,
}

/// The first of `/usr/bin/NAME`, `/bin/NAME`, `/usr/sbin/NAME`, `/sbin/NAME` that exists: the
/// agent never runs a tool found through a `PATH`.
pub fn system_tool(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Whether the agent runs as root (`/proc/self` belongs to the effective uid).
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

impl Sandbox {
    /// Finds bwrap and setpriv and starts a sandbox once (on the empty directory `probe_home`)
    /// to see that this host allows it. Err says why instances cannot be isolated here.
    pub fn probe(
        uid_base: u32,
        hidden: Vec<PathBuf>,
        probe_home: &Path,
    ) -> Result<Sandbox, String> {
        if !running_as_root() {
            return Err(
                "the agent does not run as root, so it cannot run instances as uids of their own"
                    .into(),
            );
        }
        if uid_base == 0 || uid_base.checked_add(UID_RANGE).is_none() {
            return Err(format!(
                "--instance-uid-base {uid_base} leaves no room for {UID_RANGE} unprivileged uids"
            ));
        }
        let bwrap = system_tool("bwrap").ok_or(
            "bubblewrap is not installed (no bwrap in /usr/bin or /bin; Debian: apt-get install bubblewrap)",
        )?;
        let setpriv = system_tool("setpriv")
            .ok_or("setpriv (util-linux) is not installed (no setpriv in /usr/bin or /bin)")?;
        let hidden = hidden
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        let sandbox = Sandbox {
            bwrap,
            setpriv,
            uid_base,
            hidden,
        };
        std::fs::create_dir_all(probe_home)
            .map_err(|e| format!("cannot create {}: {e}", probe_home.display()))?;
        let spec = Spec {
            home: probe_home,
            volume: None,
            binds: &[],
            env: &[],
            gpus: &[],
            own_network: false,
            resolv_conf: None,
        };
        let probe = std::process::Command::new(&sandbox.bwrap)
            .args(sandbox.options(&spec))
            .arg("--")
            .args(sandbox.inner_prefix(uid_base))
            .arg("/bin/true")
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", sandbox.bwrap.display()))?;
        let _ = std::fs::remove_dir(probe_home);
        if !probe.status.success() {
            return Err(format!(
                "bubblewrap cannot set up an instance's namespaces here ({}): {}",
                probe.status,
                String::from_utf8_lossy(&probe.stderr).trim()
            ));
        }
        Ok(sandbox)
    }

    /// The uids instances run as.
    pub fn uids(&self) -> std::ops::Range<u32> {
        self.uid_base..self.uid_base.saturating_add(UID_RANGE)
    }

    /// The command that runs a program in the sandbox, its options read from file
    /// descriptor 3 (`options`, NUL-separated), so that the environment (secrets) is in no
    /// command line of the node.
    pub fn command_prefix(&self, uid: u32) -> Vec<OsString> {
        let mut prefix: Vec<OsString> = vec![
            self.bwrap.clone().into(),
            "--args".into(),
            "3".into(),
            "--".into(),
        ];
        prefix.extend(self.inner_prefix(uid));
        prefix
    }

    /// Inside the sandbox: become the instance's uid, with no groups, no capabilities (none
    /// inheritable, an empty bounding set) and `no_new_privs`, then run the command.
    fn inner_prefix(&self, uid: u32) -> Vec<OsString> {
        vec![
            self.setpriv.clone().into(),
            format!("--reuid={uid}").into(),
            format!("--regid={uid}").into(),
            "--clear-groups".into(),
            "--inh-caps=-all".into(),
            "--bounding-set=-all".into(),
            "--no-new-privs".into(),
            "--".into(),
        ]
    }

    /// The options for bwrap, NUL-terminated each, for `--args`.
    pub fn options_bytes(&self, spec: &Spec<'_>) -> Result<Vec<u8>, String> {
        let mut bytes = Vec::new();
        for option in self.options(spec) {
            let raw = option.as_bytes();
            if raw.contains(&0) {
                return Err(format!(
                    "a NUL byte in {:?} (environment variables cannot hold one)",
                    option.to_string_lossy()
                ));
            }
            bytes.extend_from_slice(raw);
            bytes.push(0);
        }
        Ok(bytes)
    }

    fn options(&self, spec: &Spec<'_>) -> Vec<OsString> {
        let mut o = Options::default();
        o.add(&[
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "gpurent",
            // The parent is the executor's wrapper shell, not the agent: an agent that
            // restarts leaves the instance running (and adopts it), while a wrapper killed by
            // a stop takes the sandbox, and with its PID namespace everything in it, along.
            "--die-with-parent",
            "--new-session",
        ]);
        if spec.own_network {
            o.add(&["--unshare-net", "--info-fd", "4", "--block-fd", "5"]);
        }
        for dir in SYSTEM_DIRS {
            if Path::new(dir).is_dir() {
                o.add(&["--ro-bind", dir, dir]);
            }
        }
        if let (true, Some((file, at))) = (spec.own_network, spec.resolv_conf) {
            o.push("--ro-bind");
            o.push(file);
            o.push(at);
        }
        for link in SYSTEM_LINKS {
            let path = Path::new(link);
            match std::fs::read_link(path) {
                Ok(target) => {
                    o.push("--symlink");
                    o.push(target);
                    o.push(link);
                }
                Err(_) if path.is_dir() => o.add(&["--ro-bind", link, link]),
                Err(_) => {}
            }
        }
        for dir in SYS_DIRS {
            o.add(&["--ro-bind-try", dir, dir]);
        }
        for hidden in &self.hidden {
            if SYSTEM_DIRS.iter().any(|d| hidden.starts_with(d)) {
                o.push("--tmpfs");
                o.push(hidden);
            }
        }
        o.add(&["--proc", "/proc", "--dev", "/dev"]);
        o.add(&["--perms", "1777", "--tmpfs", "/dev/shm"]);
        o.add(&["--perms", "1777", "--tmpfs", "/tmp"]);
        for device in gpu_devices(spec.gpus) {
            o.push("--dev-bind");
            o.push(&device);
            o.push(&device);
        }
        o.push("--bind");
        o.push(spec.home);
        o.push(HOME);
        if let Some(volume) = spec.volume {
            o.push("--bind");
            o.push(volume);
            o.push(CHECKPOINT);
        }
        for bind in spec.binds {
            o.push(if bind.read_only {
                "--ro-bind"
            } else {
                "--bind"
            });
            o.push(&bind.source);
            o.push(&bind.target);
        }
        o.add(&["--chdir", HOME, "--clearenv"]);
        for (name, value) in spec.env {
            o.push("--setenv");
            o.push(name);
            o.push(value);
        }
        o.0
    }
}

#[derive(Default)]
struct Options(Vec<OsString>);

impl Options {
    fn push(&mut self, s: impl Into<OsString>) {
        self.0.push(s.into());
    }

    fn add(&mut self, all: &[&str]) {
        self.0.extend(all.iter().map(OsString::from));
    }
}

/// The device files of these GPUs (`/dev/nvidiaN`, its minor number from the driver's
/// `/proc/driver/nvidia/gpus/*/information`) and the control devices, where they exist.
/// A UUID the driver does not list (a MIG instance, say) gets every GPU's device file,
/// with a warning: its processes would otherwise fail.
fn gpu_devices(uuids: &[String]) -> Vec<PathBuf> {
    let mut devices: Vec<PathBuf> = NVIDIA_CONTROL
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    if uuids.is_empty() || !Path::new("/dev/nvidiactl").exists() {
        return devices;
    }
    let minors = driver_minors();
    let mut all = false;
    for uuid in uuids {
        match minors.iter().find(|(u, _)| u == uuid) {
            Some((_, minor)) => devices.push(PathBuf::from(format!("/dev/nvidia{minor}"))),
            None => all = true,
        }
    }
    if all {
        tracing::warn!(
            ?uuids,
            "the driver lists not all of these GPUs: the instance gets every GPU's device file"
        );
        devices.extend(
            minors
                .iter()
                .map(|(_, m)| PathBuf::from(format!("/dev/nvidia{m}"))),
        );
    }
    devices.sort();
    devices.dedup();
    devices.retain(|p| p.exists());
    devices
}

/// (GPU UUID, device minor) of every GPU the driver has.
fn driver_minors() -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc/driver/nvidia/gpus") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("information")).ok())
        .filter_map(|info| {
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim_start_matches(':').trim().to_owned())
            };
            let uuid = field("GPU UUID")?;
            let minor = field("Device Minor")?.parse().ok()?;
            Some((uuid, minor))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_goes_in_the_options_not_the_command_line() {
        let sandbox = Sandbox {
            bwrap: "/usr/bin/bwrap".into(),
            setpriv: "/usr/bin/setpriv".into(),
            uid_base: 200_000,
            hidden: vec!["/etc/gpurent".into()],
        };
        let env = [("TOKEN".to_owned(), OsString::from("s3cret"))];
        let spec = Spec {
            home: Path::new("/data/instances/r/home"),
            volume: Some(Path::new("/data/checkpoints/r")),
            binds: &[
                super::super::Bind {
                    source: "/data/volumes/v1".into(),
                    target: "/workspace".into(),
                    read_only: false,
                },
                super::super::Bind {
                    source: "/data/volumes/v2".into(),
                    target: "/datasets".into(),
                    read_only: true,
                },
            ],
            env: &env,
            gpus: &[],
            own_network: true,
            resolv_conf: Some((
                Path::new("/agent/resolv.conf"),
                Path::new("/run/systemd/resolve/stub-resolv.conf"),
            )),
        };
        let options = sandbox.options_bytes(&spec).unwrap();
        let text = String::from_utf8_lossy(&options);
        assert!(text.contains("--setenv\0TOKEN\0s3cret\0"), "{text}");
        assert!(text.contains("--bind\0/data/checkpoints/r\0/checkpoint\0"));
        assert!(
            text.contains("--bind\0/data/volumes/v1\0/workspace\0"),
            "{text}"
        );
        assert!(
            text.contains("--ro-bind\0/data/volumes/v2\0/datasets\0"),
            "{text}"
        );
        assert!(text.contains("--tmpfs\0/etc/gpurent\0"), "{text}");
        assert!(text.contains("--unshare-net\0--info-fd\x004\0--block-fd\x005\0"));
        assert!(
            text.contains("--ro-bind\0/agent/resolv.conf\0/run/systemd/resolve/stub-resolv.conf\0")
        );
        let prefix: Vec<String> = sandbox
            .command_prefix(200_001)
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        assert!(!prefix.iter().any(|a| a.contains("s3cret")));
        assert!(prefix.contains(&"--reuid=200001".to_owned()));
        let bad = [("X".to_owned(), OsString::from("a\0b"))];
        let spec = Spec { env: &bad, ..spec };
        assert!(sandbox.options_bytes(&spec).is_err());
    }
}
