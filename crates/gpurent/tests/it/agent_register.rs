//! An agent the control plane refuses at registration says why, with the server's reason; a node
//! that fails verification shows why in `nodes ls`.

use crate::support::{Cluster, Daemon};

#[test]
fn an_agent_refused_at_registration_prints_the_reason() {
    let cluster = Cluster::start("127.0.0.1:0");
    let first = cluster.agent("box-1", &cluster.agent_args("box-1", &[]));
    cluster.wait_ready(1);

    // Another machine (another data dir) that picked the same name.
    let mut args = cluster.agent_args("box-1", &[]);
    let at = args.iter().position(|a| a == "--data-dir").unwrap() + 1;
    args[at] = cluster.dir.path().join("other").display().to_string();
    let log = cluster.dir.path().join("other.log");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut second = Daemon::start_quiet(&args, &log);
    let mut code = None;
    crate::support::eventually("the refused agent to exit", 30, || {
        code = second.child.try_wait().ok().flatten().map(|s| s.code());
        code.is_some()
    });
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(Some(1)), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error:")
            && last.contains("409")
            && last.contains("conflict")
            && last.contains("already registered"),
        "the last line must say the server's reason (409 conflict, name taken):\n{stderr}"
    );
    drop(first);
}

/// A node that fails host verification is `unverified`, and `nodes ls` says which check
/// failed and why (a refused agent's protocol is said the same way).
#[test]
fn nodes_ls_says_why_a_node_is_unverified() {
    let cluster = Cluster::start_with("127.0.0.1:0", &["--min-disk-free-gb", "999999"]);
    let _agent = cluster.agent("box-1", &cluster.agent_args("box-1", &[]));
    crate::support::eventually("the node unverified", 30, || {
        cluster.node_status("box-1").as_deref() == Some("unverified")
    });
    let table = cluster.cli(Some(&cluster.admin), false, &["nodes", "ls"]);
    assert_eq!(table.code, 0, "{table:?}");
    let row = table
        .stdout
        .lines()
        .find(|l| l.starts_with("box-1"))
        .unwrap_or_else(|| panic!("no row for box-1: {}", table.stdout));
    assert!(
        row.contains("unverified") && row.contains("disk: ") && row.ends_with("under 999999 GiB"),
        "{row}"
    );
}
