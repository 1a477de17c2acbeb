//! The configuration files: `--config`, `config check`, `config print` and SIGHUP.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::support::{cli, eventually, read_token, Daemon, Run, BIN};

/// `gpurent ARGS` with no server of its own (the `config` commands), in `cwd`.
fn gpurent(cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> Run {
    let out = Command::new(BIN)
        .current_dir(cwd)
        .env_remove("GPURENT_DATABASE_URL")
        .env_remove("GPURENT_CONFIG")
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `config print`'s row for `option`: (value, source).
fn row(printed: &Value, option: &str) -> (Value, String) {
    let row = printed["options"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["option"] == option)
        .unwrap_or_else(|| panic!("no row for {option}: {printed}"));
    (
        row["value"].clone(),
        row["source"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn config_check_names_the_key_and_the_file_of_every_flaw() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write(
        "server.toml",
        "listen = \"127.0.0.1:9\"\ndata-dir = \"/var/lib/gpurent\"\nmax-gpu-temp = 80\n\
         tls-self-signed = true\nmax-spend-per-hour = \"12.50\"\n",
    );
    let ok = gpurent(
        dir.path(),
        &[],
        &["--json", "config", "check", "server.toml"],
    );
    assert_eq!(ok.code, 0, "{ok:?}");
    assert_eq!(ok.json()["command"], "server");
    assert_eq!(
        ok.json()["keys"],
        serde_json::json!([
            "data-dir",
            "listen",
            "max-gpu-temp",
            "max-spend-per-hour",
            "tls-self-signed"
        ])
    );

    // Each flaw: the file, the key, and why.
    let cases: [(&str, &str, &[&str]); 7] = [
        ("lissten = \"127.0.0.1:9\"\n", "unknown key `lissten`", &[]),
        (
            "data_dir = \"x\"\n",
            "unknown key `data_dir`: not an option of `gpurent server`; did you mean `data-dir`?",
            &[],
        ),
        ("listen = \"nope\"\n", "`listen`: invalid value 'nope'", &[]),
        (
            "max-gpu-temp = \"hot\"\n",
            "`max-gpu-temp`: invalid value 'hot'",
            &[],
        ),
        (
            "tls-self-signed = 1\n",
            "`tls-self-signed`: a switch: give true or false",
            &[],
        ),
        (
            "listen = [\"a\", \"b\"]\n",
            "`listen`: takes one value, not 2",
            &[],
        ),
        (
            "tls-cert = \"c.pem\"\ntls-self-signed = true\n",
            "cannot be used with",
            &["tls-cert", "tls-self-signed"],
        ),
    ];
    for (text, says, names) in cases {
        write("server.toml", text);
        let bad = gpurent(dir.path(), &[], &["config", "check", "server.toml"]);
        assert_eq!(bad.code, 1, "{text}: {bad:?}");
        assert!(bad.stderr.contains("server.toml"), "{text}: {bad:?}");
        assert!(bad.stderr.contains(says), "{text}: {bad:?}");
        for name in names {
            assert!(bad.stderr.contains(name), "{text}: {bad:?}");
        }
    }
    write("server.toml", "listen = \n");
    let syntax = gpurent(dir.path(), &[], &["config", "check", "server.toml"]);
    assert!(syntax.stderr.contains("is not valid TOML"), "{syntax:?}");

    // The command is the file's name, or --for; an agent's file has the agent's options.
    write(
        "node.toml",
        "join-token = \"gpj_x\"\nserver = \"https://cp:8080\"\n",
    );
    let unnamed = gpurent(dir.path(), &[], &["config", "check", "node.toml"]);
    assert!(
        unnamed.stderr.contains("--for server, agent or up"),
        "{unnamed:?}"
    );
    let agent = gpurent(
        dir.path(),
        &[],
        &["config", "check", "node.toml", "--for", "agent"],
    );
    assert_eq!(agent.code, 0, "{agent:?}");
    let not_server = gpurent(
        dir.path(),
        &[],
        &["config", "check", "node.toml", "--for", "server"],
    );
    assert!(
        not_server.stderr.contains("unknown key `join-token`"),
        "{not_server:?}"
    );

    // A daemon with a flawed file does not start, and says why.
    write("server.toml", "lissten = 1\n");
    let server = gpurent(dir.path(), &[], &["server", "--config", "server.toml"]);
    assert_eq!(server.code, 2, "{server:?}");
    assert!(
        server.stderr.contains("server.toml: unknown key `lissten`"),
        "{server:?}"
    );
}

#[test]
fn config_print_says_where_each_value_comes_from_and_hides_secrets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("server.toml"),
        "listen = \"127.0.0.1:9\"\nmax-gpu-temp = 80\ndatabase-url = \"postgres://u:hunter2@db/gpurent\"\n\
         session-hours = 6\ntls-self-signed = true\n",
    )
    .unwrap();
    let print = |env: &[(&str, &str)], extra: &[&str]| {
        let mut args = vec![
            "--json",
            "config",
            "print",
            "server",
            "--config",
            "server.toml",
        ];
        args.extend_from_slice(extra);
        let run = gpurent(dir.path(), env, &args);
        assert_eq!(run.code, 0, "{run:?}");
        run.json()
    };
    let printed = print(&[], &[]);
    assert_eq!(printed["config_file"], "server.toml");
    let from_file = "file server.toml".to_owned();
    assert_eq!(
        row(&printed, "listen"),
        ("127.0.0.1:9".into(), from_file.clone())
    );
    assert_eq!(
        row(&printed, "max-gpu-temp"),
        ("80".into(), from_file.clone())
    );
    assert_eq!(
        row(&printed, "queue-timeout"),
        ("3600".into(), "default".into())
    );
    assert_eq!(row(&printed, "prices"), (Value::Null, "unset".into()));
    // Secrets are redacted wherever they come from.
    assert_eq!(
        row(&printed, "database-url"),
        ("(redacted)".into(), from_file.clone())
    );
    assert!(!printed.to_string().contains("hunter2"));

    // A flag beats the environment, which beats the file.
    let printed = print(
        &[("GPURENT_DATABASE_URL", "postgres://u:s3cret@db2/x")],
        &["--max-gpu-temp", "75"],
    );
    assert_eq!(row(&printed, "max-gpu-temp"), ("75".into(), "flag".into()));
    assert_eq!(
        row(&printed, "database-url"),
        ("(redacted)".into(), "env GPURENT_DATABASE_URL".into())
    );
    assert!(!printed.to_string().contains("s3cret"));
    // A flag that cannot go with a file's option overrides it.
    let printed = print(&[], &["--tls-cert", "c.pem", "--tls-key", "k.pem"]);
    assert_eq!(row(&printed, "tls-cert"), ("c.pem".into(), "flag".into()));
    assert_eq!(
        row(&printed, "tls-self-signed"),
        ("false".into(), "default".into())
    );

    // The table says the same.
    let table = gpurent(
        dir.path(),
        &[],
        &["config", "print", "server", "--config", "server.toml"],
    );
    assert_eq!(table.code, 0, "{table:?}");
    assert!(table
        .stdout
        .starts_with("# gpurent server: configuration file server.toml"));
    assert!(table
        .stdout
        .lines()
        .any(|l| l.starts_with("max-gpu-temp") && l.ends_with("file server.toml")));
}

/// `up` from a file, reloaded with SIGHUP: new prices and rules in force, a new currency and
/// a new listen address refused or left for a restart, and said so.
#[test]
fn up_runs_from_a_file_and_sighup_reloads_what_can_change() {
    let dir = tempfile::tempdir().unwrap();
    let prices = dir.path().join("prices.toml");
    std::fs::write(&prices, "[gpu]\n\"RTX 4090\" = \"2.20\"\n").unwrap();
    let config = dir.path().join("up.toml");
    let write_config = |listen: &str, extra: &str| {
        std::fs::write(
            &config,
            format!(
                "data-dir = \"./data\"\nlisten = \"{listen}\"\nexecutor = \"sim\"\n\
                 sim-gpus = \"2xRTX4090\"\nmin-disk-free-gb = 0\nprices = \"prices.toml\"\n{extra}"
            ),
        )
        .unwrap();
    };
    write_config("127.0.0.1:0", "");
    let log = dir.path().join("up.log");
    let up = Daemon::start_in(dir.path(), &["up", "--config", "up.toml"], &log);
    // The file's data dir, relative to where `up` runs.
    let admin = read_token(&dir.path().join("data"));
    let price = || {
        let offers = cli(&up.url, Some(&admin), true, &["offers"]).json();
        offers
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["gpu_type"] == "RTX4090")
            .map(|o| o["price_per_hour"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("no RTX 4090 offer: {offers}"))
    };
    assert_eq!(price(), "2.20");

    let hup = |daemon: &Daemon| {
        let pid = daemon.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
    };
    let log_says = |what: &str| std::fs::read_to_string(&log).unwrap().contains(what);

    std::fs::write(&prices, "[gpu]\n\"RTX 4090\" = \"3.10\"\n").unwrap();
    write_config("127.0.0.1:1", "max-gpu-temp = 70\n");
    hup(&up);
    eventually("the reload is logged", 30, || {
        log_says("reloaded on SIGHUP")
    });
    assert!(
        log_says("changed prices, health rules; not changed until a restart: listen"),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(price(), "3.10");

    // Another currency would change the books: refused whole, the old prices stay.
    std::fs::write(
        &prices,
        "currency = \"CNY\"\n[gpu]\n\"RTX 4090\" = \"20\"\n[storage]\nper_gb_month = \"0.50\"\n",
    )
    .unwrap();
    hup(&up);
    eventually("the refusal is logged", 30, || {
        log_says("reload on SIGHUP failed")
    });
    assert!(log_says("the currency changes only with a restart"));
    assert_eq!(price(), "3.10");

    // A file that no longer parses: the settings in force stay, the daemon serves on.
    write_config("127.0.0.1:1", "bogus-key = 1\n");
    hup(&up);
    eventually("the flawed file is logged", 30, || {
        log_says("unknown key `bogus-key`")
    });
    assert_eq!(price(), "3.10");
    assert!(up.terminate().success());
}
