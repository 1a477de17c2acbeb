//! A process instance's network against a hostile tenant, through a real `gpurent server` and
//! `gpurent agent` (the isolated process executor, as root): from inside an instance, its
//! command and an SSH session, `curl` to the control plane's loopback port and to another
//! tenant's published port is refused, and so is `ssh -L` to them; `ssh -L` and the published
//! port to the instance's own server still work.

use std::process::{Command, Stdio};

use crate::ssh_endpoint::{keygen, tenant};
use crate::ssh_support::{http_hello, run_bounded};
use crate::support::{cli, eventually, Cluster};

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Kills a background ssh when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `curl` says of `http://127.0.0.1:PORT/`, as a line: `PORT: code=C exit=E` (exit 7:
/// it could not connect).
fn curl_line(port: u16) -> String {
    format!(
        "c=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 http://127.0.0.1:{port}/); echo \"{port}: code=$c exit=$?\""
    )
}

/// An HTTP server on 127.0.0.1:`argv[1]` that answers every GET with `hello.txt` (the proxy's
/// path form passes `/proxy/ID/PORT/...` as it came).
const SERVER: &str = "import http.server as s, sys
class H(s.BaseHTTPRequestHandler):
    def do_GET(self):
        body = open(\"/instance/hello.txt\", \"rb\").read()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
s.HTTPServer((\"127.0.0.1\", int(sys.argv[1])), H).serve_forever()
";

/// A command that writes what `curl` says of each port to `/instance/probe.txt`, then serves
/// `body` on `port`.
fn probe_then_serve(probe: &[u16], port: u16, body: &str) -> String {
    let mut probes: Vec<String> = probe.iter().map(|p| curl_line(*p)).collect();
    probes.push("true".into());
    format!(
        "cd /instance && echo {body} > hello.txt && {{ {}; }} > probe.txt; exec python3 -c '{SERVER}' {port}",
        probes.join("; ")
    )
}

/// A GET of `path` on the control plane with `token`: the whole answer ("" when it fails).
fn get(url: &str, path: &str, token: &str) -> String {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Waits until the published port answers `body` to its owner through the proxy (fails with
/// the last answer after a minute).
fn published(url: &str, id: &str, port: u16, token: &str, body: &str) {
    let path = format!("/proxy/{id}/{port}/hello.txt");
    let mut answer = String::new();
    for _ in 0..1200 {
        answer = get(url, &path, token);
        if answer.contains(body) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let got = cli(url, Some(token), true, &["get", id]);
    panic!("{path} never answered {body}: {answer}; the reservation: {got:?}");
}

#[test]
fn an_instance_reaches_neither_the_control_plane_nor_another_tenants_port() {
    if !running_as_root() || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!("SKIPPED: the isolated process executor needs root");
        return;
    }
    let cluster = Cluster::start_with(
        "127.0.0.1:0",
        &["--ssh-listen", "127.0.0.1:0", "--min-disk-free-gb", "0"],
    );
    let addr = std::fs::read_to_string(cluster.dir.path().join("data/ssh.addr")).unwrap();
    let ssh_port: u16 = addr.trim().rsplit(':').next().unwrap().parse().unwrap();
    let control_plane: u16 = cluster.url.rsplit(':').next().unwrap().parse().unwrap();
    let join = cluster
        .cli(Some(&cluster.admin), true, &["nodes", "join-token"])
        .json();
    let node = cluster.dir.path().join("node");
    let args: Vec<String> = [
        "--server",
        cluster.url.as_str(),
        "agent",
        "--data-dir",
        node.to_str().unwrap(),
        "--name",
        &format!("net-{}", std::process::id()),
        "--sim-gpus",
        "2xRTX4090",
        "--executor",
        "process",
        "--cpus-per-gpu",
        "1",
        "--memory-per-gpu-gb",
        "1",
        "--join-token",
        join["token"].as_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let _agent = cluster.agent("node-1", &args);
    cluster.wait_ready(1);
    let shared = cluster.nodes()[0]["shared_network"].as_bool();
    assert_ne!(shared, Some(true), "{:?}", cluster.nodes());
    let dir = cluster.dir.path().to_owned();
    let (key, public) = keygen(&dir, "ada");
    let (_, bob_public) = keygen(&dir, "bob");
    let ada = tenant(&cluster.url, &cluster.admin, "ada", &public);
    let bob = tenant(&cluster.url, &cluster.admin, "bob", &bob_public);

    // Bob publishes a port: "owner only".
    let (bob_port, ada_port) = (free_port(), free_port());
    let reserve = |token: &str, port: u16, command: String| {
        let r = cli(
            &cluster.url,
            Some(token),
            true,
            &[
                "reserve",
                "--gpu",
                "RTX-4090",
                "--hours",
                "1",
                "--http-port",
                &port.to_string(),
                "--",
                "sh",
                "-c",
                &command,
            ],
        );
        assert_eq!(r.code, 0, "{r:?}");
        r.json()["id"].as_str().unwrap().to_owned()
    };
    let bob_id = reserve(&bob, bob_port, probe_then_serve(&[], bob_port, "from-bob"));
    published(&cluster.url, &bob_id, bob_port, &bob, "from-bob");

    // Ada's command tries both from inside, then serves its own port.
    let ada_id = reserve(
        &ada,
        ada_port,
        probe_then_serve(&[control_plane, bob_port], ada_port, "from-ada"),
    );
    // Its published port works through its own network.
    published(&cluster.url, &ada_id, ada_port, &ada, "from-ada");

    let ssh = |extra: &[&str]| {
        let mut cmd = Command::new("ssh");
        cmd.arg("-i")
            .arg(&key)
            .args([
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
            ])
            .args(["-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.join("known_hosts").display()
            ))
            .args(["-p", &ssh_port.to_string()])
            .args(extra)
            .arg(format!("{ada_id}@127.0.0.1"));
        cmd
    };
    // What the command found, and what a session in the instance finds: nothing connects.
    let mut cat = ssh(&[]);
    cat.arg(format!(
        "cat /instance/probe.txt; {}; {}",
        curl_line(control_plane),
        curl_line(bob_port)
    ));
    let out = run_bounded(cat);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said} {out:?}");
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 4, "{said}");
    for line in lines {
        assert!(
            line.ends_with("code=000 exit=7"),
            "reached from the instance: {said}"
        );
    }

    // ssh -L: to its own server it works, to the control plane and to bob's port it does not.
    let (own, to_cp, to_bob) = (free_port(), free_port(), free_port());
    let mut forward = ssh(&[
        "-N",
        "-L",
        &format!("{own}:localhost:{ada_port}"),
        "-L",
        &format!("{to_cp}:localhost:{control_plane}"),
        "-L",
        &format!("{to_bob}:localhost:{bob_port}"),
    ]);
    forward
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _forward = Killed(forward.spawn().unwrap());
    eventually("ada's server through ssh -L", 30, || {
        http_hello(own).contains("from-ada")
    });
    // The forwards are listening (ssh opened them together): the connection is closed unanswered.
    for port in [to_cp, to_bob] {
        let body = http_hello(port);
        assert!(!body.starts_with("HTTP/"), "reached through ssh -L: {body}");
    }
    // And ssh -W says why.
    let out = run_bounded(ssh(&["-W", &format!("127.0.0.1:{control_plane}")]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert!(err.contains("forwarding failed"), "{err}");

    for (id, token) in [(&ada_id, &ada), (&bob_id, &bob)] {
        let stopped = cli(&cluster.url, Some(token), true, &["stop", id]);
        assert_eq!(stopped.code, 0, "{stopped:?}");
    }
}

/// A node whose instances share its network (here by `--shared-network`; elsewhere a host
/// without pasta or network namespaces) says so in `nodes ls` and the offers.
#[test]
fn a_shared_network_node_says_so_in_nodes_ls_and_offers() {
    if !running_as_root() || std::env::var("GPURENT_TEST_ISOLATION").as_deref() == Ok("0") {
        eprintln!("SKIPPED: the isolated process executor needs root");
        return;
    }
    let cluster = Cluster::start_with("127.0.0.1:0", &["--min-disk-free-gb", "0"]);
    let join = cluster
        .cli(Some(&cluster.admin), true, &["nodes", "join-token"])
        .json();
    let node = cluster.dir.path().join("node");
    let args: Vec<String> = [
        "--server",
        cluster.url.as_str(),
        "agent",
        "--data-dir",
        node.to_str().unwrap(),
        "--name",
        "shared",
        "--sim-gpus",
        "1xRTX4090",
        "--executor",
        "process",
        "--shared-network",
        "--join-token",
        join["token"].as_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec();
    let _agent = cluster.agent("shared", &args);
    cluster.wait_ready(1);
    let nodes = cluster.cli(Some(&cluster.admin), false, &["nodes", "ls"]);
    assert_eq!(nodes.code, 0, "{nodes:?}");
    assert!(
        nodes.stdout.contains("process (network: shared)/sim"),
        "{}",
        nodes.stdout
    );
    let offers = cluster.cli(Some(&cluster.admin), false, &["offers"]);
    assert!(
        offers.stdout.contains("1 (1 network: shared)"),
        "{}",
        offers.stdout
    );
    let json = cluster.cli(Some(&cluster.admin), true, &["offers"]).json();
    assert_eq!(json[0]["shared_network"], 1, "{json}");
    assert_eq!(json[0].get("unisolated"), None, "{json}");
}
