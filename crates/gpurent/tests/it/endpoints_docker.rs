//! An endpoint whose replicas are Docker containers, through a real `gpurent server` and a real
//! `gpurent agent` on a real Docker Engine: busybox's httpd in the tests' image answers with
//! its replica's reservation and version. Scale 0 → 1 on the first request, two replicas side
//! by side on the same port, a rolling update under load with no failed request, back to zero.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::docker_and_processes::agent;
use crate::endpoints_cli::{get, get_together};
use crate::host_limits::engine_answers;
use crate::support::{cli, eventually, Cluster};

const IMAGE: &str = "gpurent-test/busybox:latest";

/// A replica's command: serves `/tmp/www` on port 8000 with `/health`, `/` (its reservation
/// and `version`) and `/cgi-bin/slow` (the same after two seconds).
fn serve(version: &str) -> Vec<String> {
    let script = format!(
        "busybox mkdir -p /tmp/www/cgi-bin && cd /tmp/www && echo ok > health \
         && echo \"$GPURENT_RESERVATION_ID {version}\" > index.html \
         && {{ echo '#!/bin/sh'; echo 'sleep 2'; echo 'echo Content-Type: text/plain'; \
         echo 'echo'; echo 'cat /tmp/www/index.html'; }} > cgi-bin/slow \
         && busybox chmod +x cgi-bin/slow && exec busybox httpd -f -p 8000 -h /tmp/www"
    );
    vec!["sh".into(), "-c".into(), script]
}

#[test]
fn an_endpoint_of_containers_scales_rolls_over_and_back_to_zero() {
    if !engine_answers() {
        eprintln!("SKIPPED: no Docker Engine here (GPURENT_TEST_DOCKER=0 skips); scripts/test.sh starts one");
        return;
    }
    let cluster = Cluster::start_with("127.0.0.1:0", &["--min-disk-free-gb", "0"]);
    let (_agent, _containers, _) = agent(&cluster, "epd", &[]);
    let user = cluster.cli(
        Some(&cluster.admin),
        true,
        &["users", "create", "dana", "--credit", "50"],
    );
    let token = user.json()["token"].as_str().unwrap().to_owned();
    let t = Some(token.as_str());
    let url = cluster.url.clone();

    let mut create: Vec<String> = [
        "endpoints",
        "create",
        "web",
        "--gpu",
        "rtx4090",
        "--image",
        IMAGE,
        "--port",
        "8000",
        "--max-replicas",
        "2",
        "--target-inflight",
        "1",
        "--scale-down-after",
        "3",
        "--",
    ]
    .map(str::to_owned)
    .to_vec();
    create.extend(serve("v1"));
    let create: Vec<&str> = create.iter().map(String::as_str).collect();
    let created = cli(&url, t, true, &create);
    assert_eq!(created.code, 0, "{created:?}");
    let keys = cli(&url, t, true, &["endpoints", "keys", "create", "web"]);
    assert_eq!(keys.code, 0, "{keys:?}");
    let key = keys.json()["key"].as_str().unwrap().to_owned();

    // 0 → 1: the first call waits for a container to start and pass its health check.
    let (status, body) = get(&url, "/e/web/", &key);
    assert_eq!(status, 200, "{body}");
    assert!(body.trim_end().ends_with(" v1"), "{body}");
    let got = cli(&url, t, true, &["endpoints", "get", "web"]).json();
    assert_eq!(got["ready_replicas"], 1, "{got}");
    assert!(
        body.starts_with(got["replicas"][0]["id"].as_str().unwrap()),
        "{got} {body}"
    );

    // 1 → 2: two containers side by side, both listening on port 8000.
    let mut replicas = HashSet::new();
    for (status, body) in get_together(&url, "/e/web/cgi-bin/slow", &key, 4) {
        assert_eq!(status, 200, "{body}");
        // A CGI's answer is chunked: the replica is the word before its version.
        let words: Vec<&str> = body.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "v1").expect(&body);
        replicas.insert(words[at - 1].to_owned());
    }
    assert_eq!(replicas.len(), 2, "{replicas:?}");

    // A rolling update under steady calls: every call answered, by v1 until v2 takes over.
    let calling = Arc::new(AtomicBool::new(true));
    let caller = {
        let (url, key, calling) = (url.clone(), key.clone(), Arc::clone(&calling));
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while calling.load(Ordering::SeqCst) {
                answers.push(get(&url, "/e/web/", &key));
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            answers
        })
    };
    let mut update = vec![
        "endpoints".to_owned(),
        "update".into(),
        "web".into(),
        "--".into(),
    ];
    update.extend(serve("v2"));
    let update: Vec<&str> = update.iter().map(String::as_str).collect();
    let updated = cli(&url, t, true, &update);
    assert_eq!(updated.code, 0, "{updated:?}");
    eventually("the replicas to roll over to v2", 120, || {
        let (status, body) = get(&url, "/e/web/", &key);
        let e = cli(&url, t, true, &["endpoints", "get", "web"]).json();
        status == 200
            && body.trim_end().ends_with(" v2")
            && e["replicas"].as_array().is_some_and(|r| {
                r.iter()
                    .all(|r| r["generation"] == e["replicas"][0]["generation"])
            })
    });
    calling.store(false, Ordering::SeqCst);
    let answers = caller.join().unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "calls failed during the rolling update: {failed:?}"
    );
    assert!(
        answers.iter().any(|(_, b)| b.trim_end().ends_with(" v1")),
        "{answers:?}"
    );
    assert!(
        answers.iter().any(|(_, b)| b.trim_end().ends_with(" v2")),
        "{answers:?}"
    );

    // Idle: to zero, every replica's reservation stopped and its container gone.
    eventually("the endpoint to scale to zero", 90, || {
        cli(&url, t, true, &["endpoints", "get", "web"]).json()["replicas"]
            == serde_json::Value::Array(vec![])
    });
    let listed = cli(&url, t, true, &["ls"]).json();
    let ran: Vec<&serde_json::Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["endpoint"] == "web")
        .collect();
    assert!(ran.len() >= 3, "{listed}");
    assert!(ran.iter().all(|r| r["status"] == "stopped"), "{listed}");
    let removed = cli(&url, t, true, &["endpoints", "rm", "web"]);
    assert_eq!(removed.code, 0, "{removed:?}");
}
