//! Image pulls (issue 33, part 7) with a real Docker Engine and a real registry (Debian's
//! `docker-registry`, started here on a free port): an image the node lacks is pulled while
//! the reservation is `starting`, its progress in `get` and its lines in the log, and then it
//! runs; an image the registry does not have ends the reservation `failed` in the registry's
//! words.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::docker_and_processes::{agent, docker_and_isolation};
use crate::support::{eventually, Cluster};

/// A registry on 127.0.0.1 (which the Engine trusts over plain HTTP), killed when dropped.
struct Registry {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// None (the test says it is skipped) where Debian's `docker-registry` is not installed.
    fn start() -> Option<Registry> {
        if Command::new("docker-registry")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("SKIPPED: no docker-registry here (scripts/test.sh installs it)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Some(Registry::serve(tempfile::tempdir().unwrap(), port, None))
    }

    /// The same registry (its storage, its port) again, now asking for `htpasswd`'s users.
    fn with_auth(self, htpasswd: &str) -> Registry {
        let mut this = self;
        let _ = this.child.kill();
        let _ = this.child.wait();
        let dir = std::mem::replace(&mut this._dir, tempfile::tempdir().unwrap());
        let port = this.port;
        drop(this);
        Registry::serve(dir, port, Some(htpasswd))
    }

    fn serve(dir: tempfile::TempDir, port: u16, htpasswd: Option<&str>) -> Registry {
        let config = dir.path().join("config.yml");
        let mut text = format!(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if let Some(users) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, users).unwrap();
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: gpurent-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, text).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .unwrap();
        let registry = Registry {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }

    fn image(&self, name: &str) -> String {
        format!("127.0.0.1:{}/{name}", self.port)
    }
}

/// Removes the test's images from the Engine when dropped.
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker")
                .args(["image", "rm", "-f", image])
                .output();
        }
    }
}

fn docker(args: &[&str]) {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {out:?}");
}

/// An image of the test busybox with `bytes` of random data, pushed to the registry as
/// `image` and gone from the Engine.
fn push(image: &str, bytes: u64) {
    let builder = format!("gpurent-pull-build-{}", std::process::id());
    docker(&[
        "run",
        "--name",
        &builder,
        "gpurent-test/busybox",
        "sh",
        "-c",
        &format!("head -c {bytes} /dev/urandom > /payload"),
    ]);
    docker(&["commit", &builder, image]);
    docker(&["rm", "-f", &builder]);
    docker(&["push", image]);
    docker(&["image", "rm", image]);
}

/// `user:pull-s3cret` for the registry (bcrypt, as its htpasswd wants).
const HTPASSWD: &str = "tess:$2b$05$jeQHQwd.XmdlshcRdeN5ouT8z3aUkXdwP5oPmHbGpXNQix8zxEt0q\n";

#[test]
fn a_missing_image_is_pulled_with_progress_and_a_bad_one_fails_in_the_registrys_words() {
    if !docker_and_isolation() {
        return;
    }
    let Some(registry) = Registry::start() else {
        return;
    };
    // An image with a 24 MB layer of random bytes, pushed to the registry and gone from the
    // Engine.
    let image = registry.image(&format!("gpurent-test/pulled:{}", std::process::id()));
    let _images = Images(vec![image.clone()]);
    push(&image, 24_000_000);

    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "pull", &[]);
    let token = cluster.tenant("pia");
    eventually("a GPU offered", 60, || {
        cluster
            .cli(Some(&token), true, &["offers"])
            .json()
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o["available"].as_u64() >= Some(1)))
    });
    let id = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--image",
            &image,
            "--",
            "sh",
            "-c",
            "echo pulled-image-ran; sleep 600",
        ],
    );
    let mut seen_starting = false;
    eventually("the pulled image running", 120, || {
        let r = cluster.get(&token, &id);
        assert_ne!(r["status"], "failed", "{r}");
        seen_starting |= r["status"] == "starting" && r["pull"]["image"] == image.as_str();
        r["status"] == "running"
    });
    let r = cluster.get(&token, &id);
    assert_eq!(
        r["pull"]["image"],
        image.as_str(),
        "the pull's figures: {r}"
    );
    // The final figures: every layer, every byte (the payload's 24 MB at least).
    assert!(r["pull"]["layers_total"].as_u64() >= Some(1), "{r}");
    assert_eq!(r["pull"]["layers_done"], r["pull"]["layers_total"], "{r}");
    assert_eq!(r["pull"]["bytes_done"], r["pull"]["bytes_total"], "{r}");
    assert!(r["pull"]["bytes_total"].as_u64() > Some(20_000_000), "{r}");
    eprintln!("seen starting with the pull's progress: {seen_starting}");
    let logs = || cluster.cli(Some(&token), false, &["logs", &id]).stdout;
    eventually("its output after the pull's lines", 30, || {
        logs().contains("pulled-image-ran")
    });
    let log = logs();
    let pulling = log.find(&format!("gpurent: pulling image {image}"));
    let pulled = log.find(&format!("gpurent: pulled {image} ("));
    let ran = log.find("pulled-image-ran");
    assert!(
        pulling.is_some() && pulling < pulled && pulled < ran,
        "the pull's lines, then the instance's own output: {log}"
    );
    assert!(log.contains(" layers, "), "{log}");
    cluster.cli(Some(&token), true, &["stop", &id]);
    eventually("stopped", 60, || {
        cluster.get(&token, &id)["status"] == "stopped"
    });

    // An image the registry does not have: failed, in the registry's words.
    let missing = registry.image("gpurent-test/no-such-image:1");
    let bad = cluster.reserve(
        &token,
        &[
            "--gpu", "rtx4090", "--hours", "1", "--image", &missing, "--", "true",
        ],
    );
    eventually("the bad pull to fail", 60, || {
        cluster.get(&token, &bad)["status"] == "failed"
    });
    let r = cluster.get(&token, &bad);
    let message = r["end_message"].as_str().unwrap_or_default().to_owned();
    assert!(
        message.contains(&format!("cannot pull image {missing}"))
            && (message.contains("not found") || message.contains("unknown")),
        "{r}"
    );
    assert_eq!(r["charged"], "0.00", "a failed pull is not billed: {r}");
    cluster.ledger_check();
}

