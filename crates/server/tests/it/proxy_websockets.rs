//! WebSockets through the published HTTP ports: messages echoed by the test's app, and
//! JupyterLab as a browser uses it (its page, a kernel, code run over the kernel's WebSocket).

use std::net::SocketAddr;
use std::time::Duration;

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::proxy_support::{
    cookie_pair, read_frame, setup, write_frame, ws_open, ws_roundtrip, ws_roundtrip_on, APP_PORT,
};

/// A WebSocket through the proxy: text and a 300 KB binary message echoed, and the close,
/// with the bearer token and, on the apps' site, with the cookie a browser got there; a
/// stranger's gets no upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_are_spliced_through() {
    let s = setup(Backend::Sqlite, None).await;
    let rid = &s.rid;
    let path = format!("/proxy/{rid}/{APP_PORT}/api/kernels/k1/channels?session_id=1");
    let addr = s.server_addr();
    ws_roundtrip(addr, &path, &format!("Authorization: Bearer {}", s.owner))
        .await
        .unwrap();
    // On the apps' site, with the cookie the owner's browser got there.
    let pair = s.app_cookie().await;
    ws_roundtrip_on(
        addr,
        &s.app_host(APP_PORT),
        "/api/kernels/k1/channels?session_id=1",
        &format!("Cookie: {pair}"),
    )
    .await
    .unwrap();
    let refused = ws_roundtrip(
        addr,
        &path,
        &format!("Authorization: Bearer {}", s.stranger),
    )
    .await
    .unwrap_err();
    assert!(refused.contains("404"), "{refused}");
    let metrics = s.app.anonymous().get_text("/metrics", "x").await.1;
    assert!(
        metrics.contains("gpurent_proxy_websocket_upgrades_total 2"),
        "{metrics}"
    );
    s.app.shutdown().await;
}

/// A process group killed when dropped (JupyterLab and its kernels).
struct Group(tokio::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// JupyterLab behind the proxy as a browser uses it, on its own host of the apps' site: the
/// page by the cookie the owner's browser got there, a kernel started with Jupyter's XSRF
/// cookie and header, and code run over the kernel's WebSocket (Origin = the app's host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs JupyterLab: GPURENT_TEST_JUPYTER=path/to/jupyter (pip install jupyterlab)"]
async fn jupyterlab_works_behind_the_proxy() {
    let jupyter = std::env::var("GPURENT_TEST_JUPYTER").expect("GPURENT_TEST_JUPYTER");
    let s = setup(Backend::Sqlite, None).await;
    let base = "/";
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let root = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(&jupyter)
        .args(["lab", "--no-browser", "--allow-root", "--ip=127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--ServerApp.base_url={base}"))
        .arg("--IdentityProvider.token=")
        .arg("--ServerApp.password=")
        // Listening on loopback only, Jupyter refuses Host names that are not local.
        .arg("--ServerApp.allow_remote_access=True")
        .arg(format!("--ServerApp.root_dir={}", root.path().display()))
        .env("JUPYTER_RUNTIME_DIR", root.path().join("runtime"))
        .env("JUPYTER_CONFIG_DIR", root.path().join("config"))
        .env("JUPYTER_DATA_DIR", root.path().join("data"))
        .env("HOME", root.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(root.path().join("jupyter.log")).unwrap())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("jupyter");
    let _jupyter = Group(child);
    s.executor
        .ports
        .lock()
        .unwrap()
        .insert(APP_PORT, SocketAddr::from(([127, 0, 0, 1], port)));
    let host = s.app_host(APP_PORT);
    let host = host.as_str();
    let session = s.app_cookie().await;
    let mut lab = None;
    let mut last = String::new();
    for _ in 0..600 {
        let r = s
            .http
            .get(s.url(&format!("{base}lab")))
            .header("host", host)
            .header("cookie", &session)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            lab = Some(r);
            break;
        }
        last = format!("{} {}", r.status(), r.text().await.unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(root.path().join("jupyter.log")).unwrap_or_default();
    let lab = lab.unwrap_or_else(|| panic!("JupyterLab's page: {last}\n{log}"));
    let xsrf = lab
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("_xsrf="))
        .expect("Jupyter's XSRF cookie");
    assert!(xsrf.contains(&format!("Path={base}")), "{xsrf}");
    let xsrf = cookie_pair(&xsrf);
    let page = lab.text().await.unwrap();
    assert!(
        page.contains(&format!("\"baseUrl\": \"{base}\"")),
        "the page's base URL"
    );
    let cookies = format!("{session}; {xsrf}");
    let token = xsrf.trim_start_matches("_xsrf=");
    let r = s
        .http
        .post(s.url(&format!("{base}api/kernels")))
        .header("host", host)
        .header("cookie", &cookies)
        .header("x-xsrftoken", token)
        .header("content-type", "application/json")
        .body(r#"{"name": "python3"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let kernel: Value = r.json().await.unwrap();
    let kernel = kernel["id"].as_str().unwrap().to_owned();
    let mut ws = ws_open(
        s.server_addr(),
        host,
        &format!("{base}api/kernels/{kernel}/channels?session_id=s1"),
        &format!("Cookie: {cookies}\r\nOrigin: http://{host}"),
    )
    .await
    .expect("the kernel's WebSocket");
    let execute = json!({
        "header": {"msg_id": "m1", "username": "t", "session": "s1",
            "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": "print(6 * 7)", "silent": false, "store_history": false,
            "user_expressions": {}, "allow_stdin": false, "stop_on_error": true},
    });
    write_frame(&mut ws, 1, execute.to_string().as_bytes(), true).await;
    let printed = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some((opcode, payload)) = read_frame(&mut ws).await {
            if opcode != 1 {
                continue;
            }
            let message: Value = serde_json::from_slice(&payload).unwrap();
            if message["msg_type"] == "stream" && message["content"]["name"] == "stdout" {
                return Some(message["content"]["text"].as_str().unwrap().to_owned());
            }
        }
        None
    })
    .await
    .expect("the kernel's output in time");
    assert_eq!(printed.as_deref(), Some("42\n"));
    s.app.shutdown().await;
}
