//! SSH public keys through the API: the kinds accepted, fingerprints as `ssh-keygen -lf`
//! prints them, a 422 that says why for anything else, and each user's keys their own.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/ssh/{name}.pub",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The fingerprint `ssh-keygen -lf` printed for the fixture with this comment.
fn ssh_keygen(comment: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/ssh/ssh-keygen-lf.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .find(|l| l.contains(&format!(" {comment} ")))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .to_owned()
}

async fn keys_are_added_listed_and_removed(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let ada = app.tenant("ada", "10").await;
    let bob = app.tenant("bob", "10").await;

    let (status, ed) = ada
        .client
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": fixture("ed25519")}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ed}");
    assert_eq!(ed["fingerprint"], ssh_keygen("test@ed25519"));
    assert_eq!(ed["name"], "test@ed25519", "the comment names it");
    assert_eq!(ed["algorithm"], "ssh-ed25519");
    let (status, rsa) = ada
        .client
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": fixture("rsab3072"), "name": "laptop"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{rsa}");
    assert_eq!(rsa["name"], "laptop");
    assert_eq!(rsa["fingerprint"], ssh_keygen("test@rsab3072"));
    for name in ["ecdsab256", "ecdsab384", "ecdsab521"] {
        let (status, body) = ada
            .client
            .post("/api/v1/ssh-keys", &json!({"public_key": fixture(name)}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{name}: {body}");
        assert_eq!(body["fingerprint"], ssh_keygen(&format!("test@{name}")));
    }

    // Refused, each saying why.
    let cases = [
        (json!({"public_key": fixture("rsab2048")}), "3072"),
        (json!({"public_key": fixture("dsa")}), "ssh-dss"),
        (
            json!({"public_key": "ssh-ed25519 AAAA"}),
            "OpenSSH public key",
        ),
        (json!({"public_key": ""}), "one key"),
        (
            json!({"public_key": format!("{}{}", fixture("ed25519"), fixture("rsab3072"))}),
            "one key",
        ),
        (json!({"public_key": fixture("ed25519")}), "added already"),
        (
            json!({"public_key": fixture("ed25519").replace("test@ed25519", "other comment")}),
            "added already",
        ),
        (
            json!({"public_key": fixture("rsab3072"), "name": "a\u{1b}[2Jb"}),
            "name",
        ),
    ];
    for (body, why) in cases {
        let (status, answer) = ada.client.post("/api/v1/ssh-keys", &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{body}: {answer}");
    }

    // The same key may be another user's too; lists are each user's own.
    let (status, bobs) = bob
        .client
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": fixture("ed25519")}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{bobs}");
    let (_, listed) = ada.client.get("/api/v1/ssh-keys").await;
    assert_eq!(listed.as_array().unwrap().len(), 5, "{listed}");
    let (_, listed) = bob.client.get("/api/v1/ssh-keys").await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let (_, all) = app.admin().get("/api/v1/ssh-keys").await;
    assert_eq!(all.as_array().unwrap().len(), 6, "{all}");

    // Another user's key id is a 404, as one that does not exist.
    let ed_id = ed["id"].as_str().unwrap();
    let (status, _, _) = bob
        .client
        .send("DELETE", &format!("/api/v1/ssh-keys/{ed_id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, removed) = ada
        .client
        .send("DELETE", &format!("/api/v1/ssh-keys/{ed_id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(removed["fingerprint"], ed["fingerprint"]);
    let (status, _, _) = ada
        .client
        .send("DELETE", &format!("/api/v1/ssh-keys/{ed_id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, listed) = ada.client.get("/api/v1/ssh-keys").await;
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    // Removed, it may be added again.
    let (status, _) = ada
        .client
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": fixture("ed25519")}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    app.shutdown().await;
}
both_stores!(ssh_keys_api, keys_are_added_listed_and_removed);