#[test]
fn a_private_registry_answers_401_without_the_tenants_credential_and_pulls_with_it() {
    if !docker_and_isolation() {
        return;
    }
    let Some(registry) = Registry::start() else {
        return;
    };
    let image = registry.image(&format!("gpurent-test/private:{}", std::process::id()));
    let _images = Images(vec![image.clone()]);
    push(&image, 1_000_000);
    let registry = registry.with_auth(HTPASSWD);
    let host = format!("127.0.0.1:{}", registry.port);

    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "priv", &[]);
    let token = cluster.tenant("tess");
    let other = cluster.tenant("otto");
    eventually("a GPU offered", 60, || {
        cluster
            .cli(Some(&token), true, &["offers"])
            .json()
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o["available"].as_u64() >= Some(1)))
    });
    let reserve = |token: &str| {
        cluster.reserve(
            token,
            &[
                "--gpu",
                "rtx4090",
                "--hours",
                "1",
                "--image",
                &image,
                "--",
                "echo",
                "private-ran",
            ],
        )
    };
    let ended = |token: &str, id: &str| {
        eventually(&format!("{id} to end"), 90, || {
            ["failed", "stopped"].contains(&cluster.get(token, id)["status"].as_str().unwrap_or(""))
        });
        cluster.get(token, id)
    };

    // Without a credential: failed, in the registry's words (401).
    let first = reserve(&token);
    let r = ended(&token, &first);
    assert_eq!(r["status"], "failed", "{r}");
    let message = r["end_message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("cannot pull image {image}"))
            && (message.contains("unauthorized") || message.contains("no basic auth")),
        "{r}"
    );

    // The tenant keeps a credential (the password on stdin, never shown again).
    let mut add = Command::new(crate::support::BIN)
        .args(["--server", &cluster.url, "--token", &token, "--json"])
        .args(["registries", "add", &host, "--username", "tess"])
        .env_remove("GPURENT_REGISTRY_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    add.stdin
        .take()
        .unwrap()
        .write_all(b"pull-s3cret\n")
        .unwrap();
    let added = add.wait_with_output().unwrap();
    assert!(added.status.success(), "{added:?}");
    let listed = cluster.cli(Some(&token), true, &["registries", "ls"]);
    assert_eq!(listed.json()[0]["host"], host.as_str(), "{listed:?}");
    assert!(!listed.stdout.contains("pull-s3cret"), "never shown again");
    let second = reserve(&token);
    let r = ended(&token, &second);
    assert_eq!(r["status"], "stopped", "pulled with the credential: {r}");
    let logs = cluster.cli(Some(&token), false, &["logs", &second]).stdout;
    assert!(logs.contains("private-ran"), "{logs}");
    // Nobody else's pulls use it, and the instance's environment never had it.
    let env = cluster.reserve(
        &token,
        &[
            "--gpu", "rtx4090", "--hours", "1", "--image", &image, "--", "env",
        ],
    );
    ended(&token, &env);
    let logs = cluster.cli(Some(&token), false, &["logs", &env]).stdout;
    assert!(
        !logs.contains("pull-s3cret") && !logs.contains("REGISTRY_AUTH"),
        "{logs}"
    );
    docker(&["image", "rm", "-f", &image]);
    let theirs = reserve(&other);
    let r = ended(&other, &theirs);
    assert_eq!(
        r["status"], "failed",
        "another tenant does not get the credential: {r}"
    );
    let removed = cluster.cli(Some(&token), true, &["registries", "rm", &host]);
    assert_eq!(removed.code, 0, "{removed:?}");
    cluster.ledger_check();
}

