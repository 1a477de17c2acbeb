//! Job arrays with real parts: an array over three real agents (separate processes, the
//! process executor), each task seeing its `GPURENT_ARRAY_INDEX`, never more than its limit at
//! once, named `ID[INDEX]` by the CLI, and summarised by `get` and `ls`.

use crate::support::{eventually, Cluster};

#[test]
fn an_array_runs_each_index_on_real_agents() {
    let cluster = Cluster::start("127.0.0.1:0");
    let _agents: Vec<_> = ["a1", "a2", "a3"]
        .iter()
        .map(|name| {
            let args = cluster.agent_args_on(name, &["--sim-gpus", "2xRTX4090"], &[]);
            cluster.agent(name, &args)
        })
        .collect();
    cluster.wait_ready(3);
    let sam = cluster.tenant("sam");
    let array = cluster.reserve(
        &sam,
        &[
            "--gpu",
            "rtx4090",
            "--hours",
            "1",
            "--array",
            "0-19%3",
            "--",
            "sh",
            "-c",
            "echo \"index $GPURENT_ARRAY_INDEX of $GPURENT_RESERVATION_ID\"; sleep 0.3",
        ],
    );
    let mut most = 0;
    eventually("the array to end", 120, || {
        let r = cluster.get(&sam, &array);
        let live = r["array"]["running"].as_u64().unwrap_or(0);
        most = most.max(live);
        r["ended_at"].is_string()
    });
    assert!(most <= 3, "{most} tasks ran at once");
    let r = cluster.get(&sam, &array);
    assert_eq!(r["status"], "stopped", "{r}");
    assert_eq!(r["array"]["done"], 20, "{r}");

    // Each task saw its own index, and is named by it.
    for index in [0, 7, 19] {
        let name = format!("{array}[{index}]");
        let task = cluster.get(&sam, &name);
        assert_eq!(task["array_index"], index, "{task}");
        let id = task["id"].as_str().unwrap();
        let logs = cluster.cli(Some(&sam), false, &["logs", &name]);
        assert_eq!(logs.code, 0, "{logs:?}");
        assert!(
            logs.stdout.contains(&format!("index {index} of {id}")),
            "{name}: {}",
            logs.stdout
        );
    }

    // `get` and `ls` say what the array did, in words too.
    let text = cluster.cli(Some(&sam), false, &["get", &array]);
    assert!(
        text.stdout
            .contains("array 0-19%3: 20 tasks: 20 done, 0 running, 0 failed, 0 stopped, 0 queued"),
        "{}",
        text.stdout
    );
    let ls = cluster.cli(Some(&sam), true, &["ls"]).json();
    let listed = ls.as_array().unwrap();
    assert_eq!(listed.len(), 1, "the array, not its tasks: {ls}");
    assert_eq!(listed[0]["id"], array.as_str());
    // An array is not a place to ssh into: the CLI says how to name a task.
    let ssh = cluster.cli(Some(&sam), false, &["ssh", &array]);
    assert_ne!(ssh.code, 0);
    assert!(
        ssh.stderr
            .contains("is a job array of 20 tasks: name one as"),
        "{ssh:?}"
    );
    cluster.ledger_check();
}
