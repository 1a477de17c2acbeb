//! The web terminal among the SSH sessions, against a real SSH endpoint (a russh client) and
//! a WebSocket with the console's session cookie: a reservation's session cap counts both,
//! a place freed by SSH lets a terminal in, and a terminal that cannot enter the instance
//! (the sim executor runs nothing) says why and closes.

use std::time::Duration;

use futures_util::StreamExt;
use gpurent_server::ssh::SessionCaps;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{http::header, Error as WsError, Message};

use crate::console_support::login;
use crate::ssh_channels::SshRig;

const PATIENCE: Duration = Duration::from_secs(30);

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The terminal's upgrade as the instance page's script makes it: the refusal's status and
/// body when there is none.
async fn terminal(base: &str, cookie: &str, id: &str) -> Result<Ws, (u16, String)> {
    let url = format!(
        "{}/instances/{id}/terminal",
        base.replacen("http://", "ws://", 1)
    );
    let mut request = url.into_client_request().unwrap();
    let headers = request.headers_mut();
    headers.insert(
        header::COOKIE,
        format!("gpurent_session={cookie}").parse().unwrap(),
    );
    headers.insert(header::ORIGIN, base.parse().unwrap());
    match tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(request)).await {
        Err(_) => panic!("no answer to the upgrade in {PATIENCE:?}"),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(WsError::Http(r))) => Err((
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Ok(Err(e)) => panic!("the upgrade failed: {e}"),
    }
}

#[tokio::test]
async fn terminals_and_ssh_channels_share_the_reservations_session_cap() {
    // Partial moves: the rest (the key's directory) lives to the end of the test.
    let rig = SshRig::start(SessionCaps {
        sessions: 2,
        forwards: 1,
    })
    .await;
    let (app, ssh, ada, id, session) = (rig.app, rig.ssh, rig.ada, rig.id, rig.session);
    let console = login(&app, &ada, "ada").await;

    // Two SSH session channels take the reservation's two places.
    let first = session.channel_open_session().await.unwrap();
    let _second = session.channel_open_session().await.unwrap();

    // So the terminal finds none.
    let (status, body) = terminal(&app.base, &console.cookie, &id)
        .await
        .expect_err("the cap is full");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("sessions open"), "{body}");

    // A channel closed gives its place to the terminal, which cannot enter a sim instance:
    // it says so, and closes.
    first.close().await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut ws = loop {
        match terminal(&app.base, &console.cookie, &id).await {
            Ok(ws) => break ws,
            Err((409, _)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(refused) => panic!("the freed place is not the terminal's: {refused:?}"),
        }
    };
    let last = loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => panic!("the terminal said nothing in {PATIENCE:?}"),
            Ok(Some(Ok(Message::Text(text)))) => {
                break serde_json::from_str::<serde_json::Value>(&text).unwrap()
            }
            Ok(Some(Ok(_))) => {}
            Ok(other) => panic!("the terminal closed without a word: {other:?}"),
        }
    };
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["code"], "cannot_enter", "{last}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("there is no instance to enter"),
        "{last}"
    );
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => panic!("the terminal did not close after {last}"),
            Ok(Some(Ok(Message::Close(_))) | None | Some(Err(_))) => break,
            Ok(Some(Ok(_))) => {}
        }
    }
    ssh.shutdown().await;
}
