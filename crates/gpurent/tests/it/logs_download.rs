//! `gpurent logs ID --out FILE` (issue 14): the whole log, its bytes as the instance wrote them
//! (not UTF-8 or not), downloaded to a file to keep past the control plane's log retention.

use std::process::Command;

use crate::support::{cli, eventually, read_token, Daemon, BIN};

#[test]
fn a_log_downloads_whole_and_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = Daemon::start(
        &[
            "up",
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--sim-gpus",
            "1xRTX4090",
            "--executor",
            "process",
        ],
        &dir.path().join("up.log"),
    );
    let admin = read_token(&data);
    let ann = cli(
        &up.url,
        Some(&admin),
        true,
        &["users", "create", "ann", "--credit", "10"],
    )
    .json();
    let token = ann["token"].as_str().unwrap().to_owned();
    // 1.5 MiB (more than one page of the API) that is not UTF-8, then a line that is.
    let script = "head -c 1572864 /dev/zero | tr '\\0' '\\376'; printf '\\nend \\303\\251\\n'";
    let r = cli(
        &up.url,
        Some(&token),
        true,
        &[
            "reserve", "--gpu", "rtx4090", "--hours", "1", "--", "sh", "-c", script,
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    eventually("the job to end", 60, || {
        cli(&up.url, Some(&token), true, &["get", &id]).json()["status"] == "stopped"
    });
    let file = dir.path().join("job.log");
    let out = Command::new(BIN)
        .args(["--server", &up.url, "--token", &token, "logs", &id, "--out"])
        .arg(&file)
        .env_remove("GPURENT_TOKEN")
        .output()
        .expect("run gpurent logs");
    assert!(out.status.success(), "{out:?}");
    let mut expected = vec![0xfe_u8; 1_572_864];
    expected.extend_from_slice(b"\nend \xc3\xa9\n");
    let got = std::fs::read(&file).expect("the downloaded log");
    assert_eq!(got.len(), expected.len(), "bytes downloaded");
    assert!(
        got == expected,
        "the downloaded log differs from the output"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("wrote {} bytes", expected.len())),
        "{out:?}"
    );
    // Printed, it is the same bytes.
    let printed = Command::new(BIN)
        .args(["--server", &up.url, "--token", &token, "logs", &id])
        .env_remove("GPURENT_TOKEN")
        .output()
        .expect("run gpurent logs");
    assert!(printed.stdout == expected);
}
