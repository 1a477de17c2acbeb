//! A team's volumes, on both stores, with a node joined by hand that keeps volumes: members
//! make and grow them (billed to the team), viewers see them, admins and owners remove them;
//! the team's reservations mount them and its members' own reservations do not; a token bound
//! to the team acts on them by default; an outsider's `?team=` is a 404.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

const GB: u64 = 1_000_000_000;

fn mounting(team: Option<&str>) -> Value {
    let mut r = json!({"gpu_type": "rtx4090", "vram_gb": 2, "hours": 1,
           "volumes": [{"volume": "data", "path": "/workspace"}]});
    if let Some(team) = team {
        r["team"] = json!(team);
    }
    r
}

async fn a_teams_volumes_are_its_members_by_role(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (keeper, sync) = app.node_by_hand("keeper").await;
    let mut first = sync.clone();
    first["host"] = json!({"disk_free_mb": 900_000,
        "volumes": {"enforcement": "loop", "free_bytes": 10 * GB, "shared": false}});
    let (status, body) = keeper.post("/api/v1/agent/sync", &first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let olga = app.tenant("olga", "100").await;
    let mia = app.tenant("mia", "100").await;
    let vic = app.tenant("vic", "100").await;
    let sam = app.tenant("sam", "100").await;
    let team = app
        .team(
            &olga.client,
            "lab",
            &[("mia", "member"), ("vic", "viewer")],
            "20",
        )
        .await;

    // A member makes one for the team: the team owns it.
    let body = json!({"name": "data", "size_bytes": GB, "team": "lab"});
    let (status, made) = mia.client.post("/api/v1/volumes", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["owner_id"], team["id"], "{made}");
    // A viewer may not; an outsider is told there is no such team.
    let other = json!({"name": "more", "size_bytes": GB, "team": "lab"});
    let (status, refused) = vic.client.post("/api/v1/volumes", &other).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    let (status, _) = sam.client.post("/api/v1/volumes", &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Seen by the team's members with ?team=, not among anyone's own.
    let (_, listed) = vic.client.get("/api/v1/volumes?team=lab").await;
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let (_, own) = mia.client.get("/api/v1/volumes").await;
    assert_eq!(own, json!([]));
    // A misspelt team is not taken as none.
    let (status, _) = vic.client.get("/api/v1/volumes?tema=lab").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = vic.client.get("/api/v1/volumes/data?team=lab").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = sam.client.get("/api/v1/volumes/data?team=lab").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let grow = json!({"size_bytes": 2 * GB});
    let (status, _, _) = vic
        .client
        .send("PATCH", "/api/v1/volumes/data?team=lab", Some(&grow))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A token bound to the team reaches its volumes without naming it, and never its maker's.
    let mine = json!({"name": "mine", "size_bytes": GB});
    let (status, made) = mia.client.post("/api/v1/volumes", &mine).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (status, t) = mia
        .client
        .post(
            "/api/v1/tokens",
            &json!({"team": "lab", "scopes": ["read", "volumes"], "expires_in_days": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{t}");
    let bound = app.client(Some(t["token"].as_str().unwrap()));
    let (status, got) = bound.get("/api/v1/volumes/data").await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let (_, listed) = bound.get("/api/v1/volumes").await;
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data"], "{listed}");
    let (status, _) = bound.get("/api/v1/volumes/mine").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = mia.client.get("/api/v1/volumes/data").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the team's is not among her own"
    );

    // The team's reservation mounts it; a member's own does not find it.
    let (status, body) = mia.client.reserve(mounting(None)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, placed) = mia.client.reserve(mounting(Some("lab"))).await;
    assert_eq!(status, StatusCode::CREATED, "{placed}");
    assert_eq!(placed["volumes"][0]["name"], "data", "{placed}");

    // A member may not remove one; an owner may, but not while it is mounted.
    let (status, _, _) = mia
        .client
        .send("DELETE", "/api/v1/volumes/data?team=lab", None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, busy) = olga
        .client
        .send("DELETE", "/api/v1/volumes/data?team=lab", None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    let spare = json!({"name": "spare", "size_bytes": GB, "team": "lab"});
    let (status, made) = mia.client.post("/api/v1/volumes", &spare).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (status, _, gone) = olga
        .client
        .send("DELETE", "/api/v1/volumes/spare?team=lab", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{gone}");
    assert_eq!(gone["state"], "deleting", "{gone}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(team_volumes, a_teams_volumes_are_its_members_by_role);
