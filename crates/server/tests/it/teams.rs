//! Teams through the API, on both stores, with a real agent: a team's shared balance filled by
//! an owner's move of credit (never more than they hold), a reservation made for it and paid
//! from it to the second, seen by its members, stopped by a member and not a viewer, invisible
//! to others; roles enforced on its members (an admin below owner, the last owner kept).

use chrono::Duration;
use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;

/// `PUT .../members/USER` as `client`: its status and answer.
async fn set_role(client: &Client, user: &str, role: &str) -> (StatusCode, Value) {
    let path = format!("/api/v1/teams/lab/members/{user}");
    let (status, _, body) = client
        .send("PUT", &path, Some(&json!({ "role": role })))
        .await;
    (status, body)
}

/// `DELETE .../members/USER` as `client`.
async fn remove(client: &Client, user: &str) -> (StatusCode, Value) {
    let path = format!("/api/v1/teams/lab/members/{user}");
    let (status, _, body) = client.send("DELETE", &path, None).await;
    (status, body)
}

async fn a_team_shares_its_balance_and_its_roles_hold(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let olga = app.tenant("olga", "100").await;
    let mia = app.tenant("mia", "0").await;
    let vic = app.tenant("vic", "0").await;
    let eve = app.tenant("eve", "50").await;

    let (status, team) = olga
        .client
        .post("/api/v1/teams", &json!({"name": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{team}");
    assert_eq!(
        (team["role"].as_str(), team["balance"].as_str()),
        (Some("owner"), Some("0.00"))
    );
    let team_id = team["id"].as_str().unwrap().to_owned();
    // Names are unique among users and teams; a bad name says why.
    let (status, taken) = eve
        .client
        .post("/api/v1/teams", &json!({"name": "olga"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{taken}");
    let (status, bad) = eve
        .client
        .post("/api/v1/teams", &json!({"name": "a b"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");

    for (user, role) in [("mia", "member"), ("vic", "viewer")] {
        let (status, m) = set_role(&olga.client, user, role).await;
        assert_eq!(status, StatusCode::OK, "{m}");
        assert_eq!(m["role"], role);
    }
    let (status, unknown) = set_role(&olga.client, "nobody", "member").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{unknown}");
    // A member may not manage members; an outsider does not see the team at all.
    let (status, refused) = set_role(&mia.client, "eve", "member").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.to_string().contains("admin or above"), "{refused}");
    let (status, _) = eve.client.get("/api/v1/teams/lab").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, listed) = eve.client.get("/api/v1/teams").await;
    assert_eq!(listed, json!([]));
    let (_, listed) = vic.client.get("/api/v1/teams").await;
    assert_eq!(listed[0]["role"], "viewer", "{listed}");

    // Credit moves in from an owner's own balance, never more than it holds.
    let (status, short) = olga
        .client
        .post("/api/v1/teams/lab/credit", &json!({"amount": "100.01"}))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{short}");
    let (status, moved) = olga
        .client
        .post_with_key(
            "/api/v1/teams/lab/credit",
            &json!({"amount": "40"}),
            "move-1",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(
        (moved["balance"].as_str(), moved["team_balance"].as_str()),
        (Some("60.00"), Some("40.00"))
    );
    // Retried with its key: moved once.
    let (_, again) = olga
        .client
        .post_with_key(
            "/api/v1/teams/lab/credit",
            &json!({"amount": "40"}),
            "move-1",
        )
        .await;
    assert_eq!(again["team_balance"], "40.00", "{again}");
    let (status, _) = mia
        .client
        .post("/api/v1/teams/lab/credit", &json!({"amount": "1"}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a member moves no credit in");

    // mia (no credit of her own) reserves for the team: it pays.
    let (status, r) = mia
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(
        (r["team"].as_str(), r["tenant_id"].as_str()),
        (Some("lab"), Some(team_id.as_str()))
    );
    let id = r["id"].as_str().unwrap().to_owned();
    let (status, _) = vic
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab"}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a viewer does not reserve");
    let (status, _) = eve
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab"}))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "an outsider's team is unknown"
    );
    let running = app.wait_status(&mia.client, &id, "running").await;
    assert_eq!(running["created_by"], mia.id.as_str());

    // Seen by its members, viewer included; not by others.
    let path = format!("/api/v1/reservations/{id}");
    for member in [&olga, &vic] {
        let (status, seen) = member.client.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{seen}");
        assert_eq!(seen["team"], "lab");
        let (_, listed) = member.client.get("/api/v1/reservations").await;
        assert!(listed.to_string().contains(&id), "{listed}");
    }
    let (status, _) = eve.client.get(&path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, listed) = eve.client.get("/api/v1/reservations").await;
    assert!(!listed.to_string().contains(&id), "{listed}");

    // A viewer may not stop it; a member may. Charged to the team, to the second.
    app.advance(Duration::seconds(90));
    let stop = format!("{path}/stop");
    let (status, refused) = vic.client.post(&stop, &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(refused.to_string().contains("viewer"), "{refused}");
    let (status, _) = eve.client.post(&stop, &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = olga.client.post(&stop, &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let done = app.wait_status(&mia.client, &id, "stopped").await;
    assert_eq!(done["charged"], "0.0625", "90 s at 2.50/h: {done}");
    let (_, lab) = olga.client.get("/api/v1/teams/lab").await;
    assert_eq!(lab["balance"], "39.9375", "{lab}");
    // Its statements, to its members (a viewer too), by its id; not to others.
    let usage = format!("/api/v1/usage?user_id={team_id}");
    let (status, used) = vic.client.get(&usage).await;
    assert_eq!(status, StatusCode::OK, "{used}");
    assert_eq!(used["total"], "0.0625", "{used}");
    let (status, _) = eve.client.get(&usage).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, mia_balance) = mia.client.get("/api/v1/balance").await;
    assert_eq!(
        mia_balance["balance"], "0.00",
        "mia paid nothing: {mia_balance}"
    );

    // Its members: the last owner stays; an admin manages below owner only.
    let names = |team: &Value| -> Vec<(String, String)> {
        team["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap().into(),
                    m["role"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    assert_eq!(
        names(&lab),
        [("olga", "owner"), ("mia", "member"), ("vic", "viewer")]
            .map(|(n, r)| (n.to_owned(), r.to_owned()))
    );
    let (status, last) = remove(&olga.client, "olga").await;
    assert_eq!(status, StatusCode::CONFLICT, "{last}");
    assert!(last.to_string().contains("at least one owner"), "{last}");
    let (status, _) = set_role(&olga.client, "olga", "admin").await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the last owner is not demoted"
    );
    let (status, _) = set_role(&olga.client, "mia", "admin").await;
    assert_eq!(status, StatusCode::OK);
    let (status, refused) = set_role(&mia.client, "vic", "owner").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "an admin makes no owner: {refused}"
    );
    let (status, refused) = remove(&mia.client, "olga").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "an admin removes no owner: {refused}"
    );
    let (status, _) = remove(&mia.client, "vic").await;
    assert_eq!(status, StatusCode::OK, "an admin removes a viewer");
    let (status, _) = vic.client.get(&path).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "gone with the membership");
    // Anyone may leave.
    let (status, _) = remove(&mia.client, "mia").await;
    assert_eq!(status, StatusCode::OK);
    // A team is not a user: not listed as one, and nobody signs in as it.
    let (_, users) = app.admin().get("/api/v1/users").await;
    assert!(!users.to_string().contains("\"lab\""), "{users}");
    app.assert_consistent().await;
    app.shutdown().await;
}

both_stores!(
    a_team_shares_its_balance_and_its_roles_hold_on,
    a_team_shares_its_balance_and_its_roles_hold
);
