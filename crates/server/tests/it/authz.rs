//! Authorization (BFLA): every route of the OpenAPI document has an entry in the policy
//! table, and called as each role (admin, host, tenant, no token) exactly the roles the table
//! allows get past authorization. Object-level authorization (BOLA): a tenant using another
//! tenant's ids gets 404, as for ids that do not exist.

use gpurent_server::{Access, ServerConfig, POLICY};
use gpurent_store::Backend;
use gpurent_types::Role;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

fn no_rate_limits(config: &mut ServerConfig) {
    config.rate_limits.per_token = None;
    config.rate_limits.per_address = None;
}

/// (method, route template) of every operation in the OpenAPI document.
fn documented_routes() -> Vec<(String, String, bool)> {
    let doc = serde_json::to_value(gpurent_server::openapi_document()).unwrap();
    let mut routes = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let has_body = op.get("requestBody").is_some();
            routes.push((method.to_uppercase(), path.clone(), has_body));
        }
    }
    routes
}

fn policy_of(method: &str, path: &str) -> Option<Access> {
    POLICY
        .iter()
        .find(|(m, p, _)| *m == method && *p == path)
        .map(|(_, _, a)| *a)
}

#[test]
fn every_documented_route_has_a_policy_and_every_policy_a_route() {
    let documented = documented_routes();
    for (method, path, _) in &documented {
        assert!(
            policy_of(method, path).is_some(),
            "{method} {path} has no entry in policy::POLICY (default deny)"
        );
    }
    for (method, path, access) in POLICY {
        // The document itself, the proxy to published ports (every method and path below a
        // port: the app's API, not gpurent's), and the web console (`console_pages` checks
        // that each of its entries is routed).
        let served_outside_the_document = *path == "/api/v1/openapi.json"
            || path.starts_with("/proxy/")
            || matches!(access, Access::Page(_))
            || (!path.starts_with("/api/") && !["/healthz", "/readyz", "/metrics"].contains(path));
        assert!(
            served_outside_the_document
                || documented.iter().any(|(m, p, _)| m == method && p == path),
            "policy entry {method} {path} names no route"
        );
    }
}

async fn each_role_gets_exactly_what_the_policy_allows(backend: Backend) {
    let app = TestApp::with(backend)
        .with_config(no_rate_limits)
        .start()
        .await;
    let host = app.user("hank", "host", "0").await;
    let tenant = app.tenant("tina", "10").await;
    let callers = [
        (Some(Role::Admin), app.admin()),
        (Some(Role::Host), host.client.clone()),
        (Some(Role::Tenant), tenant.client.clone()),
        (None, app.anonymous()),
    ];
    for (method, template, has_body) in documented_routes() {
        let access = policy_of(&method, &template).unwrap();
        // Ids that exist nowhere: authorization is decided before the handler looks.
        let path = template
            .replace("{id}", "00000000000000000000000000000000")
            .replace("{node}", "no-such-node")
            .replace("{month}", "2026-01");
        let body = has_body.then(|| json!({}));
        for (role, client) in &callers {
            let (status, _, answer) = client.send(&method, &path, body.as_ref()).await;
            let refused = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
            match access {
                Access::Public => {
                    assert!(!refused, "{method} {path} as {role:?}: {status} {answer}")
                }
                // No user token is a node credential.
                Access::Node => assert!(
                    !status.is_success(),
                    "{method} {path} as {role:?}: {status} {answer}"
                ),
                Access::Page(_) => {
                    panic!("{method} {template}: a console page in the API document")
                }
                Access::Roles(allowed, _) => match role {
                    Some(r) if allowed.contains(r) => {
                        assert!(!refused, "{method} {path} as {r}: {status} {answer}")
                    }
                    Some(r) => {
                        assert_eq!(
                            status,
                            StatusCode::FORBIDDEN,
                            "{method} {path} as {r}: {answer}"
                        );
                        assert_eq!(answer["error"]["code"], "forbidden");
                    }
                    None => {
                        assert_eq!(
                            status,
                            StatusCode::UNAUTHORIZED,
                            "{method} {path}: {answer}"
                        );
                        assert_eq!(answer["error"]["code"], "unauthorized");
                    }
                },
            }
        }
    }
    app.shutdown().await;
}
both_stores!(bfla, each_role_gets_exactly_what_the_policy_allows);

