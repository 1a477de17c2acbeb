//! The contract flow end to end through the CLI: `gpurent up`, a tenant with credit, offers,
//! reserve, running, stop, the exact charge and the new balance.

use std::os::unix::fs::PermissionsExt;

use chrono::{DateTime, Utc};
use gpurent_types::Money;
use serde_json::json;

use crate::support::{cli, eventually, read_token, Daemon};

#[test]
fn the_contract_flow_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = Daemon::up_sim(&data, "2xRTX4090", &[], &dir.path().join("up.log"));
    let url = up.url.clone();
    let admin = read_token(&data);
    let mode = std::fs::metadata(data.join("admin.token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "admin.token must be private");

    let alice = cli(
        &url,
        Some(&admin),
        true,
        &["users", "create", "alice", "--credit", "100"],
    );
    assert_eq!(alice.code, 0, "{alice:?}");
    let alice = alice.json();
    assert_eq!(
        (alice["name"].as_str(), alice["role"].as_str()),
        (Some("alice"), Some("tenant"))
    );
    let token = alice["token"].as_str().unwrap().to_owned();
    let t = Some(token.as_str());

    assert_eq!(
        cli(&url, t, true, &["balance"]).json(),
        json!({"balance": "100.00", "currency": "USD", "held": "0.00", "earnings": "0.00"})
    );
    let offers = cli(&url, t, true, &["offers"]).json();
    for (field, value) in [
        ("gpu_type", json!("RTX4090")),
        ("vram_gb", json!(24)),
        ("available", json!(2)),
        ("price_per_hour", json!("2.50")),
        ("spot_min_bid", json!("1.00")),
    ] {
        assert_eq!(offers[0][field], value, "{field} in {offers}");
    }

    let r = cli(
        &url,
        t,
        true,
        &[
            "reserve", "--gpu", "RTX-4090", "--hours", "1", "--", "python", "train.py",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let r = r.json();
    assert_eq!(
        (
            r["gpu_type"].as_str(),
            r["gpu_count"].as_u64(),
            r["price_per_hour"].as_str(),
            r["tier"].as_str()
        ),
        (Some("RTX4090"), Some(1), Some("2.50"), Some("on-demand"))
    );
    let id = r["id"].as_str().unwrap().to_owned();
    eventually("running", 30, || {
        cli(&url, t, true, &["get", &id]).json()["status"] == "running"
    });
    let listed = cli(&url, t, true, &["ls"]).json();
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    assert_eq!(listed[0]["command"], json!(["python", "train.py"]));

    std::thread::sleep(std::time::Duration::from_millis(2100));
    let stopped = cli(&url, t, true, &["stop", &id]);
    assert_eq!(stopped.json(), json!({"id": id, "status": "stopping"}));
    eventually("stopped", 30, || {
        cli(&url, t, true, &["get", &id]).json()["status"] == "stopped"
    });
    let done = cli(&url, t, true, &["get", &id]).json();
    let started: DateTime<Utc> = done["started_at"].as_str().unwrap().parse().unwrap();
    let ended: DateTime<Utc> = done["ended_at"].as_str().unwrap().parse().unwrap();
    let seconds = (ended - started).num_seconds();
    assert!(seconds >= 2, "ran {seconds} s");
    let charge = seconds * 2_500_000 / 3600;
    assert_eq!(done["charged"], Money::from_micros(charge).to_string());
    let balance = cli(&url, t, true, &["balance"]).json();
    assert_eq!(
        balance["balance"],
        Money::from_micros(100_000_000 - charge).to_string()
    );

    // The month's invoice says the same, as JSON and as CSV (a header, the line, the total).
    let month = started.format("%Y-%m").to_string();
    let invoice = cli(&url, t, true, &["invoice", &month]).json();
    assert_eq!(invoice["total"], done["charged"], "{invoice}");
    let csv = cli(&url, t, false, &["invoice", &month, "--csv"]);
    assert_eq!(csv.code, 0, "{csv:?}");
    let rows: Vec<&str> = csv.stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{csv:?}");
    assert!(rows[1].contains(&id), "{csv:?}");
    // The node belongs to the admin who made its join token: 80% of the charge.
    let earned = cli(&url, Some(&admin), true, &["earnings"]).json();
    assert_eq!(
        earned["total"],
        Money::from_micros(charge * 8 / 10).to_string(),
        "{earned}"
    );
    let spot = cli(&url, Some(&admin), true, &["admin", "spot"]).json();
    assert_eq!(spot["ended"], 0, "{spot}");

    // Errors: one JSON document on stdout and a non-zero exit.
    let missing = cli(&url, t, true, &["get", "no-such-id"]);
    assert_eq!(missing.code, 1);
    assert_eq!(missing.json()["error"]["code"], "not_found");
    // An id is one path segment: it cannot reach another endpoint.
    let sneaky = cli(
        &url,
        Some(&admin),
        true,
        &["stop", "../../nodes/join-token?"],
    );
    assert_eq!(
        (sneaky.code, sneaky.json()["error"]["code"].as_str()),
        (1, Some("not_found")),
        "{sneaky:?}"
    );
    let forbidden = cli(&url, t, true, &["nodes", "ls"]);
    assert_eq!(
        (forbidden.code, forbidden.json()["error"]["code"].as_str()),
        (1, Some("forbidden"))
    );
    let no_capacity = cli(
        &url,
        t,
        true,
        &[
            "reserve", "--gpu", "rtx4090", "--count", "3", "--hours", "1",
        ],
    );
    assert_eq!(no_capacity.json()["error"]["code"], "no_capacity");

    // --queue: waits as pending while the GPUs are taken and runs when they free; what no
    // node could ever take is still refused.
    let both = cli(
        &url,
        t,
        true,
        &[
            "reserve", "--gpu", "rtx4090", "--count", "2", "--hours", "1",
        ],
    );
    let both = both.json()["id"].as_str().unwrap().to_owned();
    let queued = cli(
        &url,
        t,
        true,
        &["reserve", "--gpu", "rtx4090", "--hours", "1", "--queue"],
    );
    assert_eq!(queued.code, 0, "{queued:?}");
    let queued = queued.json();
    assert_eq!(queued["status"], "pending", "{queued}");
    assert!(queued["queue_reason"].is_string(), "{queued}");
    let queued = queued["id"].as_str().unwrap().to_owned();
    let never = cli(
        &url,
        t,
        true,
        &[
            "reserve", "--gpu", "rtx4090", "--count", "3", "--hours", "1", "--queue",
        ],
    );
    assert_eq!(never.json()["error"]["code"], "no_capacity");
    cli(&url, t, true, &["stop", &both]);
    eventually("the queued reservation running", 30, || {
        cli(&url, t, true, &["get", &queued]).json()["status"] == "running"
    });
    cli(&url, t, true, &["stop", &queued]);
    eventually("the queued reservation stopped", 30, || {
        cli(&url, t, true, &["get", &queued]).json()["status"] == "stopped"
    });
    let human = cli(&url, t, false, &["offers"]);
    assert!(human.stdout.starts_with("GPU"), "{human:?}");

    let nodes = cli(&url, Some(&admin), true, &["nodes", "ls"]).json();
    assert_eq!(nodes[0]["status"], "ready");
    assert_eq!(nodes[0]["gpus"].as_array().map(Vec::len), Some(2));
    let status = up.terminate();
    assert!(status.success(), "gpurent up exited with {status}");
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let run = cli("http://127.0.0.1:9", Some("x"), true, &["balance"]);
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["error"]["code"], "unreachable");
}

#[test]
fn usage_errors_are_json_errors_with_json() {
    let run = cli(
        "http://127.0.0.1:9",
        None,
        true,
        &["reserve", "--hours", "1"],
    );
    assert_eq!(run.code, 2);
    let body = run.json();
    assert_eq!(body["error"]["code"], "usage");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--gpu")),
        "{body}"
    );
    let human = cli(
        "http://127.0.0.1:9",
        None,
        false,
        &["reserve", "--hours", "1"],
    );
    assert_eq!((human.code, human.stdout.as_str()), (2, ""));
}

#[tokio::test]
async fn ledger_check_finds_a_tampered_balance() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = [
        "up",
        "--data-dir",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--sim-gpus",
        "1xRTX4090",
        "--executor",
        "sim",
    ];
    let up = Daemon::start(&args, &dir.path().join("up1.log"));
    let admin = read_token(&data);
    cli(
        &up.url,
        Some(&admin),
        true,
        &["users", "create", "bob", "--credit", "10"],
    );
    let check = cli(&up.url, Some(&admin), true, &["admin", "ledger-check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert_eq!(check.json()["ok"], true);
    assert!(up.terminate().success());

    // Someone edits a balance behind the ledger's back.
    let url = format!("sqlite://{}?mode=rw", data.join("gpurent.db").display());
    let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE accounts SET balance = balance + 1000000 WHERE id LIKE 'user:%' AND balance > 0",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    drop(conn);

    let up = Daemon::start(&args, &dir.path().join("up2.log"));
    let check = cli(&up.url, Some(&admin), true, &["admin", "ledger-check"]);
    assert_eq!(check.code, 1, "{check:?}");
    let report = check.json();
    assert_eq!(report["ok"], false);
    assert_eq!(report["sum"], "1.00");
    assert_eq!(report["mismatched"][0]["cached"], "11.00");
    assert_eq!(report["mismatched"][0]["derived"], "10.00");
}

#[test]
fn owners_set_their_prices_in_a_price_file() {
    let dir = tempfile::tempdir().unwrap();
    let prices = dir.path().join("prices.toml");
    std::fs::write(&prices, "[gpu]\n\"RTX 4090\" = \"1.99\"\n").unwrap();
    let data = dir.path().join("data");
    let up = Daemon::up_sim(
        &data,
        "1xRTX4090",
        &["--prices", prices.to_str().unwrap()],
        &dir.path().join("up.log"),
    );
    let offers = cli(&up.url, Some(&read_token(&data)), true, &["offers"]).json();
    assert_eq!(offers[0]["price_per_hour"], "1.99");
    assert!(up.terminate().success());

    std::fs::write(&prices, "[gpu]\n\"RTX 4090\" = \"cheap\"\n").unwrap();
    let out = std::process::Command::new(crate::support::BIN)
        .args([
            "up",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--prices",
            prices.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RTX 4090") && stderr.contains("cheap"),
        "{stderr}"
    );
}
