//! The web console's terminal (`GET /instances/ID/terminal`, a WebSocket with the console's
//! session cookie) against a real `gpurent server` and a `gpurent agent` process with the
//! process executor: a command runs and answers, a resize reaches the PTY, an exit status
//! comes back, other tenants, other sites and API tokens are refused, the terminal counts as
//! a session, ends when its session or its reservation ends, and leaves its audit record.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::{cli, eventually, Cluster};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long any one expected message may take (a loaded 2-core machine).
const PATIENCE: Duration = Duration::from_secs(60);

/// Who opens a terminal: a console session (its cookie), or an API token (not enough).
#[derive(Clone, Copy)]
enum As<'a> {
    Session(&'a str),
    Bearer(&'a str),
}

/// Opens the terminal of `id` as `who`, with `origin` (None: no Origin header, as a
/// non-browser client); the refusal's status and body when the upgrade is refused.
async fn open(url: &str, who: As<'_>, id: &str, origin: Option<&str>) -> Result<Ws, (u16, String)> {
    let ws_url = format!(
        "{}/instances/{id}/terminal?cols=80&rows=24",
        url.replacen("http://", "ws://", 1)
    );
    let mut request = ws_url.into_client_request().unwrap();
    let headers = request.headers_mut();
    match who {
        As::Session(token) => headers.insert(
            header::COOKIE,
            format!("gpurent_session={token}").parse().unwrap(),
        ),
        As::Bearer(token) => headers.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        ),
    };
    if let Some(origin) = origin {
        headers.insert(header::ORIGIN, origin.parse().unwrap());
    }
    match tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(request)).await {
        Err(_) => panic!("the terminal's upgrade did not answer in {PATIENCE:?}"),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(WsError::Http(response))) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Ok(Err(e)) => panic!("the terminal's upgrade failed: {e}"),
    }
}

/// Logs the tenant in as the console does (`POST /api/v1/login`), first giving it a console
/// password by its API token when it has none (setting it again would end its other
/// sessions): the session's (token, token id).
async fn session(url: &str, token: &str, name: &str) -> (String, String) {
    let http = reqwest::Client::new();
    let password = format!("{name}-console-password");
    let login = || {
        http.post(format!("{url}/api/v1/login"))
            .json(&serde_json::json!({ "name": name, "password": password }))
            .send()
    };
    let mut answer = login().await.unwrap();
    if answer.status() == reqwest::StatusCode::UNAUTHORIZED {
        let set = http
            .post(format!("{url}/api/v1/users/me/password"))
            .bearer_auth(token)
            .json(&serde_json::json!({ "password": password }))
            .send()
            .await
            .unwrap();
        assert!(set.status().is_success(), "{:?}", set.text().await);
        answer = login().await.unwrap();
    }
    assert!(answer.status().is_success(), "{:?}", answer.text().await);
    let session: serde_json::Value = answer.json().await.unwrap();
    (
        session["token"].as_str().unwrap().to_owned(),
        session["token_id"].as_str().unwrap().to_owned(),
    )
}

/// This site's own origin, as a browser on its pages sends it.
fn origin_of(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// Reads the terminal's output until `seen` holds `want`; everything read.
async fn read_until(ws: &mut Ws, want: &str) -> String {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !seen.contains(want) {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| {
                panic!("no {want:?} in {PATIENCE:?}; the terminal showed {seen:?}")
            });
        match msg {
            Some(Ok(Message::Binary(data))) => seen.push_str(&String::from_utf8_lossy(&data)),
            Some(Ok(Message::Text(text))) => {
                panic!("the terminal ended ({text}) before {want:?}; it showed {seen:?}")
            }
            Some(Ok(_)) => {}
            other => panic!("the terminal closed ({other:?}) before {want:?}; it showed {seen:?}"),
        }
    }
    seen
}

/// Reads until the server's last text message and the close that follows it: (the message
/// as JSON, the output read before it).
async fn read_end(ws: &mut Ws) -> (serde_json::Value, String) {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let last = loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| {
                panic!("the terminal did not end in {PATIENCE:?}; it showed {seen:?}")
            });
        match msg {
            Some(Ok(Message::Binary(data))) => seen.push_str(&String::from_utf8_lossy(&data)),
            Some(Ok(Message::Text(text))) => break serde_json::from_str(&text).unwrap(),
            Some(Ok(_)) => {}
            other => {
                panic!("the terminal closed ({other:?}) without a last message; it showed {seen:?}")
            }
        }
    };
    // Then the socket closes.
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => panic!("the terminal sent {last} but did not close"),
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => break,
            Ok(Some(Ok(_))) => {}
        }
    }
    (last, seen)
}

async fn type_line(ws: &mut Ws, line: &str) {
    ws.send(Message::Binary(format!("{line}\n").into_bytes().into()))
        .await
        .unwrap();
}

