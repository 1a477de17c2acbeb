//! MIG: an agent whose (fake) NVML reports an H200 with MIG on offers each MIG device as a unit
//! of its own type, priced as its part of the H200, and a reservation of one gets that MIG
//! device's UUID in `CUDA_VISIBLE_DEVICES`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::support::{eventually, Cluster};

const THREE_G: &str = "MIG-7c2e6a2b-8f3d-5b1e-9a44-0d6f1c3e2b71";
const ONE_G: [&str; 2] = [
    "MIG-e5b84f17-0c6a-5d29-8e3b-2f71a9c4d608",
    "MIG-1f6d3b28-a94e-5c71-9d02-6b8e4f3a7c15",
];

/// The written H200 fixture with MIG on: 3g.71gb, 2g.35gb and two 1g.18gb.
fn mig_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/nvidia-h200/nvml-mig.json")
}

/// The offers by type: (available, vram_gb, price_per_hour).
fn offers(cluster: &Cluster, token: &str) -> BTreeMap<String, (Value, Value, Value)> {
    let offers = cluster.cli(Some(token), true, &["offers"]).json();
    offers
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["gpu_type"].as_str().unwrap_or_default().to_owned(),
                (
                    o["available"].clone(),
                    o["vram_gb"].clone(),
                    o["price_per_hour"].clone(),
                ),
            )
        })
        .collect()
}

/// Waits for a reservation to end; its last state and its log.
fn finished(cluster: &Cluster, token: &str, id: &str) -> (Value, String) {
    let mut last = Value::Null;
    eventually(&format!("{id} to end"), 30, || {
        last = cluster.get(token, id);
        matches!(last["status"].as_str(), Some("stopped" | "failed"))
    });
    let logs = cluster.cli(Some(token), false, &["logs", id]);
    (last, logs.stdout)
}