async fn another_tenants_ids_are_not_found(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .with_config(no_rate_limits)
        .start()
        .await;
    let alice = app.tenant("alice", "50").await;
    let bob = app.tenant("bob", "50").await;
    let (status, r) = alice
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let rid = r["id"].as_str().unwrap().to_owned();
    let (status, _, token) = alice
        .client
        .send(
            "POST",
            "/api/v1/tokens",
            Some(&json!({"name": "ci", "expires_in_days": 30})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let token_id = token["id"].as_str().unwrap().to_owned();
    let a = &alice.id;

    let probes: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", format!("/api/v1/reservations/{rid}"), None),
        ("POST", format!("/api/v1/reservations/{rid}/stop"), None),
        ("GET", format!("/api/v1/reservations/{rid}/logs"), None),
        ("GET", format!("/api/v1/users/{a}"), None),
        (
            "POST",
            format!("/api/v1/users/{a}/password"),
            Some(json!({"password": "hunter2hunter2"})),
        ),
        ("DELETE", format!("/api/v1/tokens/{token_id}"), None),
        ("GET", format!("/api/v1/usage?user_id={a}"), None),
        ("GET", format!("/api/v1/invoices/2026-01?user_id={a}"), None),
        ("GET", format!("/api/v1/earnings?user_id={a}"), None),
    ];
    for (method, path, body) in &probes {
        let (status, _, answer) = bob.client.send(method, path, body.as_ref()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found");
    }
    // Exactly as for ids that do not exist.
    let (_, _, missing) = bob
        .client
        .send(
            "GET",
            "/api/v1/reservations/00000000000000000000000000000000",
            None,
        )
        .await;
    assert_eq!(missing["error"]["code"], "not_found");

    // Lists hold only bob's own; alice's id as a cursor is answered as an unknown one, so
    // it cannot tell bob that the id exists.
    let (status, mine) = bob
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{mine}");
    let (_, _, list) = bob.client.send("GET", "/api/v1/reservations", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["id"], mine["id"]);
    let (_, _, foreign) = bob
        .client
        .send("GET", &format!("/api/v1/reservations?after={rid}"), None)
        .await;
    let (_, _, unknown) = bob
        .client
        .send(
            "GET",
            "/api/v1/reservations?after=00000000000000000000000000000000",
            None,
        )
        .await;
    assert_eq!(foreign, unknown);
    let (_, _, foreign) = bob
        .client
        .send("GET", &format!("/api/v1/tokens?after={token_id}"), None)
        .await;
    let (_, _, unknown) = bob
        .client
        .send(
            "GET",
            "/api/v1/tokens?after=00000000000000000000000000000000",
            None,
        )
        .await;
    assert_eq!(foreign, unknown);
    let (_, _, tokens) = bob.client.send("GET", "/api/v1/tokens", None).await;
    assert!(
        tokens
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["user_id"] == json!(bob.id)),
        "{tokens}"
    );

    // Nothing of alice's changed: her reservation still runs, her token still works.
    let (_, r) = alice
        .client
        .get(&format!("/api/v1/reservations/{rid}"))
        .await;
    assert_ne!(r["status"], "stopping");
    assert_ne!(r["status"], "stopped");
    let (status, _, t) = alice.client.send("GET", "/api/v1/tokens", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        t.as_array()
            .unwrap()
            .iter()
            .all(|t| t["revoked_at"].is_null()),
        "{t}"
    );
    // An admin reaches them.
    let (status, _, _) = app
        .admin()
        .send("GET", &format!("/api/v1/users/{a}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    app.shutdown().await;
}
both_stores!(bola, another_tenants_ids_are_not_found);
