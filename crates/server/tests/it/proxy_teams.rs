//! A team's published ports: its members whose role may enter its instances reach them by
//! bearer token (their own, or one bound to the team with `ssh`) and may make links to them;
//! a viewer, a token without `ssh` or bound to another team, an admin, a stranger and a
//! member once removed get the same 404 as for a port that does not exist.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::proxy_support::{setup, user, APP_PORT};

async fn token(s: &crate::proxy_support::Setup, of: &str, body: Value) -> String {
    let (status, t) = s.app.client(Some(of)).post("/api/v1/tokens", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    t["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_teams_members_reach_its_apps() {
    let s = setup(Backend::Sqlite, None).await;
    let mia = user(&s.app, "mia").await;
    let vic = user(&s.app, "vic").await;
    let olga = s.owner_client();
    let members = [("mia", "member"), ("vic", "viewer")];
    s.app.team(&olga, "lab", &members, "20").await;
    s.app.team(&olga, "other", &members, "0").await;
    let (status, r) = s
        .app
        .client(Some(&mia))
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab",
                        "http_ports": [APP_PORT]}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    s.app
        .wait_status(&s.app.client(Some(&mia)), &rid, "running")
        .await;
    let path = format!("/proxy/{rid}/{APP_PORT}/x");
    let reach = |bearer: String| {
        let request = s.http.get(s.url(&path)).bearer_auth(bearer);
        async move { request.send().await.unwrap().status() }
    };

    let bound_ssh = token(
        &s,
        &mia,
        json!({"team": "lab", "scopes": ["ssh"], "expires_in_days": 1}),
    )
    .await;
    let bound_read = token(
        &s,
        &mia,
        json!({"team": "lab", "scopes": ["read"], "expires_in_days": 1}),
    )
    .await;
    let elsewhere = token(
        &s,
        &mia,
        json!({"team": "other", "scopes": ["ssh"], "expires_in_days": 1}),
    )
    .await;
    for (who, bearer, expected) in [
        ("a member", mia.clone(), StatusCode::OK),
        ("the team's owner", s.owner.clone(), StatusCode::OK),
        (
            "a member's token bound to the team",
            bound_ssh.clone(),
            StatusCode::OK,
        ),
        (
            "a member's token without ssh",
            bound_read,
            StatusCode::NOT_FOUND,
        ),
        (
            "a token bound to another team",
            elsewhere,
            StatusCode::NOT_FOUND,
        ),
        ("a viewer", vic.clone(), StatusCode::NOT_FOUND),
        ("a stranger", s.stranger.clone(), StatusCode::NOT_FOUND),
        (
            "an admin",
            "gpr_test_admin".to_owned(),
            StatusCode::NOT_FOUND,
        ),
    ] {
        assert_eq!(reach(bearer).await, expected, "{who}");
    }

    // Links: a member makes one; a viewer is told there is no such reservation.
    let links = format!("/api/v1/reservations/{rid}/proxy-links");
    let (status, link) = s
        .app
        .client(Some(&mia))
        .post(&links, &json!({"port": APP_PORT}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{link}");
    let (status, _) = s
        .app
        .client(Some(&vic))
        .post(&links, &json!({"port": APP_PORT}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Removed from the team: at once, nothing of hers gets in.
    let (status, _, _) = olga
        .send("DELETE", "/api/v1/teams/lab/members/mia", None)
        .await;
    assert!(status.is_success(), "{status}");
    for (who, bearer) in [("her own token", mia), ("her bound token", bound_ssh)] {
        assert_eq!(reach(bearer).await, StatusCode::NOT_FOUND, "{who}");
    }
    s.app.shutdown().await;
}
