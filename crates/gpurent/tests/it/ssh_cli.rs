//! The tenant's side of instance access against a real `gpurent up`: the connection details
//! in `get` and `GET /api/v1/ssh`, `gpurent ssh-config` blocks that the real OpenSSH client
//! follows with the host key pinned, `gpurent ssh`, and what each says when it cannot.

use std::path::Path;
use std::process::Command;

use crate::ssh_support::{keygen, mode, run_bounded, Home, NOT_AVAILABLE};
use crate::support::{cli, eventually, read_token, Daemon};

/// `gpurent up` with `extra` flags on fresh loopback ports; its data dir is DIR/data.
fn start_up(dir: &Path, extra: &[&str]) -> Daemon {
    let data = dir.join("data");
    let mut args = vec![
        "up",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sim-gpus",
        "2xRTX4090",
    ];
    // The sim executor unless `extra` names one (`auto` would pick Docker or processes).
    if !extra.contains(&"--executor") {
        args.extend(["--executor", "sim"]);
    }
    args.extend(extra);
    Daemon::start(&args, &dir.join("up.log"))
}

/// The port the SSH endpoint listens on (DATA_DIR/ssh.addr).
fn ssh_port(dir: &Path) -> u16 {
    let addr = std::fs::read_to_string(dir.join("data/ssh.addr")).expect("DATA_DIR/ssh.addr");
    addr.trim().rsplit(':').next().unwrap().parse().unwrap()
}

/// A tenant with 100 of credit and the public key `key` (if any); its token.
fn tenant(url: &str, admin: &str, name: &str, key: Option<&Path>) -> String {
    let user = cli(
        url,
        Some(admin),
        true,
        &["users", "create", name, "--credit", "100"],
    );
    assert_eq!(user.code, 0, "{user:?}");
    let token = user.json()["token"].as_str().unwrap().to_owned();
    if let Some(key) = key {
        let added = cli(
            url,
            Some(&token),
            true,
            &["keys", "add", key.to_str().unwrap()],
        );
        assert_eq!(added.code, 0, "{added:?}");
    }
    token
}

/// Reserves `args` and waits until the reservation has `status`; its id.
fn reserve(url: &str, token: &str, args: &[&str], status: &str) -> String {
    let r = cli(url, Some(token), true, &[&["reserve"], args].concat());
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    eventually(status, 30, || {
        cli(url, Some(token), true, &["get", &id]).json()["status"] == status
    });
    id
}

