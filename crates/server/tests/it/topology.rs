//! Whole GPUs for one reservation come from one PCIe switch when one has enough.

use gpurent_store::Backend;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::both_stores;

/// The node's GPU indices (its order in `nodes ls`) of a reservation.
fn indices(node: &Value, reservation: &Value) -> Vec<usize> {
    let order: Vec<&str> = node["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["uuid"].as_str().expect("uuid"))
        .collect();
    let mut at: Vec<usize> = reservation["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|u| {
            order
                .iter()
                .position(|o| Some(*o) == u.as_str())
                .expect("a GPU of the node")
        })
        .collect();
    at.sort_unstable();
    at
}

async fn gangs_stay_under_one_switch(backend: Backend) {
    // Two switches of four: GPUs 0-3 and 4-7.
    let app = TestApp::with(backend)
        .with_sim_gpus("8xRTX4090/4")
        .start()
        .await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    let groups: Vec<Value> = nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["switch_group"].clone())
        .collect();
    assert_eq!(groups, [0, 0, 0, 0, 1, 1, 1, 1].map(|g| json!(g)));

    let alice = app.tenant("alice", "500").await;
    let reserve = |count: u32| {
        let client = alice.client.clone();
        async move {
            let (_, r) = client
                .reserve(json!({"gpu_type": "rtx4090", "gpu_count": count, "hours": 1}))
                .await;
            r
        }
    };
    let one = reserve(1).await;
    let four = reserve(4).await;
    let (_, nodes) = app.admin().get("/api/v1/nodes").await;
    assert_eq!(indices(&nodes[0], &one), [0]);
    // The lowest free GPUs would be 1-4, across both switches.
    assert_eq!(indices(&nodes[0], &four), [4, 5, 6, 7]);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    gangs_stay_under_one_switch_test,
    gangs_stay_under_one_switch
);
