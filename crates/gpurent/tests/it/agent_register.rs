//! An agent the control plane refuses at registration says why, with the server's reason.

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