const SLEEP: [&str; 7] = ["--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "3600"];

/// `ssh -F CONFIG HOST true` as the real OpenSSH client, never prompting: (exit, stderr).
fn ssh_with_config(home: &Home, config: &Path, host: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new("ssh");
    cmd.env("HOME", &home.home)
        .env_remove("SSH_AUTH_SOCK")
        .arg("-F")
        .arg(config)
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            host,
            "true",
        ]);
    let out = run_bounded(cmd);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ssh_config_pins_the_endpoint_key_for_real_ssh_and_get_shows_how_to_connect() {
    let dir = tempfile::tempdir().unwrap();
    let up = start_up(dir.path(), &["--ssh-listen", "127.0.0.1:0"]);
    let url = up.url.clone();
    let port = ssh_port(dir.path());
    let admin = read_token(&dir.path().join("data"));
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "ada", "");
    let ada = tenant(&url, &admin, "ada", Some(&public));
    let id = reserve(&url, &ada, &SLEEP, "running");

    // `get` while it runs: how to connect, at the host the API was reached at.
    let got = cli(&url, Some(&ada), true, &["get", &id]).json();
    let ssh = &got["ssh"];
    assert_eq!(ssh["user"], id.as_str(), "{got}");
    assert_eq!(ssh["host"], "127.0.0.1", "{got}");
    assert_eq!(ssh["port"], port, "{got}");
    assert_eq!(
        ssh["command"],
        format!("ssh -p {port} {id}@127.0.0.1"),
        "{got}"
    );
    let human = cli(&url, Some(&ada), false, &["get", &id]);
    assert!(
        human
            .stdout
            .contains(&format!("connect: ssh -p {port} {id}@127.0.0.1")),
        "{human:?}"
    );
    let listed = cli(&url, Some(&ada), true, &["ls"]).json();
    assert_eq!(listed[0]["ssh"]["port"], port, "{listed}");
    // The host is the one the API was reached at.
    let by_name = url.replace("127.0.0.1", "localhost");
    let got = cli(&by_name, Some(&ada), true, &["get", &id]).json();
    assert_eq!(got["ssh"]["host"], "localhost", "{got}");

    // GET /api/v1/ssh: the host key and its fingerprint as ssh-keygen -lf prints them.
    let host_pub = dir.path().join("data/ssh_host_ed25519_key.pub");
    let endpoint = endpoint_info(&url, &ada);
    assert_eq!(endpoint["port"], port, "{endpoint}");
    assert_eq!(endpoint["host"], "127.0.0.1", "{endpoint}");
    let keygen_lf = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(&host_pub)
        .output()
        .unwrap();
    let keygen_lf = String::from_utf8_lossy(&keygen_lf.stdout).into_owned();
    let fingerprint = endpoint["fingerprint"].as_str().unwrap();
    assert!(fingerprint.starts_with("SHA256:"), "{endpoint}");
    assert_eq!(
        keygen_lf.split_whitespace().nth(1),
        Some(fingerprint),
        "{keygen_lf}"
    );
    let host_line = std::fs::read_to_string(&host_pub).unwrap();
    assert!(
        host_line.starts_with(endpoint["host_key"].as_str().unwrap()),
        "{endpoint}"
    );

    // A queued one has no connection details.
    let queued = cli(
        &url,
        Some(&ada),
        true,
        &[
            "reserve", "--gpu", "RTX-4090", "--count", "2", "--hours", "1", "--queue", "--", "true",
        ],
    );
    assert_eq!(queued.code, 0, "{queued:?}");
    let queued_id = queued.json()["id"].as_str().unwrap().to_owned();
    let pending = cli(&url, Some(&ada), true, &["get", &queued_id]).json();
    assert_eq!(pending["status"], "pending", "{pending}");
    assert!(pending.get("ssh").is_none(), "{pending}");
    let not_yet = home.gpurent(&[], &["--server", &url, "--token", &ada, "ssh", &queued_id]);
    assert_ne!(not_yet.code, 0);
    assert!(
        not_yet
            .stderr
            .contains(&format!("reservation {queued_id} is pending")),
        "{not_yet:?}"
    );
    let stop = cli(&url, Some(&ada), true, &["stop", &queued_id]);
    assert_eq!(stop.code, 0, "{stop:?}");

    // ssh-config: the blocks, and a known_hosts file of the owner's only.
    let args = [
        "--server",
        &url,
        "--token",
        &ada,
        "ssh-config",
        "-i",
        key.to_str().unwrap(),
    ];
    let config = home.gpurent(&[], &args);
    assert_eq!(config.code, 0, "{config:?}");
    assert!(
        config.stdout.contains(&format!("Host gpurent-{id}\n")),
        "{config:?}"
    );
    assert!(
        config.stdout.contains(&format!("  Port {port}\n")),
        "{config:?}"
    );
    assert!(
        config.stdout.contains("  StrictHostKeyChecking yes\n"),
        "{config:?}"
    );
    assert_eq!(
        config.stdout.matches("Host gpurent-").count(),
        1,
        "{config:?}"
    );
    let known_hosts = home.known_hosts();
    assert_eq!(mode(&known_hosts), 0o600);
    let pinned = std::fs::read_to_string(&known_hosts).unwrap();
    let host_pub =
        std::fs::read_to_string(dir.path().join("data/ssh_host_ed25519_key.pub")).unwrap();
    let host_key: Vec<&str> = host_pub.split_whitespace().take(2).collect();
    assert!(pinned.contains(&host_key.join(" ")), "{pinned}");
    let config_file = dir.path().join("ssh_config");
    std::fs::write(&config_file, &config.stdout).unwrap();

    // The real ssh follows it: past host key verification to the endpoint, which lets the
    // owner in (and, until the relay lands, says that entering is not available yet).
    let (code, err) = ssh_with_config(&home, &config_file, &format!("gpurent-{id}"));
    assert!(!err.contains("Host key verification failed"), "{err}");
    assert!(!err.contains("Permission denied"), "{err}");
    assert!(err.contains(NOT_AVAILABLE), "{code:?} {err}");

    // --write: into gpurent's own file, included from ~/.ssh/config (kept as it was).
    let ssh_dir = home.home.join(".ssh");
    std::fs::create_dir_all(&ssh_dir).unwrap();
    let user_config = ssh_dir.join("config");
    std::fs::write(&user_config, "Host other\n  User someone\n").unwrap();
    let write = [&args[..], &["--write"]].concat();
    for _ in 0..2 {
        let written = home.gpurent(&[], &write);
        assert_eq!(written.code, 0, "{written:?}");
        assert_eq!(written.stdout, "", "{written:?}");
        assert!(written.stderr.contains("wrote 1 Host block"), "{written:?}");
    }
    let included = std::fs::read_to_string(&user_config).unwrap();
    let gpurent_config = home.config.join("gpurent/ssh_config");
    let include = format!("Include {}\n", gpurent_config.display());
    assert!(
        included.starts_with(&format!("# Added by gpurent ssh-config --write\n{include}")),
        "{included}"
    );
    assert_eq!(included.matches("Include ").count(), 1, "{included}");
    assert!(
        included.ends_with("Host other\n  User someone\n"),
        "{included}"
    );
    assert_eq!(
        std::fs::read_to_string(&gpurent_config).unwrap(),
        config.stdout
    );
    assert_eq!(mode(&gpurent_config), 0o600);
    let (_, err) = ssh_with_config(&home, &user_config, &format!("gpurent-{id}"));
    assert!(err.contains(NOT_AVAILABLE), "{err}");

    // Running it again keeps one line for the endpoint.
    let again = home.gpurent(&[], &args);
    assert_eq!(again.stdout, config.stdout);
    assert_eq!(std::fs::read_to_string(&known_hosts).unwrap(), pinned);

    // `gpurent ssh` runs the system ssh with the same pin: the same answer.
    let ssh = home.gpurent(
        &[],
        &[
            "--server",
            &url,
            "--token",
            &ada,
            "ssh",
            &id,
            "-i",
            key.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert!(
        !ssh.stderr.contains("Host key verification failed"),
        "{ssh:?}"
    );
    assert!(ssh.stderr.contains(NOT_AVAILABLE), "{ssh:?}");
    assert_eq!(ssh.code, 255, "{ssh:?}");
    let no_path = dir.path().join("empty-path");
    std::fs::create_dir(&no_path).unwrap();
    let missing = home.gpurent(
        &[("PATH", &no_path)],
        &["--server", &url, "--token", &ada, "ssh", &id],
    );
    assert_ne!(missing.code, 0);
    assert!(
        missing.stderr.contains("ssh is not installed"),
        "{missing:?}"
    );

    // Another key pinned under the endpoint's name: the real ssh refuses to go on.
    let (_, other) = keygen(dir.path(), "other", "");
    let other = std::fs::read_to_string(other).unwrap();
    let other: Vec<&str> = other.split_whitespace().take(2).collect();
    let wrong = pinned.replace(&host_key.join(" "), &other.join(" "));
    assert_ne!(wrong, pinned);
    std::fs::write(&known_hosts, wrong).unwrap();
    let (code, err) = ssh_with_config(&home, &config_file, &format!("gpurent-{id}"));
    assert_eq!(code, Some(255), "{err}");
    assert!(err.contains("Host key verification failed"), "{err}");
    assert!(!err.contains(NOT_AVAILABLE), "{err}");

    // Stopped: no connection details, and `gpurent ssh` says why.
    let stop = cli(&url, Some(&ada), true, &["stop", &id]);
    assert_eq!(stop.code, 0, "{stop:?}");
    eventually("stopped", 30, || {
        cli(&url, Some(&ada), true, &["get", &id]).json()["status"] == "stopped"
    });
    let got = cli(&url, Some(&ada), true, &["get", &id]).json();
    assert!(got.get("ssh").is_none(), "{got}");
    let stopped = home.gpurent(
        &[],
        &["--server", &url, "--token", &ada, "--json", "ssh", &id],
    );
    assert_ne!(stopped.code, 0);
    let error = &stopped.json()["error"];
    assert_eq!(error["code"], "not_running", "{stopped:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains(&format!("reservation {id} is stopped")),
        "{stopped:?}"
    );
    let none = home.gpurent(&[], &["--server", &url, "--token", &ada, "ssh-config"]);
    assert_eq!(none.code, 0, "{none:?}");
    assert!(!none.stdout.contains("Host "), "{none:?}");
}

#[test]
fn without_an_endpoint_ssh_says_so_and_an_advertised_host_is_what_clients_get() {
    let dir = tempfile::tempdir().unwrap();
    // `Daemon::start` turns SSH off for an `up` that does not ask for it.
    let up = start_up(dir.path(), &[]);
    let url = up.url.clone();
    let admin = read_token(&dir.path().join("data"));
    let home = Home::new(dir.path());
    let ada = tenant(&url, &admin, "ada", None);
    let id = reserve(&url, &ada, &SLEEP, "running");
    let got = cli(&url, Some(&ada), true, &["get", &id]).json();
    assert!(got.get("ssh").is_none(), "{got}");
    for command in [
        &["ssh", id.as_str()][..],
        &["ssh-config"],
        &["cp", "x", &format!("{id}:y")],
    ] {
        let args = [
            &["--server", url.as_str(), "--token", &ada, "--json"][..],
            command,
        ]
        .concat();
        let refused = home.gpurent(&[], &args);
        assert_ne!(refused.code, 0, "{refused:?}");
        let error = &refused.json()["error"];
        assert_eq!(error["code"], "no_ssh_endpoint", "{command:?}: {refused:?}");
        assert!(
            error["message"].as_str().unwrap().contains("--ssh-listen"),
            "{refused:?}"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (status, body) = runtime.block_on(async {
        let response = reqwest::Client::new()
            .get(format!("{url}/api/v1/ssh"))
            .bearer_auth(&ada)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json::<serde_json::Value>().await.unwrap())
    });
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "no_ssh_endpoint", "{body}");
    drop(up);

    // Behind NAT: the advertised host and port, whatever the API was reached at.
    let dir = tempfile::tempdir().unwrap();
    let up = start_up(
        dir.path(),
        &[
            "--ssh-listen",
            "127.0.0.1:0",
            "--ssh-advertise",
            "gpu.example.com:2200",
        ],
    );
    let url = up.url.clone();
    let admin = read_token(&dir.path().join("data"));
    let ada = tenant(&url, &admin, "ada", None);
    let id = reserve(&url, &ada, &SLEEP, "running");
    let got = cli(&url, Some(&ada), true, &["get", &id]).json();
    assert_eq!(got["ssh"]["host"], "gpu.example.com", "{got}");
    assert_eq!(got["ssh"]["port"], 2200, "{got}");
    assert_eq!(
        got["ssh"]["command"],
        format!("ssh -p 2200 {id}@gpu.example.com")
    );
    let home = Home::new(dir.path());
    let config = home.gpurent(&[], &["--server", &url, "--token", &ada, "ssh-config", &id]);
    assert_eq!(config.code, 0, "{config:?}");
    assert!(
        config
            .stdout
            .contains("  HostName gpu.example.com\n  Port 2200\n"),
        "{config:?}"
    );
    // Without an endpoint there is nothing to advertise: said at start.
    let alone = run_bounded({
        let mut server = Command::new(crate::support::BIN);
        server
            .args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--ssh-advertise",
                "gpu.example.com",
            ])
            .arg("--data-dir")
            .arg(dir.path().join("alone"));
        server
    });
    assert!(!alone.status.success());
    assert!(
        String::from_utf8_lossy(&alone.stderr).contains("--ssh-advertise needs an SSH endpoint"),
        "{alone:?}"
    );
    // A bad value is refused at start, with what is wrong.
    let bad = Command::new(crate::support::BIN)
        .args(["up", "--ssh-advertise", "gpu example:22", "--data-dir"])
        .arg(dir.path().join("unused"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("HOST[:PORT]"),
        "{bad:?}"
    );
}

