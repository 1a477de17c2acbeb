//! `gpurent admin backup` and `admin restore`: an online copy restored to books that balance.
//!
//! Real parts: `up` and `server` processes taking reservations from other processes while the
//! backup is taken, a restore into a new data dir (and a new PostgreSQL database), a control
//! plane started on it, `admin ledger-check` and `audit verify`; a real agent with the process
//! executor whose post-backup work the restored control plane does not know; and every refusal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gpurent_store::testing::TestDatabase;
use gpurent_store::Backend;
use serde_json::Value;

use crate::support::{cli, eventually, read_token, Daemon, Run, BIN};

/// `gpurent [--json] ARGS` with no server: the local commands.
fn local(args: &[&str]) -> Run {
    let out = std::process::Command::new(BIN)
        .arg("--json")
        .args(args)
        .env_remove("GPURENT_DATABASE_URL")
        .env_remove("GPURENT_MASTER_KEY")
        .output()
        .expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A tenant with plenty of credit; its token.
fn tenant(url: &str, admin: &str, name: &str) -> String {
    let args = ["users", "create", name, "--credit", "500"];
    let made = cli(url, Some(admin), true, &args).json();
    made["token"].as_str().unwrap().to_owned()
}

/// Reservations made (and stopped again, to free their GPU) from other processes until
/// stopped: each acknowledged one with when its answer came.
struct Reserving {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<(String, Instant)>>>,
}

impl Reserving {
    fn start(url: &str, tokens: Vec<String>) -> Reserving {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = tokens
            .into_iter()
            .map(|token| {
                let (url, stop) = (url.to_owned(), stop.clone());
                std::thread::spawn(move || {
                    let mut made = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let args = ["reserve", "--gpu", "rtx4090", "--hours", "1"];
                        let r = cli(&url, Some(&token), true, &args);
                        // No free GPU for a moment: not acknowledged, nothing to find later.
                        if r.code != 0 {
                            continue;
                        }
                        let id = r.json()["id"].as_str().unwrap().to_owned();
                        made.push((id.clone(), Instant::now()));
                        cli(&url, Some(&token), true, &["stop", &id]);
                    }
                    made
                })
            })
            .collect();
        Reserving { stop, threads }
    }

    fn finish(self) -> Vec<(String, Instant)> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    }
}

