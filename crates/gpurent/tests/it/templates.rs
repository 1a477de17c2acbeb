//! Templates (issue 33, part 8) with a real Docker Engine: the shipped jupyter and pytorch
//! templates run images built here under their names (a `jupyter` that serves HTTP on 8888,
//! an image whose own command prints its environment), and each template's image, command,
//! published port and environment reach the instance; the shell template gives an interactive
//! process instance; a tenant's own template with a volume mount and overrides; and a
//! template naming an image the node does not have ends its reservation saying so.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::docker_and_processes::{agent, docker_and_isolation};
use crate::support::{eventually, Cluster};

/// Marks the images this test builds, so that it never removes one it did not make.
const LABEL: &str = "gpurent-test=templates";

/// Images built for the test under the shipped templates' names, removed when it ends.
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker")
                .args(["image", "rm", "-f", image])
                .output();
        }
    }
}

fn docker(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new("docker")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Whether `image` exists and is not one of this test's (a real one is left alone).
fn someone_elses(image: &str) -> bool {
    let out = docker(
        &[
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"gpurent-test\"}}",
            image,
        ],
        "",
    );
    out.status.success() && String::from_utf8_lossy(&out.stdout).trim() != "templates"
}

/// `image` from the test busybox, with `script` as `/usr/local/bin/NAME` (if any) and `cmd`
/// as its own command.
fn build(image: &str, script: Option<(&str, &str)>, cmd: &str) {
    let name = format!("gpurent-tpl-build-{}", std::process::id());
    let setup = match script {
        Some((bin, _)) => format!(
            "mkdir -p /usr/local/bin && cat > /usr/local/bin/{bin} && chmod 755 /usr/local/bin/{bin}"
        ),
        None => "true".to_owned(),
    };
    let ran = docker(
        &[
            "run",
            "-i",
            "--name",
            &name,
            "gpurent-test/busybox",
            "sh",
            "-c",
            &setup,
        ],
        script.map_or("", |(_, text)| text),
    );
    assert!(ran.status.success(), "{ran:?}");
    let committed = docker(
        &[
            "commit",
            "--change",
            &format!("LABEL {LABEL}"),
            "--change",
            &format!("CMD {cmd}"),
            &name,
            image,
        ],
        "",
    );
    let _ = docker(&["rm", "-f", &name], "");
    assert!(committed.status.success(), "{committed:?}");
}

fn http(url: &str, path: &str, token: &str) -> String {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

const JUPYTER: &str = "jupyter/base-notebook:latest";
const PYTORCH: &str = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime";

/// A stand-in for `jupyter lab`: says how it was started, and serves a page where the
/// template's `base_url` puts the lab.
const FAKE_JUPYTER: &str = r#"#!/bin/sh
echo "jupyter $*"
dir=/tmp/www/proxy/$GPURENT_RESERVATION_ID/8888
mkdir -p "$dir"
echo "lab of $GPURENT_RESERVATION_ID" > "$dir/index.html"
exec httpd -f -p 8888 -h /tmp/www
"#;

#[test]
fn templates_give_their_image_command_ports_and_environment_to_the_instance() {
    if !docker_and_isolation() {
        return;
    }
    if someone_elses(JUPYTER) || someone_elses(PYTORCH) {
        eprintln!("SKIPPED: this machine has real {JUPYTER} or {PYTORCH} images; not replaced");
        return;
    }
    let _images = Images(vec![JUPYTER.to_owned(), PYTORCH.to_owned()]);
    build(JUPYTER, Some(("jupyter", FAKE_JUPYTER)), r#"["jupyter"]"#);
    build(
        PYTORCH,
        None,
        r#"["sh", "-c", "echo torch-ready PYTHONUNBUFFERED=$PYTHONUNBUFFERED; exec sleep 3600"]"#,
    );
    let cluster = Cluster::start("127.0.0.1:0");
    let (_agent, _containers, _) = agent(&cluster, "tpl", &[]);
    let token = cluster.tenant("tess");
    let cli = |args: &[&str]| cluster.cli(Some(&token), true, args);

    // Both GPUs offered before the first reservation.
    eventually("both GPUs offered", 60, || {
        cli(&["offers"])
            .json()
            .as_array()
            .is_some_and(|offers| offers.iter().any(|o| o["available"].as_u64() >= Some(2)))
    });
    let listed = cli(&["templates", "ls"]).json();
    let shipped: Vec<(String, Value, bool)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["image"].clone(),
                t["public"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shipped,
        [
            ("jupyter".to_owned(), Value::from(JUPYTER), true),
            ("pytorch".to_owned(), Value::from(PYTORCH), true),
            ("shell".to_owned(), Value::Null, true),
        ]
    );
    let running = |id: &str| {
        eventually(&format!("{id} running"), 90, || {
            let r = cluster.get(&token, id);
            assert!(
                !["failed", "stopped"].contains(&r["status"].as_str().unwrap_or("")),
                "{r}"
            );
            r["status"] == "running"
        });
    };
    let logs_have = |id: &str, text: &str| {
        eventually(&format!("{text:?} in the log of {id}"), 30, || {
            cluster
                .cli(Some(&token), false, &["logs", id])
                .stdout
                .contains(text)
        });
    };
    let stop = |id: &str| {
        cli(&["stop", id]);
        eventually(&format!("{id} stopped"), 60, || {
            cluster.get(&token, id)["status"] == "stopped"
        });
    };
    let reserve = |extra: &[&str]| {
        cluster.reserve(
            &token,
            &[&["--gpu", "rtx4090", "--hours", "1"], extra].concat(),
        )
    };

    // jupyter: its image and command (with the instance's own id in its base URL), its port
    // published through the control plane.
    let lab = reserve(&["--template", "jupyter"]);
    running(&lab);
    let r = cluster.get(&token, &lab);
    assert_eq!(r["image"], JUPYTER);
    assert_eq!(r["http_ports"], serde_json::json!([8888]));
    logs_have(
        &lab,
        &format!("jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --ServerApp.token= --ServerApp.password= --ServerApp.base_url=/proxy/{lab}/8888/"),
    );
    eventually("the lab to answer through the proxy", 30, || {
        http(&cluster.url, &format!("/proxy/{lab}/8888/"), &token)
            .contains(&format!("lab of {lab}"))
    });
    stop(&lab);

    // pytorch: the image's own command, the template's environment.
    let torch = reserve(&["--template", "pytorch"]);
    running(&torch);
    logs_have(&torch, "torch-ready PYTHONUNBUFFERED=1");
    stop(&torch);

    // shell: no image, no command: an interactive process instance that stays up.
    let shell = reserve(&["--template", "shell"]);
    running(&shell);
    let r = cluster.get(&token, &shell);
    assert_eq!(r["image"], Value::Null, "{r}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(cluster.get(&token, &shell)["status"], "running");
    stop(&shell);

    // A tenant's own: the command line, env and volume mount; a flag overrides its env.
    let made = cli(&[
        "templates",
        "create",
        "greet",
        "--image",
        "gpurent-test/busybox",
        "--command",
        "sh -c 'echo $GREETING $WHO; ls /data'",
        "--env",
        "GREETING=hello",
        "--env",
        "WHO=template",
        "--volume-mount",
        "/data",
    ]);
    assert_eq!(made.code, 0, "{made:?}");
    assert_eq!(made.json()["name"], "greet");
    let vol = cli(&["volumes", "create", "greetings", "--size", "64MiB"]);
    assert_eq!(vol.code, 0, "{vol:?}");
    let greet = reserve(&[
        "--template",
        "greet",
        "--env",
        "WHO=flag",
        "--volume",
        "greetings",
    ]);
    eventually("greet to end", 90, || {
        cluster.get(&token, &greet)["status"] == "stopped"
    });
    logs_have(&greet, "hello flag");
    assert_eq!(
        cluster.get(&token, &greet)["volumes"][0]["path"],
        "/data",
        "the template's volume mount"
    );

    // A template naming an image the node does not have: the reservation ends saying so.
    let made = cli(&[
        "templates",
        "create",
        "ghost",
        "--image",
        "gpurent-test/no-such-image",
        "--command",
        "true",
    ]);
    assert_eq!(made.code, 0, "{made:?}");
    let ghost = reserve(&["--template", "ghost"]);
    eventually("ghost to fail", 90, || {
        cluster.get(&token, &ghost)["status"] == "failed"
    });
    let r = cluster.get(&token, &ghost);
    let message = r["end_message"].as_str().unwrap_or_default();
    assert!(
        message.contains("gpurent-test/no-such-image"),
        "the image is named: {r}"
    );
    cluster.ledger_check();
}