/// `GET /api/v1/ssh` as `token`.
fn endpoint_info(url: &str, token: &str) -> serde_json::Value {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .get(format!("{url}/api/v1/ssh"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    })
}

/// `up` whose instances can be entered: the process executor, not in
/// this machine's cgroup tree.
fn start_up_process(dir: &Path) -> Daemon {
    start_up(
        dir,
        &[
            "--ssh-listen",
            "127.0.0.1:0",
            "--executor",
            "process",
            "--allow-unisolated",
            "--cgroup-root",
            "/nonexistent/gpurent",
        ],
    )
}

/// `gpurent cp` both ways through the control plane's endpoint, into an unisolated process instance.
#[test]
fn cp_copies_into_and_out_of_an_instance_through_gpurent_up() {
    use crate::ssh_support::{random_file, sha256};
    let dir = tempfile::tempdir().unwrap();
    let up = start_up_process(dir.path());
    let url = up.url.clone();
    let admin = read_token(&dir.path().join("data"));
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "ada", "");
    let ada = tenant(&url, &admin, "ada", Some(&public));
    let id = reserve(&url, &ada, &SLEEP, "running");
    let local = dir.path().join("data.bin");
    random_file(&local, 3 * 1024 * 1024 + 1, 9);
    let base = [
        "--server",
        url.as_str(),
        "--token",
        &ada,
        "--json",
        "cp",
        "-i",
        key.to_str().unwrap(),
    ];
    let remote = format!("{id}:data.bin");
    let up_copy = home.gpurent(
        &[],
        &[&base[..], &[local.to_str().unwrap(), &remote]].concat(),
    );
    assert_eq!(up_copy.code, 0, "{up_copy:?}");
    assert_eq!(up_copy.json()["bytes"], 3 * 1024 * 1024 + 1);
    let back = dir.path().join("back.bin");
    let down = home.gpurent(
        &[],
        &[&base[..], &[&remote, back.to_str().unwrap()]].concat(),
    );
    assert_eq!(down.code, 0, "{down:?}");
    assert_eq!(sha256(&back), sha256(&local));
    cli(&url, Some(&ada), true, &["stop", &id]);
    drop(up);
    gpurent_agent::testing::kill_processes_naming(dir.path());
}