/// The restored control plane's books and trail are clean, and every reservation acknowledged
/// before the backup began is there.
fn books_hold(url: &str, admin: &str, before: &[String]) {
    let check = cli(url, Some(admin), true, &["admin", "ledger-check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert_eq!(check.json()["ok"], true, "{check:?}");
    let verify = cli(url, Some(admin), true, &["audit", "verify"]);
    assert_eq!(verify.code, 0, "{verify:?}");
    assert_eq!(verify.json()["ok"], true, "{verify:?}");
    for id in before {
        let got = cli(url, Some(admin), true, &["get", id]);
        assert_eq!(
            got.code, 0,
            "reservation {id} acknowledged before the backup: {got:?}"
        );
    }
}

/// Reservations are made from three processes while the backup is taken; restored into a new
/// data dir, `up` starts on it (its local agent resuming its node) with clean books.
#[test]
fn a_backup_taken_while_reserving_restores_clean_books_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let (d1, d2) = (dir.path().join("d1"), dir.path().join("d2"));
    let file = dir.path().join("backup.tar");
    let up = Daemon::up_sim(&d1, "8xRTX4090", &[], &dir.path().join("up1.log"));
    let admin = read_token(&d1);
    let tokens = (0..3)
        .map(|i| tenant(&up.url, &admin, &format!("t{i}")))
        .collect();
    let reserving = Reserving::start(&up.url, tokens);
    eventually("some reservations", 60, || {
        cli(&up.url, Some(&admin), true, &["ls"])
            .json()
            .as_array()
            .is_some_and(|a| a.len() >= 10)
    });
    let began = Instant::now();
    let backup = local(&["admin", "backup", "--data-dir", s(&d1), s(&file)]);
    assert_eq!(backup.code, 0, "{backup:?}");
    let doc = backup.json();
    let made = reserving.finish();
    let before: Vec<String> = made
        .iter()
        .filter(|(_, at)| *at < began)
        .map(|(id, _)| id.clone())
        .collect();
    assert!(before.len() >= 10, "{} before the backup", before.len());
    assert_eq!(doc["store"], "sqlite");
    assert!(
        doc["reservations"].as_u64().unwrap() >= before.len() as u64,
        "{doc}"
    );
    for needed in ["database.sqlite", "data/master.key", "data/admin.token"] {
        assert!(
            doc["files"].as_array().unwrap().iter().any(|f| f == needed),
            "{doc}"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the backup holds secrets");
    // Nothing of the work files is left beside it.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    drop(up);

    let restored = local(&["admin", "restore", s(&file), "--data-dir", s(&d2)]);
    assert_eq!(restored.code, 0, "{restored:?}");
    assert_eq!(restored.json()["reservations"], doc["reservations"]);
    let up = Daemon::up_sim(&d2, "8xRTX4090", &[], &dir.path().join("up2.log"));
    books_hold(&up.url, &read_token(&d2), &before);
    let nodes = cli(&up.url, Some(&admin), true, &["nodes", "ls"]).json();
    assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{nodes}");
}

/// Refused, saying why: a running server, a data dir that holds a database, a file that is no
/// backup, a truncated one, a damaged one, one of a newer schema, one of another store.
#[test]
fn a_restore_refuses_what_it_must_not_overwrite_or_cannot_trust() {
    let dir = tempfile::tempdir().unwrap();
    let d1 = dir.path().join("d1");
    let file = dir.path().join("backup.tar");
    let up = Daemon::up_sim(&d1, "1xRTX4090", &[], &dir.path().join("up.log"));
    let backup = local(&["admin", "backup", "--data-dir", s(&d1), s(&file)]);
    assert_eq!(backup.code, 0, "{backup:?}");
    let refused = |file: &Path, dir: &Path, extra: &[&str], code: &str| -> String {
        let mut args = vec!["admin", "restore", s(file), "--data-dir", s(dir)];
        args.extend_from_slice(extra);
        let r = local(&args);
        assert_eq!(r.code, 1, "{r:?}");
        let error = r.json()["error"].clone();
        assert_eq!(error["code"], code, "{r:?}");
        error["message"].as_str().unwrap().to_owned()
    };

    let why = refused(&file, &d1, &["--force"], "in_use");
    assert!(why.contains("in use") && why.contains("pid"), "{why}");
    drop(up);
    let why = refused(&file, &d1, &[], "not_empty");
    assert!(
        why.contains("gpurent.db") && why.contains("--force"),
        "{why}"
    );

    let fresh = |name: &str| dir.path().join(name);
    let garbage = fresh("garbage.tar");
    std::fs::write(&garbage, b"this is not a backup\n".repeat(100)).unwrap();
    refused(&garbage, &fresh("g"), &[], "not_a_backup");
    let bytes = std::fs::read(&file).unwrap();
    let truncated = fresh("truncated.tar");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    refused(&truncated, &fresh("t"), &[], "truncated");
    let damaged = fresh("damaged.tar");
    let mut flipped = bytes.clone();
    // Inside the database's copy: the manifest and its header take the first blocks.
    flipped[8192] ^= 0xff;
    std::fs::write(&damaged, &flipped).unwrap();
    refused(&damaged, &fresh("d"), &[], "damaged");
    assert!(
        !fresh("d").join("gpurent.db").exists(),
        "nothing put in place"
    );

    // The same files under a manifest of a newer schema, archived by tar(1).
    let x = fresh("x");
    std::fs::create_dir(&x).unwrap();
    let untar = std::process::Command::new("tar")
        .args(["-xf", s(&file), "-C", s(&x)])
        .status()
        .unwrap();
    assert!(untar.success());
    let manifest_path = x.join("gpurent-backup/manifest.json");
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    manifest["schema_version"] = Value::from(9999);
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let mut members = vec!["gpurent-backup/manifest.json".to_owned()];
    for f in manifest["files"].as_array().unwrap() {
        members.push(format!("gpurent-backup/{}", f["name"].as_str().unwrap()));
    }
    let newer = fresh("newer.tar");
    let tar = std::process::Command::new("tar")
        .args(["--format=ustar", "-cf", s(&newer), "-C", s(&x)])
        .args(&members)
        .status()
        .unwrap();
    assert!(tar.success());
    let why = refused(&newer, &fresh("n"), &[], "newer_schema");
    assert!(why.contains("9999"), "{why}");
    // The archive tar(1) wrote is read as well as ours: with the manifest as it was, it restores.
    manifest["schema_version"] = backup.json()["schema_version"].clone();
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let retarred = fresh("retarred.tar");
    let tar = std::process::Command::new("tar")
        .args(["--format=ustar", "-cf", s(&retarred), "-C", s(&x)])
        .args(&members)
        .status()
        .unwrap();
    assert!(tar.success());
    let ok = local(&[
        "admin",
        "restore",
        s(&retarred),
        "--data-dir",
        s(&fresh("r")),
    ]);
    assert_eq!(ok.code, 0, "{ok:?}");
    refused(
        &file,
        &fresh("p"),
        &["--database-url", "postgres://nobody@127.0.0.1:1/x"],
        "wrong_store",
    );
    // --force replaces what the dir holds (the server is stopped).
    let forced = local(&[
        "admin",
        "restore",
        s(&file),
        "--data-dir",
        s(&d1),
        "--force",
    ]);
    assert_eq!(forced.code, 0, "{forced:?}");
}

fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

/// Kills what the agents of `0` left running, however the test ends.
struct Reap(PathBuf);

impl Drop for Reap {
    fn drop(&mut self) {
        gpurent_agent::testing::kill_processes_naming(&self.0);
    }
}

/// A real agent (process executor) runs a reservation made after the backup; the restored
/// control plane does not know it, and the agent stops it at its first sync while what the
/// control plane knows runs on. An agent that joined after the backup is unknown too: refused,
/// it fences its own work when its lease runs out.
#[test]
fn agents_stop_the_work_a_restored_control_plane_does_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let _reap = Reap(dir.path().to_owned());
    let (d1, d2) = (dir.path().join("d1"), dir.path().join("d2"));
    let file = dir.path().join("backup.tar");
    let server = Daemon::server(&d1, &dir.path().join("server1.log"));
    let url = server.url.clone();
    let admin = read_token(&d1);
    let agent = |name: &str, gpus: &str, liveness: &[&str]| {
        let join = cli(&url, Some(&admin), true, &["nodes", "join-token"]).json();
        let data = dir.path().join(name);
        let mut args = vec![
            "--server",
            &url,
            "agent",
            "--data-dir",
            s(&data),
            "--name",
            name,
            "--sim-gpus",
            gpus,
            "--executor",
            "process",
            "--cgroup-root",
            "/nonexistent/gpurent",
            "--allow-unisolated",
            "--join-token",
            join["token"].as_str().unwrap(),
        ];
        args.extend_from_slice(liveness);
        Daemon::start_quiet(&args, &dir.path().join(format!("{name}.log")))
    };
    let ready = |count: usize| {
        eventually(&format!("{count} nodes ready"), 30, || {
            let nodes = cli(&url, Some(&admin), true, &["nodes", "ls"]).json();
            let nodes = nodes.as_array().cloned().unwrap_or_default();
            nodes.len() == count && nodes.iter().all(|n| n["status"] == "ready")
        })
    };
    // A lease of a minute: whatever it stops while the control plane is away for a few
    // seconds, it stops because a sync told it to.
    let _a = agent(
        "a",
        "2xRTX4090",
        &["--heartbeat-ms", "1000", "--missed-heartbeats", "60"],
    );
    ready(1);
    let token = tenant(&url, &admin, "pat");
    let tag = format!("gpurent-backup-{}", std::process::id());
    let reserve = |name: &str| {
        let script = format!("exec sleep 600 # {tag}-{name}");
        let args = [
            "reserve", "--gpu", "rtx4090", "--hours", "1", "--", "/bin/sh", "-c", &script,
        ];
        let r = cli(&url, Some(&token), true, &args);
        assert_eq!(r.code, 0, "{r:?}");
        let id = r.json()["id"].as_str().unwrap().to_owned();
        eventually(&format!("{name} running"), 30, || {
            cli(&url, Some(&token), true, &["get", &id]).json()["status"] == "running"
        });
        eventually(&format!("{name}'s workload"), 10, || {
            processes_with(&format!("{tag}-{name}")) == 1
        });
        id
    };
    let known = reserve("known");
    let backup = local(&["admin", "backup", "--data-dir", s(&d1), s(&file)]);
    assert_eq!(backup.code, 0, "{backup:?}");
    let _b = agent("b", "1xRTX4090", &[]);
    ready(2);
    let unknown = [reserve("after1"), reserve("after2")];
    let nodes_of: Vec<Value> = unknown
        .iter()
        .map(|id| cli(&url, Some(&token), true, &["get", id]).json()["node"].clone())
        .collect();
    assert!(nodes_of.contains(&Value::from("a")), "{nodes_of:?}");
    assert!(nodes_of.contains(&Value::from("b")), "{nodes_of:?}");
    let port = url.rsplit(':').next().unwrap().to_owned();
    assert!(server.terminate().success());

    let restored = local(&["admin", "restore", s(&file), "--data-dir", s(&d2)]);
    assert_eq!(restored.code, 0, "{restored:?}");
    let listen = format!("127.0.0.1:{port}");
    let args = ["server", "--data-dir", s(&d2), "--listen", &listen];
    let server = Daemon::start(&args, &dir.path().join("server2.log"));
    assert_eq!(server.url, url);
    eventually("the post-backup work to be stopped", 60, || {
        processes_with(&format!("{tag}-after")) == 0
    });
    assert_eq!(
        processes_with(&format!("{tag}-known")),
        1,
        "known work must run on"
    );
    let got = cli(&url, Some(&token), true, &["get", &known]).json();
    assert_eq!(got["status"], "running", "{got}");
    for id in &unknown {
        let r = cli(&url, Some(&admin), true, &["get", id]);
        assert_ne!(
            r.code, 0,
            "{id} is unknown to the restored control plane: {r:?}"
        );
    }
    books_hold(&url, &admin, std::slice::from_ref(&known));
}

/// The PostgreSQL directory of pg_dump and pg_restore as new as the cluster: the highest
/// version installed (Debian's layout), else the PATH's.
fn pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("pg_dump").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
    });
    dirs.pop()
}

