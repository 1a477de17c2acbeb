//! Teams through the CLI, with a real control plane and agent: a lab's owner makes the team,
//! adds a student and moves credit in; the student, with no credit of their own, runs work for
//! the team, paid from its balance; a move beyond the owner's balance says why.

use crate::support::{eventually, Cluster};

#[test]
fn a_lab_shares_its_grant_through_the_cli() {
    let cluster = Cluster::start("127.0.0.1:0");
    let _agent = cluster.agent("lab-node", &cluster.agent_args("lab-node", &[]));
    cluster.wait_ready(1);
    let olga = cluster.tenant("olga");
    let mia = cluster.tenant("mia");
    let cli = |token: &str, json: bool, args: &[&str]| cluster.cli(Some(token), json, args);

    let made = cli(&olga, false, &["teams", "create", "lab"]);
    assert_eq!(made.code, 0, "{made:?}");
    assert!(made.stdout.contains("you are its owner"), "{}", made.stdout);
    let added = cli(
        &olga,
        false,
        &["teams", "add", "lab", "mia", "--role", "member"],
    );
    assert_eq!(added.code, 0, "{added:?}");
    assert!(
        added.stdout.contains("mia is member of team lab"),
        "{}",
        added.stdout
    );
    // Beyond the owner's balance (50): refused, saying so; nothing moved.
    let short = cli(&olga, false, &["credit", "move", "80", "--to-team", "lab"]);
    assert_ne!(short.code, 0);
    assert!(short.stderr.contains("not enough credit"), "{short:?}");
    let moved = cli(&olga, true, &["credit", "move", "20", "--to-team", "lab"]).json();
    assert_eq!(
        (moved["team_balance"].as_str(), moved["balance"].as_str()),
        (Some("20.00"), Some("30.00"))
    );
    // mia has 50 of her own: the lab's work is paid from the lab's balance, not hers.
    let id = cluster.reserve(
        &mia,
        &[
            "--team", "lab", "--gpu", "rtx4090", "--hours", "1", "--", "sleep", "600",
        ],
    );
    eventually("the lab's work to run", 30, || {
        cluster.get(&mia, &id)["status"] == "running"
    });
    let shown = cli(&mia, false, &["get", &id]).stdout;
    assert!(shown.contains("team: lab"), "{shown}");
    let listed = cli(&olga, false, &["ls"]).stdout;
    assert!(
        listed.contains(&id),
        "the owner sees the team's work: {listed}"
    );
    let lab = cli(&olga, false, &["teams", "get", "lab"]).stdout;
    assert!(
        lab.contains("olga") && lab.contains("owner") && lab.contains("member"),
        "{lab}"
    );

    let stopped = cli(&mia, false, &["stop", &id]);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    eventually("stopped", 30, || {
        cluster.get(&mia, &id)["status"] == "stopped"
    });
    // A CI token that can only reserve (and read) for the lab: no --team needed with it.
    let made = cli(
        &olga,
        true,
        &[
            "tokens",
            "create",
            "--name",
            "ci",
            "--team",
            "lab",
            "--scope",
            "reserve,read",
            "--expires",
            "30d",
        ],
    )
    .json();
    assert_eq!(
        made["scopes"],
        serde_json::json!(["read", "reserve"]),
        "{made}"
    );
    let ci = made["token"].as_str().unwrap().to_owned();
    // For people, the team by its name.
    let said = cli(
        &olga,
        false,
        &[
            "tokens",
            "create",
            "--team",
            "lab",
            "--scope",
            "read",
            "--expires",
            "1d",
        ],
    );
    assert!(said.stdout.contains("; for team lab)"), "{said:?}");
    let by_ci = cluster.reserve(
        &ci,
        &["--gpu", "rtx4090", "--hours", "1", "--", "sleep", "600"],
    );
    assert_eq!(cluster.get(&ci, &by_ci)["team"], "lab");
    // Not olga's own account, and not what its scopes lack.
    let refused = cli(&ci, false, &["balance"]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("bound to a team"), "{refused:?}");
    let refused = cli(&ci, false, &["usage"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("do not include billing"),
        "{refused:?}"
    );
    let bad = cli(
        &olga,
        false,
        &["tokens", "create", "--scope", "root", "--expires", "1d"],
    );
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("is not a scope"), "{bad:?}");
    let listed = cli(&olga, false, &["tokens", "ls"]).stdout;
    assert!(listed.contains("read,reserve"), "{listed}");
    assert_eq!(cli(&ci, false, &["stop", &by_ci]).code, 0);
    eventually("stopped", 30, || {
        cluster.get(&ci, &by_ci)["status"] == "stopped"
    });

    let charged: gpurent_types::Money = cluster.get(&mia, &id)["charged"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let ci_charged: gpurent_types::Money = cluster.get(&ci, &by_ci)["charged"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let teams = cli(&olga, true, &["teams", "ls"]).json();
    let balance: gpurent_types::Money = teams[0]["balance"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        balance.micros() + charged.micros() + ci_charged.micros(),
        20_000_000,
        "the lab paid for it: {teams}"
    );
    // The lab's statement, by its name, to a member.
    let used = cli(&mia, true, &["usage", "--team", "lab"]).json();
    let total: gpurent_types::Money = used["total"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        total.micros(),
        charged.micros() + ci_charged.micros(),
        "{used}"
    );
    let mine = cli(&mia, true, &["balance"]).json();
    assert_eq!(mine["balance"], "50.00", "mia paid nothing: {mine}");
    // The lab's volumes are listed by name; a team not hers is told apart.
    let volumes = cli(&mia, true, &["volumes", "ls", "--team", "lab"]);
    assert_eq!(volumes.code, 0, "{volumes:?}");
    assert_eq!(volumes.json(), serde_json::json!([]));
    let unknown = cli(
        &mia,
        false,
        &["volumes", "create", "x", "--size", "1GB", "--team", "nope"],
    );
    assert_ne!(unknown.code, 0);
    assert!(unknown.stderr.contains("nope"), "{unknown:?}");
    cluster.ledger_check();
}