/// `gpurent port-forward` to an HTTP server inside the instance.
#[test]
fn port_forward_reaches_an_http_server_in_an_instance_through_gpurent_up() {
    let dir = tempfile::tempdir().unwrap();
    let up = start_up_process(dir.path());
    let url = up.url.clone();
    let admin = read_token(&dir.path().join("data"));
    let home = Home::new(dir.path());
    let (key, public) = keygen(dir.path(), "ada", "");
    let ada = tenant(&url, &admin, "ada", Some(&public));
    let served = dir.path().join("served");
    std::fs::create_dir(&served).unwrap();
    std::fs::write(served.join("hello.txt"), b"hello from the instance\n").unwrap();
    let id = reserve(
        &url,
        &ada,
        &[
            "--gpu",
            "RTX-4090",
            "--hours",
            "1",
            "--",
            "python3",
            "-m",
            "http.server",
            "18931",
            "--bind",
            "127.0.0.1",
            "--directory",
            served.to_str().unwrap(),
        ],
        "running",
    );
    let args = [
        "--server",
        url.as_str(),
        "--token",
        &ada,
        "port-forward",
        "-i",
        key.to_str().unwrap(),
        &id,
        "0:18931",
    ];
    let (_forward, port, _) = crate::ssh_client_sshd::start_forward(&home, &[], &args);
    let mut body = String::new();
    eventually("the instance's HTTP server through the forward", 30, || {
        body = crate::ssh_support::http_hello(port);
        body.contains("hello from the instance")
    });
    cli(&url, Some(&ada), true, &["stop", &id]);
    drop(up);
    gpurent_agent::testing::kill_processes_naming(dir.path());
}
