//! The `.deb` from `scripts/package.sh`, installed into a fresh Debian root.
//!
//! `scripts/package.sh --profile dev --no-build` packages the debug binary the tests already
//! built (CI builds no release binary for this). The packages are installed with dpkg into a
//! fresh Debian root (`debian_root.rs`), their Depends from the root's own apt sources; then
//! the root is booted with systemd-nspawn, and the installed units, started with systemctl as
//! an operator would, give a control plane and a node that runs a reservation.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::debian_root::{Booted, DebianRoot};
use crate::support::BIN;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `scripts/package.sh --profile dev --no-build --out OUT`, of the binary under test: the
/// package and its dbgsym package.
fn package(out: &Path) -> (PathBuf, PathBuf) {
    // BIN is TARGET/debug/gpurent.
    let target = Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .expect("the target directory");
    let run = Command::new("bash")
        .arg(repo().join("scripts/package.sh"))
        .args(["--profile", "dev", "--no-build", "--out"])
        .arg(out)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("run scripts/package.sh");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "scripts/package.sh failed ({}):\n{stdout}{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let debs: Vec<PathBuf> = stdout.lines().map(PathBuf::from).collect();
    assert_eq!(debs.len(), 2, "two packages: {stdout}");
    assert!(
        debs.iter()
            .all(|d| d.is_file() && d.extension().is_some_and(|e| e == "deb")),
        "{debs:?}"
    );
    let (dbgsym, main): (Vec<PathBuf>, Vec<PathBuf>) = debs
        .into_iter()
        .partition(|d| d.to_string_lossy().contains("gpurent-dbgsym_"));
    assert_eq!((main.len(), dbgsym.len()), (1, 1), "{main:?} {dbgsym:?}");
    (main[0].clone(), dbgsym[0].clone())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The long options `gpurent COMMAND --help` lists.
fn options_of(command: &str) -> BTreeSet<String> {
    let out = Command::new(BIN)
        .args([command, "--help"])
        .output()
        .expect("run gpurent");
    assert!(out.status.success());
    text(&out.stdout)
        .lines()
        .filter(|line| {
            let indent = line.len() - line.trim_start().len();
            (2..=6).contains(&indent) && line.trim_start().starts_with('-')
        })
        .filter_map(|line| {
            let long = &line[line.find("--")? + 2..];
            let name: String = long
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The example files show every option of their command, each as a commented-out line
/// `# key = value` that is valid TOML once uncommented, and set none: a packaged install
/// needs nothing set (its units run in /var/lib/gpurent, where the relative default data
/// dirs belong).
#[test]
fn the_example_configuration_shows_every_option_of_its_command_and_sets_none() {
    // Options of the whole CLI that are not a daemon's (help, the CLI's own token, output).
    let not_in_files = ["help", "version", "config", "token", "json"];
    for (file, command, also_not) in [
        (
            "server.toml",
            "server",
            &["server", "ca-cert", "tls-fingerprint"][..],
        ),
        ("agent.toml", "agent", &[][..]),
    ] {
        let path = repo().join("deploy/config").join(file);
        let body = std::fs::read_to_string(&path).expect("the example file");
        let table: toml::Table = body.parse().expect("the example is TOML");
        assert!(
            table.is_empty(),
            "{file} sets {table:?}: everything should be commented out"
        );
        let mut keys = BTreeSet::new();
        for line in body.lines() {
            let Some((key, value)) = line.strip_prefix("# ").and_then(|l| l.split_once(" = "))
            else {
                continue;
            };
            if !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                continue;
            }
            let uncommented = format!("{key} = {value}");
            assert!(
                uncommented.parse::<toml::Table>().is_ok(),
                "{file}: `{uncommented}` is not valid TOML once uncommented"
            );
            assert!(keys.insert(key.to_owned()), "{file}: {key} twice");
        }
        let options: BTreeSet<String> = options_of(command)
            .into_iter()
            .filter(|o| !not_in_files.contains(&o.as_str()) && !also_not.contains(&o.as_str()))
            .collect();
        let missing: Vec<_> = options.difference(&keys).collect();
        let unknown: Vec<_> = keys.difference(&options).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "deploy/config/{file} against `gpurent {command} --help`: missing {missing:?}, \
             not options {unknown:?}"
        );
    }
}

/// Polls `check` every 250 ms for up to `secs` seconds; panics with `what` and the last
/// thing `check` said.
fn wait_for(what: &str, secs: u64, mut check: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return,
            Err(last) if start.elapsed() > Duration::from_secs(secs) => {
                panic!("timed out after {secs} s waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// `gpurent --json ARGS` in the container, in /var/lib/gpurent (where the admin token is found
/// as on a development machine), with `env` (`GPURENT_TOKEN=...`) before it.
fn cli(vm: &Booted<'_>, env: &str, args: &str) -> Result<Value, String> {
    let out = vm.run(&format!(
        "cd /var/lib/gpurent && {env} gpurent --json {args}"
    ));
    if !out.status.success() {
        return Err(format!("{}{}", text(&out.stdout), text(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", text(&out.stdout)))
}

fn phase(start: &mut Instant, what: &str) {
    eprintln!(
        "package test: {what} in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    *start = Instant::now();
}

#[test]
fn the_package_installs_into_a_fresh_debian_and_its_units_give_a_control_plane_and_a_node() {
    let mut clock = Instant::now();
    let Some(mut root) = DebianRoot::fresh() else {
        return;
    };
    phase(&mut clock, "a fresh Debian root");
    let (deb, dbgsym) = package(&root.scratch().join("debs"));
    phase(&mut clock, "scripts/package.sh --profile dev --no-build");
    for file in [&deb, &dbgsym] {
        let name = file.file_name().expect("a file name");
        // Not /tmp: the booted system mounts a tmpfs there.
        std::fs::copy(file, root.path().join("root").join(name)).expect("copy the package in");
    }
    let debs = "/root/gpurent_*.deb /root/gpurent-dbgsym_*.deb";

    // dpkg alone stops at the missing Depends; apt-get -f installs them from the root's own
    // sources, without the Recommends.
    let alone = root.run(&format!("dpkg -i {debs}"));
    assert!(
        !alone.status.success(),
        "dpkg -i without bubblewrap must fail"
    );
    assert!(
        text(&alone.stderr).contains("bubblewrap"),
        "{}",
        text(&alone.stderr)
    );
    root.ok("apt-get update -q && apt-get install -f -y -q --no-install-recommends");
    let status = root.ok("dpkg-query -W -f='${Status}' gpurent gpurent-dbgsym");
    assert_eq!(status, "install ok installedinstall ok installed");
    root.ok("command -v bwrap");
    phase(&mut clock, "dpkg -i and apt-get -f install");

    let version = root.ok("gpurent --version");
    assert!(version.starts_with("gpurent "), "{version}");

    let files = root.ok("dpkg -L gpurent");
    for path in [
        "/usr/bin/gpurent",
        "/usr/lib/systemd/system/gpurent-server.service",
        "/usr/lib/systemd/system/gpurent-agent.service",
        "/etc/gpurent/server.toml",
        "/etc/gpurent/agent.toml",
        "/etc/gpurent/server.env",
        "/etc/gpurent/agent.env",
    ] {
        assert!(
            files.lines().any(|l| l == path),
            "dpkg -L gpurent lacks {path}:\n{files}"
        );
    }
    let conffiles = root.ok("dpkg-query -W -f='${Conffiles}' gpurent");
    for path in ["server.toml", "agent.toml", "server.env", "agent.env"] {
        assert!(
            conffiles.contains(&format!("/etc/gpurent/{path} ")),
            "{conffiles}"
        );
    }
    // The secrets' files are root's only.
    let modes = root.ok(
        "stat -c '%a %U' /etc/gpurent/server.env /etc/gpurent/agent.env /etc/gpurent/server.toml",
    );
    assert_eq!(modes, "600 root\n600 root\n644 root\n");
    let user = root.ok("getent passwd gpurent");
    assert!(user.trim_end().ends_with(":/usr/sbin/nologin"), "{user}");

    // The debug info: one file, named by the installed (stripped) binary's build id.
    let debug: Vec<String> = root
        .ok("dpkg -L gpurent-dbgsym")
        .lines()
        .filter(|l| l.ends_with(".debug"))
        .map(str::to_owned)
        .collect();
    assert_eq!(debug.len(), 1, "{debug:?}");
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(root.path().join("usr/bin/gpurent"))
        .output()
        .expect("run readelf (binutils)");
    let build_id = text(&notes.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_owned))
        .expect("the binary has a build id");
    assert_eq!(
        debug[0],
        format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &build_id[..2],
            &build_id[2..]
        )
    );
    let symbols = Command::new("readelf")
        .arg("-S")
        .arg(root.path().join("usr/bin/gpurent"))
        .output()
        .expect("run readelf");
    assert!(
        !text(&symbols.stdout).contains(".debug_line"),
        "the installed binary is stripped"
    );

    let fields = root.ok(&format!("dpkg-deb -f {debs} Depends Recommends"));
    let depends = fields
        .lines()
        .find_map(|l| l.strip_prefix("Depends: "))
        .unwrap_or("");
    let recommends = fields
        .lines()
        .find_map(|l| l.strip_prefix("Recommends: "))
        .unwrap_or("");
    assert!(depends.split(", ").any(|d| d == "bubblewrap"), "{fields}");
    assert!(
        recommends.contains("docker.io") && recommends.contains("passt"),
        "{fields}"
    );

    // The units, as systemd reads them: any warning fails (the chroot lacks nothing they name).
    let verify = root.run("systemd-analyze verify gpurent-server.service gpurent-agent.service");
    let said = format!("{}{}", text(&verify.stdout), text(&verify.stderr));
    assert!(
        verify.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
    phase(&mut clock, "the installed files checked");

    // The agent runs the installed unit's own command line, with simulated GPUs (this machine
    // has none) and, where the container's cgroups are read-only (a cgroup v1 host), its
    // instances unisolated: a drop-in, as an operator would add flags.
    let unit = std::fs::read_to_string(
        root.path()
            .join("usr/lib/systemd/system/gpurent-agent.service"),
    )
    .expect("the installed agent unit");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit's ExecStart");
    let dropin = root
        .path()
        .join("etc/systemd/system/gpurent-agent.service.d");
    std::fs::create_dir_all(&dropin).expect("the drop-in directory");
    std::fs::write(
        dropin.join("test.conf"),
        format!(
            "[Service]\nExecStart=\nExecStart={exec} --sim-gpus 2xRTX4090 --allow-unisolated\n"
        ),
    )
    .expect("the drop-in");

    let vm = root.boot();
    phase(&mut clock, "booted with systemd-nspawn");

    vm.ok("systemctl enable --now gpurent-server");
    wait_for("the control plane to answer", 60, || {
        cli(&vm, "", "nodes ls").map(|_| ())
    });
    let owner = vm.ok("stat -c '%U' /proc/$(systemctl show -p MainPID --value gpurent-server)");
    assert_eq!(owner.trim(), "gpurent", "the server runs as its own user");
    let data = vm.ok("stat -c '%U %a' /var/lib/gpurent/gpurent-data /var/lib/gpurent");
    assert_eq!(data, "gpurent 700\nroot 755\n");
    let security = vm.ok("systemd-analyze security --no-pager gpurent-server gpurent-agent");
    eprintln!("{security}");
    let exposure: f64 = security
        .lines()
        .find_map(|l| l.strip_prefix("gpurent-server.service"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|e| e.parse().ok())
        .expect("the server's exposure");
    assert!(
        exposure <= 2.0,
        "the server's hardening slipped: exposure {exposure}"
    );
    phase(&mut clock, "systemctl enable --now gpurent-server");

    // `systemctl reload` reads the configuration again in the same process.
    let pid = vm.ok("systemctl show -p MainPID --value gpurent-server");
    vm.ok("systemctl reload gpurent-server");
    wait_for("the reload to be logged", 30, || {
        let log = vm.ok("journalctl -u gpurent-server --no-pager -o cat");
        log.contains("reloaded on SIGHUP").then_some(()).ok_or(log)
    });
    assert_eq!(
        vm.ok("systemctl show -p MainPID --value gpurent-server"),
        pid,
        "a reload is not a restart"
    );
    phase(&mut clock, "systemctl reload gpurent-server");

    let token = vm.ok("cd /var/lib/gpurent && gpurent nodes join-token");
    let token = token.trim();
    assert!(token.starts_with("gpj_"), "a join token: {token}");
    vm.ok(&format!(
        "umask 077; echo 'GPURENT_JOIN_TOKEN={token}' > /etc/gpurent/agent.env"
    ));
    vm.ok("systemctl daemon-reload && systemctl enable --now gpurent-agent");
    let mut executor = String::new();
    wait_for("the node to register and be ready", 60, || {
        let nodes = cli(&vm, "", "nodes ls")?;
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        match nodes.first() {
            Some(n) if nodes.len() == 1 && n["status"] == "ready" => {
                executor = n.to_string();
                Ok(())
            }
            _ => Err(format!("{nodes:?}")),
        }
    });
    eprintln!("the node: {executor}");
    let owner = vm.ok("stat -c '%U' /proc/$(systemctl show -p MainPID --value gpurent-agent)");
    assert_eq!(owner.trim(), "root");
    phase(&mut clock, "systemctl enable --now gpurent-agent: a node");

    let alice = cli(&vm, "", "users create alice --credit 100").expect("a tenant");
    let alice = alice["token"]
        .as_str()
        .expect("the tenant's token")
        .to_owned();
    let env = format!("GPURENT_TOKEN={alice}");
    let reservation = cli(
        &vm,
        &env,
        "reserve --gpu rtx4090 --hours 1 -- echo hi-from-the-package",
    )
    .expect("a reservation");
    let id = reservation["id"].as_str().expect("its id").to_owned();
    wait_for("the reservation to end", 60, || {
        let r = cli(&vm, &env, &format!("get {id}"))?;
        if r["ended_at"].is_null() {
            Err(r.to_string())
        } else if r["end_reason"] == "exited" {
            Ok(())
        } else {
            panic!("the reservation ended otherwise: {r}")
        }
    });
    let logs = vm.ok(&format!("cd /var/lib/gpurent && {env} gpurent logs {id}"));
    assert!(logs.contains("hi-from-the-package"), "{logs}");
    phase(&mut clock, "a reservation ran");

    // An upgrade (the same package again: its postinst try-restarts both running units)
    // leaves the agent's instances running: the new agent adopts them (KillMode=process).
    let long =
        cli(&vm, &env, "reserve --gpu rtx4090 --hours 1 -- sleep 600").expect("a reservation");
    let long = long["id"].as_str().expect("its id").to_owned();
    wait_for("the instance to run", 60, || {
        let r = cli(&vm, &env, &format!("get {long}"))?;
        (r["status"] == "running")
            .then_some(())
            .ok_or(r.to_string())
    });
    let sleeps = "for p in /proc/[0-9]*; do \
        [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'sleep 600 ' ] && echo ${p#/proc/}; done; true";
    let before = vm.ok(sleeps);
    assert_eq!(before.lines().count(), 1, "one `sleep 600`: {before:?}");
    let pids = "systemctl show -p MainPID --value gpurent-server gpurent-agent";
    let before_upgrade = vm.ok(pids);
    vm.ok("dpkg -i /root/gpurent_*.deb");
    wait_for("both restarted, the node ready again", 60, || {
        let now = vm.ok(pids);
        // `systemctl show` parts its units' answers with an empty line.
        let restarted = now
            .lines()
            .filter(|l| !l.is_empty())
            .zip(before_upgrade.lines().filter(|l| !l.is_empty()))
            .all(|(n, b)| n != b && n != "0");
        let nodes = cli(&vm, "", "nodes ls")?;
        (restarted && nodes[0]["status"] == "ready")
            .then_some(())
            .ok_or(format!(
                "main pids {now:?} (before {before_upgrade:?}), {nodes}"
            ))
    });
    // A few heartbeats with the new agent.
    std::thread::sleep(Duration::from_secs(5));
    let r = cli(&vm, &env, &format!("get {long}")).expect("the reservation");
    assert_eq!(r["status"], "running", "after the agent's restart: {r}");
    assert_eq!(vm.ok(sleeps), before, "the same instance runs on");
    vm.ok(&format!("cd /var/lib/gpurent && {env} gpurent stop {long}"));
    wait_for("the stopped instance to end", 60, || {
        let left = vm.ok(sleeps);
        left.trim().is_empty().then_some(()).ok_or(left)
    });
    phase(&mut clock, "an instance outlived an upgrade");

    // Both stop cleanly on SIGTERM.
    vm.ok("systemctl stop gpurent-agent gpurent-server");
    let state = vm.ok("systemctl show -p ActiveState -p Result gpurent-server gpurent-agent");
    assert_eq!(
        state.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        [
            "Result=success",
            "ActiveState=inactive",
            "Result=success",
            "ActiveState=inactive"
        ],
        "{state}"
    );
    drop(vm);
    phase(&mut clock, "stopped and shut down");
}
