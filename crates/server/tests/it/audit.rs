//! The audit trail through the API: every request, allowed or refused, is a record with its
//! user, action, resource, GPUs, outcome and client; search by user, resource and time;
//! verification passes, and names the record an attacker changed in the database.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;

async fn records(app: &TestApp, query: &str) -> Vec<Value> {
    let (status, page) = app.admin().get(&format!("/api/v1/audit?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["records"].as_array().unwrap().clone()
}

async fn every_request_is_recorded(backend: gpurent_store::Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_node("box-1", "2xRTX4090").await;
    app.wait_nodes_ready().await;
    let pat = app.tenant("pat", "100").await;
    let (status, r) = pat
        .client
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "gpu_count": 2, "hours": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let gpus: Vec<String> = r["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_owned())
        .collect();
    // Refused ones too: no token, a bad token, a tenant on an admin route, another's id.
    assert_eq!(
        app.anonymous().get("/api/v1/reservations").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.client(Some("gpr_not_a_token"))
            .get("/api/v1/balance")
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        pat.client.get("/api/v1/audit").await.0,
        StatusCode::FORBIDDEN
    );
    let sam = app.tenant("sam", "10").await;
    let (status, _) = sam.client.get(&format!("/api/v1/reservations/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let all = records(&app, "").await;
    let find = |action: &str, outcome: u64| {
        all.iter()
            .find(|r| r["action"] == action && r["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {action} {outcome} in {all:#?}"))
            .clone()
    };
    let reserve = find("POST /api/v1/reservations", 201);
    assert_eq!(reserve["user_id"], pat.id.as_str());
    assert_eq!(reserve["resource"], "/api/v1/reservations");
    let allocation = reserve["allocation"].as_str().unwrap();
    assert!(
        allocation.starts_with(&format!("{id} 2x RTX4090 on box-1: ")),
        "{allocation}"
    );
    for gpu in &gpus {
        assert!(allocation.contains(gpu.as_str()), "{allocation}");
    }
    assert!(reserve["client"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    let anonymous = find("GET /api/v1/reservations", 401);
    assert_eq!(anonymous["user_id"], Value::Null);
    assert_eq!(find("GET /api/v1/balance", 401)["user_id"], Value::Null);
    assert_eq!(find("GET /api/v1/audit", 403)["user_id"], pat.id.as_str());
    let other = find("GET /api/v1/reservations/{id}", 404);
    assert_eq!(other["user_id"], sam.id.as_str());
    assert_eq!(other["resource"], format!("/api/v1/reservations/{id}"));
    // Heartbeats that succeed and probes are not recorded.
    assert!(all.iter().all(|r| r["action"] != "POST /api/v1/agent/sync"));

    // The request id is the one answered in `x-request-id`.
    let response = pat.client.get_response("/api/v1/offers").await;
    let request_id = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let offers = records(&app, "resource=/api/v1/offers").await;
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0]["request_id"], request_id.as_str());

    // Search by user, by resource (an id is enough), and by time.
    let mine = records(&app, &format!("user={}", pat.id)).await;
    assert!(!mine.is_empty() && mine.iter().all(|r| r["user_id"] == pat.id.as_str()));
    let about = records(&app, &format!("resource={id}")).await;
    assert_eq!(about.len(), 2, "{about:#?}");
    // The earliest time, not the first record's: concurrent requests are stamped when they
    // arrive and chained when they end, so the chain's order need not be the clock's.
    let first_at = all
        .iter()
        .map(|r| {
            let at = r["at"].as_str().unwrap();
            chrono::DateTime::parse_from_rfc3339(at).unwrap_or_else(|e| panic!("{at}: {e}"))
        })
        .min()
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let before = records(&app, &format!("to={}", first_at.replace('+', "%2B"))).await;
    assert!(before.is_empty(), "{before:#?}");
    let (status, body) = app.admin().get("/api/v1/audit?from=yesterday").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // Intact, it verifies; changed behind the server's back, the record is named.
    let (status, verdict) = app.admin().get("/api/v1/audit/verify").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(verdict["ok"], true, "{verdict}");
    assert!(verdict["records"].as_u64().unwrap() >= 8);
    assert_eq!(
        pat.client.get("/api/v1/audit/verify").await.0,
        StatusCode::FORBIDDEN
    );
    let seq = reserve["seq"].as_u64().unwrap();
    app.raw_sql(&format!(
        "UPDATE audit_log SET outcome = 200 WHERE seq = {seq}"
    ))
    .await;
    let (_, verdict) = app.admin().get("/api/v1/audit/verify").await;
    assert_eq!(verdict["ok"], false);
    assert_eq!(verdict["first_bad"]["seq"], seq);
    assert_eq!(verdict["first_bad"]["problem"], "altered");
    let (_, checkpoints) = app.admin().get("/api/v1/audit/checkpoints").await;
    assert!(
        !checkpoints.as_array().unwrap().is_empty(),
        "the first append signs one"
    );
    app.shutdown().await;
}

crate::both_stores!(every_request_is_recorded_test, every_request_is_recorded);

/// A burst of reservations is written in batches, each with its requests' records in its own
/// transaction; replays and refusals are recorded by the middleware. Every request is one
/// record, whichever wrote it, and the trail verifies.
async fn a_burst_is_recorded_once_per_request(backend: gpurent_store::Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("8xRTX4090")
        .with_sim_gpus("8xRTX4090")
        .start()
        .await;
    let mut tenants = Vec::new();
    for i in 0..3 {
        tenants.push(app.tenant(&format!("t{i}"), "1000").await);
    }
    let body = json!({"gpu_type": "rtx4090", "hours": 1});
    // 24 requests for 16 GPUs, and each of the first tenant's first 4 keys sent twice.
    let requests = (0..28).map(|i| {
        let client = tenants[i % tenants.len()].client.clone();
        let body = body.clone();
        async move {
            if i < 8 {
                let key = format!("burst-{}", i / 2);
                client
                    .post_with_key("/api/v1/reservations", &body, &key)
                    .await
            } else {
                client.post("/api/v1/reservations", &body).await
            }
        }
    });
    let results = futures::future::join_all(requests).await;
    let placed: std::collections::BTreeSet<String> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .map(|(_, r)| r["id"].as_str().unwrap().to_owned())
        .collect();
    let refused = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .count();
    assert_eq!(placed.len(), 16, "{results:?}");
    assert_eq!(
        refused,
        28 - results
            .iter()
            .filter(|(s, _)| *s == StatusCode::CREATED)
            .count()
    );

    let all = records(&app, "limit=1000").await;
    let posts: Vec<&Value> = all
        .iter()
        .filter(|r| r["action"] == "POST /api/v1/reservations")
        .collect();
    assert_eq!(posts.len(), 28, "{posts:#?}");
    let ids: std::collections::BTreeSet<&str> = posts
        .iter()
        .map(|r| r["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 28, "one record per request");
    assert_eq!(
        posts.iter().filter(|r| r["outcome"] == 409).count(),
        refused
    );
    for id in &placed {
        let about: Vec<&&Value> = posts
            .iter()
            .filter(|r| {
                r["allocation"]
                    .as_str()
                    .is_some_and(|a| a.starts_with(id.as_str()))
            })
            .collect();
        // A keyed request's replay names the same reservation.
        assert!(!about.is_empty() && about.len() <= 2, "{id}: {about:#?}");
        assert!(about.iter().all(|r| r["outcome"] == 201));
    }
    let (status, verdict) = app.admin().get("/api/v1/audit/verify").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(verdict["ok"], true, "{verdict}");
    app.shutdown().await;
}

crate::both_stores!(
    a_burst_is_recorded_once_per_request_test,
    a_burst_is_recorded_once_per_request
);

/// A team's reservation is recorded under the member who acted, and its record names the team,
/// for the reserve and for a stop by another member.
async fn a_teams_reservation_is_recorded_with_its_team(backend: gpurent_store::Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_node("box-1", "2xRTX4090").await;
    app.wait_nodes_ready().await;
    let olga = app.tenant("olga", "100").await;
    let arty = app.tenant("arty", "10").await;
    app.team(&olga.client, "lab", &[("arty", "member")], "50")
        .await;
    let (status, r) = olga
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().unwrap().to_owned();
    let (status, _) = arty
        .client
        .post(&format!("/api/v1/reservations/{id}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);

    let all = records(&app, "").await;
    let reserve = all
        .iter()
        .find(|r| r["action"] == "POST /api/v1/reservations" && r["outcome"] == 201)
        .unwrap_or_else(|| panic!("{all:#?}"));
    assert_eq!(reserve["user_id"], olga.id.as_str());
    let allocation = reserve["allocation"].as_str().unwrap();
    assert!(allocation.starts_with(&id), "{allocation}");
    assert!(allocation.ends_with(" for team lab"), "{allocation}");
    let stop = all
        .iter()
        .find(|r| r["action"] == "POST /api/v1/reservations/{id}/stop")
        .unwrap_or_else(|| panic!("{all:#?}"));
    assert_eq!(stop["user_id"], arty.id.as_str());
    assert!(
        stop["allocation"]
            .as_str()
            .is_some_and(|a| a.ends_with(" for team lab")),
        "{stop}"
    );
    app.shutdown().await;
}
crate::both_stores!(
    team_records_name_the_team,
    a_teams_reservation_is_recorded_with_its_team
);
