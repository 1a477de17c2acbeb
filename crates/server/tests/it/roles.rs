//! Changing a user's role (`PATCH /api/v1/users/{id}` with `role`, the admin's users page):
//! it takes effect on the user's next request, and the last admin cannot lose its role.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;
use crate::console_support::login_admin;

async fn roles_change_and_the_last_admin_keeps_its_own(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let admin = app.admin();
    let hank = app.user("hank", "host", "0").await;
    // A host makes join tokens; demoted to tenant, the same token no longer may.
    let (status, _) = hank
        .client
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, user) = admin
        .patch(
            &format!("/api/v1/users/{}", hank.id),
            &json!({"role": "tenant"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{user}");
    assert_eq!(user["role"], "tenant");
    let (status, _) = hank
        .client
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Not a role.
    let (status, body) = admin
        .patch(
            &format!("/api/v1/users/{}", hank.id),
            &json!({"role": "root"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    // Two admins: the first may step down; then the other is the last and may not.
    let (_, users) = admin.get("/api/v1/users").await;
    let first = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["role"] == "admin")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = admin
        .patch(
            &format!("/api/v1/users/{}", hank.id),
            &json!({"role": "admin"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = hank
        .client
        .patch(
            &format!("/api/v1/users/{first}"),
            &json!({"role": "tenant"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = hank
        .client
        .patch(
            &format!("/api/v1/users/{}", hank.id),
            &json!({"role": "host"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("only admin"),
        "{body}"
    );
    let (_, me) = hank.client.get(&format!("/api/v1/users/{}", hank.id)).await;
    assert_eq!(me["role"], "admin");
    // An unknown user.
    let (status, _) = hank
        .client
        .patch(
            "/api/v1/users/00000000000000000000000000000000",
            &json!({"role": "host"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.shutdown().await;
}
both_stores!(api, roles_change_and_the_last_admin_keeps_its_own);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_page_changes_a_role_and_sets_a_password() {
    let app = TestApp::with(Backend::Sqlite).start().await;
    let tina = app.tenant("tina", "0").await;
    let console = login_admin(&app).await;
    let page = console.get("/admin/users").await;
    assert!(
        page.html.contains(&format!("id=\"role-{}\"", tina.id)),
        "a role field per user"
    );
    let done = console
        .post(
            &format!("/admin/users/{}/limits", tina.id),
            &[("role", "host")],
        )
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.html);
    let (_, user) = app.admin().get(&format!("/api/v1/users/{}", tina.id)).await;
    assert_eq!(user["role"], "host");
    let bad = console
        .post(
            &format!("/admin/users/{}/limits", tina.id),
            &[("role", "root")],
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    // The admin gives the user a password from its row; the user then logs in with it.
    let short = console
        .post(
            &format!("/admin/users/{}/password", tina.id),
            &[("password", "short")],
        )
        .await;
    assert_eq!(
        short.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        short.html
    );
    let set = console
        .post(
            &format!("/admin/users/{}/password", tina.id),
            &[("password", crate::console_support::PASSWORD)],
        )
        .await;
    assert_eq!(set.status, StatusCode::SEE_OTHER, "{}", set.html);
    let tinas =
        crate::console_support::login_with(&app.base, "tina", crate::console_support::PASSWORD)
            .await
            .expect("tina logs in with the password the admin set");
    assert_eq!(
        tinas.get("/").await.location(),
        Some("/nodes"),
        "tina is a host now"
    );
    app.shutdown().await;
}
