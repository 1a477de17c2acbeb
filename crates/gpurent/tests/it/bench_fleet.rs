//! `gpurent bench fleet`: a short run of simulated agents against a real control plane (a
//! child `gpurent server`) answers one JSON document with syncs, no errors, and reservations
//! placed on the fleet and reported running, on SQLite and, where the tests have one,
//! PostgreSQL.

use std::process::Command;

use gpurent_store::testing::{TestDatabase, PG_URL_VAR};
use gpurent_store::Backend;
use serde_json::Value;

use crate::support::BIN;

/// Runs a 20-node, 5-second fleet and checks its JSON document.
fn short_fleet(database_url: Option<&str>, backend: &str) {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--json",
        "bench",
        "fleet",
        "--nodes",
        "20",
        "--duration-secs",
        "5",
    ])
    .args(["--reservations-per-sec", "4"]);
    if let Some(url) = database_url {
        cmd.args(["--database-url", url]);
    }
    let out = cmd.output().expect("run gpurent bench fleet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench fleet failed: {stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}): {stderr}"));
    for field in [
        "nodes",
        "gpus",
        "seconds",
        "syncs",
        "syncs_per_sec",
        "sync_p50_ms",
        "sync_p99_ms",
        "errors",
        "reservations_created",
        "reservations_placed",
        "reservations_running",
        "control_plane_cpu_percent",
        "control_plane_rss_mib",
        "control_plane_cpu_ms_per_sync",
        "control_plane_cpu_wait_percent",
        "agents_cpu_percent",
    ] {
        assert!(
            doc[field].is_number(),
            "{field} missing or not a number: {doc}"
        );
    }
    assert_eq!(doc["backend"], backend, "{doc}");
    assert_eq!(doc["nodes"], 20, "{doc}");
    assert_eq!(doc["gpus"], 160, "{doc}");
    assert!(doc["syncs"].as_u64().unwrap() > 0, "no syncs: {doc}");
    assert_eq!(doc["errors"], 0, "sync errors: {doc}");
    assert_eq!(doc["reservation_errors"], 0, "reservations refused: {doc}");
    assert!(
        doc["reservations_placed"].as_u64().unwrap() > 0,
        "no reservation reached its agent: {doc}"
    );
    assert!(
        doc["reservations_running"].as_u64().unwrap() > 0,
        "no reservation ran: {doc}"
    );
    assert!(
        doc["sync_p99_ms"].as_f64().unwrap() >= doc["sync_p50_ms"].as_f64().unwrap(),
        "{doc}"
    );
    assert!(
        doc["control_plane_rss_mib"].as_f64().unwrap() > 0.0,
        "the control plane's memory was not read: {doc}"
    );
    match backend {
        "postgres" => assert!(doc["database_cpu_percent"].is_number(), "{doc}"),
        _ => assert!(doc["database_cpu_percent"].is_null(), "{doc}"),
    }
}

#[test]
fn bench_fleet_short_run_on_sqlite() {
    short_fleet(None, "sqlite");
}

#[test]
fn bench_fleet_short_run_on_postgres() {
    if std::env::var(PG_URL_VAR).is_err() {
        eprintln!("{PG_URL_VAR} is not set (scripts/test.sh sets it): PostgreSQL not tested");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let db = runtime
        .block_on(TestDatabase::new(Backend::Postgres))
        .unwrap();
    short_fleet(Some(&db.url), "postgres");
}
