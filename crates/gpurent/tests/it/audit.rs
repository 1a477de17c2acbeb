//! `gpurent audit verify|ls|export` against a real control plane: the trail verifies, exports
//! as JSON lines, and after a record is changed in the database file, `verify` names it and
//! exits 1 (the contract's `{"ok", "records", "first_bad"}`).

use crate::support::{cli, Cluster};

#[test]
fn the_trail_verifies_exports_and_names_a_changed_record() {
    let cluster = Cluster::start("127.0.0.1:0");
    let token = cluster.tenant("pat");
    let (url, admin) = (cluster.url.as_str(), cluster.admin.as_str());
    assert_eq!(cli(url, Some(&token), true, &["balance"]).code, 0);
    assert_ne!(cli(url, Some(&token), true, &["audit", "verify"]).code, 0);

    let verify = cli(url, Some(admin), true, &["audit", "verify"]);
    assert_eq!(verify.code, 0, "{verify:?}");
    let verdict = verify.json();
    assert_eq!(verdict["ok"], true);
    assert_eq!(verdict["first_bad"], serde_json::Value::Null);
    let records = verdict["records"].as_u64().unwrap();
    assert!(records >= 3, "{verdict}");

    let out = cluster.dir.path().join("trail.jsonl");
    let export = cli(
        url,
        Some(admin),
        false,
        &["audit", "export", "--out", out.to_str().unwrap()],
    );
    assert_eq!(export.code, 0, "{export:?}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() as u64 >= records);
    let balance = lines
        .iter()
        .find(|r| r["action"] == "GET /api/v1/balance" && r["outcome"] == 200)
        .expect("the balance request");
    let seq = balance["seq"].as_u64().unwrap();

    let ls = cli(
        url,
        Some(admin),
        true,
        &[
            "audit",
            "ls",
            "--resource",
            "/api/v1/balance",
            "--from",
            "2020-01-01",
        ],
    );
    assert_eq!(ls.code, 0, "{ls:?}");
    assert_eq!(ls.json().as_array().unwrap().len(), 1);
    let bad = cli(
        url,
        Some(admin),
        true,
        &["audit", "ls", "--from", "yesterday"],
    );
    assert_ne!(bad.code, 0);
    assert!(bad.stdout.contains("invalid_value"), "{bad:?}");

    // Someone with access to the database file changes who made the request.
    let db = cluster.dir.path().join("data").join("gpurent.db");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&format!(
            "sqlite://{}",
            db.display()
        ))
        .await
        .unwrap();
        sqlx::query(&format!(
            "UPDATE audit_log SET user_id = 'someone-else' WHERE seq = {seq}"
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    });
    let verify = cli(url, Some(admin), true, &["audit", "verify"]);
    assert_eq!(verify.code, 1, "{verify:?}");
    let verdict = verify.json();
    assert_eq!(verdict["ok"], false);
    assert_eq!(verdict["first_bad"]["seq"], seq);
    assert_eq!(verdict["first_bad"]["problem"], "altered");
    let human = cli(url, Some(admin), false, &["audit", "verify"]);
    assert_eq!(human.code, 1);
    assert!(
        human.stdout.contains(&format!("BROKEN at record {seq}")),
        "{human:?}"
    );
}
