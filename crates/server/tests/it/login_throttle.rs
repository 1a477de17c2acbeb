//! Login throttling per account: a burst of wrong passwords from several client addresses
//! makes each further try wait (a 429 with `Retry-After`, its password unchecked, the right
//! one included) until the wait is over; failures are in the audit trail and a burst is an
//! event for the admin; a name that is no user's is answered exactly alike.

use std::net::{IpAddr, Ipv4Addr};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

const PASSWORD: &str = "correct horse battery";

/// A client from another loopback address (Linux answers for all of 127/8), so that the
/// per-address rate limit is not what stops a burst.
fn from(app: &TestApp, n: u8) -> (reqwest::Client, String) {
    let http = reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)))
        .build()
        .unwrap();
    (http, app.base.clone())
}

async fn try_login(
    app: &TestApp,
    n: u8,
    name: &str,
    password: &str,
) -> (StatusCode, Option<u64>, Value) {
    let (http, base) = from(app, n);
    let answer = http
        .post(format!("{base}/api/v1/login"))
        .json(&json!({"name": name, "password": password}))
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let retry = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (status, retry, answer.json().await.unwrap_or(Value::Null))
}

async fn a_burst_of_wrong_passwords_waits(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    let (status, body) = tina
        .client
        .post("/api/v1/users/me/password", &json!({"password": PASSWORD}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // Five wrong passwords, each from another address: each checked, each a 401.
    for n in 1..=5 {
        let (status, retry, body) = try_login(&app, 10 + n, "tina", "wrong horse battery").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "try {n}: {body}");
        assert_eq!(retry, None);
    }
    // The sixth waits, from yet another address; the right password too, unchecked.
    let (status, retry, body) = try_login(&app, 20, "tina", "wrong horse battery").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "login_throttled");
    let retry = retry.expect("Retry-After");
    assert!((1..=30).contains(&retry), "{retry}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("try again at"),
        "{body}"
    );
    let (status, _, body) = try_login(&app, 21, "tina", PASSWORD).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the right password waits too: {body}"
    );

    // The console's login form says so too.
    let page = crate::console_support::login_with(&app.base, "tina", PASSWORD)
        .await
        .expect_err("no session during the wait");
    assert_eq!(page.status, StatusCode::TOO_MANY_REQUESTS, "{}", page.html);
    page.assert_has("try again at");

    // A name that is no user's is answered exactly alike, wait included.
    for n in 1..=5 {
        let (status, _, body) = try_login(&app, 30 + n, "nobody", "wrong horse battery").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "try {n}: {body}");
    }
    let (status, retry, body) = try_login(&app, 40, "nobody", "wrong horse battery").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(retry.is_some());
    assert_eq!(body["error"]["code"], "login_throttled");

    // After the wait the right password works, and forgets the failures.
    app.advance(chrono::Duration::seconds(31));
    let (status, _, session) = try_login(&app, 22, "tina", PASSWORD).await;
    assert_eq!(status, StatusCode::OK, "{session}");
    for n in 1..=4 {
        let (status, _, body) = try_login(&app, 50 + n, "tina", "wrong horse battery").await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "after a success, try {n}: {body}"
        );
    }

    // The failures are in the audit trail, with tina's id and each client's address.
    let (status, page) = app
        .admin()
        .get(&format!("/api/v1/audit?user={}&limit=1000", tina.id))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let records = page["records"].as_array().unwrap();
    let logins = |outcome: u64| {
        records
            .iter()
            .filter(|r| r["action"] == "POST /api/v1/login" && r["outcome"] == outcome)
            .collect::<Vec<_>>()
    };
    assert_eq!(logins(401).len(), 9, "{records:#?}");
    assert_eq!(logins(429).len(), 3, "{records:#?}");
    assert_eq!(logins(200).len(), 1, "{records:#?}");
    assert!(logins(401)
        .iter()
        .any(|r| r["client"].as_str().unwrap().starts_with("127.0.0.11:")));
    app.shutdown().await;
}
both_stores!(login_burst, a_burst_of_wrong_passwords_waits);

async fn a_burst_is_an_event_for_the_admin(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    let (status, _) = tina
        .client
        .post("/api/v1/users/me/password", &json!({"password": PASSWORD}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // 20 refused tries within 10 minutes (wrong passwords, then tries during the wait).
    for n in 1..=20u8 {
        let (status, _, body) = try_login(&app, 100 + n, "tina", "wrong horse battery").await;
        let expected = if n <= 5 {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(status, expected, "try {n}: {body}");
        app.advance(chrono::Duration::seconds(1));
    }
    let (status, events) = app.admin().get("/api/v1/events").await;
    assert_eq!(status, StatusCode::OK, "{events}");
    let bursts: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "login_burst")
        .collect();
    assert_eq!(bursts.len(), 1, "{events:#}");
    assert!(bursts[0]["detail"].as_str().unwrap().contains(&tina.id));
    // More tries in the same window raise nothing more; a name that is no user's, nothing.
    for n in 1..=25u8 {
        try_login(&app, 130 + n, "tina", "wrong").await;
        try_login(&app, 160 + n, "nobody", "wrong").await;
    }
    let (_, events) = app.admin().get("/api/v1/events").await;
    let bursts = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "login_burst")
        .count();
    assert_eq!(bursts, 1, "{events:#}");
    app.shutdown().await;
}
both_stores!(login_burst_event, a_burst_is_an_event_for_the_admin);

async fn the_owner_is_never_locked_out_for_good(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    tina.client
        .post("/api/v1/users/me/password", &json!({"password": PASSWORD}))
        .await;
    // An attacker tries whenever a wait ends: the waits grow to 15 minutes and stop there.
    let mut waits = Vec::new();
    for _ in 0..20 {
        let (status, retry, _) = try_login(&app, 2, "tina", "wrong").await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry = retry.unwrap();
            waits.push(retry);
            app.advance(chrono::Duration::seconds(i64::try_from(retry).unwrap()));
        }
    }
    assert!(waits.iter().all(|&w| w <= 900), "{waits:?}");
    assert_eq!(waits.last(), Some(&900), "{waits:?}");
    // The owner, after the wait, gets in.
    let (status, _, body) = try_login(&app, 3, "tina", PASSWORD).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    app.shutdown().await;
}
both_stores!(login_lockout_ends, the_owner_is_never_locked_out_for_good);

async fn failures_of_made_up_names_are_bounded(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    for n in 0..3 {
        let (status, _, _) = try_login(&app, 7, &format!("ghost-{n}"), "wrong").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        app.raw_count("SELECT COUNT(*) FROM login_throttle").await,
        3
    );
    // A day later the maintenance loop has forgotten them.
    app.advance(chrono::Duration::hours(25));
    app.maintenance_tick().await;
    assert_eq!(
        app.raw_count("SELECT COUNT(*) FROM login_throttle").await,
        0
    );
    app.shutdown().await;
}
both_stores!(login_unknown_names, failures_of_made_up_names_are_bounded);
