//! What a hostile tenant or a careless host sends: forms of money the schema forbids, NUL
//! bytes and control characters, reserved variables, a lying inventory, a shrunk one, and
//! tokens that try to outlive the token that made them. Each is refused with a 422 naming
//! the field, or does no harm.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

async fn money_and_hours_exactly_as_the_schema_says(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    for bad in [
        "+5",
        " 5",
        "5 ",
        "5.",
        ".5",
        "1.5000000",
        "0x10",
        "5e2",
        "--5",
    ] {
        let (status, body) = app
            .admin()
            .post(
                "/api/v1/users",
                &json!({"name": "moe", "role": "tenant", "credit": bad}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {body}");
        assert!(message(&body).contains("credit"), "{bad:?}: {body}");
    }
    let t = app.tenant("moe", "5").await;
    let (status, body) = t.client.get("/api/v1/balance").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["balance"], "5.00");
    for bad in ["+0.80", "0.80 ", ".80"] {
        let (status, body) = t
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "tier": "spot", "bid": bad}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {body}");
        assert!(message(&body).contains("bid"), "{bad:?}: {body}");
    }

    // Below the schema's minimum of 0.001 hours (3.6 s).
    let (status, body) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 0.00028}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("hours"), "{body}");
    let (status, body) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 0.001}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.shutdown().await;
}
both_stores!(money_and_hours, money_and_hours_exactly_as_the_schema_says);

