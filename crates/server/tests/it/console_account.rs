//! The console's account page: SSH keys added from the form and removed, API tokens made with
//! the password and shown once (on the page answering the form, in no URL) that then work
//! against the API, revoked from the page, and a new password that logs in; forms without
//! their CSRF token are refused; revoking the session in use logs out; in Chinese too.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::{assert_translated, login, PASSWORD};

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/ssh/{name}.pub",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text of the element with `data-field="NAME"`'s first `code` inside it.
fn field_code(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("data-field=\"{name}\""))
        .unwrap_or_else(|| panic!("no {name} in {html}"));
    let rest = &html[at..];
    let start = rest.find('>').unwrap() + 1;
    rest[start..].split('<').next().unwrap().to_owned()
}

async fn account_page_keys_tokens_and_password(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let tina = app.tenant("tina", "10").await;
    let console = login(&app, &tina, "tina").await;
    let page = console.get("/account").await;
    assert_eq!(page.status, StatusCode::OK);
    page.assert_has("data-form=\"ssh-key\"");
    page.assert_has("data-form=\"token\"");
    page.assert_has("data-form=\"password\"");

    // SSH keys: added from the textarea, listed with the API's fingerprint, removed.
    let added = console
        .post(
            "/account/ssh-keys",
            &[("public_key", &fixture("ed25519")), ("name", "laptop")],
        )
        .await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.html);
    assert_eq!(added.location().unwrap_or(""), "/account?done=key");
    let (_, keys) = tina.client.get("/api/v1/ssh-keys").await;
    let key = &keys[0];
    assert_eq!(key["name"], "laptop");
    let page = console.get("/account?done=key").await;
    page.assert_has(&format!(
        "data-ssh-key-id=\"{}\"",
        key["id"].as_str().unwrap()
    ));
    page.assert_has(key["fingerprint"].as_str().unwrap());
    page.assert_has("data-confirm=");
    // A key the API refuses: the form again, with why, and the text kept.
    let refused = console
        .post("/account/ssh-keys", &[("public_key", &fixture("dsa"))])
        .await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    refused.assert_has("role=\"alert\"");
    refused.assert_has("ssh-dss");
    let forged = console
        .post_raw(
            "/account/ssh-keys",
            &[("public_key", &fixture("ecdsab256"))],
            &[],
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let (_, keys) = tina.client.get("/api/v1/ssh-keys").await;
    assert_eq!(keys.as_array().unwrap().len(), 1, "{keys}");
    let removed = console
        .post(
            &format!("/account/ssh-keys/{}/remove", key["id"].as_str().unwrap()),
            &[],
        )
        .await;
    assert_eq!(removed.status, StatusCode::SEE_OTHER);
    let (_, keys) = tina.client.get("/api/v1/ssh-keys").await;
    assert_eq!(keys, json!([]));

    // A token: shown once on the answer, never in its URL, and it works.
    let made = console
        .post(
            "/account/tokens",
            &[
                ("name", "ci"),
                ("expires_in_days", "7"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.html);
    assert!(made.location().is_none());
    let token = field_code(&made.html, "token");
    assert!(token.starts_with("gpr_"), "{token}");
    made.assert_has(&format!("data-copy=\"{token}\""));
    let (status, me) = app
        .client(Some(&token))
        .get(&format!("/api/v1/users/{}", tina.id))
        .await;
    assert_eq!(status, StatusCode::OK, "{me}");
    let again = console.get("/account").await;
    assert!(!again.html.contains(&token), "the token is shown only once");
    let (_, tokens) = tina.client.get("/api/v1/tokens").await;
    let ci = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci")
        .unwrap()
        .clone();
    let ci_id = ci["id"].as_str().unwrap();
    again.assert_has(&format!("data-token-id=\"{ci_id}\""));
    assert!(ci["expires_at"].is_string(), "{ci}");
    // Without the password the token would die with this login: refused with why.
    let unbound = console
        .post("/account/tokens", &[("name", "x"), ("password", "")])
        .await;
    assert_eq!(unbound.status, StatusCode::UNPROCESSABLE_ENTITY);
    unbound.assert_has("outlives this login session");
    let wrong = console
        .post("/account/tokens", &[("password", "not the password")])
        .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    wrong.assert_has("not your current password");
    let revoked = console
        .post(&format!("/account/tokens/{ci_id}/revoke"), &[])
        .await;
    assert_eq!(revoked.status, StatusCode::SEE_OTHER);
    let (status, _) = app
        .client(Some(&token))
        .get(&format!("/api/v1/users/{}", tina.id))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked token");
    // Another tenant's token id is not found.
    let other = app.tenant("otto", "1").await;
    let (_, theirs) = other.client.get("/api/v1/tokens").await;
    let theirs = theirs[0]["id"].as_str().unwrap();
    let foreign = console
        .post(&format!("/account/tokens/{theirs}/revoke"), &[])
        .await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);

    // The password: both fields must match; then the new one logs in.
    let differ = console
        .post(
            "/account/password",
            &[
                ("password", "new password one"),
                ("repeat", "new password two"),
            ],
        )
        .await;
    assert_eq!(differ.status, StatusCode::UNPROCESSABLE_ENTITY);
    differ.assert_has("the two passwords differ");
    let short = console
        .post(
            "/account/password",
            &[("password", "short"), ("repeat", "short")],
        )
        .await;
    assert_eq!(short.status, StatusCode::UNPROCESSABLE_ENTITY);
    let changed = console
        .post(
            "/account/password",
            &[
                ("current_password", PASSWORD),
                ("password", "the new console password"),
                ("repeat", "the new console password"),
            ],
        )
        .await;
    assert_eq!(changed.status, StatusCode::SEE_OTHER, "{}", changed.html);
    assert_eq!(changed.location().unwrap_or(""), "/account?done=password");
    let (status, _) = app
        .anonymous()
        .post(
            "/api/v1/login",
            &json!({"name": "tina", "password": "the new console password"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "the new password logs in");
    let (status, _) = app
        .anonymous()
        .post(
            "/api/v1/login",
            &json!({"name": "tina", "password": PASSWORD}),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the old one does not");

    // In Chinese, with a key and a token listed.
    console
        .post("/account/ssh-keys", &[("public_key", &fixture("ed25519"))])
        .await;
    let zh = console.get("/account?lang=zh-CN&done=key").await;
    zh.assert_has("data-ssh-key-id=");
    assert_translated(&zh);
    let made = console
        .post(
            "/account/tokens?lang=zh-CN",
            &[("name", "ci"), ("password", "the new console password")],
        )
        .await;
    assert_translated(&made);

    // Revoking the session in use says so first, and logs out.
    let page = console.get("/account").await;
    let pill = page
        .html
        .find("this session")
        .expect("the session in use is marked");
    let row = page.html[..pill].rfind("data-token-id=\"").unwrap() + 15;
    let session = page.html[row..].split('"').next().unwrap().to_owned();
    let (_, tokens) = tina.client.get("/api/v1/tokens").await;
    let listed = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == session.as_str())
        .unwrap();
    assert_eq!(listed["kind"], "session", "{listed}");
    page.assert_has("This is the session you are using: revoking it logs you out.");
    let out = console
        .post(&format!("/account/tokens/{session}/revoke"), &[])
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    let after = console.get("/account").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    assert!(
        after.location().unwrap_or("").starts_with("/login"),
        "{:?}",
        after.location()
    );
    app.shutdown().await;
}
both_stores!(account_page, account_page_keys_tokens_and_password);
