//! What the CLI sends and prints: the admin token of `./gpurent-data` goes only to the server
//! that data dir belongs to, and names from the server cannot drive the terminal.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use crate::support::{read_token, Daemon, Run, BIN};

/// `gpurent ARGS` run in `cwd` without --token, GPURENT_TOKEN or GPURENT_DATA_DIR: the CLI
/// finds `./gpurent-data` by itself.
fn cli_in(cwd: &Path, args: &[&str]) -> Run {
    let out = Command::new(BIN)
        .current_dir(cwd)
        .args(args)
        .env_remove("GPURENT_TOKEN")
        .env_remove("GPURENT_DATA_DIR")
        .env_remove("GPURENT_SERVER")
        .output()
        .expect("run gpurent");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A listener that answers every request 401 and sends the request heads it read.
fn recording_server() -> (String, mpsc::Receiver<String>) {
    recording_server_at("127.0.0.1:0")
}

fn recording_server_at(addr: &str) -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind(addr).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                head.push_str(&line);
                line.clear();
            }
            let body = r#"{"error":{"code":"unauthorized","message":"who are you?"}}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            if tx.send(head).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

#[test]
fn the_admin_token_of_the_data_dir_goes_only_to_its_own_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("gpurent-data");
    let server = Daemon::server(&data, &dir.path().join("server.log"));
    let admin = read_token(&data);

    // Its own server: the admin token is used without --token.
    let own = cli_in(
        dir.path(),
        &["--server", &server.url, "--json", "users", "ls"],
    );
    assert_eq!(own.code, 0, "{own:?}");
    // A trailing slash is the same server.
    let own = cli_in(
        dir.path(),
        &["--server", &format!("{}/", server.url), "balance"],
    );
    assert_eq!(own.code, 0, "{own:?}");

    // Any other server: never the admin token, and an error that says to pass --token.
    let (other, heads) = recording_server();
    let run = cli_in(dir.path(), &["--server", &other, "ls"]);
    let sent: Vec<String> = heads.try_iter().collect();
    assert!(
        sent.iter().all(|h| !h.contains(&admin)),
        "the admin token went to {other}: {sent:?}"
    );
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("--token"), "{run:?}");
    // The same server under another name (localhost for 127.0.0.1) is another server too:
    // the CLI cannot know where a name leads.
    let renamed = server.url.replace("127.0.0.1", "localhost");
    let run = cli_in(dir.path(), &["--server", &renamed, "ls"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("--token"), "{run:?}");

    // Killed with kill -9, the server leaves its URL behind; whoever listens on its port
    // next gets no token: the data dir's lock, released by the kernel, tells it is gone.
    let mut server = server;
    let url = server.url.clone();
    server.kill9();
    assert!(data.join("server.url").exists());
    let (squatter, heads) = recording_server_at(url.trim_start_matches("http://"));
    assert_eq!(squatter, url);
    let run = cli_in(dir.path(), &["--server", &url, "ls"]);
    let sent: Vec<String> = heads.try_iter().collect();
    assert!(
        sent.iter().all(|h| !h.contains(&admin)),
        "the admin token went to the dead server's port: {sent:?}"
    );
    assert!(run.stderr.contains("not running"), "{run:?}");
}

#[test]
fn names_with_control_characters_are_printed_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Daemon::server(&data, &dir.path().join("server.log"));
    let admin = read_token(&data);
    let cli =
        |json: bool, args: &[&str]| crate::support::cli(&server.url, Some(&admin), json, args);
    let created = cli(true, &["tokens", "create", "--name", "plain"]);
    assert_eq!(created.code, 0, "{created:?}");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    // Straight into the database: the API refuses such names (or will).
    let hostile = "ok\x1b]0;owned\x07\x1b[2J\rfake\u{9b}31m";
    let db = format!("sqlite://{}", data.join("gpurent.db").display());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&db).await.unwrap();
        sqlx::query("UPDATE api_tokens SET name = ? WHERE id = ?")
            .bind(hostile)
            .bind(&id)
            .execute(&mut conn)
            .await
            .unwrap();
    });

    let table = cli(false, &["tokens", "ls"]);
    assert_eq!(table.code, 0, "{table:?}");
    let bad: Vec<char> = table
        .stdout
        .chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect();
    assert!(
        bad.is_empty(),
        "raw control characters {bad:?} in:\n{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .contains(r"ok\u{1b}]0;owned\u{7}\u{1b}[2J\rfake\u{9b}31m"),
        "the name, escaped, in:\n{}",
        table.stdout
    );
    // JSON stays exact.
    let json = cli(true, &["tokens", "ls"]).json();
    let names: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&hostile), "{names:?}");
}