/// `gpurent_ssh_sessions` on the control plane's `/metrics`.
async fn sessions_open(url: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("gpurent_ssh_sessions "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no gpurent_ssh_sessions in /metrics:\n{text}"))
}

async fn wait_sessions(url: &str, want: u64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let open = sessions_open(url).await;
        if open == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} sessions open, not {want}, after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_web_terminal_runs_a_shell_in_the_instance_until_it_stops() {
    // A machine short of disk still takes this test's work.
    let cluster = Cluster::start_with("127.0.0.1:0", &["--min-disk-free-gb", "0"]);
    // Limits that fit a 2-core machine.
    let args = cluster.agent_args(
        "node-1",
        &["--cpus-per-gpu", "1", "--memory-per-gpu-gb", "1"],
    );
    let _agent = cluster.agent("node-1", &args);
    cluster.wait_ready(1);
    let ada_token = cluster.tenant("ada");
    let bob_token = cluster.tenant("bob");
    let id = cluster.reserve(
        &ada_token,
        &["--gpu", "RTX-4090", "--hours", "1", "--", "sleep", "600"],
    );
    eventually("running", 60, || {
        cluster.get(&ada_token, &id)["status"] == "running"
    });
    let url = cluster.url.clone();
    let origin = origin_of(&url).to_owned();
    let (ada, _) = session(&url, &ada_token, "ada").await;
    let (bob, _) = session(&url, &bob_token, "bob").await;

    // A command runs and its output comes back (42 is computed by the shell, not echoed).
    let mut ws = open(&url, As::Session(&ada), &id, Some(&origin))
        .await
        .unwrap();
    type_line(&mut ws, "echo hello-$((6*7))").await;
    read_until(&mut ws, "hello-42").await;
    wait_sessions(&url, 1).await;

    // A resize reaches the instance's PTY.
    ws.send(Message::Text(
        r#"{"type":"resize","cols":123,"rows":45}"#.into(),
    ))
    .await
    .unwrap();
    type_line(&mut ws, "stty size").await;
    read_until(&mut ws, "45 123").await;

    // The shell's exit status is the last message.
    type_line(&mut ws, "exit 3").await;
    let (last, _) = read_end(&mut ws).await;
    assert_eq!(last["type"], "exit", "{last}");
    assert_eq!(last["code"], 3, "{last}");
    wait_sessions(&url, 0).await;

    // Another tenant's reservation, and an unknown one: 404, as in the API.
    let (status, body) = open(&url, As::Session(&bob), &id, Some(&origin))
        .await
        .expect_err("refused");
    assert_eq!(status, 404, "{body}");
    let (status, body) = open(&url, As::Session(&ada), "r-nope", Some(&origin))
        .await
        .expect_err("refused");
    assert_eq!(status, 404, "{body}");
    // A page of another site (the owner's cookie would go with it): 403.
    let (status, body) = open(&url, As::Session(&ada), &id, Some("http://evil.example"))
        .await
        .expect_err("refused");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Origin"), "{body}");
    // The console's own route: an API token is no session (it is sent to the login page).
    let (status, body) = open(&url, As::Bearer(&ada_token), &id, Some(&origin))
        .await
        .expect_err("refused");
    assert!((300..400).contains(&status), "{status} {body}");

    // A terminal whose session ends (a logout revokes its token) ends, saying why.
    let (short, short_id) = session(&url, &ada_token, "ada").await;
    let mut ws = open(&url, As::Session(&short), &id, Some(&origin))
        .await
        .unwrap();
    type_line(&mut ws, "echo on-$((1+1))").await;
    read_until(&mut ws, "on-2").await;
    let revoked = cli(&url, Some(&short), true, &["tokens", "revoke", &short_id]);
    assert_eq!(revoked.code, 0, "{revoked:?}");
    let (last, _) = read_end(&mut ws).await;
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["code"], "session_ended", "{last}");
    assert!(
        last["message"].as_str().unwrap().contains("log in again"),
        "{last}"
    );

    // A terminal open when the reservation stops ends, saying why.
    let mut ws = open(&url, As::Session(&ada), &id, Some(&origin))
        .await
        .unwrap();
    type_line(&mut ws, "echo still-$((40+2))").await;
    read_until(&mut ws, "still-42").await;
    let stopped = cli(&url, Some(&ada_token), true, &["stop", &id]);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    let (last, _) = read_end(&mut ws).await;
    // The terminal's own recheck says why, unless the node ended the shell first.
    let said_why = last["type"] == "error"
        && last["code"] == "not_running"
        && last["message"]
            .as_str()
            .is_some_and(|m| m.contains(&id) && m.contains("connect while it runs"));
    assert!(said_why || last["type"] == "exit", "{last}");
    wait_sessions(&url, 0).await;
    eventually("stopped", 60, || {
        cluster.get(&ada_token, &id)["status"] == "stopped"
    });
    let (status, body) = open(&url, As::Session(&ada), &id, Some(&origin))
        .await
        .expect_err("refused");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("is stopped"), "{body}");

    // Each terminal is in the audit trail: who, through the console, the bytes.
    let resource = format!("/instances/{id}/terminal");
    let shells = || -> Vec<serde_json::Value> {
        let records = cluster
            .cli(
                Some(&cluster.admin),
                true,
                &[
                    "audit",
                    "ls",
                    "--resource",
                    &resource,
                    "--from",
                    "2020-01-01",
                ],
            )
            .json();
        records
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["action"] == "CONSOLE shell")
            .cloned()
            .collect()
    };
    eventually("the terminals' audit records", 10, || shells().len() >= 3);
    let shells = shells();
    assert_eq!(shells.len(), 3, "{shells:?}");
    for record in &shells {
        assert_eq!(record["outcome"], 200, "{record}");
        assert_eq!(
            record["user_id"],
            cluster.get(&ada_token, &id)["tenant_id"],
            "{record}"
        );
        let detail = record["allocation"].as_str().unwrap();
        assert!(detail.starts_with("web console;"), "{detail}");
        assert!(
            !detail.contains(" 0 bytes in") && !detail.contains(" 0 bytes out"),
            "{detail}"
        );
    }
}
