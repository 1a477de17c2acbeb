//! Self-fencing: an agent that cannot reach the control plane for longer than its lease stops
//! its tenants' work, so work rescheduled elsewhere never runs twice.

use std::time::Duration;

use gpurent_store::Backend;
use serde_json::json;

use crate::app::TestApp;

fn alive(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_past_its_lease_stops_its_instances() {
    let mut app = TestApp::with(Backend::Sqlite)
        .with_agent_lease(Duration::from_secs(1))
        .start()
        .await;
    let dir = app.add_process_node("lonely", Duration::from_secs(1)).await;
    let t = app.tenant("tia", "10").await;
    let (_, r) = t.client.reserve(json!({"gpu_type": "rtx4090", "hours": 1, "command": ["sh", "-c", "echo $$ > \"$HOME/pid\"; exec sleep 300"]})).await;
    let id = r["id"].as_str().unwrap().to_owned();
    app.wait_status(&t.client, &id, "running").await;
    let pid_file = dir.join("instances").join(&id).join("pid");
    let mut pid = 0;
    for _ in 0..100 {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            pid = p;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pid > 0 && alive(pid));

    // The control plane goes away; within a short while past the lease the work must stop,
    // and not before the lease.
    app.server.take().unwrap().shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive(pid), "fenced before the lease ran out");
    let mut stopped = false;
    for _ in 0..200 {
        if !alive(pid) {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stopped,
        "the agent kept running its instance without the control plane"
    );
    app.shutdown().await;
}
