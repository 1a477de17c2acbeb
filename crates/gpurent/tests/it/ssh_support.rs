//! What the tests of `gpurent ssh`, `ssh-config`, `cp` and `port-forward` share: keys made by
//! ssh-keygen, OpenSSH's sshd on a loopback port (killed when dropped), and `gpurent` runs
//! with their own HOME and config dir.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::support::{Run, BIN};

/// What a sim executor's node answers a channel, relayed by the endpoint.
pub const NOT_AVAILABLE: &str =
    "gpurent: the sim executor runs nothing: there is no instance to enter";

/// A fresh ed25519 key pair made by ssh-keygen, with `passphrase` (empty: none): (private,
/// public).
pub fn keygen(dir: &Path, name: &str, passphrase: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-C", name, "-N", passphrase, "-f"])
        .arg(&private)
        .stdin(Stdio::null())
        .status()
        .expect("ssh-keygen (openssh-client; scripts/test.sh installs it)");
    assert!(status.success());
    (private.clone(), private.with_extension("pub"))
}

/// Runs `cmd` with no stdin, killed after 60 s so that a hang fails the test.
pub fn run_bounded(mut cmd: Command) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_bounded(child, 60)
}

/// Waits for `child`'s output; kills it after `secs` so that a hang fails the test.
pub fn wait_bounded(child: std::process::Child, secs: u64) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("pid {pid} did not finish within {secs} s");
        }
    }
}

/// `GET /hello.txt` on 127.0.0.1:`port` with a plain socket ("" when it fails).
pub fn http_hello(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if stream
        .write_all(b"GET /hello.txt HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return String::new();
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

/// A home of its own for `gpurent` and `ssh`: HOME (no ~/.ssh keys unless a test puts them
/// there) and XDG_CONFIG_HOME (where gpurent keeps its known_hosts).
pub struct Home {
    pub home: PathBuf,
    pub config: PathBuf,
}

impl Home {
    pub fn new(dir: &Path) -> Home {
        let home = dir.join("home");
        let config = dir.join("config");
        std::fs::create_dir_all(&home).unwrap();
        Home { home, config }
    }

    /// `gpurent` with this home, no ssh-agent (unless `env` gives one) and `args`.
    pub fn command(&self, env: &[(&str, &Path)], args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", &self.config)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("GPURENT_TOKEN")
            .env_remove("GPURENT_SERVER")
            .env("GPURENT_DATA_DIR", "/nonexistent");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.args(args);
        cmd
    }

    pub fn gpurent(&self, env: &[(&str, &Path)], args: &[&str]) -> Run {
        let out = run_bounded(self.command(env, args));
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The known_hosts file gpurent writes.
    pub fn known_hosts(&self) -> PathBuf {
        self.config.join("gpurent/known_hosts")
    }
}

/// OpenSSH's sshd on a free loopback port with a host key and authorized keys of its own,
/// killed when dropped.
pub struct Sshd {
    child: Child,
    pub port: u16,
    pub host_pub: PathBuf,
    /// Who logs in: the user these tests run as.
    pub user: String,
}

impl Sshd {
    /// Starts sshd in `dir`, letting in the public keys `authorized`.
    pub fn start(dir: &Path, authorized: &[&Path]) -> Sshd {
        let sshd = Path::new("/usr/sbin/sshd");
        assert!(
            sshd.exists(),
            "no /usr/sbin/sshd: install openssh-server (scripts/test.sh does)"
        );
        let (host, host_pub) = keygen(dir, "sshd_host", "");
        let keys: String = authorized
            .iter()
            .map(|k| std::fs::read_to_string(k).unwrap())
            .collect();
        std::fs::write(dir.join("authorized_keys"), keys).unwrap();
        // sshd run as root wants its privilege separation directory (the service makes it).
        let _ = std::fs::create_dir_all("/run/sshd");
        let user = String::from_utf8(
            Command::new("id")
                .arg("-un")
                .output()
                .expect("id -un")
                .stdout,
        )
        .unwrap()
        .trim()
        .to_owned();
        let log = dir.join("sshd.log");
        // A port taken between choosing and binding is tried again with another.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let config = dir.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\n\
                     AuthorizedKeysFile {keys}\nPidFile {pid}\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
                     PermitRootLogin prohibit-password\nAllowTcpForwarding yes\n\
                     Subsystem sftp internal-sftp\nLogLevel VERBOSE\n",
                    host = host.display(),
                    keys = dir.join("authorized_keys").display(),
                    pid = dir.join("sshd.pid").display(),
                ),
            )
            .unwrap();
            let mut child = Command::new(sshd)
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("spawn sshd");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Sshd {
                        child,
                        port,
                        host_pub: host_pub.clone(),
                        user: user.clone(),
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "sshd did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// The hidden flags that point gpurent's client at this server instead of a control
    /// plane's endpoint.
    pub fn direct(&self) -> Vec<String> {
        vec![
            "--direct".into(),
            format!("127.0.0.1:{}", self.port),
            "--direct-host-key".into(),
            self.host_pub.display().to_string(),
        ]
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `len` bytes that do not compress or repeat (xorshift), written to `path`.
pub fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(len);
    std::fs::write(path, bytes).unwrap();
}

/// The SHA-256 of a file, in hex.
pub fn sha256(path: &Path) -> String {
    let mut file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A file's permission bits.
pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A `gpurent port-forward` (or any process) killed when dropped.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a Docker Engine answers and has the test image (`scripts/test.sh` imports it).
pub fn docker_answers() -> bool {
    Command::new("docker")
        .args(["image", "inspect", "gpurent-test/busybox:latest"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