async fn nul_bytes_and_control_characters_are_refused(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let t = app.tenant("nia", "50").await;
    let base = json!({"gpu_type": "rtx4090", "hours": 1});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    let cases = [
        (
            with("command", json!(["sh", "-c", "echo a\u{0}b"])),
            "command",
        ),
        (with("env", json!({"A": "x\u{0}"})), "env"),
        (with("env", json!({"A\u{0}B": "x"})), "env"),
        (with("secrets", json!({"S": "\u{0}"})), "secrets"),
        (with("image", json!("busybox\u{0}")), "image"),
        (with("gpu_type", json!("rtx4090\u{0}")), "gpu_type"),
    ];
    for (body, field) in cases {
        let (status, answer) = t.client.reserve(body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert!(message(&answer).contains(field), "{body}: {answer}");
        // A secret's value is never repeated, not even in an error.
        assert!(!message(&answer).contains('\u{0}'), "{answer}");
    }
    let (_, listed) = t.client.get("/api/v1/reservations").await;
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");

    // Names a person reads in a terminal: no escape sequences, no carriage returns.
    for name in [
        "\u{1b}[2J\u{1b}[31mowned",
        "ok\rfake",
        "tab\there",
        "nul\u{0}",
    ] {
        let (status, body) = t
            .client
            .post(
                "/api/v1/tokens",
                &json!({"name": name, "expires_in_days": 1}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name:?}: {body}");
        assert!(message(&body).contains("name"), "{name:?}: {body}");
        let (status, body) = app
            .admin()
            .post("/api/v1/users", &json!({"name": name, "role": "tenant"}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name:?}: {body}");
        assert!(message(&body).contains("name"), "{name:?}: {body}");
    }
    for name in ["alice\r", " alice", "alice\n"] {
        let (status, body) = app
            .admin()
            .post("/api/v1/users", &json!({"name": name, "role": "tenant"}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name:?}: {body}");
    }
    let (status, body) = app
        .admin()
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app
        .anonymous()
        .post(
            "/api/v1/agent/register",
            &json!({"join_token": body["token"], "name": "n\u{1b}[1m", "executor": "sim",
                "gpu_backend": "sim", "gpus": []}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("name"), "{body}");
    app.shutdown().await;
}
both_stores!(
    nul_and_control,
    nul_bytes_and_control_characters_are_refused
);

async fn reserved_variables_cannot_be_set(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let t = app.tenant("ron", "50").await;
    for (field, name) in [
        ("env", "CUDA_VISIBLE_DEVICES"),
        ("env", "NVIDIA_VISIBLE_DEVICES"),
        ("env", "NVIDIA_DRIVER_CAPABILITIES"),
        ("env", "GPURENT_EPOCH"),
        ("env", "GPURENT_CHECKPOINT_DIR"),
        ("secrets", "NVIDIA_VISIBLE_DEVICES"),
        ("secrets", "GPURENT_X"),
    ] {
        let (status, body) = t
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1, field: {name: "0"}}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {body}");
        assert!(message(&body).contains(name), "{name}: {body}");
        assert!(message(&body).contains(field), "{name}: {body}");
    }
    let (status, body) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "env": {"CUDA_CACHE_PATH": "/tmp/c"}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.shutdown().await;
}
both_stores!(reserved_variables, reserved_variables_cannot_be_set);

async fn a_token_never_outlives_the_token_that_made_it(backend: Backend) {
    let app = TestApp::with(backend).with_manual_clock().start().await;
    let tina = app.tenant("tina", "10").await;
    let (status, day) = tina
        .client
        .post(
            "/api/v1/tokens",
            &json!({"expires_in_days": 1, "name": "day"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{day}");
    let day_client = app.client(day["token"].as_str());
    // A child of a one-day token asks for no expiry, and for thirty days: both end with it.
    let (status, forever) = day_client.post("/api/v1/tokens", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{forever}");
    assert_eq!(forever["expires_at"], day["expires_at"], "{forever}");
    let (status, month) = day_client
        .post("/api/v1/tokens", &json!({"expires_in_days": 30}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{month}");
    assert_eq!(month["expires_at"], day["expires_at"], "{month}");
    // A grandchild, from the child.
    let (status, grandchild) = app
        .client(month["token"].as_str())
        .post("/api/v1/tokens", &json!({"expires_in_days": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{grandchild}");

    // A tenant's token that never expires (made by an admin) makes only expiring ones,
    // unless the tenant gives its password.
    let (status, body) = tina.client.post("/api/v1/tokens", &json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("password"), "{body}");
    let (status, body) = tina
        .client
        .post("/api/v1/tokens", &json!({"password": "not her password"}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "wrong_password", "{body}");
    let (status, _, _) = tina
        .client
        .send(
            "POST",
            &format!("/api/v1/users/{}/password", tina.id),
            Some(&json!({"password": "correct horse battery"})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, kept) = day_client
        .post(
            "/api/v1/tokens",
            &json!({"password": "correct horse battery", "name": "ci"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{kept}");
    assert!(kept["expires_at"].is_null(), "{kept}");
    // An admin makes tokens that never expire.
    let (status, admins) = app.admin().post("/api/v1/tokens", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{admins}");
    assert!(admins["expires_at"].is_null(), "{admins}");

    // Revoking the parent revokes its children and theirs; a token made with the password
    // is a credential of its own.
    let (status, _, _) = tina
        .client
        .send(
            "DELETE",
            &format!("/api/v1/tokens/{}", day["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    for child in [&forever, &month, &grandchild] {
        let (status, body) = app
            .client(child["token"].as_str())
            .get("/api/v1/balance")
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{child}: {body}");
        assert!(message(&body).contains("revoked"), "{body}");
    }
    let (status, _) = app
        .client(kept["token"].as_str())
        .get("/api/v1/balance")
        .await;
    assert_eq!(status, StatusCode::OK);

    // And past the parent's day, nothing made from it works either.
    let (_, session) = app
        .anonymous()
        .post(
            "/api/v1/login",
            &json!({"name": "tina", "password": "correct horse battery"}),
        )
        .await;
    let (status, from_session) = app
        .client(session["token"].as_str())
        .post("/api/v1/tokens", &json!({"expires_in_days": 3650}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{from_session}");
    assert_eq!(from_session["expires_at"], session["expires_at"]);
    app.advance(chrono::Duration::days(2));
    let (status, body) = app
        .client(from_session["token"].as_str())
        .get("/api/v1/balance")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    app.shutdown().await;
}
both_stores!(token_lineage, a_token_never_outlives_the_token_that_made_it);

/// A host's agent may declare only what a GPU can be.
async fn a_lying_inventory_is_refused(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (_, join) = app
        .admin()
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    let gpu = |vram_mb: u64, model: &str, uuid: &str| json!({"index": 0, "uuid": uuid, "model": model, "vram_mb": vram_mb});
    let register = |gpus: Value| {
        json!({"join_token": join["token"], "name": "liar", "executor": "sim",
            "gpu_backend": "sim", "gpus": gpus})
    };
    let many: Vec<Value> = (0..257)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{i}"), "model": "NVIDIA H100", "vram_mb": 81_559}))
        .collect();
    let cases = [
        (
            json!([gpu(16 * 1024 * 1024, "NVIDIA H100", "GPU-a")]),
            "vram",
        ),
        (json!([gpu(0, "NVIDIA H100", "GPU-a")]), "vram"),
        (
            json!([gpu(81_559, "NVIDIA H100\u{1b}[2J", "GPU-a")]),
            "model",
        ),
        (json!([gpu(81_559, &"H".repeat(200), "GPU-a")]), "model"),
        (json!([gpu(81_559, "NVIDIA H100", "GPU a\r")]), "uuid"),
        (
            json!([
                gpu(81_559, "NVIDIA H100", "GPU-a"),
                gpu(81_559, "NVIDIA H100", "GPU-a")
            ]),
            "uuid",
        ),
        (json!(many), "GPUs"),
    ];
    for (gpus, what) in cases {
        let (status, body) = app
            .anonymous()
            .post("/api/v1/agent/register", &register(gpus.clone()))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
        assert!(message(&body).contains(what), "{what}: {body}");
    }
    // Registered honestly, it cannot grow its GPU to 16 TiB in a sync either.
    let (status, node) = app
        .anonymous()
        .post(
            "/api/v1/agent/register",
            &register(json!([gpu(81_559, "NVIDIA H100", "GPU-honest")])),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let agent = app.client(node["node_token"].as_str());
    let (status, body) = agent
        .post(
            "/api/v1/agent/sync",
            &json!({"gpus": [gpu(81_559, "NVIDIA H100", "GPU-honest"),
                {"index": 1, "uuid": "GPU-huge", "model": "NVIDIA H100", "vram_mb": 16u64 << 20}],
                "instances": []}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let gpus = nodes[0]["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{nodes}");
    assert_eq!(gpus[0]["vram_gb"], 80, "{nodes}");
    app.shutdown().await;
}
both_stores!(lying_inventory, a_lying_inventory_is_refused);

/// A node's agent may report only so many events, each a short line of plain text (they are
/// shown in terminals: `gpurent events`, a tenant's `gpurent logs`).
async fn an_agents_events_are_bounded(backend: Backend) {
    let app = TestApp::with(backend).start().await;
    let (_, join) = app
        .admin()
        .post("/api/v1/nodes/join-token", &json!({}))
        .await;
    let gpu = json!({"index": 0, "uuid": "GPU-e", "model": "NVIDIA H100", "vram_mb": 81_559});
    let (status, node) = app
        .anonymous()
        .post(
            "/api/v1/agent/register",
            &json!({"join_token": join["token"], "name": "chatty", "executor": "sim",
                "gpu_backend": "sim", "gpus": [gpu]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let agent = app.client(node["node_token"].as_str());
    let event = |detail: &str| json!({"kind": "unowned_gpu_process", "gpu_uuid": "GPU-e", "detail": detail});
    let sync = |events: Vec<Value>| json!({"gpus": [], "instances": [], "events": events});
    let cases = [
        (vec![event("x"); 1001], "at most 1000 events"),
        (vec![event(&"x".repeat(1001))], "at most 1000 bytes"),
        (vec![event("process 7\u{1b}[2J")], "control characters"),
    ];
    for (events, what) in cases {
        let (status, body) = agent.post("/api/v1/agent/sync", &sync(events)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
        assert!(message(&body).contains(what), "{what}: {body}");
    }
    let (_, before) = app.admin().get("/api/v1/events").await;
    assert!(
        before
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["node_id"] != node["node_id"]),
        "{before}"
    );
    // A fair one is kept, for the admin.
    let (status, body) = agent
        .post(
            "/api/v1/agent/sync",
            &sync(vec![event("process 7 of no instance")]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, events) = app.admin().get("/api/v1/events").await;
    let kept: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["node_id"] == node["node_id"])
        .collect();
    assert_eq!(kept.len(), 1, "{events}");
    assert_eq!(kept[0]["kind"], "unowned_gpu_process");
    assert_eq!(kept[0]["detail"], "process 7 of no instance");
    app.shutdown().await;
}
both_stores!(chatty_agent, an_agents_events_are_bounded);

/// An agent restarted with fewer GPUs: the one it no longer reports takes no new work, and
/// the work on it is handled as on a lost node (rescheduled, here onto the GPU left).
async fn a_gpu_the_agent_no_longer_reports_leaves_placement(backend: Backend) {
    let mut app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let t = app.tenant("gus", "100").await;
    let (status, first) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, second) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "on_node_loss": "stop"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    let first_id = first["id"].as_str().unwrap();
    let second_id = second["id"].as_str().unwrap();
    let first = app.wait_status(&t.client, first_id, "running").await;
    let second = app.wait_status(&t.client, second_id, "running").await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let kept = nodes[0]["gpus"][0]["uuid"].as_str().unwrap().to_owned();
    let dropped = nodes[0]["gpus"][1]["uuid"].as_str().unwrap().to_owned();
    // Which of them ran on the GPU that goes away.
    let (on_dropped, on_kept) = if first["gpus"][0] == dropped.as_str() {
        (first, second)
    } else {
        (second, first)
    };

    app.kill_agent("node-0").await;
    app.restart_agent_with_gpus("node-0", "1xRTX4090").await;
    app.eventually("the dropped GPU to be missing", || async {
        let (_, nodes) = app.admin().get("/api/v1/nodes").await;
        nodes[0]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["uuid"] == dropped.as_str() && g["status"] == "missing")
    })
    .await;
    // The work on the kept GPU is untouched.
    let (_, still) = t
        .client
        .get(&format!(
            "/api/v1/reservations/{}",
            on_kept["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(still["status"], "running", "{still}");
    // The one on the dropped GPU: rescheduled when it asked for it, else ended as lost.
    let moved_id = on_dropped["id"].as_str().unwrap();
    if on_dropped["id"] == first_id {
        let (_, r) = t
            .client
            .get(&format!("/api/v1/reservations/{moved_id}"))
            .await;
        assert!(
            r["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .all(|g| g != dropped.as_str()),
            "{r}"
        );
        assert_ne!(
            r["status"], "running",
            "{r}: nothing is free for it to run on"
        );
    } else {
        let r = app.wait_status(&t.client, moved_id, "lost").await;
        assert!(r["ended_at"].is_string(), "{r}");
    }
    // No new paid work lands on the missing GPU.
    let (status, body) = t
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let placed_on_dropped = app
        .raw_count(&format!(
            "SELECT COUNT(*) FROM allocations WHERE gpu_uuid = '{dropped}'"
        ))
        .await;
    assert_eq!(placed_on_dropped, 0);
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    assert!(
        nodes[0]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["uuid"] == kept.as_str() && g["status"] == "allocated"),
        "{nodes}"
    );
    app.assert_consistent().await;

    // It comes back: placement may use it again.
    app.kill_agent("node-0").await;
    app.restart_agent_with_gpus("node-0", "2xRTX4090").await;
    app.eventually("the GPU to be back", || async {
        let (_, nodes) = app.admin().get("/api/v1/nodes").await;
        nodes[0]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["uuid"] == dropped.as_str() && g["status"] != "missing")
    })
    .await;
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    shrunk_inventory,
    a_gpu_the_agent_no_longer_reports_leaves_placement
);

/// A tenant learns nothing about other hosts' nodes from a refusal.
async fn no_capacity_names_no_node(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    let host = app.user("hana", "host", "0").await;
    app.add_node_owned(&host.client, "secret-rack-7", "2xRTX4090")
        .await;
    let t = app.tenant("tom", "100").await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let node_id = nodes[0]["id"].as_str().unwrap().to_owned();
    let gpu_uuid = nodes[0]["gpus"][0]["uuid"].as_str().unwrap().to_owned();
    for body in [
        json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 3}),
        json!({"gpu_type": "rtx4090", "hours": 1, "vram_gb": 200}),
        json!({"gpu_type": "h100", "hours": 1}),
        json!({"gpu_type": "rtx4090", "hours": 1, "gpu_count": 3, "queue": true}),
    ] {
        let (status, answer) = t.client.reserve(body.clone()).await;
        assert!(status.is_client_error(), "{body}: {answer}");
        let text = answer.to_string();
        for secret in ["secret-rack-7", node_id.as_str(), gpu_uuid.as_str(), "hana"] {
            assert!(!text.contains(secret), "{body}: {answer} names {secret}");
        }
    }
    app.shutdown().await;
}
both_stores!(no_capacity_anonymous, no_capacity_names_no_node);
