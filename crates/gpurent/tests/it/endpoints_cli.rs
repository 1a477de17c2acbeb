//! `gpurent endpoints` against a real `gpurent server` and a real `gpurent agent` running the
//! isolated process executor (as root), its replicas real Python HTTP servers: the contract's
//! JSON, a key, scale 0 → 1 on the first request, two replicas side by side on the same port
//! (each in its own network), a replica's log, scale to zero, removal.

use std::collections::HashSet;
use std::io::{Read, Write};

use serde_json::Value;

use crate::support::{cli, eventually, Cluster};

/// The app: sleeps `?ms=N`, then says which replica answered; logs each request.
const APP: &str = "import http.server as s, json, os, time, urllib.parse as u
class H(s.BaseHTTPRequestHandler):
    def do_GET(self):
        q = u.parse_qs(u.urlparse(self.path).query)
        time.sleep(int(q.get('ms', ['0'])[0]) / 1000)
        body = json.dumps({'replica': os.environ['GPURENT_RESERVATION_ID'], 'path': self.path}).encode()
        self.send_response(200)
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        print('served', self.path, flush=True)
s.ThreadingHTTPServer(('127.0.0.1', 8000), H).serve_forever()
";

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A GET of `path` on the control plane with the endpoint's key: (status, body).
pub(crate) fn get(url: &str, path: &str, key: &str) -> (u16, String) {
    let addr = url.trim_start_matches("http://");
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, String::new());
    };
    let _ = write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// `n` GETs of `path` at once, each from a thread of its own: their (status, body).
pub(crate) fn get_together(url: &str, path: &str, key: &str, n: usize) -> Vec<(u16, String)> {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let (url, path, key) = (url.to_owned(), path.to_owned(), key.to_owned());
            std::thread::spawn(move || get(&url, &path, &key))
        })
        .collect();
    calls.into_iter().map(|c| c.join().unwrap()).collect()
}

#[test]
fn an_endpoint_of_real_processes_scales_from_zero_and_back() {
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
        &format!("ep-{}", std::process::id()),
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
    let user = cluster.cli(
        Some(&cluster.admin),
        true,
        &["users", "create", "erin", "--credit", "50"],
    );
    let token = user.json()["token"].as_str().unwrap().to_owned();
    let t = Some(token.as_str());
    let url = &cluster.url;

    let created = cli(
        url,
        t,
        true,
        &[
            "endpoints",
            "create",
            "web",
            "--gpu",
            "rtx4090",
            "--port",
            "8000",
            "--max-replicas",
            "2",
            "--target-inflight",
            "1",
            "--scale-down-after",
            "2",
            "--",
            "python3",
            "-c",
            APP,
        ],
    );
    assert_eq!(created.code, 0, "{created:?}");
    let e = created.json();
    assert_eq!(e["name"], "web");
    assert_eq!(e["status"], "idle");
    let call = e["url"].as_str().unwrap().to_owned();
    assert!(call.ends_with("/e/web"), "{e}");
    let keys = cli(url, t, true, &["endpoints", "keys", "create", "web"]);
    assert_eq!(keys.code, 0, "{keys:?}");
    let key = keys.json()["key"].as_str().unwrap().to_owned();
    assert!(keys.json()["id"].is_string());

    // 0 → 1: the first call waits for a real process to start and answers.
    let (status, body) = get(url, "/e/web/first", &key);
    assert_eq!(status, 200, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(first["path"], "/first");
    let got = cli(url, t, true, &["endpoints", "get", "web"]).json();
    assert_eq!(got["ready_replicas"], 1, "{got}");
    assert_eq!(got["replicas"][0]["id"], first["replica"], "{got}");
    assert_eq!(got["replicas"][0]["status"], "running");
    assert!(got["replicas"][0]["node"].is_string());
    assert_eq!(got["cold_starts"], 1, "{got}");
    println!(
        "cold start: {} ms",
        got["cold_start_p50_ms"].as_f64().unwrap_or(-1.0)
    );

    // 1 → 2: two replicas side by side, each listening on 127.0.0.1:8000 in its own network.
    let mut replicas = HashSet::new();
    for (status, body) in get_together(url, "/e/web/slow?ms=2000", &key, 4) {
        assert_eq!(status, 200, "{body}");
        let a: Value = serde_json::from_str(&body).unwrap();
        replicas.insert(a["replica"].as_str().unwrap().to_owned());
    }
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    let log = cli(
        url,
        t,
        false,
        &["endpoints", "logs", "web", "--replica", "1"],
    );
    assert_eq!(log.code, 0, "{log:?}");
    assert!(log.stdout.contains("served /first"), "{log:?}");

    // Idle: to zero, the replicas' reservations stopped.
    eventually("the endpoint to scale to zero", 60, || {
        cli(url, t, true, &["endpoints", "get", "web"]).json()["replicas"] == Value::Array(vec![])
    });
    let listed = cli(url, t, true, &["ls"]).json();
    let ended: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["endpoint"] == "web")
        .collect();
    assert_eq!(ended.len(), 2, "{listed}");
    assert!(ended.iter().all(|r| r["status"] == "stopped"), "{listed}");

    let removed = cli(url, t, true, &["endpoints", "rm", "web"]);
    assert_eq!(removed.code, 0, "{removed:?}");
    assert_eq!(removed.json()["name"], "web");
    let (status, _) = get(url, "/e/web/first", &key);
    assert_eq!(status, 404);
}
