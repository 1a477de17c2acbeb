//! Scoped tokens, on both stores: a token does only what its scopes cover (a 403 naming what it
//! lacks), never mints a wider one, and a token bound to a team reserves for that team and sees
//! only its reservations, within what its maker's role there allows, for as long as they are a
//! member.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

/// A token made with `client`'s, valid a day, with this body's scopes and team.
async fn token(app: &TestApp, client: &Client, body: Value) -> (StatusCode, Value, Client) {
    let mut body = body;
    body["expires_in_days"] = json!(1);
    let (status, made) = client.post("/api/v1/tokens", &body).await;
    let scoped = app.client(made["token"].as_str());
    (status, made, scoped)
}

async fn tokens_do_what_their_scopes_cover(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let olga = app.tenant("olga", "100").await;
    let mia = app.tenant("mia", "10").await;
    let vic = app.tenant("vic", "0").await;
    let (status, _) = olga
        .client
        .post("/api/v1/teams", &json!({"name": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for (user, role) in [("mia", "member"), ("vic", "viewer")] {
        let (status, _, body) = olga
            .client
            .send(
                "PUT",
                &format!("/api/v1/teams/lab/members/{user}"),
                Some(&json!({ "role": role })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (_, moved) = olga
        .client
        .post("/api/v1/teams/lab/credit", &json!({"amount": "50"}))
        .await;
    assert_eq!(moved["team_balance"], "50.00", "{moved}");

    // A read-only token reads, and does nothing else.
    let (status, made, reader) = token(&app, &olga.client, json!({"scopes": ["read"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["scopes"], json!(["read"]));
    let (status, _) = reader.get("/api/v1/reservations").await;
    assert_eq!(status, StatusCode::OK);
    let (status, refused) = reader
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused.to_string().contains("do not include reserve"),
        "{refused}"
    );
    let (status, refused) = reader.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "billing: {refused}");
    let (status, refused) = reader
        .post(
            "/api/v1/ssh-keys",
            &json!({"public_key": "ssh-ed25519 AAAA x"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.to_string().contains("without scopes"), "{refused}");
    // It never mints a wider token; a narrower or equal one, yes.
    let (status, refused, _) = token(&app, &reader, json!({"scopes": ["read", "reserve"]})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused.to_string().contains("cannot hold more"),
        "{refused}"
    );
    let (status, refused, _) = token(&app, &reader, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "inherits read only: {refused}");
    assert_eq!(refused["scopes"], json!(["read"]));
    let (status, bad, _) = token(&app, &olga.client, json!({"scopes": []})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    let (status, bad, _) = token(&app, &olga.client, json!({"scopes": ["root"]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");

    // mia's CI token for the lab: it reserves for the lab without naming it, and sees only
    // the lab's reservations.
    let (status, own) = mia
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{own}");
    let (status, made, ci) = token(
        &app,
        &mia.client,
        json!({"team": "lab", "scopes": ["reserve", "read"], "name": "ci"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (status, r) = ci.reserve(json!({"gpu_type": "rtx4090", "hours": 1})).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["team"], "lab", "{r}");
    let (_, listed) = ci.get("/api/v1/reservations").await;
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [r["id"].as_str().unwrap()], "only the lab's");
    let (status, _) = ci
        .get(&format!(
            "/api/v1/reservations/{}",
            own["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "mia's own is not the lab's");
    // Bound to the lab, it reaches nothing of mia's own account, and sees only the lab.
    // Its volumes are the lab's (none), not mia's.
    let (status, volumes) = ci.get("/api/v1/volumes").await;
    assert_eq!((status, volumes), (StatusCode::OK, json!([])));
    for (method, path) in [("GET", "/api/v1/balance"), ("GET", "/api/v1/ssh-keys")] {
        let (status, _, refused) = ci.send(method, path, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {refused}");
        assert!(refused.to_string().contains("bound to a team"), "{refused}");
    }
    let (status, _, refused) = ci
        .send(
            "POST",
            "/api/v1/ssh-keys",
            Some(&json!({"public_key": "ssh-ed25519 AAAA x"})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (status, used) = ci.get("/api/v1/usage").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "no billing scope: {used}");
    // Another team through it: unknown to it.
    let (status, _) = mia
        .client
        .post("/api/v1/teams", &json!({"name": "side"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, refused) = ci
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "side"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{refused}");
    let (status, refused, _) = token(&app, &ci, json!({"team": "side"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{refused}");

    let (_, teams) = ci.get("/api/v1/teams").await;
    assert_eq!(
        teams.as_array().map(Vec::len),
        Some(1),
        "only the lab: {teams}"
    );
    let (status, _) = ci.get("/api/v1/teams/side").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A viewer's token for the lab holds no more than a viewer may.
    let (status, refused, _) = token(
        &app,
        &vic.client,
        json!({"team": "lab", "scopes": ["reserve"]}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.to_string().contains("viewer"), "{refused}");
    let (status, viewed, books) = token(
        &app,
        &vic.client,
        json!({"team": "lab", "scopes": ["read", "billing"]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{viewed}");
    // Its statements are the lab's by default.
    let (status, used) = books.get("/api/v1/usage").await;
    assert_eq!(status, StatusCode::OK, "{used}");
    assert_eq!(used["user_id"], viewed["team_id"], "{used}");
    // An outsider's token for the lab: the lab is unknown to them.
    let eve = app.tenant("eve", "1").await;
    let (status, _, _) = token(&app, &eve.client, json!({"team": "lab"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // mia leaves the lab: her lab token reserves no more.
    let (status, _, _) = olga
        .client
        .send("DELETE", "/api/v1/teams/lab/members/mia", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, refused) = ci.reserve(json!({"gpu_type": "rtx4090", "hours": 1})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused.to_string().contains("no longer a member"),
        "{refused}"
    );
    let (status, refused) = ci.get("/api/v1/reservations").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "nor reads the lab: {refused}"
    );
    let (status, _) = ci.get("/api/v1/teams").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    app.shutdown().await;
}

both_stores!(
    tokens_do_what_their_scopes_cover_on,
    tokens_do_what_their_scopes_cover
);
