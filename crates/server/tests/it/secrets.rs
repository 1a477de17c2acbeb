//! Secrets at rest: a reservation's secret environment variables reach its instance (a real
//! process), are shown by name only, and are nowhere in the database in clear: not in the
//! reservation row, not in the audit trail, not in the request hash.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

const VALUE: &str = "hf_sEcReT-7f3a9c";

async fn secrets_reach_the_instance_only(backend: Backend) {
    let mut app = TestApp::with(backend).start().await;
    app.add_process_node("proc-node", std::time::Duration::from_secs(1))
        .await;
    let ann = app.tenant("ann", "10").await;
    let (status, r) = ann
        .client
        .reserve(json!({
            "gpu_type": "rtx4090",
            "hours": 1,
            "env": {"MODEL": "llama"},
            "secrets": {"HF_TOKEN": VALUE},
            "command": ["sh", "-c", "echo model=$MODEL token=$HF_TOKEN; sleep 300"],
        }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["secrets"], json!(["HF_TOKEN"]));
    assert!(!r.to_string().contains(VALUE));
    let id = r["id"].as_str().unwrap().to_owned();
    let (_, again) = ann.client.get(&format!("/api/v1/reservations/{id}")).await;
    assert_eq!(again["secrets"], json!(["HF_TOKEN"]));
    assert!(!again.to_string().contains(VALUE));

    // The instance has it.
    let path = format!("/api/v1/reservations/{id}/logs");
    let mut text = String::new();
    for _ in 0..400 {
        let (_, body, _) = ann.client.get_text(&path, "x").await;
        if !body.is_empty() {
            text = body;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(text.trim(), format!("model=llama token={VALUE}"));

    // Nowhere in the database in clear (the instance's own output aside, which is its own).
    for (table, column) in [
        ("reservations", "secrets"),
        ("reservations", "env"),
        ("reservations", "secret_names"),
        ("reservations", "request_hash"),
        ("audit_log", "resource"),
        ("audit_log", "allocation"),
    ] {
        let found = app
            .raw_count(&format!(
                "SELECT COUNT(*) FROM {table} WHERE {column} LIKE '%{VALUE}%'"
            ))
            .await;
        assert_eq!(found, 0, "{table}.{column}");
    }
    let sealed = app
        .raw_count("SELECT COUNT(*) FROM reservations WHERE secrets LIKE '%key_id%'")
        .await;
    assert_eq!(sealed, 1, "sealed in an envelope");

    // A name given twice, or a bad name, is refused without repeating the value.
    let (status, body) = ann
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1,
            "env": {"HF_TOKEN": "x"}, "secrets": {"HF_TOKEN": VALUE}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(!body.to_string().contains(VALUE));
    let (status, _) = ann
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "secrets": {"1BAD": VALUE}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    app.shutdown().await;
}

both_stores!(secrets_test, secrets_reach_the_instance_only);
