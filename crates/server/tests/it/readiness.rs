//! `/readyz` (issue 19): 200 only while the store can write. A PostgreSQL database turned
//! read-only (as a demoted primary or a standby is) answers 503 there, and HAProxy takes the
//! replica out; writes answer 503 `unavailable` (retryable) meanwhile; back to 200 when it
//! takes writes again. On SQLite, a database file that is gone answers 503.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;

use crate::app::TestApp;

async fn readyz(app: &TestApp) -> StatusCode {
    reqwest::get(format!("{}/readyz", app.base))
        .await
        .expect("GET /readyz")
        .status()
}

async fn wait_readyz(app: &TestApp, want: StatusCode) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = readyz(app).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz stayed {got}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sets (or resets) the database's `default_transaction_read_only` from the server's
/// `postgres` database and closes the sessions open on it, so that every new one has it.
async fn read_only(app: &TestApp, on: bool) {
    let server = std::env::var(gpurent_store::testing::PG_URL_VAR).expect("PostgreSQL");
    let name = app
        .database_url()
        .rsplit('/')
        .next()
        .expect("database name")
        .to_owned();
    let mut conn = sqlx::PgConnection::connect(&server).await.expect("connect");
    let set = if on {
        format!("ALTER DATABASE {name} SET default_transaction_read_only = on")
    } else {
        format!("ALTER DATABASE {name} RESET default_transaction_read_only")
    };
    sqlx::query(&set)
        .execute(&mut conn)
        .await
        .expect("alter database");
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&name)
        .execute(&mut conn)
        .await
        .expect("terminate sessions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_while_postgresql_is_read_only() {
    let app = TestApp::with(gpurent_store::Backend::Postgres)
        .start()
        .await;
    assert_eq!(readyz(&app).await, StatusCode::OK);

    read_only(&app, true).await;
    wait_readyz(&app, StatusCode::SERVICE_UNAVAILABLE).await;
    // Liveness is unaffected: the process is fine, only its database is not.
    let live = reqwest::get(format!("{}/healthz", app.base))
        .await
        .expect("GET /healthz");
    assert_eq!(live.status(), StatusCode::OK);
    let (status, body) = app
        .admin()
        .post(
            "/api/v1/users",
            &json!({"name": "refused", "role": "tenant", "credit": "1"}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");

    read_only(&app, false).await;
    wait_readyz(&app, StatusCode::OK).await;
    app.tenant("accepted", "1").await;
    assert_eq!(
        app.raw_count("SELECT count(*) FROM users WHERE name IN ('refused', 'accepted')")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_when_the_sqlite_file_is_gone() {
    let app = TestApp::with(gpurent_store::Backend::Sqlite).start().await;
    assert_eq!(readyz(&app).await, StatusCode::OK);
    let path = app
        .database_url()
        .trim_start_matches("sqlite://")
        .to_owned();
    let moved = format!("{path}.moved");
    std::fs::rename(&path, &moved).expect("move the database file away");
    wait_readyz(&app, StatusCode::SERVICE_UNAVAILABLE).await;
    std::fs::rename(&moved, &path).expect("move it back");
    wait_readyz(&app, StatusCode::OK).await;
}

/// What `/metrics` says of the nodes this control plane fenced.
async fn nodes_lost(app: &TestApp) -> u64 {
    let (status, text, _) = app.admin().get_text("/metrics", "content-type").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    text.lines()
        .find_map(|l| l.strip_prefix("gpurent_nodes_lost_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no gpurent_nodes_lost_total in {text}"))
}

/// A database outage longer than the node TTL (a failover) fences no node: no heartbeat could
/// be written for the database's fault, not the nodes'. The replica fences only once its store
/// has answered for a TTL, and the agents have synced again by then. Without that rule the
/// first pass after the outage fences every node and reschedules all their work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_longer_than_the_node_ttl_fences_no_node() {
    let app = TestApp::with(gpurent_store::Backend::Postgres)
        .with_sim_gpus("1xRTX4090")
        .with_sim_gpus("1xRTX4090")
        // A TTL of 8 s, longer than an agent's wait between its retries (5 s); the agents keep
        // their work through the outage (a long lease).
        .with_liveness(Duration::from_secs(1), 8)
        .with_agent_lease(Duration::from_secs(60))
        .start()
        .await;
    app.wait_nodes_ready().await;
    let tenant = app.tenant("alice", "100").await.client;
    let (status, r) = tenant
        .post(
            "/api/v1/reservations",
            &json!({"gpu_type": "rtx4090", "hours": 1, "command": ["sleep", "600"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let id = r["id"].as_str().expect("id").to_owned();
    app.wait_status(&tenant, &id, "running").await;

    read_only(&app, true).await;
    wait_readyz(&app, StatusCode::SERVICE_UNAVAILABLE).await;
    // More than a TTL without a heartbeat written.
    tokio::time::sleep(Duration::from_secs(10)).await;
    read_only(&app, false).await;
    wait_readyz(&app, StatusCode::OK).await;
    // A TTL and more after the store answers again: the agents synced, nothing was fenced.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(nodes_lost(&app).await, 0);
    for node in ["node-0", "node-1"] {
        assert_eq!(app.node_status(node).await, "ready", "{node}");
    }
    let (_, r) = tenant.get(&format!("/api/v1/reservations/{id}")).await;
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["epoch"], 1, "it never moved: {r}");
}