/// The same on PostgreSQL: pg_dump while reservations are made, pg_restore into an empty
/// database, a server on it with clean books; a database that is not empty is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_reserving_restores_clean_books_on_postgres() {
    let (db1, db2) = (
        TestDatabase::new(Backend::Postgres).await.unwrap(),
        TestDatabase::new(Backend::Postgres).await.unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let _reap = Reap(dir.path().to_owned());
    let (d1, d2) = (dir.path().join("d1"), dir.path().join("d2"));
    let file = dir.path().join("backup.tar");
    let bin = pg_bin();
    let mut pg: Vec<&str> = Vec::new();
    if let Some(bin) = &bin {
        pg.extend(["--pg-bin", s(bin)]);
    }
    let server = |data: &Path, url: &str, log: &str| {
        let args = [
            "server",
            "--data-dir",
            s(data),
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            url,
        ];
        Daemon::start(&args, &dir.path().join(log))
    };
    let first = server(&d1, &db1.url, "server1.log");
    let admin = read_token(&d1);
    let join = cli(&first.url, Some(&admin), true, &["nodes", "join-token"]).json();
    let agent_dir = dir.path().join("agent");
    let _agent = Daemon::start_quiet(
        &[
            "--server",
            &first.url,
            "agent",
            "--data-dir",
            s(&agent_dir),
            "--name",
            "n1",
            "--sim-gpus",
            "8xRTX4090",
            "--executor",
            "sim",
            "--join-token",
            join["token"].as_str().unwrap(),
        ],
        &dir.path().join("agent.log"),
    );
    eventually("the node", 30, || {
        cli(&first.url, Some(&admin), true, &["nodes", "ls"]).json()[0]["status"] == "ready"
    });
    let tokens = (0..3)
        .map(|i| tenant(&first.url, &admin, &format!("t{i}")))
        .collect();
    let reserving = Reserving::start(&first.url, tokens);
    eventually("some reservations", 60, || {
        cli(&first.url, Some(&admin), true, &["ls"])
            .json()
            .as_array()
            .is_some_and(|a| a.len() >= 10)
    });
    let began = Instant::now();
    let mut args = vec![
        "admin",
        "backup",
        "--data-dir",
        s(&d1),
        "--database-url",
        &db1.url,
        s(&file),
    ];
    args.extend_from_slice(&pg);
    let backup = local(&args);
    assert_eq!(backup.code, 0, "{backup:?}");
    let doc = backup.json();
    assert_eq!(doc["store"], "postgres");
    let made = reserving.finish();
    let before: Vec<String> = made
        .iter()
        .filter(|(_, at)| *at < began)
        .map(|(id, _)| id.clone())
        .collect();
    assert!(before.len() >= 10, "{} before the backup", before.len());
    drop(first);

    let mut args = vec![
        "admin",
        "restore",
        s(&file),
        "--data-dir",
        s(&d2),
        "--database-url",
        &db2.url,
    ];
    args.extend_from_slice(&pg);
    let restored = local(&args);
    assert_eq!(restored.code, 0, "{restored:?}");
    assert_eq!(restored.json()["reservations"], doc["reservations"]);
    // The database holds gpurent's tables now: a second restore into it is refused.
    let d3 = dir.path().join("d3");
    let mut args = vec![
        "admin",
        "restore",
        s(&file),
        "--data-dir",
        s(&d3),
        "--database-url",
        &db2.url,
    ];
    args.extend_from_slice(&pg);
    let again = local(&args);
    assert_eq!(again.json()["error"]["code"], "not_empty", "{again:?}");
    let second = server(&d2, &db2.url, "server2.log");
    books_hold(&second.url, &read_token(&d2), &before);
}