#[test]
fn an_owner_keeps_an_image_warm_with_prepull_and_work_needs_no_pull() {
    if !docker_and_isolation() {
        return;
    }
    let Some(registry) = Registry::start() else {
        return;
    };
    let image = registry.image(&format!("gpurent-test/warm:{}", std::process::id()));
    let _images = Images(vec![image.clone()]);
    push(&image, 1_000_000);
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "warm", &["--prepull", &image]);
    eventually("the image pulled at start", 60, || {
        Command::new("docker")
            .args(["image", "inspect", &image])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let token = cluster.tenant("wes");
    eventually("a GPU offered", 60, || {
        cluster
            .cli(Some(&token), true, &["offers"])
            .json()
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o["available"].as_u64() >= Some(1)))
    });
    let id = cluster.reserve(
        &token,
        &[
            "--gpu", "rtx4090", "--hours", "1", "--image", &image, "--", "echo", "warm-ran",
        ],
    );
    eventually("it ran", 60, || {
        cluster.get(&token, &id)["status"] == "stopped"
    });
    let r = cluster.get(&token, &id);
    assert!(r.get("pull").is_none(), "no pull was needed: {r}");
    let logs = cluster.cli(Some(&token), false, &["logs", &id]).stdout;
    assert!(
        logs.contains("warm-ran") && !logs.contains("gpurent: pulling"),
        "{logs}"
    );
}

/// A TCP relay to `to` that cuts the connection that has carried `limit` bytes back, and
/// every connection after it (a registry lost half way through a download: the Engine's
/// resumed downloads find it gone); it runs until the test ends.
fn cutting_relay(to: u16, limit: u64) -> u16 {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let gone = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            if gone.load(Ordering::SeqCst) {
                drop(client);
                continue;
            }
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let gone = gone.clone();
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_read, &mut s_write);
            });
            let (mut s_read, mut c_write) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                let mut sent = 0u64;
                while let Ok(n) = s_read.read(&mut buf) {
                    if n == 0 || c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    sent += n as u64;
                    if sent > limit {
                        gone.store(true, Ordering::SeqCst);
                        break;
                    }
                }
                let _ = c_write.shutdown(std::net::Shutdown::Both);
                let _ = s_read.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    port
}

#[test]
fn a_pull_cut_off_half_way_fails_the_reservation_saying_so_and_the_node_goes_on() {
    if !docker_and_isolation() {
        return;
    }
    let Some(registry) = Registry::start() else {
        return;
    };
    let name = format!("gpurent-test/cut:{}", std::process::id());
    let direct = registry.image(&name);
    push(&direct, 24_000_000);
    // The same repository through a relay that cuts each download after 4 MB.
    let relay = cutting_relay(registry.port, 4_000_000);
    let image = format!("127.0.0.1:{relay}/{name}");
    let _images = Images(vec![direct, image.clone()]);
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "cut", &[]);
    let token = cluster.tenant("cora");
    eventually("a GPU offered", 60, || {
        cluster
            .cli(Some(&token), true, &["offers"])
            .json()
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o["available"].as_u64() >= Some(1)))
    });
    let id = cluster.reserve(
        &token,
        &[
            "--gpu", "rtx4090", "--hours", "1", "--image", &image, "--", "true",
        ],
    );
    let mut seen_bytes = 0;
    eventually("the cut pull to fail", 180, || {
        let r = cluster.get(&token, &id);
        seen_bytes = seen_bytes.max(r["pull"]["bytes_done"].as_u64().unwrap_or(0));
        assert!(
            !["running", "stopped"].contains(&r["status"].as_str().unwrap_or("")),
            "{r}"
        );
        r["status"] == "failed"
    });
    let r = cluster.get(&token, &id);
    let message = r["end_message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("cannot pull image {image}")),
        "{r}"
    );
    assert_eq!(r["charged"], "0.00", "{r}");
    eprintln!("bytes seen pulled before the cut: {seen_bytes}; the failure: {message}");
    // The node goes on: its next reservation runs.
    let next = cluster.reserve(
        &token,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--image",
            "gpurent-test/busybox",
            "--",
            "echo",
            "after-the-cut",
        ],
    );
    eventually("the next one to run", 60, || {
        cluster.get(&token, &next)["status"] == "stopped"
    });
    assert_eq!(cluster.nodes()[0]["status"], "ready");
}
