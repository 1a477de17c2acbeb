//! Sensitive account changes need the password, as a script running with a victim's console
//! session would not have it: with a session older than 5 minutes, adding an SSH key, making
//! a token that never expires and changing the password are refused without it (and with a
//! wrong one), and work with it; a password change ends the user's other sessions and is in
//! the audit trail. Through the API: the rule for login sessions and for API tokens.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::{login, login_with, PASSWORD};

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/ssh/{name}.pub",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

async fn an_old_session_needs_the_password(backend: Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    let console = login(&app, &tina, "tina").await;
    let other = login_with(&app.base, "tina", PASSWORD).await.unwrap();
    app.advance(chrono::Duration::minutes(6));

    // An SSH key: the page asks for the password, and the form without it is refused.
    let page = console.get("/account").await;
    page.assert_has("id=\"key_password\"");
    let key = fixture("ed25519");
    let refused = console
        .post("/account/ssh-keys", &[("public_key", &key)])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.html);
    refused.assert_has("needs your password");
    refused.assert_has("id=\"key_password\"");
    let wrong = console
        .post(
            "/account/ssh-keys",
            &[("public_key", &key), ("password", "not the password")],
        )
        .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    wrong.assert_has("not your current password");
    let (_, keys) = tina.client.get("/api/v1/ssh-keys").await;
    assert_eq!(keys.as_array().unwrap().len(), 0, "{keys}");
    let added = console
        .post(
            "/account/ssh-keys",
            &[("public_key", &key), ("password", PASSWORD)],
        )
        .await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.html);
    let (_, keys) = tina.client.get("/api/v1/ssh-keys").await;
    assert_eq!(keys.as_array().unwrap().len(), 1, "{keys}");

    // A token that never expires: not without the password, then with it.
    let refused = console
        .post("/account/tokens", &[("name", "ci"), ("password", "")])
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    let made = console
        .post("/account/tokens", &[("name", "ci"), ("password", PASSWORD)])
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.html);
    made.assert_has("data-field=\"new-token\"");

    // The password: never without the current one, however fresh the login.
    let fresh = login_with(&app.base, "tina", PASSWORD).await.unwrap();
    let change = |current: &'static str| {
        vec![
            ("current_password", current),
            ("password", "a new console password"),
            ("repeat", "a new console password"),
        ]
    };
    let refused = fresh.post("/account/password", &change("")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.html);
    refused.assert_has("current_password");
    let wrong = console
        .post("/account/password", &change("not the password"))
        .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    wrong.assert_has("not your current password");
    let changed = console.post("/account/password", &change(PASSWORD)).await;
    assert_eq!(changed.status, StatusCode::SEE_OTHER, "{}", changed.html);

    // The other sessions have ended: their cookies get the login page; this one goes on.
    for ended in [&other, &fresh] {
        let page = ended.get("/account").await;
        assert_eq!(page.status, StatusCode::SEE_OTHER);
        assert!(
            page.location().unwrap_or("").starts_with("/login"),
            "{:?}",
            page.location()
        );
    }
    assert_eq!(console.get("/account").await.status, StatusCode::OK);
    // API tokens made deliberately stay.
    assert_eq!(tina.client.get("/api/v1/balance").await.0, StatusCode::OK);

    // In the audit trail: the change, by tina.
    let (status, page) = app
        .admin()
        .get(&format!("/api/v1/audit?user={}&limit=1000", tina.id))
        .await;
    assert_eq!(status, StatusCode::OK);
    let records = page["records"].as_array().unwrap();
    assert!(
        records
            .iter()
            .any(|r| r["action"] == "POST /api/v1/users/{id}/password"
                && r["outcome"] == 204
                && r["user_id"] == json!(tina.id)),
        "{records:#?}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["action"] == "POST /api/v1/users/{id}/password" && r["outcome"] == 403),
        "the refused ones too: {records:#?}"
    );
    app.shutdown().await;
}
both_stores!(console_reauth, an_old_session_needs_the_password);

async fn the_api_rule_for_sessions_and_tokens(backend: Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    // The first password needs none (there is none yet), but one given must still be one
    // the schema allows; the next needs the current one, even with an API token.
    let (status, body) = tina
        .client
        .post(
            "/api/v1/users/me/password",
            &json!({"password": PASSWORD, "current_password": ""}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("current_password")),
        "{body}"
    );
    let (status, body) = tina
        .client
        .post("/api/v1/users/me/password", &json!({"password": PASSWORD}))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = tina
        .client
        .post(
            "/api/v1/users/me/password",
            &json!({"password": "another password"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "password_required");
    let (status, body) = tina
        .client
        .post(
            "/api/v1/users/me/password",
            &json!({"password": "another password", "current_password": "wrong one"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "wrong_password");

    // A login session (`gpurent login`) adds a key at once, but not 5 minutes later.
    let (status, session) = app
        .anonymous()
        .post(
            "/api/v1/login",
            &json!({"name": "tina", "password": PASSWORD}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{session}");
    let session = app.client(session["token"].as_str());
    let (status, body) = session
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": fixture("ed25519")}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.advance(chrono::Duration::minutes(5));
    let key = fixture("ecdsab256");
    let (status, body) = session
        .post("/api/v1/ssh-keys", &json!({"public_key": key}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "password_required");
    let (status, body) = session
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": key, "password": PASSWORD}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // An API token made deliberately is no ambient credential: no password needed.
    let (status, body) = tina
        .client
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": fixture("rsab3072")}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // Wrong current passwords count toward the login throttle: a stolen session cannot
    // guess the password either.
    for _ in 0..5 {
        session
            .post(
                "/api/v1/users/me/password",
                &json!({"password": "another password", "current_password": "guess"}),
            )
            .await;
    }
    let (status, body) = session
        .post(
            "/api/v1/users/me/password",
            &json!({"password": "another password", "current_password": PASSWORD}),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    app.shutdown().await;
}
both_stores!(api_reauth, the_api_rule_for_sessions_and_tokens);
