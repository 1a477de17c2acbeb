//! Quotas through the CLI, with a real control plane and agent: an admin gives a team its
//! GPUs, a tenant without a quota borrows (shown in `get`), and a tenant may not set quotas.

use crate::support::{eventually, Cluster};

#[test]
fn an_admin_sets_a_quota_and_borrowed_work_says_so() {
    let cluster = Cluster::start("127.0.0.1:0");
    let _agent = cluster.agent("q-node", &cluster.agent_args("q-node", &[]));
    cluster.wait_ready(1);
    let olga = cluster.tenant("olga");
    let arty = cluster.tenant("arty");
    let admin = |args: &[&str]| cluster.cli(Some(&cluster.admin), false, args);
    assert_eq!(
        cluster
            .cli(Some(&olga), false, &["teams", "create", "lab"])
            .code,
        0
    );

    let bad = admin(&["quotas", "set", "lab", "--gpu", "rtx4090", "--gpus", "x"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("not a number of GPUs"), "{bad:?}");
    let refused = cluster.cli(
        Some(&olga),
        false,
        &["quotas", "set", "lab", "--gpu", "rtx4090", "--gpus", "1"],
    );
    assert_ne!(refused.code, 0, "a tenant sets no quota: {refused:?}");
    let set = admin(&[
        "quotas",
        "set",
        "lab",
        "--gpu",
        "rtx4090",
        "--gpus",
        "1",
        "--borrow-limit",
        "0.5",
    ]);
    assert_eq!(set.code, 0, "{set:?}");
    assert!(
        set.stdout
            .contains("lab has 1 rtx4090 GPUs guaranteed, may borrow 0.5 more"),
        "{set:?}"
    );
    let listed = admin(&["quotas", "ls"]);
    assert!(
        listed.stdout.contains("lab") && listed.stdout.contains("0.5"),
        "{listed:?}"
    );

    // arty has no quota of a type with quotas: his work is borrowed, and `get` says so.
    let id = cluster.reserve(
        &arty,
        &["--gpu", "rtx4090", "--hours", "1", "--", "sleep", "600"],
    );
    eventually("arty's work to run", 30, || {
        cluster.get(&arty, &id)["status"] == "running"
    });
    let shown = cluster.cli(Some(&arty), false, &["get", &id]).stdout;
    assert!(shown.contains("borrowed:"), "{shown}");

    assert_eq!(admin(&["quotas", "rm", "lab", "--gpu", "rtx4090"]).code, 0);
    let gone = admin(&["quotas", "rm", "lab", "--gpu", "rtx4090"]);
    assert_ne!(gone.code, 0, "{gone:?}");
}