#[test]
fn mig_fixtures_give_offers_and_reservations_of_mig_units() {
    // The H200 at 7.00 an hour, so its slices cost whole sevenths of it.
    let prices = tempfile::tempdir().unwrap();
    let price_file = prices.path().join("prices.toml");
    std::fs::write(&price_file, "[gpu]\n\"H200\" = \"7.00\"\n").unwrap();
    let cluster = Cluster::start_with("127.0.0.1:0", &["--prices", price_file.to_str().unwrap()]);
    let mut args = cluster.agent_args("h200", &[]);
    let sim = args.iter().position(|a| a == "--sim-gpus").unwrap();
    args.splice(
        sim..sim + 2,
        [
            "--fake-nvml".to_owned(),
            mig_fixture().to_str().unwrap().to_owned(),
        ],
    );
    let _agent = cluster.agent("h200", &args);
    cluster.wait_ready(1);

    // The node's GPUs are its MIG devices, each with its own type and memory.
    let nodes = cluster.nodes();
    let gpus: Vec<(String, String, Value)> = nodes[0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["uuid"].as_str().unwrap().to_owned(),
                g["model"].as_str().unwrap().to_owned(),
                g["vram_gb"].clone(),
            )
        })
        .collect();
    assert_eq!(gpus.len(), 4, "{nodes:?}");
    assert!(
        gpus.contains(&(THREE_G.into(), "H200-MIG-3G.71GB".into(), json!(70)))
            && ONE_G.iter().all(|u| gpus.contains(&(
                (*u).into(),
                "H200-MIG-1G.18GB".into(),
                json!(18)
            ))),
        "{gpus:?}"
    );
    let table = cluster.cli(Some(&cluster.admin), false, &["nodes", "ls"]);
    assert_eq!(table.code, 0, "{table:?}");

    // Each profile is a type of its own, priced as its compute slices of the H200; the H200
    // itself is not offered while MIG is on.
    let alice = cluster.tenant("alice");
    let offered = offers(&cluster, &alice);
    assert_eq!(
        offered,
        BTreeMap::from([
            (
                "H200-MIG-1G.18GB".to_owned(),
                (json!(2), json!(18), json!("1.00"))
            ),
            (
                "H200-MIG-2G.35GB".to_owned(),
                (json!(1), json!(35), json!("2.00"))
            ),
            (
                "H200-MIG-3G.71GB".to_owned(),
                (json!(1), json!(70), json!("3.00"))
            ),
        ]),
        "{offered:?}"
    );
    let human = cluster.cli(Some(&alice), false, &["offers"]);
    assert!(human.stdout.contains("H200-MIG-3G.71GB"), "{human:?}");

    // The 3g.71gb, named as NVIDIA writes it: the workload sees that MIG device only.
    let r = cluster.cli(
        Some(&alice),
        true,
        &[
            "reserve",
            "--gpu",
            "H200 MIG 3g.71gb",
            "--hours",
            "1",
            "--",
            "sh",
            "-c",
            "echo visible=$CUDA_VISIBLE_DEVICES",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let r = r.json();
    assert_eq!(
        (r["gpu_type"].as_str(), r["price_per_hour"].as_str()),
        (Some("H200-MIG-3G.71GB"), Some("3.00")),
        "{r}"
    );
    let id = r["id"].as_str().unwrap().to_owned();
    let (last, log) = finished(&cluster, &alice, &id);
    assert_eq!(last["status"], "stopped", "{last}\nlog: {log}");
    assert_eq!(last["gpus"], json!([THREE_G]), "{last}");
    assert!(log.contains(&format!("visible={THREE_G}")), "{log}");

    // The two 1g.18gb go to two reservations; a third finds no capacity, while the 2g.35gb
    // is still there to rent.
    let long = |gpu: &str| {
        cluster.reserve(
            &alice,
            &["--gpu", gpu, "--hours", "1", "--", "sleep", "300"],
        )
    };
    let first = long("h200 mig 1g.18gb");
    let second = long("H200-MIG-1G.18GB");
    let mut held = Vec::new();
    for id in [&first, &second] {
        eventually(&format!("{id} running"), 30, || {
            cluster.get(&alice, id)["status"] == "running"
        });
        held.extend(
            cluster.get(&alice, id)["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_str().unwrap().to_owned()),
        );
    }
    held.sort();
    let mut both = ONE_G.map(str::to_owned).to_vec();
    both.sort();
    assert_eq!(held, both);
    let third = cluster.cli(
        Some(&alice),
        true,
        &[
            "reserve",
            "--gpu",
            "H200 MIG 1g.18gb",
            "--hours",
            "1",
            "--",
            "true",
        ],
    );
    assert_ne!(third.code, 0, "{third:?}");
    assert_eq!(third.json()["error"]["code"], "no_capacity", "{third:?}");
    assert_eq!(
        offers(&cluster, &alice)["H200-MIG-1G.18GB"].0,
        json!(0),
        "both 1g.18gb are rented"
    );
    let two_g = long("H200 MIG 2g.35gb");
    eventually("the 2g.35gb running", 30, || {
        cluster.get(&alice, &two_g)["status"] == "running"
    });
    for id in [&first, &second, &two_g] {
        let stop = cluster.cli(Some(&alice), true, &["stop", id]);
        assert_eq!(stop.code, 0, "{stop:?}");
    }
    for id in [&first, &second, &two_g] {
        eventually(&format!("{id} stopped"), 30, || {
            cluster.get(&alice, id)["status"] == "stopped"
        });
    }

    // Several units of one type in one reservation, like GPUs: the workload sees both.
    let pair = cluster.reserve(
        &alice,
        &[
            "--gpu",
            "H200 MIG 1g.18gb",
            "--count",
            "2",
            "--hours",
            "1",
            "--",
            "sh",
            "-c",
            "echo visible=$CUDA_VISIBLE_DEVICES",
        ],
    );
    let (last, log) = finished(&cluster, &alice, &pair);
    assert_eq!(last["status"], "stopped", "{last}\nlog: {log}");
    assert!(
        ONE_G.iter().all(|u| log.contains(u)) && log.contains("visible=MIG-"),
        "{log}"
    );
    cluster.ledger_check();
}
