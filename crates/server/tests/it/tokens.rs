//! Passwords, logins and tokens: expiring and revoked tokens get 401s that say which, and a
//! wrong password looks exactly like an unknown user.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn tokens_expire_and_are_revoked(backend: Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    let (status, _, made) = tina
        .client
        .send(
            "POST",
            "/api/v1/tokens",
            Some(&json!({"expires_in_days": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert!(made["token"].as_str().unwrap().starts_with("gpr_"));
    assert!(made["expires_at"].is_string());
    let short = app.client(made["token"].as_str());
    let (status, _) = short.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::OK);

    let (_, _, forever) = tina
        .client
        .send(
            "POST",
            "/api/v1/tokens",
            Some(&json!({"expires_in_days": 30})),
        )
        .await;
    let forever_client = app.client(forever["token"].as_str());

    app.advance(chrono::Duration::hours(25));
    let (status, body) = short.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );
    let (status, _) = forever_client.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::OK);

    // Revoked by its owner: 401 saying so; revoking again keeps the first time.
    let id = forever["id"].as_str().unwrap();
    let (status, _, revoked) = tina
        .client
        .send("DELETE", &format!("/api/v1/tokens/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert!(revoked["revoked_at"].is_string());
    let (status, body) = forever_client.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("revoked"),
        "{body}"
    );
    let (_, _, again) = tina
        .client
        .send("DELETE", &format!("/api/v1/tokens/{id}"), None)
        .await;
    assert_eq!(again["revoked_at"], revoked["revoked_at"]);

    // An admin revokes anyone's; the list shows them all, never a secret.
    let (_, _, listed) = tina.client.send("GET", "/api/v1/tokens", None).await;
    let listed = listed.as_array().unwrap().clone();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|t| t.get("token").is_none()));
    let first = listed
        .iter()
        .find(|t| t["revoked_at"].is_null() && t["expires_at"].is_null() && t["kind"] == "api")
        .unwrap();
    let (status, _, _) = app
        .admin()
        .send(
            "DELETE",
            &format!("/api/v1/tokens/{}", first["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = tina.client.get("/api/v1/balance").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "tina's first token is revoked"
    );

    let (status, _, body) = app
        .admin()
        .send(
            "POST",
            "/api/v1/tokens",
            Some(&json!({"expires_in_days": 0})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("expires_in_days"));

    // A month after they died, expired and revoked tokens are forgotten.
    app.advance(chrono::Duration::days(31));
    app.maintenance_tick().await;
    let (_, _, all) = app.admin().send("GET", "/api/v1/tokens", None).await;
    let all = all.as_array().unwrap();
    assert!(
        all.iter().all(|t| t["user_id"] != json!(tina.id)),
        "{all:?}"
    );
    assert_eq!(all.len(), 1, "the admin's own token stays: {all:?}");
    app.shutdown().await;
}
both_stores!(expiry_and_revocation, tokens_expire_and_are_revoked);

async fn passwords_log_in_for_a_session(backend: Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    let login = |name: &str, password: &str| json!({"name": name, "password": password});

    // Without a password nobody logs in as tina.
    let (status, _, none) = app
        .anonymous()
        .send("POST", "/api/v1/login", Some(&login("tina", "whatever1")))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, _, short) = tina
        .client
        .send(
            "POST",
            "/api/v1/users/me/password",
            Some(&json!({"password": "short"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(short["error"]["message"]
        .as_str()
        .unwrap()
        .contains("password"));
    let (status, _, _) = tina
        .client
        .send(
            "POST",
            &format!("/api/v1/users/{}/password", tina.id),
            Some(&json!({"password": "correct horse battery"})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let (status, _, wrong) = app
        .anonymous()
        .send(
            "POST",
            "/api/v1/login",
            Some(&login("tina", "wrong horse battery")),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, unknown) = app
        .anonymous()
        .send(
            "POST",
            "/api/v1/login",
            Some(&login("nobody", "wrong horse battery")),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong, unknown,
        "a wrong password and an unknown user look the same"
    );
    assert_eq!(wrong, none);

    let (status, _, session) = app
        .anonymous()
        .send(
            "POST",
            "/api/v1/login",
            Some(&login("tina", "correct horse battery")),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{session}");
    assert_eq!(session["user_id"], json!(tina.id));
    let console = app.client(session["token"].as_str());
    let (status, _) = console.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::OK);

    // An admin sets anyone's password, which ends the user's sessions at once.
    let (status, _, _) = app
        .admin()
        .send(
            "POST",
            &format!("/api/v1/users/{}/password", tina.id),
            Some(&json!({"password": "another long one"})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = console.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("revoked"),
        "{body}"
    );
    // A session ends after 12 hours.
    let (status, _, session) = app
        .anonymous()
        .send(
            "POST",
            "/api/v1/login",
            Some(&login("tina", "another long one")),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{session}");
    let console = app.client(session["token"].as_str());
    app.advance(chrono::Duration::hours(12) + chrono::Duration::seconds(1));
    let (status, body) = console.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );
    app.shutdown().await;
}
both_stores!(logins, passwords_log_in_for_a_session);
