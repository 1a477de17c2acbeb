//! Budgets through the CLI, with a real control plane: set, shown in `budget get` and in
//! `balance`, a bad one refused saying why, a team's set by its owner and refused to a member,
//! and removed.

use crate::support::Cluster;

#[test]
fn a_budget_is_set_shown_and_removed_through_the_cli() {
    let cluster = Cluster::start("127.0.0.1:0");
    let olga = cluster.tenant("olga");
    let mia = cluster.tenant("mia");
    let cli = |token: &str, json: bool, args: &[&str]| cluster.cli(Some(token), json, args);

    let none = cli(&olga, false, &["budget", "get"]);
    assert_ne!(none.code, 0);
    assert!(none.stderr.contains("not found"), "{none:?}");
    let bad = cli(
        &olga,
        false,
        &["budget", "set", "--monthly", "10", "--alert-at", "0"],
    );
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("percentages"), "{bad:?}");

    let set = cli(
        &olga,
        false,
        &[
            "budget",
            "set",
            "--monthly",
            "500",
            "--alert-at",
            "80,50",
            "--stop-at-limit",
        ],
    );
    assert_eq!(set.code, 0, "{set:?}");
    assert!(
        set.stdout.contains("spent 0.00 of 500.00 (within it)")
            && set.stdout.contains("alerts at 50%, 80%")
            && set.stdout.contains("running reservations are stopped"),
        "{}",
        set.stdout
    );
    let got = cli(&olga, true, &["budget", "get"]).json();
    assert_eq!(
        (got["monthly"].as_str(), got["over"].as_bool()),
        (Some("500.00"), Some(false))
    );
    let balance = cli(&olga, false, &["balance"]);
    assert!(
        balance.stdout.contains("spent 0.00 of 500.00"),
        "{balance:?}"
    );

    // A team's: its owner sets it, a member may not.
    assert_eq!(cli(&olga, false, &["teams", "create", "lab"]).code, 0);
    assert_eq!(
        cli(
            &olga,
            false,
            &["teams", "add", "lab", "mia", "--role", "member"]
        )
        .code,
        0
    );
    let refused = cli(
        &mia,
        false,
        &["budget", "set", "--team", "lab", "--monthly", "5"],
    );
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("admin or above"), "{refused:?}");
    let team = cli(
        &olga,
        false,
        &["budget", "set", "--team", "lab", "--monthly", "5"],
    );
    assert!(team.stdout.contains("budget of team lab"), "{team:?}");
    let seen = cli(&mia, false, &["budget", "get", "--team", "lab"]);
    assert!(seen.stdout.contains("of 5.00"), "{seen:?}");

    let removed = cli(&olga, false, &["budget", "rm"]);
    assert_eq!(removed.code, 0, "{removed:?}");
    assert_ne!(cli(&olga, false, &["budget", "get"]).code, 0);
    let balance = cli(&olga, false, &["balance"]);
    assert_eq!(balance.code, 0, "{balance:?}");
    assert!(!balance.stdout.contains("budget"), "{balance:?}");
}
