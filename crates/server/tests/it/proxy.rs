//! Published HTTP ports (`/proxy/ID/PORT/`): requests, downloads and uploads reach a real HTTP
//! server standing in for the app inside the instance, through the real agent's tunnel (an
//! executor of this test enters the "instance" by connecting to that server); only the owner
//! gets in, here by bearer token. The apps' site and its links are `proxy_sites`, WebSockets
//! `proxy_websockets`, what the tests share `proxy_support`.

use std::time::Duration;

use gpurent_server::ServerConfig;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::app::TestApp;
use crate::both_stores;
use crate::proxy_support::{download_byte, setup, setup_with, user, APP_PORT, DEAD_PORT, DOWNLOAD};

/// The owner's bearer token gets through: the path as sent (prefix included, query kept),
/// the credential kept from the app, X-Forwarded-*, a 10 MiB download and a 3 MiB upload
/// intact, and `get` says where the port is.
async fn the_owner_reaches_the_app_with_a_bearer_token(backend: Backend) {
    let s = setup(backend, None).await;
    let rid = &s.rid;
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/lab/tree?a=1&b=%2F")))
        .bearer_auth(&s.owner)
        .header("cookie", "_xsrf=abc")
        .header("x-forwarded-for", "10.0.0.9")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-security-policy"], "sandbox");
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(
        echo["uri"],
        format!("/proxy/{rid}/{APP_PORT}/lab/tree?a=1&b=%2F")
    );
    let h = &echo["headers"];
    assert_eq!(
        h["authorization"],
        Value::Null,
        "the bearer token reached the app: {h}"
    );
    assert_eq!(h["cookie"], "_xsrf=abc");
    assert_eq!(h["x-forwarded-for"], "10.0.0.9, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    let host = s.server_addr().to_string();
    assert_eq!(h["host"], host.as_str(), "Host stays the client's");
    assert_eq!(h["x-forwarded-host"], host.as_str());

    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/download")))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.bytes().await.unwrap();
    let expected: Vec<u8> = (0..DOWNLOAD).map(download_byte).collect();
    assert_eq!(body.len(), DOWNLOAD);
    assert_eq!(
        hex::encode(Sha256::digest(&body)),
        hex::encode(Sha256::digest(&expected))
    );

    let upload: Vec<u8> = (0..3 * 1024 * 1024).map(|i| download_byte(i * 7)).collect();
    let r = s
        .http
        .post(s.url(&format!("/proxy/{rid}/{APP_PORT}/upload")))
        .bearer_auth(&s.owner)
        .body(upload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let digest: Value = r.json().await.unwrap();
    assert_eq!(digest["len"], upload.len());
    assert_eq!(digest["sha256"], hex::encode(Sha256::digest(&upload)));

    // A token of the owner's gets in only with the ssh scope, where it has scopes.
    for (scopes, expected) in [
        (json!(["billing", "read"]), StatusCode::NOT_FOUND),
        (json!(["ssh"]), StatusCode::OK),
    ] {
        let (status, made) = s
            .owner_client()
            .post(
                "/api/v1/tokens",
                &json!({"expires_in_days": 1, "scopes": scopes}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        let r = s
            .http
            .get(s.url(&format!("/proxy/{rid}/{APP_PORT}/lab")))
            .bearer_auth(made["token"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), expected, "{scopes}");
    }

    // Without the slash after the port: sent on to it (the cookie's path has it).
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{APP_PORT}?x=1")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(
        r.headers()["location"],
        format!("/proxy/{rid}/{APP_PORT}/?x=1").as_str()
    );

    let (_, got) = s
        .owner_client()
        .get(&format!("/api/v1/reservations/{rid}"))
        .await;
    assert_eq!(got["http_ports"], json!([APP_PORT, DEAD_PORT]));
    assert_eq!(
        got["http"][0],
        json!({
            "port": APP_PORT,
            "url": format!("http://{host}/proxy/{rid}/{APP_PORT}/"),
            "app_url": format!("http://{rid}-{APP_PORT}.localhost:{}/", s.server_addr().port()),
        })
    );
    // Use through the proxy counts as activity (idle reclaim leaves it running).
    let active = format!(
        "SELECT COUNT(*) FROM reservations WHERE id = '{rid}' AND last_active_at IS NOT NULL"
    );
    s.app
        .eventually("the proxied use to count as activity", || async {
            s.app.raw_count(&active).await == 1
        })
        .await;
    let metrics = s.app.anonymous().get_text("/metrics", "x").await.1;
    let requests = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gpurent_proxy_requests_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("gpurent_proxy_requests_total");
    assert!(requests >= 4, "{requests} proxied requests counted");
    s.app.shutdown().await;
}
both_stores!(bearer, the_owner_reaches_the_app_with_a_bearer_token);

/// Anyone but the owner gets the same 404 as a path that does not exist: another tenant,
/// an admin, no credential, a wrong token, a port not published, an unknown reservation, a
/// stopped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anyone_else_gets_not_found() {
    let s = setup(Backend::Sqlite, None).await;
    let rid = &s.rid;
    let path = format!("/proxy/{rid}/{APP_PORT}/echo");
    let cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        (
            "another tenant",
            s.http.get(s.url(&path)).bearer_auth(&s.stranger),
        ),
        (
            "an admin",
            s.http.get(s.url(&path)).bearer_auth("gpr_test_admin"),
        ),
        ("no credential", s.http.get(s.url(&path))),
        (
            "a wrong token",
            s.http.get(s.url(&path)).bearer_auth("gpr_nonsense"),
        ),
        (
            "a made-up cookie",
            s.http
                .get(s.url(&path))
                .header("cookie", "gpurent_proxy=gps_00"),
        ),
        (
            "a port not published",
            s.http
                .get(s.url(&format!("/proxy/{rid}/7777/echo")))
                .bearer_auth(&s.owner),
        ),
        (
            "an unknown reservation",
            s.http
                .get(s.url(&format!(
                    "/proxy/00000000-0000-0000-0000-000000000000/{APP_PORT}/"
                )))
                .bearer_auth(&s.owner),
        ),
        (
            "another tenant's POST",
            s.http.post(s.url(&path)).bearer_auth(&s.stranger).body("x"),
        ),
    ];
    for (who, request) in cases {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{who}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{who}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("no route for /proxy/"),
            "{who}: {message}"
        );
    }
    // Links: only the owner makes them, only for published ports.
    let links = format!("/api/v1/reservations/{rid}/proxy-links");
    let (status, body) = s
        .app
        .client(Some(&s.stranger))
        .post(&links, &json!({"port": APP_PORT}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = s.owner_client().post(&links, &json!({"port": 7777})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not publish port 7777"),
        "{body}"
    );
    // Stopped: gone for the owner too.
    let (status, _) = s
        .owner_client()
        .post(&format!("/api/v1/reservations/{rid}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let r = s
        .http
        .get(s.url(&path))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    s.app.shutdown().await;
}

/// Bad published ports are refused with a message that says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_http_ports_are_refused() {
    let app = TestApp::with(Backend::Sqlite)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let token = user(&app, "vera").await;
    let client = app.client(Some(&token));
    for (ports, says) in [
        (json!([8888, 8888]), "8888 is given twice"),
        (json!([0]), "0 is not a port"),
        (json!([1, 2, 3, 4, 5, 6, 7, 8, 9]), "at most 8 ports"),
    ] {
        let (status, body) = client
            .post(
                "/api/v1/reservations",
                &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": ports}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    let (status, body) = client
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": [70000]}),
        )
        .await;
    assert!(status.is_client_error(), "{status} {body}");
    app.shutdown().await;
}

/// 502 with a message that says why: nothing listens on the port; the agent is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_port_is_a_bad_gateway() {
    let s = setup_with(TestApp::with(Backend::Sqlite).with_cuttable_links(), None).await;
    let rid = s.rid.clone();
    let r = s
        .http
        .get(s.url(&format!("/proxy/{rid}/{DEAD_PORT}/")))
        .bearer_auth(&s.owner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_gateway");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "cannot reach port {DEAD_PORT} of reservation {rid}"
        )) && message.contains("nothing listens"),
        "{message}"
    );
    // The agent's link to the control plane cut: its tunnel is gone.
    s.app.cut("node-0");
    let url = s.url(&format!("/proxy/{rid}/{APP_PORT}/"));
    let mut last = String::new();
    for _ in 0..200 {
        let r = s.http.get(&url).bearer_auth(&s.owner).send().await.unwrap();
        let status = r.status();
        last = r.text().await.unwrap();
        if status == StatusCode::BAD_GATEWAY && last.contains("agent is not connected") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(last.contains("agent is not connected"), "{last}");
    s.app.shutdown().await;
}

/// An upload to an app may take longer than the listener's body deadline (which answers 408
/// to slow API requests): the proxy's requests stream as long as the app reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_not_cut_by_the_body_deadline() {
    let s = setup(
        Backend::Sqlite,
        Some(|c: &mut ServerConfig| c.http.body_timeout = Duration::from_millis(300)),
    )
    .await;
    let mut conn = TcpStream::connect(s.server_addr()).await.unwrap();
    let body = b"0123456789";
    let head = format!(
        "POST /proxy/{}/{APP_PORT}/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        s.rid,
        s.owner,
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    // Ten bytes over three deadlines and more.
    for b in body {
        conn.write_all(&[*b]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(&hex::encode(Sha256::digest(body))),
        "the app got the whole body: {answer}"
    );
    s.app.shutdown().await;
}

/// The real thing on the process executor: `python3 -m http.server` inside the instance,
/// reached through the proxy by the agent entering the instance's network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_in_a_process_instance() {
    let mut app = TestApp::with(Backend::Sqlite).start().await;
    let dir = app.add_process_node("node-0", Duration::from_secs(1)).await;
    let token = user(&app, "pia").await;
    let client = app.client(Some(&token));
    // Processes share the node's network here: a port nobody else uses.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let (status, r) = client
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 1, "http_ports": [port],
                "command": ["sh", "-c", format!(
                    "d=www/proxy/$GPURENT_RESERVATION_ID/{port} && mkdir -p $d && \
                     echo served-from-the-instance > $d/hello.txt && \
                     exec python3 -m http.server {port} --bind 127.0.0.1 --directory www")]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&client, &rid, "running").await;
    let url = format!("{}/proxy/{rid}/{port}/hello.txt", app.base);
    let http = reqwest::Client::new();
    let mut last = String::new();
    for _ in 0..400 {
        let r = http.get(&url).bearer_auth(&token).send().await.unwrap();
        let status = r.status();
        last = r.text().await.unwrap();
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // http.server serves the path as it gets it, the prefix included.
    assert_eq!(last, "served-from-the-instance\n");
    let _ = client
        .post(&format!("/api/v1/reservations/{rid}/stop"), &json!({}))
        .await;
    app.shutdown().await;
    gpurent_agent::testing::kill_processes_naming(&dir);
}
